#!/usr/bin/env bash
# The README's test command: installs dependencies, builds, runs the whole suite (unit tests
# and integration tests that really mount), the conformance lane, then the reliability stages:
# the suite again under ASan+UBSan, the fs tests under TSan, and every fuzz target for a short
# budget (docs/RELIABILITY.md). Exits non-zero when any test fails or is skipped, a sanitizer reports
# or a fuzzer finds something. CKPTFS_QUICK=1 runs the first stage only; the sanitizer stages run
# with CKPTFS_SANITIZERS=1 (not yet on by default: see docs/RELIABILITY.md).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
bash scripts/install-deps.sh
bash scripts/build.sh

# A test skips only where the machine cannot run it (no usable /dev/fuse, no way to drop root);
# on the machines this command is for, a skip hides a test that did not run, so it fails.
run_ctest() {  # BUILD_DIR [ctest args...]
  local dir=$1 log
  shift
  log=$(mktemp)
  (cd "$dir" && ctest --output-on-failure -j2 --timeout 900 "$@") | tee "$log"
  if grep -q "(Skipped)" "$log"; then
    rm -f "$log"
    echo "error: tests were skipped in $dir (see above); this suite needs /dev/fuse and root" >&2
    return 1
  fi
  rm -f "$log"
}

# Sanitizer reports, also from a mount's daemon (whose stderr is /dev/null), go to files; any
# such file fails the stage.
sanitizer_env() {  # REPORT_PREFIX
  export ASAN_OPTIONS="abort_on_error=1:detect_leaks=1:log_path=$1"
  export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1:log_path=$1"
  export TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:log_path=$1"
  export LSAN_OPTIONS="suppressions=$root/scripts/lsan.supp"
}
check_reports() {  # REPORT_PREFIX
  if compgen -G "$1*" >/dev/null; then
    cat "$1"* >&2
    echo "error: sanitizer reports (above), in $1*" >&2
    return 1
  fi
}
sanitized_build() {  # BUILD_DIR SANITIZERS [targets...]
  local dir=$1 sanitize=$2
  shift 2
  local launcher=()
  command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
  cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCKPTFS_SANITIZE="$sanitize" \
    -DCKPTFS_BUILD_BENCH=OFF "${launcher[@]}" >/dev/null
  cmake --build "$dir" -j"$(nproc)" ${1:+--target "$@"}
}

stage() { echo; echo "=== stage: $1 ($(date +%T))"; }

stage "unit and integration tests"
run_ctest build
[ "${CKPTFS_QUICK:-0}" = 1 ] && exit 0

stage "conformance lane against real MindSpore"
# CKPTFS_CONFORMANCE=0 skips it, offline.
bash scripts/conformance.sh

if [ "${CKPTFS_SANITIZERS:-0}" = 1 ]; then
stage "unit and integration tests under ASan+UBSan (build-asan)"
sanitized_build build-asan address,undefined
rm -rf build-asan/reports && mkdir -p build-asan/reports
(sanitizer_env "$root/build-asan/reports/report" && run_ctest build-asan)
check_reports build-asan/reports/report

stage "fs tests under TSan (build-tsan)"
sanitized_build build-tsan thread test_fs ckptfs
rm -rf build-tsan/reports && mkdir -p build-tsan/reports
(sanitizer_env "$root/build-tsan/reports/report" && cd build-tsan && ./tests/test_fs)
check_reports build-tsan/reports/report
fi

stage "fuzz targets, ${CKPTFS_FUZZ_SECONDS:-20} s each (build-fuzz)"
bash scripts/fuzz.sh "${CKPTFS_FUZZ_SECONDS:-20}"
