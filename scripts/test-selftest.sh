#!/usr/bin/env bash
# The test command's self-test: scripts/test.sh must exit non-zero when a test fails or is
# skipped, in every stage. It runs the command's stages on a tiny selection of tests, first as
# they are (every stage must pass: the selection matches and runs), then with a failure injected
# into one stage at a time (that stage must fail, and say so):
#   CKPTFS_INJECT_FAILURE=1  fails the unit test Harness.InjectedFailure (tests/fs), a check of
#                            integration.test_harness, the first conformance case that runs, and
#                            the fuzz target strategy_json (it crashes on its first input)
#   CKPTFS_INJECT_SKIP=1     makes that unit test and that integration test report a skip
# The last stage of scripts/test.sh runs it; it reuses the builds the stages before made, so it
# takes about two minutes. Alone, after the builds (or a full run of scripts/test.sh):
#   scripts/test-selftest.sh [STAGE...]     # default: suite conformance asan tsan fuzz
# Each run's output is kept in build/selftest/NAME.log.
set -euo pipefail
cd "$(dirname "$0")/.."

checked=("$@")
[ ${#checked[@]} -gt 0 ] || checked=(suite conformance asan tsan fuzz)
out=build/selftest
rm -rf "$out" && mkdir -p "$out"

unit='Harness\.InjectedFailure'
integration='integration\.test_harness'
# The tiny selection: the two harness tests in each ctest stage, one quick conformance case, one
# fuzz target for 2 s (its findings kept apart from build-fuzz/artifacts).
selection=(
  CKPTFS_BUILD=0
  "CKPTFS_CTEST_REGEX=^($unit|$integration)\$"
  "CKPTFS_CONFORMANCE_ARGS=-k test_string_entries"
  CKPTFS_FUZZ_TARGETS=strategy_json CKPTFS_FUZZ_SECONDS=2
  "FUZZ_FLAGS=-artifact_prefix=$PWD/$out/fuzz-"
)

problems=0
# Runs scripts/test.sh with the selection and the stages given; EXPECT is pass, or the text that
# the output must hold besides the line naming the failed stage.
attempt() {  # NAME EXPECT STAGES [VAR=VALUE...]
  local name=$1 expect=$2 stages=$3 rc=0 log="$out/$1.log"
  shift 3
  env -u CKPTFS_QUICK -u CKPTFS_CONFORMANCE -u CKPTFS_SANITIZERS -u CKPTFS_TSAN \
    -u CKPTFS_INJECT_FAILURE -u CKPTFS_INJECT_SKIP \
    "${selection[@]}" CKPTFS_STAGES="$stages" "$@" bash scripts/test.sh >"$log" 2>&1 || rc=$?
  local verdict
  if [ "$expect" = pass ]; then
    if [ "$rc" -eq 0 ]; then verdict=ok; else verdict="exit $rc, expected 0"; fi
  elif [ "$rc" -eq 0 ]; then
    verdict="exit 0 though $* (a failure the command hid)"
  elif ! grep -q "FAILED in stage" "$log" || ! grep -q -- "$expect" "$log"; then
    verdict="exit $rc, but not from the injected failure (no \"$expect\")"
  else
    verdict=ok
  fi
  if [ "$verdict" = ok ]; then
    printf 'ok    %-24s %s\n' "$name" "$( [ "$expect" = pass ] && echo passed || echo "failed as it must ($*)")"
  else
    problems=$((problems + 1))
    tail -40 "$log"
    printf 'FAIL  %-24s %s; log: %s\n' "$name" "$verdict" "$log"
  fi
}

# Nothing injected: every stage passes on the selection.
attempt control pass "${checked[*]}"
failed="failure injected (CKPTFS_INJECT_FAILURE=1)"
for stage in "${checked[@]}"; do
  case $stage in
    suite)
      attempt suite-unit "$failed" suite CKPTFS_INJECT_FAILURE=1 "CKPTFS_CTEST_REGEX=^$unit\$"
      attempt suite-integration "$failed" suite CKPTFS_INJECT_FAILURE=1 \
        "CKPTFS_CTEST_REGEX=^$integration\$"
      attempt suite-unit-skip "tests were skipped" suite CKPTFS_INJECT_SKIP=1 \
        "CKPTFS_CTEST_REGEX=^$unit\$"
      attempt suite-integration-skip "tests were skipped" suite CKPTFS_INJECT_SKIP=1 \
        "CKPTFS_CTEST_REGEX=^$integration\$"
      ;;
    conformance) attempt conformance "$failed" conformance CKPTFS_INJECT_FAILURE=1 ;;
    asan) attempt asan "$failed" asan CKPTFS_INJECT_FAILURE=1 ;;
    tsan) attempt tsan "$failed" tsan CKPTFS_INJECT_FAILURE=1 ;;
    fuzz) attempt fuzz "fuzz findings in: strategy_json" fuzz CKPTFS_INJECT_FAILURE=1 ;;
    *) echo "test-selftest: unknown stage $stage" >&2; exit 2 ;;
  esac
done
if [ "$problems" -gt 0 ]; then
  echo "test-selftest: $problems of the runs above did not end as they must: scripts/test.sh can hide a failure" >&2
  exit 1
fi
echo "test-selftest: every stage (${checked[*]}) fails on an injected failure and passes without"
