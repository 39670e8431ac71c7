#!/usr/bin/env bash
# The conformance lane: the tests in tests/conformance run MindSpore itself (its transform, loader
# and trainer) and compare with the mount byte for byte. Makes its Python environment once, in
# build/conformance-venv, from the pins in tests/conformance/requirements.txt (remade when they
# change), builds ckptfs if needed and runs pytest. A full run writes its results table to
# build/conformance-results.md; arguments go to pytest (then no results are written).
#   scripts/conformance.sh --refresh-doc   # copies that table into docs/CONFORMANCE.md
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
venv=build/conformance-venv
stamp=$(cat "$requirements" "$requirements_mf" | sha256sum | cut -d' ' -f1)
mkdir -p build

if [ "$(cat "$venv/requirements.sha256" 2>/dev/null)" != "$stamp" ]; then
  rm -rf "$venv"
  /usr/bin/python3 -m venv "$venv"
  # The index is asked first, with a short timeout: pip itself retries for minutes before failing.
  index=$("$venv/bin/pip" config get global.index-url 2>/dev/null || true)
  index=${PIP_INDEX_URL:-${index:-https://pypi.org/simple}}
  if ! "$venv/bin/python" -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=20)' \
      "${index%/}/pip/" >/dev/null 2>&1; then
    rm -rf "$venv"
    echo "conformance: cannot reach the Python package index ($index) to install $requirements; CKPTFS_CONFORMANCE=0 skips this lane on an offline machine" >&2
    exit 1
  fi
  echo "conformance: installing $requirements into $venv"
  # No wheel cache: the venv is this lane's cache, and a second copy of its wheels would only take
  # disk that the suite's fixtures need.
  if ! { "$venv/bin/pip" install --quiet --no-cache-dir --requirement "$requirements" &&
         "$venv/bin/pip" install --quiet --no-cache-dir --no-deps --requirement "$requirements_mf"; } \
      >build/conformance-pip.log 2>&1; then
    cat build/conformance-pip.log >&2
    rm -rf "$venv"
    echo "conformance: pip could not install $requirements and $requirements_mf (log above and in build/conformance-pip.log)" >&2
    exit 1
  fi
  echo "$stamp" >"$venv/requirements.sha256"
fi

# The build/ of scripts/build.sh; only the binary is needed here.
[ -f build/CMakeCache.txt ] || cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$(nproc)" --target ckptfs >/dev/null

args=(--ckptfs build/ckptfs --basetemp build/conformance-tmp -p no:cacheprovider)
if [ $# -eq 0 ]; then
  rm -f "$results"  # a run that fails before the end leaves no table of an older run behind
  args+=(--conformance-results "$results")
fi
exec "$venv/bin/python" -m pytest tests/conformance "${args[@]}" "$@"
