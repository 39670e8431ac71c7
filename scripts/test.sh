#!/usr/bin/env bash
# The README's test command. Stages, in order (each prints its time at the end):
#   build        dependencies (scripts/install-deps.sh) and the Release build (unity), warnings
#                as errors
#   suite        every unit and integration test (the integration tests really mount)
#   conformance  the conformance lane against real MindSpore (scripts/conformance.sh)
#   asan         one clang build with ASan+UBSan of every library (build-fuzz), then the whole
#                suite under it; the fuzz stage uses the same build
#   tsan         a gcc build with TSan (build-tsan), the fs tests and the integration tests
#                labelled tsan under it
#   fuzz         every fuzz target for a short budget (scripts/fuzz.sh)
#   selftest     the command checks itself: with a failure injected, each stage above must fail
#                (scripts/test-selftest.sh); about two minutes, the builds above are reused
# Exits non-zero when any test fails or is skipped, a sanitizer reports or a fuzzer finds
# something; the last line names the stage that failed. docs/RELIABILITY.md.
# Knobs:
#   CKPTFS_STAGES="suite conformance asan tsan fuzz selftest"  the stages to run (this default)
#   CKPTFS_QUICK=1          the build and the suite only
#   CKPTFS_CONFORMANCE=0    no conformance stage (offline); CKPTFS_SANITIZERS=0 no asan stage
#                           (the fuzz stage still builds build-fuzz); CKPTFS_TSAN=0 no tsan stage
#   CKPTFS_FUZZ_SECONDS=N   the fuzz budget per target (default 12)
# and, for the self-test (which sets them), small runs of a stage:
#   CKPTFS_BUILD=0          no build stage (build/ must be current)
#   CKPTFS_CTEST_REGEX=RE   each ctest run takes only the tests matching RE (ctest -R)
#   CKPTFS_CONFORMANCE_ARGS="-k NAME"   pytest arguments for the conformance stage
#   CKPTFS_FUZZ_TARGETS="NAME..."       only these fuzz targets
#
# Every stage's status is collected explicitly (`cmd || return`, PIPESTATUS), never left to
# `set -e`: bash ignores `set -e` inside a function called from an && or || list, which once let
# a failing ctest in the TSan stage pass as the status of the command after it.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

stages=${CKPTFS_STAGES:-suite conformance asan tsan fuzz selftest}
[ "${CKPTFS_QUICK:-0}" = 1 ] && stages=suite
[ "${CKPTFS_CONFORMANCE:-1}" = 0 ] && stages=${stages//conformance/}
[ "${CKPTFS_SANITIZERS:-1}" = 0 ] && stages=${stages//asan/}
[ "${CKPTFS_TSAN:-1}" = 0 ] && stages=${stages//tsan/}
wanted() { [[ " $stages " == *" $1 "* ]]; }

# Each stage's wall time, printed at the end however the script ends.
times=()
stage_name=""
stage_start=0
# The disk left after each stage is printed too: the suite's tests remove their work folders when
# they pass, and a failure that reads "No space left on device" is the machine's, not the product's.
free_disk() { df -h --output=avail . 2>/dev/null | tail -1 | tr -d ' '; }
end_stage() {
  if [ -n "$stage_name" ]; then
    times+=("$(printf '%6d s  %s (then %s free)' $((SECONDS - stage_start)) "$stage_name" "$(free_disk)")")
  fi
  stage_name=""
}
# The conformance venvs' background job (stage_build), ended with the script.
venvs_pid=""
stop_venvs() {
  if [ -n "$venvs_pid" ]; then kill -- "-$venvs_pid" 2>/dev/null || true; fi
}
trap 'stop_venvs; end_stage; echo; echo "=== stage times (total ${SECONDS} s):"; printf "%s\n" "${times[@]}"' EXIT

# Runs one stage: FUNCTION's status decides, and a failure ends the script naming the stage.
run_stage() {  # TITLE FUNCTION
  end_stage
  stage_name=$1
  stage_start=$SECONDS
  echo
  echo "=== stage: $1 ($(date +%T), $(free_disk) free on $PWD's disk)"
  local rc=0
  "$2" || rc=$?
  if [ "$rc" -ne 0 ]; then
    end_stage
    echo "scripts/test.sh: FAILED in stage: $1 (exit $rc)" >&2
    exit "$rc"
  fi
}

# A test skips only where the machine cannot run it (no usable /dev/fuse, no way to drop root, a
# tool missing); on the machines this command is for, a skip hides a test that did not run, so it
# fails, as does a filter that selects no test.
run_ctest() {  # BUILD_DIR [ctest args...]
  local dir=$1 log rc=0
  shift
  local only=()
  if [ -n "${CKPTFS_CTEST_REGEX:-}" ]; then only=(-R "$CKPTFS_CTEST_REGEX"); fi
  log=$(mktemp) || return
  # ctest's own status, whatever pipefail and errexit are here.
  (cd "$dir" || exit
   ctest --output-on-failure -j2 --timeout 900 "$@" "${only[@]}" 2>&1 | tee "$log"
   exit "${PIPESTATUS[0]}") || rc=$?
  if [ "$rc" -eq 0 ] && grep -q "No tests were found" "$log"; then
    echo "error: no test in $dir matches ctest $* ${only[*]}" >&2
    rc=1
  fi
  if grep -q "(Skipped)" "$log"; then
    echo "error: tests were skipped in $dir (above): a skip hides a test that did not run" >&2
    [ "$rc" -ne 0 ] || rc=1
  fi
  rm -f "$log"
  [ "$rc" -eq 0 ] || echo "error: ctest in $dir failed (exit $rc)" >&2
  return "$rc"
}

# Prints the tests a selection names, so that what a stage leaves out is seen, not assumed.
print_tests() {  # BUILD_DIR TEXT CTEST_SELECTION...
  local dir=$1 text=$2 names
  shift 2
  names=$(cd "$dir" && ctest -N "$@" | sed -n 's/^ *Test *#[0-9]*: //p' | tr '\n' ' ') || return
  echo "$text: ${names:-none}"
}

# Sanitizer reports, also from a mount's daemon (whose stderr is /dev/null), go to files; any
# such file fails the stage. The variables are set in a subshell, for that stage only.
sanitizer_env() {  # REPORT_PREFIX
  export ASAN_OPTIONS="abort_on_error=1:detect_leaks=1:log_path=$1"
  export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1:log_path=$1"
  export TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:log_path=$1"
  export LSAN_OPTIONS="suppressions=$root/scripts/lsan.supp:print_suppressions=0"
}
# A file holding nothing but LeakSanitizer's "Unable to get registers from thread N." is no
# finding: a thread was ending while the leak check stopped the process, and LSan then counts
# that thread's whole stack as reachable (it can hide a leak, never invent one). It is printed
# and set aside; any other line in any file fails the stage.
check_reports() {  # REPORT_PREFIX
  local f found=0 lsan='^==[0-9]+==Unable to get registers from thread [0-9]+\.$'
  for f in "$1"*; do
    [ -e "$f" ] || continue
    local other=0
    grep -qvE "$lsan" "$f" || other=$?  # 1: no other line; 0 or 2 (an error): not set aside
    if grep -qE "$lsan" "$f" && [ "$other" -eq 1 ]; then
      echo "note: $f only says LeakSanitizer could not read an ending thread: $(cat "$f")" >&2
      continue
    fi
    cat "$f" >&2
    found=1
  done
  if [ "$found" -ne 0 ]; then
    echo "error: sanitizer reports (above), in $1*" >&2
    return 1
  fi
}
sanitized_suite() {  # BUILD_DIR [ctest args...]
  local dir=$1 rc=0
  shift
  rm -rf "$dir/reports" && mkdir -p "$dir/reports" || return
  (sanitizer_env "$root/$dir/reports/report" && run_ctest "$dir" "$@") || rc=$?
  check_reports "$dir/reports/report" || rc=1
  return "$rc"
}

# The conformance lane's venvs (gigabytes from PyPI, mostly waiting on the network) are made in
# the background while the build stage compiles and the suite runs; the conformance stage waits
# for them and fails when making them failed (their log: build/conformance-venvs.log). setsid: a
# failed run ends the whole group, pip included (stop_venvs, above).
stage_build() {
  bash scripts/install-deps.sh || return
  if wanted conformance; then
    mkdir -p build || return
    setsid bash scripts/conformance.sh --venvs >build/conformance-venvs.log 2>&1 &
    venvs_pid=$!
  fi
  # A unity build, as the sanitizer stages' (CMakeLists.txt says what it changes): 340 s here
  # against about 600 s file by file, on CI's 2 cores. scripts/build.sh alone still builds file
  # by file, which is what catches a source that compiles only beside another.
  bash scripts/build.sh -DCKPTFS_WERROR=ON -DCMAKE_UNITY_BUILD=ON
}

stage_suite() {
  run_ctest build
}

stage_conformance() {
  if [ -n "$venvs_pid" ]; then
    local rc=0
    wait "$venvs_pid" || rc=$?
    venvs_pid=""
    cat build/conformance-venvs.log
    if [ "$rc" -ne 0 ]; then
      echo "error: making the conformance venvs failed (exit $rc; log above)" >&2
      return "$rc"
    fi
  fi
  local args=()
  read -ra args <<<"${CKPTFS_CONFORMANCE_ARGS:-}"
  bash scripts/conformance.sh "${args[@]}"
}

# ASan+UBSan: the fuzz stage's clang build (build-fuzz) already compiles every library with
# ASan+UBSan, so the binary and the unit tests are built there too, once for both stages. The
# whole suite runs under it, unit and integration tests (docs/RELIABILITY.md has the times),
# but for the tests labelled no_sanitizer.
stage_asan_build() {
  bash scripts/fuzz.sh --build ckptfs unit_tests
}
stage_asan() {
  print_tests build-fuzz "left out (label no_sanitizer: an address-space limit means nothing to \
a sanitized build)" -L '^no_sanitizer$' || return
  sanitized_suite build-fuzz -LE '^no_sanitizer$'
}

# TSan: a gcc build of the libraries, test_fs and the daemon (TSan cannot share a binary with
# ASan). The fs module's tests (tree, read-ahead, splicing, real mounts with worker threads),
# then the integration tests labelled tsan, whose daemon serves many concurrent readers and meets
# faults. Not TreeReads.SourceShrunkUnderTheMappingGivesEioNotACrash: the SIGBUS it provokes on
# purpose kills the process under TSan ("Bus error"; it passes in the Release and ASan builds).
tsan_skip='^TreeReads\.SourceShrunkUnderTheMappingGivesEioNotACrash$'
stage_tsan_build() {
  local launcher=()
  command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
  # A unity build, as build-fuzz's (scripts/fuzz.sh says why).
  cmake -S . -B build-tsan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCKPTFS_SANITIZE=thread \
    -DCKPTFS_BUILD_BENCH=OFF -DCMAKE_UNITY_BUILD=ON "${launcher[@]}" >/dev/null || return
  cmake --build build-tsan -j"$(nproc)" --target test_fs ckptfs
}
stage_tsan() {
  print_tests build-tsan "integration tests in this stage (label tsan)" -L '^tsan$' || return
  print_tests build-tsan "left out (its SIGBUS on purpose kills a TSan process)" -R "$tsan_skip" ||
    return
  sanitized_suite build-tsan -L '^(fs|tsan)$' -E "$tsan_skip"
}

stage_fuzz() {
  local targets=()
  read -ra targets <<<"${CKPTFS_FUZZ_TARGETS:-}"
  bash scripts/fuzz.sh "${CKPTFS_FUZZ_SECONDS:-12}" "${targets[@]}"
}

stage_selftest() {
  local checked=()
  read -ra checked <<<"${stages//selftest/}"
  bash scripts/test-selftest.sh "${checked[@]}"
}

if [ "${CKPTFS_BUILD:-1}" = 1 ]; then
  run_stage "dependencies and Release build (unity, -DCKPTFS_WERROR=ON)" stage_build
fi
wanted suite && run_stage "unit and integration tests" stage_suite
wanted conformance && run_stage "conformance lane against real MindSpore" stage_conformance
if wanted asan; then
  run_stage "clang ASan+UBSan build (build-fuzz): the fuzz targets, ckptfs and the unit tests" \
    stage_asan_build
  run_stage "unit and integration tests under ASan+UBSan (build-fuzz)" stage_asan
fi
if wanted tsan; then
  run_stage "TSan build (build-tsan: test_fs and ckptfs)" stage_tsan_build
  run_stage "fs tests and the integration tests labelled tsan, under TSan" stage_tsan
fi
wanted fuzz && run_stage "fuzz targets, ${CKPTFS_FUZZ_SECONDS:-12} s each (build-fuzz)" stage_fuzz
wanted selftest && run_stage "self-test: each stage fails on an injected failure" stage_selftest
end_stage
echo
read -ra ran <<<"$stages"
echo "scripts/test.sh: passed (stages: ${ran[*]})"
