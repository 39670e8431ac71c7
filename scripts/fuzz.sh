#!/usr/bin/env bash
# Builds the libFuzzer targets (fuzz/*.cc, clang with ASan+UBSan) into build-fuzz/ and runs each
# for SECONDS (default 30), or only the targets named. Every target whose seed folder
# fuzz/corpus/<name>/ exists is run; what it finds is kept in build-fuzz/corpus/<name>/ (the
# seeds in the repository are only read). Exits non-zero on any crash, sanitizer report,
# timeout (-timeout, s per input) or out-of-memory (-rss_limit_mb); the input that did it is in
# build-fuzz/artifacts/<name>/. As many targets run at once as there are cores (FUZZ_PARALLEL=N
# overrides), each for the whole budget. Extra libFuzzer flags: FUZZ_FLAGS="-jobs=2 ..." (they
# come last, so they override the defaults). The long run of docs/RELIABILITY.md, one target at a time:
#   ASAN_OPTIONS=quarantine_size_mb=64 FUZZ_FLAGS="-runs=10000000 -timeout=120" \
#     scripts/fuzz.sh 86400 TARGET
# (ASan keeps up to 256 MB of freed blocks to catch a use after free; over millions of
# executions that quarantine, not the product, took target_summary past -rss_limit_mb=512.)
# (libFuzzer's -timeout is wall-clock time: at low priority on a loaded machine an input that
# takes 3 ms can wait more than 10 s for a CPU; a fuzzer at nice 19 got 3 % of a core at times.)
#   scripts/fuzz.sh [SECONDS] [TARGET...]
#   scripts/fuzz.sh --build [CMAKE_TARGET...]   # builds every fuzz target and these, runs nothing
# The same build directory holds the test suite built with the same flags (ASan+UBSan for every
# library): the test command's sanitizer stage builds `ckptfs` and the test binaries there with
# --build, so the libraries are compiled with sanitizers once for both (docs/RELIABILITY.md).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${FUZZ_BUILD_DIR:-build-fuzz}
launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
# A unity build: each module's sources compiled as a few batches parse the heavy headers and
# instrument their templates once a batch, not once a file (docs/TESTING.md has the times).
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_COMPILER=clang++-14 \
  -DCKPTFS_FUZZ=ON -DCKPTFS_BUILD_TESTS=ON -DCKPTFS_BUILD_BENCH=OFF -DCMAKE_UNITY_BUILD=ON \
  "${launcher[@]}" >/dev/null
all_targets=()
for dir in fuzz/corpus/*/; do all_targets+=("$(basename "$dir")"); done
if [ "${1:-}" = --build ]; then
  shift
  cmake --build "$build" -j"$(nproc)" --target "${all_targets[@]/#/fuzz_}" "$@"
  exit 0
fi
seconds=${1:-30}
shift || true
targets=("$@")
[ ${#targets[@]} -eq 0 ] && targets=("${all_targets[@]}")
cmake --build "$build" -j"$(nproc)" --target "${targets[@]/#/fuzz_}"
# A fuzzer uses one core: as many run at once as there are cores (FUZZ_PARALLEL overrides), each
# with its whole budget; their results are printed in the order of the targets.
parallel=${FUZZ_PARALLEL:-$(nproc)}
fuzz_one() {  # NAME: the fuzzer's status goes to a file, read once every fuzzer has finished
  local name=$1 rc=0
  # shellcheck disable=SC2086
  "$build/fuzz/fuzz_$name" -max_total_time="$seconds" -rss_limit_mb=512 -timeout=10 \
    -max_len=65536 -print_final_stats=1 -artifact_prefix="$build/artifacts/$name/" \
    ${FUZZ_FLAGS:-} "$build/corpus/$name" "fuzz/corpus/$name" >"$build/artifacts/$name/last.log" \
    2>&1 || rc=$?
  echo "$rc" >"$build/artifacts/$name/last.status"
}
for name in "${targets[@]}"; do
  mkdir -p "$build/corpus/$name" "$build/artifacts/$name"
  rm -f "$build/artifacts/$name/last.status"
  while [ "$(jobs -rp | wc -l)" -ge "$parallel" ]; do wait -n || true; done
  fuzz_one "$name" &
done
wait
failed=()
for name in "${targets[@]}"; do
  log="$build/artifacts/$name/last.log"
  echo "== fuzz_$name: ${seconds}s"
  if [ "$(cat "$build/artifacts/$name/last.status" 2>/dev/null)" = 0 ]; then
    grep -E "^stat::number_of_executed_units|^stat::peak_rss_mb" "$log" | tr '\n' ' '
    echo
  else
    tail -40 "$log"
    failed+=("$name")
  fi
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "error: fuzz findings in: ${failed[*]} (inputs in $build/artifacts/)" >&2
  exit 1
fi
