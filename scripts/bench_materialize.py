#!/usr/bin/python3
"""`ckptfs materialize` (-j 1 and -j 2) against scripts/naive_convert.py (MindSpore's way:
every needed source file loaded whole, per target) on the same generated data in the same run:
wall time and peak RSS (/usr/bin/time -v), paired rounds, medians.

    scripts/bench_materialize.py --workdir DIR [--ckptfs build/ckptfs] [--size-gib 1] [--runs 3]

Each round runs the three converters one after another (the order rotates from round to round,
so none always runs first), each into an empty output directory, with the source files hot in
the page cache and `sync` before each run so that no converter pays for another's write-back.
materialize fsyncs every file it writes (that is what makes it resumable); naive_convert.py does
not, so its times leave out the write-back materialize pays for. Every output of the first round
is compared byte for byte with the generator's expected files. The load average is printed at
the start and the end: the machine may be shared.
"""

import argparse
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import bench  # noqa: E402  (the data sets and the /usr/bin/time wrapper of scripts/bench.py)

MIB = 1 << 20


def digest(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(8 * MIB):
            h.update(chunk)
    return h.hexdigest()


def warm(files):
    for path in files:
        with open(path, "rb") as f:
            while f.read(8 * MIB):
                pass


def loadavg():
    return "{:.2f} {:.2f} {:.2f}".format(*os.getloadavg())


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--ckptfs", default=os.path.join(os.path.dirname(HERE), "build", "ckptfs"))
    ap.add_argument("--size-gib", type=float, default=1.0)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--json", help="also write the figures here")
    args = ap.parse_args()
    ckptfs = os.path.abspath(args.ckptfs)
    os.makedirs(args.workdir, exist_ok=True)

    def log(msg):
        print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)

    start_load = loadavg()
    log(f"load average {start_load}")
    ds = bench.Dataset(os.path.join(args.workdir, "data"), f"mat_{args.size_gib:g}",
                       bench.transformer_case(args.size_gib, "tp4"))
    ds.prepare(log)
    expected = {os.path.basename(os.path.dirname(p)): digest(p) for p in ds.expected_files()}
    data_bytes = ds.bytes()
    log(f"data: {ds.case['description']}; {data_bytes / MIB:.0f} MiB of target files")

    out_root = os.path.join(args.workdir, "out")
    index_dir = os.path.join(args.workdir, "index")
    pb2_dir = os.path.join(args.workdir, "pb2")
    converters = {
        "naive_convert.py": lambda out: [bench.PYTHON, os.path.join(HERE, "naive_convert.py"),
                                         ds.src_dir, out, *ds.strategy_args(),
                                         "--pb2-dir", pb2_dir],
        "materialize -j 1": lambda out: [ckptfs, "materialize", ds.src_dir, out,
                                         *ds.strategy_args(), "--view", "ckpt", "--index-dir",
                                         index_dir, "-j", "1", "-q"],
        "materialize -j 2": lambda out: [ckptfs, "materialize", ds.src_dir, out,
                                         *ds.strategy_args(), "--view", "ckpt", "--index-dir",
                                         index_dir, "-j", "2", "-q"],
    }
    # The index is built once beforehand, as a second mount or materialize of the same sources
    # finds it; the scan itself is a fraction of a second at this size.
    bench.run([ckptfs, "index", "build", ds.src_dir, "--index-dir", index_dir, "-q"])
    names = list(converters)
    times = {n: [] for n in names}
    rss = {n: [] for n in names}
    for r in range(args.runs):
        order = names[r % len(names):] + names[:r % len(names)]
        for name in order:
            out = os.path.join(out_root, name.replace(" ", "_"))
            shutil.rmtree(out, ignore_errors=True)
            warm(ds.source_files)
            subprocess.run(["sync"], check=True)
            wall, peak, _ = bench.time_and_peak_rss(converters[name](out))
            times[name].append(wall)
            rss[name].append(peak)
            log(f"round {r + 1} {name}: {wall:.2f} s, peak RSS {peak / MIB:.0f} MiB")
            if r == 0:
                got = {}
                for d in sorted(os.listdir(out)):
                    files = [f for f in os.listdir(os.path.join(out, d)) if f.endswith(".ckpt")]
                    got[d] = digest(os.path.join(out, d, files[0])) if len(files) == 1 else None
                if got != expected:
                    raise SystemExit(f"{name}: output differs from the expected files")
            shutil.rmtree(out, ignore_errors=True)
    end_load = loadavg()
    log(f"load average {end_load}")

    naive = times["naive_convert.py"]
    print()
    print(f"data: {ds.case['description']}, {data_bytes / MIB:.0f} MiB written per run; "
          f"{args.runs} rounds; load average {start_load} at the start, {end_load} at the end")
    print(f"| converter | time (median, min-max) | MB/s | peak RSS (median) | "
          f"naive time / this (paired median) |")
    print("|---|---|---|---|---|")
    figures = {"size_bytes": data_bytes, "runs": args.runs, "load_start": start_load,
               "load_end": end_load}
    for name in names:
        t = statistics.median(times[name])
        ratio = statistics.median(a / b for a, b in zip(naive, times[name]))
        print(f"| {name} | {t:.2f} s ({min(times[name]):.2f}-{max(times[name]):.2f}) | "
              f"{data_bytes / 1e6 / t:.0f} | {statistics.median(rss[name]) / MIB:.0f} MiB | "
              f"{ratio:.2f} |")
        figures[name] = {"times": times[name], "peak_rss": rss[name]}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(figures, f, indent=1)


if __name__ == "__main__":
    main()
