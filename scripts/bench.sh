#!/usr/bin/env bash
# The issue-4 benchmark: builds ckptfs and the bench tools (Release, into build-bench/), then
# runs scripts/bench.py, which generates its data (reused across runs), measures every figure in
# one run on the same bytes, verifies checksums of everything read, and prints the table.
#
#   scripts/bench.sh [--small] [--runs N] [--size-gib X] [--many-params N] [--huge-params N]
#                    [--no-knobs] [--only safetensors] [--keep] [--workdir DIR] [--json FILE]
#
#   --small        ~256 MiB data and 3 paired runs: a check that takes a couple of minutes
#   --runs N       paired runs per figure (default 7; 3 with --small)
#   --size-gib X   size of the main data (default 4; 0.25 with --small)
#   --many-params  parameters of the many-tensor mount case (default 1600 x 64 source files)
#   --huge-params  parameters of the second many-tensor case, mounted once (default 102400 x 64
#                  source files; 0 skips it; skipped with --small; ~10 min to generate once)
#   --no-knobs     skip the knob variants (mount options, readahead, request size)
#   --only safetensors
#                  only the safetensors view's rows (s1)-(s4) and the figures they are
#                  compared with ((a), (b), the -o cache first read and re-read (e))
#   --keep         keep scratch outputs (naive conversions, daemon logs, index dirs)
#   --workdir DIR  data + scratch (default build-bench/bench-data); generated data sets are kept
#                  there and reused when their parameters match
#   --json FILE    also write the result table as JSON
#   --no-hfai      skip the hfai row (scripts/bench_hfai.py: the merged hfai model read through
#                  the mount against torch.load of every PART file and hfai's merge; ~1 GiB of
#                  data generated once with Debian's python3-torch; skipped with --only)
#
# Exit status: 0 when every checksum matched (whether targets are met or not is in the table),
# 1 on a mismatch or any failure. Needs root (or fuse permissions), /usr/bin/python3 with numpy
# and protobuf, protoc, /usr/bin/time, and ~6x the data size of free disk.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
build=${CKPTFS_BENCH_BUILD:-$repo/build-bench}
workdir=$build/bench-data
args=()
hfai=1
while [ $# -gt 0 ]; do
  case $1 in
    --workdir) workdir=$2; shift 2 ;;
    --small|--keep|--no-knobs) args+=("$1"); shift ;;
    --no-hfai) hfai=0; shift ;;
    --only) args+=("$1" "$2"); hfai=0; shift 2 ;;
    --runs|--size-gib|--many-params|--huge-params|--json) args+=("$1" "$2"); shift 2 ;;
    -h|--help) sed -n '2,30p' "$0"; exit 0 ;;
    *) echo "bench.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
mkdir -p "$workdir"
workdir=$(cd "$workdir" && pwd)

# Release build of the filesystem and the tools, in our own build dir (never more than -j2:
# the machine has two cores and other builds may be running).
if [ ! -f "$build/CMakeCache.txt" ]; then
  cmake -S "$repo" -B "$build" -DCMAKE_BUILD_TYPE=Release -DCKPTFS_BUILD_TESTS=OFF >/dev/null
fi
cmake --build "$build" -j2 --target ckptfs readbench read_map_bench fuse_ceiling >/dev/null

# bench.py unmounts whatever it mounted on any exit it can see; this catches the rest (a killed
# interpreter): nothing under the workdir stays mounted.
cleanup() {
  local status=$? m
  for m in $(awk -v w="$workdir/" 'index($2, w) == 1 {print $2}' /proc/self/mounts); do
    "$build/ckptfs" umount "$m" 2>/dev/null || fusermount3 -u -z "$m" 2>/dev/null || true
  done
  exit "$status"
}
trap cleanup EXIT

/usr/bin/python3 "$repo/scripts/bench.py" --workdir "$workdir" --build-dir "$build" "${args[@]}"
if [ "$hfai" = 1 ]; then
  hfai_args=(--workdir "$workdir/hfai" --ckptfs "$build/ckptfs")
  for a in "${args[@]}"; do [ "$a" = --small ] && hfai_args+=(--runs 3); done
  /usr/bin/python3 "$repo/scripts/bench_hfai.py" "${hfai_args[@]}"
fi
