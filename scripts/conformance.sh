#!/usr/bin/env bash
# The conformance lane: the tests in tests/conformance run MindSpore itself (its transform, loader
# and trainer) and compare with the mount byte for byte. Makes its Python environment once, in
# build/conformance-venv, from the pins in tests/conformance/requirements.txt (remade when they
# change), builds ckptfs if needed and runs pytest; then the PyTorch lane (tests/conformance_torch,
# torch itself writing DCP checkpoints) in build/torch-venv from tests/conformance_torch/
# requirements.txt. A full run writes one results table to build/conformance-results.md;
# arguments go to the MindSpore lane's pytest and run only it (then no results are written);
#   scripts/conformance.sh --torch [pytest arguments]   # only the PyTorch lane
#   scripts/conformance.sh --refresh-doc   # copies that table into docs/CONFORMANCE.md
#   scripts/conformance.sh --venvs   # only makes both venvs (scripts/test.sh runs this in the
#                                    # background of its build stage: pip waits on the network)
# Running the tests never changes a tracked file: refreshing the doc is this deliberate step.
# CKPTFS_CONFORMANCE=0 skips the lane, for machines that cannot reach PyPI.
set -euo pipefail
cd "$(dirname "$0")/.."

results=build/conformance-results.md
if [ "${1:-}" = --refresh-doc ]; then
  if [ ! -f "$results" ]; then
    echo "conformance: no $results: run every case first (bash scripts/conformance.sh)" >&2
    exit 1
  fi
  exec /usr/bin/python3 tests/conformance/report.py refresh "$results" docs/CONFORMANCE.md
fi

if [ "${CKPTFS_CONFORMANCE:-1}" = "0" ]; then
  echo "conformance: skipped (CKPTFS_CONFORMANCE=0)"
  exit 0
fi

requirements=tests/conformance/requirements.txt
# MindFormers, pinned with everything it imports, without pip's resolver (the file says why).
requirements_mf=tests/conformance/requirements-mindformers.txt
requirements_torch=tests/conformance_torch/requirements.txt
mkdir -p build

# make_venv VENV STAMP INSTALL_FUNCTION: (re)makes VENV when STAMP changed.
make_venv() {
  local venv=$1 stamp=$2 install=$3
  [ "$(cat "$venv/requirements.sha256" 2>/dev/null)" = "$stamp" ] && return 0
  rm -rf "$venv"
  /usr/bin/python3 -m venv "$venv"
  # The index is asked first, with a short timeout: pip itself retries for minutes before failing.
  local index
  index=$("$venv/bin/pip" config get global.index-url 2>/dev/null || true)
  index=${PIP_INDEX_URL:-${index:-https://pypi.org/simple}}
  if ! "$venv/bin/python" -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=20)' \
      "${index%/}/pip/" >/dev/null 2>&1; then
    rm -rf "$venv"
    echo "conformance: cannot reach the Python package index ($index) to make $venv; CKPTFS_CONFORMANCE=0 skips this lane on an offline machine" >&2
    exit 1
  fi
  echo "conformance: installing $venv"
  # No wheel cache: the venv is this lane's cache, and a second copy of its wheels would only take
  # disk that the suite's fixtures need.
  local log=$venv-pip.log
  if ! "$install" "$venv" >"$log" 2>&1; then
    cat "$log" >&2
    rm -rf "$venv"
    echo "conformance: pip could not make $venv (log above and in $log)" >&2
    exit 1
  fi
  echo "$stamp" >"$venv/requirements.sha256"
}

install_mindspore() {
  "$1/bin/pip" install --quiet --no-cache-dir --requirement "$requirements" &&
    "$1/bin/pip" install --quiet --no-cache-dir --no-deps --requirement "$requirements_mf"
}

install_torch() {
  "$1/bin/pip" install --quiet --no-cache-dir --requirement "$requirements_torch"
}

if [ "${1:-}" = --venvs ]; then
  make_venv build/conformance-venv \
    "$(cat "$requirements" "$requirements_mf" | sha256sum | cut -d' ' -f1)" install_mindspore
  make_venv build/torch-venv "$(sha256sum <"$requirements_torch" | cut -d' ' -f1)" install_torch
  exit 0
fi

# The build/ of scripts/build.sh; only the binary is needed here.
[ -f build/CMakeCache.txt ] || cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$(nproc)" --target ckptfs >/dev/null

# `--torch [pytest arguments]` runs only the PyTorch lane; other arguments go to the MindSpore
# lane's pytest and run only it. A full run (no arguments) runs both and writes one table.
if [ "${1:-}" = --torch ]; then
  shift
  make_venv build/torch-venv "$(sha256sum <"$requirements_torch" | cut -d' ' -f1)" install_torch
  exec build/torch-venv/bin/python -m pytest tests/conformance_torch --ckptfs build/ckptfs \
    --basetemp build/conformance-torch-tmp -p no:cacheprovider "$@"
fi

make_venv build/conformance-venv "$(cat "$requirements" "$requirements_mf" | sha256sum | cut -d' ' -f1)" \
  install_mindspore
args=(--ckptfs build/ckptfs --basetemp build/conformance-tmp -p no:cacheprovider)
if [ $# -gt 0 ]; then
  exec build/conformance-venv/bin/python -m pytest tests/conformance "${args[@]}" "$@"
fi
rm -f "$results"  # a run that fails before the end leaves no table of an older run behind
status=0
build/conformance-venv/bin/python -m pytest tests/conformance "${args[@]}" \
  --conformance-results "$results" || status=$?
make_venv build/torch-venv "$(sha256sum <"$requirements_torch" | cut -d' ' -f1)" install_torch
build/torch-venv/bin/python -m pytest tests/conformance_torch --ckptfs build/ckptfs \
  --basetemp build/conformance-torch-tmp -p no:cacheprovider --conformance-results "$results" ||
  status=$?
exit "$status"
