#!/usr/bin/env bash
# The README's test command: installs dependencies, builds (warnings are errors), runs the whole
# suite (unit tests and integration tests that really mount), the conformance lane, then the
# reliability stages: with CKPTFS_SANITIZERS=1, the parsers' tests and the input and read
# integration tests under ASan+UBSan (off by default: not yet run end to end in this form, and
# its build would take the command past its 40-minute budget on 2 cores), and every fuzz target
# for a short budget (docs/RELIABILITY.md). Exits non-zero when any test fails or is skipped, a sanitizer reports or a fuzzer finds something, and prints each
# stage's time. CKPTFS_QUICK=1 runs the build and the suite only; CKPTFS_SANITIZERS=1 adds
# the ASan+UBSan stage, CKPTFS_ASAN_ALL=1 runs the whole suite in it; CKPTFS_TSAN=1 adds the fs
# tests under TSan (not yet run clean: see docs/RELIABILITY.md).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

# Each stage's wall time, printed at the end however the script ends.
times=()
stage_name=""
stage_start=0
end_stage() {
  [ -n "$stage_name" ] && times+=("$(printf '%6d s  %s' $((SECONDS - stage_start)) "$stage_name")")
  stage_name=""
}
stage() {
  end_stage
  stage_name=$1
  stage_start=$SECONDS
  echo
  echo "=== stage: $1 ($(date +%T))"
}
trap 'end_stage; echo; echo "=== stage times (total ${SECONDS} s):"; printf "%s\n" "${times[@]}"' EXIT

stage "dependencies and Release build (-DCKPTFS_WERROR=ON)"
bash scripts/install-deps.sh
bash scripts/build.sh -DCKPTFS_WERROR=ON

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
  export LSAN_OPTIONS="suppressions=$root/scripts/lsan.supp:print_suppressions=0"
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

stage "unit and integration tests"
run_ctest build
[ "${CKPTFS_QUICK:-0}" = 1 ] && exit 0

stage "conformance lane against real MindSpore"
# CKPTFS_CONFORMANCE=0 skips it, offline.
bash scripts/conformance.sh

# Under ASan+UBSan by default a subset, to keep the whole command near its budget on 2 cores
# (docs/RELIABILITY.md has the times): the binary and the unit tests of every module that reads
# files other programs wrote, and the integration tests that feed ckptfs bad, huge or changing
# input and serve reads under load and faults.
asan_modules=(ckpt safetensors torchzip strategy source index)
asan_itests='bad_input|limits|source_changed|inspect|safetensors|mindformers|hfai|faults'
if [ "${CKPTFS_SANITIZERS:-0}" = 1 ]; then
  stage "ASan+UBSan build (build-asan)"
  if [ "${CKPTFS_ASAN_ALL:-0}" = 1 ]; then
    sanitized_build build-asan address,undefined
  else
    sanitized_build build-asan address,undefined ckptfs "${asan_modules[@]/#/test_}"
  fi
  stage "parsers' unit tests and input and read integration tests under ASan+UBSan"
  rm -rf build-asan/reports && mkdir -p build-asan/reports
  if [ "${CKPTFS_ASAN_ALL:-0}" = 1 ]; then
    (sanitizer_env "$root/build-asan/reports/report" && run_ctest build-asan)
  else
    labels=$(IFS='|'; echo "${asan_modules[*]}")
    (sanitizer_env "$root/build-asan/reports/report" && run_ctest build-asan -L "^($labels)\$" &&
      run_ctest build-asan -R "^integration\.test_($asan_itests)\$")
  fi
  check_reports build-asan/reports/report
fi

if [ "${CKPTFS_TSAN:-0}" = 1 ]; then
  stage "TSan build (build-tsan: test_fs and ckptfs)"
  sanitized_build build-tsan thread test_fs ckptfs
  stage "fs tests and the read and fault integration tests under TSan"
  rm -rf build-tsan/reports && mkdir -p build-tsan/reports
  # The fs module's tests (tree, read-ahead, splicing, real mounts with worker threads), then the
  # integration tests whose daemon serves many concurrent readers and meets faults.
  (sanitizer_env "$root/build-tsan/reports/report" && run_ctest build-tsan -L '^fs$' &&
    run_ctest build-tsan -R '^integration\.test_(faults|mount_options)$')
  check_reports build-tsan/reports/report
fi

stage "fuzz targets, ${CKPTFS_FUZZ_SECONDS:-20} s each (build-fuzz)"
bash scripts/fuzz.sh "${CKPTFS_FUZZ_SECONDS:-20}"
