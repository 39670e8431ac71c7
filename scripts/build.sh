#!/usr/bin/env bash
# Configures and builds ckptfs into build/ (Release). Arguments go to cmake's configure step
# (scripts/test.sh passes -DCKPTFS_WERROR=ON -DCMAKE_UNITY_BUILD=ON); file by file otherwise.
set -euo pipefail
cd "$(dirname "$0")/.."
# ccache where installed, as the sanitizer and fuzz builds use it: rebuilds of a clone reuse objects.
launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DCMAKE_UNITY_BUILD=OFF "${launcher[@]}" "$@"
cmake --build build -j"$(nproc)"
