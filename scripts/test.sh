#!/usr/bin/env bash
# The README's test command: installs dependencies, builds, runs the whole suite (unit tests
# and integration tests that really mount). Exits non-zero when any test fails.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
bash scripts/build.sh
cd build
ctest --output-on-failure -j2 --timeout 900
