#!/usr/bin/env bash
# Configures and builds ckptfs into build/ (Release). Arguments go to cmake's configure step
# (scripts/test.sh passes -DCKPTFS_WERROR=ON).
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release "$@"
cmake --build build -j"$(nproc)"
