#!/usr/bin/env bash
# Installs everything ckptfs needs to build, test and benchmark on Debian 12, from Debian's
# packages; with --demo, only what scripts/demo.sh needs (the binary and the fixture
# generator). Safe to run again; skips apt when every package is already present.
set -euo pipefail

packages=(
  build-essential cmake pkg-config git
  libfuse3-dev fuse3
  libprotobuf-dev protobuf-compiler
  liblmdb-dev
  libspdlog-dev libfmt-dev
  libcli11-dev nlohmann-json3-dev zlib1g-dev
  libjemalloc-dev
  python3 python3-numpy
)
if [ "${1:-}" != --demo ]; then
  packages+=(
    lmdb-utils
    libgtest-dev libgmock-dev libbenchmark-dev
    python3-protobuf python3-venv
    python3-torch  # tests/integration/test_hfai.py loads hfai PART files with torch.load
    clang-14 libclang-rt-14-dev  # scripts/fuzz.sh: libFuzzer
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
