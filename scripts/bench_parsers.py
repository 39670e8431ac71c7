#!/usr/bin/python3
"""ckptfs parser benchmark (issue 29, items 10 and 12): the cost of reading headers and pickles
that are large in what they list rather than in bytes.

Rows printed, each with its goal:
  safetensors  `ckptfs inspect` of a file of N one-element tensors (N = 20,000, 50,000, 100,000
               by default; names like a transformer's): CPU time (user + system) and wall time,
               and header bytes. Goal: the 100,000-tensor header under 1 s of CPU (it took 37 s
               when every key was found by a linear search); CPU time, because on a shared
               machine the wall time is mostly waiting for a core (the load is printed). The
               time includes printing the table to /dev/null.
  pickle       `ckptfs inspect` of a torch.save file whose pickle is one list of 3,000,000
               empty dicts (3 MB, a byte each, appended 1,000 at a time): wall time, peak RSS (/usr/bin/time) and how it
               ended. Goal: refused in one line, peak RSS under 128 MiB + 48 x the file (926 MB
               before the memory budget).

Files are written here (build-bench/parsers/), byte by byte, independently of ckptfs. Every
figure is the median of --runs runs (default 3); the load average is printed with each.
Run: scripts/bench_parsers.py [--ckptfs build/ckptfs] [--tensors 20000,50000,100000] [--runs 3]
"""

import argparse
import io
import json
import os
import statistics
import struct
import subprocess
import sys
import time
import zipfile

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)

from ckptfix import stio  # noqa: E402


def safetensors_file(path, count):
    """`count` F32 tensors of one element, in the reference writer's layout (stio)."""
    if os.path.exists(path):
        return
    entries = [stio.Entry(f"model.layers.{i // 16:05d}.block_{i % 16:02d}.weight", "Float32", [1],
                          4, lambda: iter([b"\0\0\0\0"])) for i in range(count)]
    tmp = path + ".tmp"
    stio.write(tmp, entries, {"format": "pt"})
    os.replace(tmp, path)


def empty_dicts_file(path, count):
    """A torch.save zip whose data.pkl is one list of `count` empty dicts."""
    if os.path.exists(path):
        return
    pickle = b"\x80\x02]" + (b"(" + b"}" * 1000 + b"e") * (count // 1000) + b"."
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as z:
        z.writestr("archive/data.pkl", pickle)
        z.writestr("archive/version", "3\n")
    with open(path, "wb") as f:
        f.write(buf.getvalue())


def timed(cmd):
    """(wall seconds, peak RSS in KiB, exit code, stderr without the time line, CPU seconds)
    of one run."""
    start = time.monotonic()
    proc = subprocess.run(["/usr/bin/time", "-f", "maxrss_kib=%M cpu=%U+%S"] + cmd,
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                          timeout=3600)
    took = time.monotonic() - start
    lines = proc.stderr.splitlines()
    usage = [line for line in lines if line.startswith("maxrss_kib=")][-1].split()
    rss = int(usage[0].split("=")[1])
    user, system = usage[1].split("=")[1].split("+")
    rest = "\n".join(line for line in lines
                     if not line.startswith(("maxrss_kib=", "Command exited")))
    return took, rss, proc.returncode, rest, float(user) + float(system)


def load():
    return os.getloadavg()[0]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ckptfs", default=os.path.join(REPO, "build", "ckptfs"))
    parser.add_argument("--tensors", default="20000,50000,100000")
    parser.add_argument("--dicts", type=int, default=3_000_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--data", default=os.path.join(REPO, "build-bench", "parsers"))
    args = parser.parse_args()
    os.makedirs(args.data, exist_ok=True)

    print("safetensors header: ckptfs inspect (table to /dev/null)")
    for count in [int(n) for n in args.tensors.split(",")]:
        path = os.path.join(args.data, f"tensors_{count}.safetensors")
        safetensors_file(path, count)
        with open(path, "rb") as f:
            (header,) = struct.unpack("<Q", f.read(8))
        runs = [timed([args.ckptfs, "inspect", path]) for _ in range(args.runs)]
        bad = [r for r in runs if r[2] != 0]
        if bad:
            sys.exit(f"inspect {path} failed: {bad[0][3]}")
        took = statistics.median(r[0] for r in runs)
        cpu = statistics.median(r[4] for r in runs)
        goal = "  goal < 1 s: " + ("met" if cpu < 1 else "NOT MET") if count == 100_000 else ""
        print(f"  {count:>7,} tensors, header {header / 1e6:5.1f} MB: {cpu:6.2f} s CPU, "
              f"{took:6.2f} s wall (peak RSS {statistics.median(r[1] for r in runs) / 1024:.0f} "
              f"MiB, load {load():.1f}){goal}")

    path = os.path.join(args.data, f"dicts_{args.dicts}.pt")
    empty_dicts_file(path, args.dicts)
    size = os.path.getsize(path)
    runs = [timed([args.ckptfs, "inspect", path]) for _ in range(args.runs)]
    took = statistics.median(r[0] for r in runs)
    rss = statistics.median(r[1] for r in runs) * 1024
    limit = (128 << 20) + 48 * size
    refused = all(r[2] == 1 and len(r[3].strip().splitlines()) == 1 for r in runs)
    print(f"pickle of {args.dicts:,} empty dicts ({size / 1e6:.1f} MB): "
          f"{'refused in one line' if refused else 'NOT refused'} in {took:.2f} s, peak RSS "
          f"{rss / 2**20:.0f} MiB (goal: refused, under {limit / 2**20:.0f} MiB: "
          f"{'met' if refused and rss <= limit else 'NOT MET'}; load {load():.1f})")
    print(json.dumps({"message": runs[0][3].strip()[:300]}))


if __name__ == "__main__":
    main()
