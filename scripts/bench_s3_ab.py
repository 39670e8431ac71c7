#!/usr/bin/python3
"""Two ckptfs binaries against each other on a cold read of the view straight from S3 (issue 33):
pairs of cold `cat`s of the whole view from `ckptfs mount s3://...`, the old binary and the new
alternating (which goes first alternates too), on the fixture and server of scripts/bench_s3.py.
Per read: wall, the daemon's CPU (user + system), the server's (weed) CPU, GETs and bytes
fetched; then the medians of each binary and of the pairs' ratios. The first read of each
binary is checked byte for byte against the fixture's expected files.

    scripts/bench_s3_ab.py --old /tmp/old-ckptfs --new build/ckptfs [--pairs 6]
        [--perf DIR: a `perf record -g` of each binary's last read's daemon into DIR]
"""

import argparse
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import bench_s3  # noqa: E402
from bench_s3 import MIB, median  # noqa: E402
from bench_s3_ceiling import cpu_of, pid_serving, s3_bench, timed_child  # noqa: E402


def cold_read(bench, url, extra, weed, perf_to=None, check=None):
    """A cold cat of the view: (wall, daemon CPU, daemon user CPU, weed CPU, counters); with
    `check`, then its bytes against the fixture's (a failure noted under that label)."""
    with bench.mounted(url, extra):
        files = [v for v, _ in bench.view_files()]
        daemon = pid_serving(bench.args.ckptfs, bench.mnt)
        perf = None
        if perf_to:
            perf = subprocess.Popen(["perf", "record", "-g", "-q", "-o", perf_to, "-p",
                                     str(daemon)], stdout=subprocess.DEVNULL,
                                    stderr=subprocess.DEVNULL)
            time.sleep(0.5)
        w0, d0, u0 = cpu_of(weed), cpu_of(daemon), cpu_of(daemon, "user")
        before = bench.server.counters()
        took, _ = timed_child(["cat", *files])
        c = bench.server.counters() - before
        out = (took, cpu_of(daemon) - d0, cpu_of(daemon, "user") - u0, cpu_of(weed) - w0, c)
        if perf:
            perf.send_signal(2)
            perf.wait()
        if check:
            bench.check(check)
        return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--old", required=True)
    ap.add_argument("--new", required=True)
    ap.add_argument("--pairs", type=int, default=6)
    ap.add_argument("--size-gib", type=float, default=0.25)
    ap.add_argument("--work", default=os.path.join(bench_s3.REPO, "build", "bench-s3"))
    ap.add_argument("--perf", help="directory for a perf record of each binary's last read")
    args = ap.parse_args(argv)
    args.ckptfs = args.new  # fills the index
    binaries = {"old": os.path.realpath(args.old), "new": os.path.realpath(args.new)}
    reads = {"old": [], "new": []}
    loads = [os.getloadavg()[0]]
    with s3_bench(args, "index-ab") as (bench, weed, url, s3, idx):
        for p in range(args.pairs):
            for name in (("old", "new") if p % 2 == 0 else ("new", "old")):
                bench.args.ckptfs = binaries[name]
                perf_to = None
                if args.perf and p >= args.pairs - 2:
                    os.makedirs(args.perf, exist_ok=True)
                    perf_to = os.path.join(args.perf, f"{name}.data")
                check = f"{name}: cat of the view from s3://" if p < 2 else None
                reads[name].append(cold_read(bench, url, ["--index-dir", idx, *s3], weed,
                                             perf_to, check))
                r = reads[name][-1]
                print(f"pair {p + 1} {name}: {bench.target_bytes / 1e6 / r[0]:6.1f} MB/s, "
                      f"daemon {r[1]:.2f} s (user {r[2]:.2f}), weed {r[3]:.2f} s, "
                      f"{r[4]['range_gets']} GETs", flush=True)
            loads.append(os.getloadavg()[0])
    print(f"\n{args.pairs} pairs, load average {min(loads):.1f}-{max(loads):.1f}; medians:")
    for name, vals in reads.items():
        print(f"  {name}: {bench.target_bytes / 1e6 / median([v[0] for v in vals]):6.1f} MB/s, "
              f"daemon CPU {median([v[1] for v in vals]):.3f} s (user "
              f"{median([v[2] for v in vals]):.3f}), weed {median([v[3] for v in vals]):.2f} s, "
              f"{median([v[4]['range_gets'] for v in vals]):.0f} GETs, "
              f"{median([v[4]['sent_bytes'] for v in vals]) / MIB:.1f} MiB")
    cpu = [n[1] / o[1] for o, n in zip(reads["old"], reads["new"])]
    speed = [o[0] / n[0] for o, n in zip(reads["old"], reads["new"])]
    print(f"  new / old daemon CPU per pair: median {median(cpu):.2f} "
          f"({', '.join(f'{x:.2f}' for x in cpu)})")
    print(f"  new / old speed per pair: median {median(speed):.2f} "
          f"({', '.join(f'{x:.2f}' for x in speed)})")
    for failure in bench.failures:
        print(f"FAIL {failure}")
    return 1 if bench.failures else 0


if __name__ == "__main__":
    sys.exit(main())
