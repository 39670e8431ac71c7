#!/usr/bin/python3
"""The ceiling of a view read straight from S3 on this machine (issue 33, step 2): where the CPU
goes, all figures from one run on the fixture and server of scripts/bench_s3.py.

Per run (cold each time; CPU = user + system seconds from /proc/PID/stat):
  raw GETs  curl fetching every source in 1 MiB ranged GETs, 64 in flight, to /dev/null: MB/s,
            the server's (weed's) CPU and curl's CPU per 251 MiB
  s3fs      `cat` of the view through ckptfs over s3fs (shipped index): wall, weed, s3fs,
            daemon and cat CPU
  s3://     `cat` of the view from `ckptfs mount s3://...`: wall, weed, daemon and cat CPU
and then the bound: the wall time of a native read whose daemon cost nothing, where the server's
CPU per byte fetched and the reader's CPU (which holds the kernel's FUSE copy) share the cores.

    scripts/bench_s3_ceiling.py [--runs 3] [--work build/bench-s3] [--ckptfs build/ckptfs]
"""

import argparse
import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import bench_s3  # noqa: E402
from bench_s3 import BUCKET, MIB, PREFIX, Bench, median, s3harness  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")
RANGE = 1 << 20
IN_FLIGHT = 64
UNIT = 251 * MIB  # the per-unit figures are per 251 MiB, the bytes a cold view read fetches


def cpu_of(pid, part=None):
    """User + system CPU seconds of process `pid` (all its threads; "user" or "sys": that part
    alone), 0 if it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        user, system = int(fields[11]) / TICK, int(fields[12]) / TICK
        return {"user": user, "sys": system}.get(part, user + system)
    except (OSError, IndexError, ValueError, TypeError):
        return 0.0


def pid_serving(binary, mnt):
    """The pid of the process running `binary` with `mnt` on its command line, or None."""
    binary = os.path.realpath(binary)
    for pid in (p for p in os.listdir("/proc") if p.isdigit()):
        try:
            if os.path.realpath(f"/proc/{pid}/exe") != binary:
                continue
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if mnt.encode() in f.read().split(b"\0"):
                    return int(pid)
        except OSError:
            continue
    return None


def s3fs_pid(mnt):
    mnt = os.path.realpath(mnt).encode()
    for pid in (p for p in os.listdir("/proc") if p.isdigit()):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                args = f.read().split(b"\0")
            if os.path.basename(args[0]) == b"s3fs" and mnt in args:
                return int(pid)
        except OSError:
            continue
    return None


def timed_child(cmd):
    """(wall seconds, CPU seconds of the child) of running `cmd` with stdout to /dev/null."""
    start = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    took = time.monotonic() - start
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"bench_s3_ceiling: {cmd[0]} failed")
    return took, usage.ru_utime + usage.ru_stime


def raw_gets(bench, weed, size=RANGE, if_match=False):
    """curl -Z over every source in ranges of `size` (with the If-Match of each object's ETag):
    (wall, weed CPU, curl CPU, bytes, counters)."""
    etags = object_etags(bench) if if_match else {}
    with tempfile.NamedTemporaryFile("w", suffix=".curl", delete=False) as cfg:
        total = 0
        sep = ""
        for path in bench.sources:
            rel = os.path.relpath(path, bench.fx.src_dir)
            length = os.path.getsize(path)
            etag = etags[rel] if if_match else None
            for off in range(0, length, size):
                end = min(off + size, length) - 1
                cfg.write(f'{sep}url = "{bench.server.endpoint}/{BUCKET}/{PREFIX}/{rel}"\n'
                          f'range = "{off}-{end}"\noutput = "/dev/null"\n'
                          f'aws-sigv4 = "aws:amz:{s3harness.REGION}:s3"\n'
                          f'user = "{s3harness.ACCESS_KEY}:{s3harness.SECRET_KEY}"\n'
                          + (f'header = "If-Match: \\"{etag}\\""\n' if etag else "")
                          + 'fail\nsilent\n')
                sep = "next\n"
                total += end + 1 - off
    try:
        before, cpu = bench.server.counters(), cpu_of(weed)
        took, curl_cpu = timed_child(["curl", "-Z", "--parallel-max", str(IN_FLIGHT),
                                      "-K", cfg.name])
        return took, cpu_of(weed) - cpu, curl_cpu, total, bench.server.counters() - before
    finally:
        os.unlink(cfg.name)


def object_etags(bench):
    """{path under PREFIX: ETag without quotes} of the bucket's objects (a HEAD each)."""
    out = {}
    for path in bench.sources:
        rel = os.path.relpath(path, bench.fx.src_dir)
        head = bench.server._curl(["-I", f"{bench.server.endpoint}/{BUCKET}/{PREFIX}/{rel}"])
        for line in head.stdout.splitlines():
            if line.lower().startswith("etag:"):
                out[rel] = line.split(":", 1)[1].strip().strip('"')
    return out


def local_read(bench, weed):
    """A hot read of the view from the local copy of the sources (page cache): the daemon's
    CPU for mapping, copying and the FUSE transport alone. (wall, 0, daemon, cat, 0, {})."""
    idx = os.path.join(bench.work, "index-local")
    shutil.rmtree(idx, ignore_errors=True)
    for path in bench.sources:  # into the page cache
        with open(path, "rb") as f:
            while f.read(1 << 24):
                pass
    with bench.mounted(bench.fx.src_dir, ["--index-dir", idx]):
        files = [v for v, _ in bench.view_files()]
        daemon = pid_serving(bench.args.ckptfs, bench.mnt)
        d0, u0 = cpu_of(daemon), cpu_of(daemon, "user")
        took, cat_cpu = timed_child(["cat", *files])
        out = (took, 0.0, cpu_of(daemon) - d0, cat_cpu, 0.0, cpu_of(daemon, "user") - u0)
    shutil.rmtree(idx, ignore_errors=True)
    return out


def view_read(bench, src, extra, weed, with_s3fs):
    """A cold cat of the whole view: (wall, weed, daemon, cat, s3fs CPU seconds, counters)."""
    with bench.mounted(src, extra):
        files = [v for v, _ in bench.view_files()]
        daemon = pid_serving(bench.args.ckptfs, bench.mnt)
        s3fs = s3fs_pid(bench.s3) if with_s3fs else None
        w0, d0, u0 = cpu_of(weed), cpu_of(daemon), cpu_of(daemon, "user")
        s0 = cpu_of(s3fs) if s3fs else 0.0
        before = bench.server.counters()
        took, cat_cpu = timed_child(["cat", *files])
        c = bench.server.counters() - before
        return (took, cpu_of(weed) - w0, cpu_of(daemon) - d0, cat_cpu,
                (cpu_of(s3fs) - s0) if s3fs else 0.0, c, cpu_of(daemon, "user") - u0)


@contextlib.contextmanager
def s3_bench(args, index_name):
    """The bench's server, fixture, bucket and shipped index (scripts/bench_s3.py), and an index
    of the bucket filled once with `args.ckptfs`: yields (bench, the server's pid, the s3:// URL,
    the endpoint options, the index directory)."""
    s3harness.ensure_tools()
    os.makedirs(args.work, exist_ok=True)
    os.environ.update(AWS_ACCESS_KEY_ID=s3harness.ACCESS_KEY,
                      AWS_SECRET_ACCESS_KEY=s3harness.SECRET_KEY, AWS_REGION=s3harness.REGION)
    with s3harness.S3Server(os.path.join(os.path.realpath(args.work), "server")) as server:
        bench = Bench(args, server)
        try:
            bench.setup()
            url = f"s3://{BUCKET}/{PREFIX}"
            s3 = ["--s3-endpoint", server.endpoint]
            idx = os.path.join(bench.work, index_name)
            shutil.rmtree(idx, ignore_errors=True)
            subprocess.run([args.ckptfs, "index", "build", url, "--index-dir", idx, "-q", *s3],
                           check=True)
            yield bench, server.proc.pid, url, s3, idx
            shutil.rmtree(idx, ignore_errors=True)
        finally:
            s3harness.unmount_s3fs(bench.s3)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size-gib", type=float, default=0.25)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--work", default=os.path.join(bench_s3.REPO, "build", "bench-s3"))
    ap.add_argument("--ckptfs", default=os.path.join(bench_s3.REPO, "build", "ckptfs"))
    args = ap.parse_args(argv)
    with s3_bench(args, "index-ceiling") as (bench, weed, url, s3, idx):
        raw = {(1 << 20, False): [], (1 << 20, True): [], (8 << 20, True): []}
        via_s3fs, native, local = [], [], []
        for _ in range(args.runs):
            for (size, if_match), vals in raw.items():
                vals.append(raw_gets(bench, weed, size, if_match))
            via_s3fs.append(view_read(bench, bench.fresh_s3fs(), ["--index", bench.shipped],
                                      weed, True))
            s3harness.unmount_s3fs(bench.s3)
            native.append(view_read(bench, url, ["--index-dir", idx, *s3], weed, False))
            local.append(local_read(bench, weed))
    report(bench, args, raw, via_s3fs, native, local)
    return 0


def report(bench, args, raw, via_s3fs, native, local):
    tb, cores = bench.target_bytes, os.cpu_count()
    print(f"\nceiling on {cores} cores (median of {args.runs} runs, load average "
          f"{os.getloadavg()[0]:.1f}; CPU = user + system seconds):")
    per = {}
    for (size, if_match), vals in raw.items():
        t, w, cc, total = (median([r[i] for r in vals]) for i in range(4))
        per[(size, if_match)] = (t / total, w / total)
        print(f"  raw GETs, curl -Z {IN_FLIGHT} in flight, {size >> 20} MiB ranges"
              f"{', If-Match' if if_match else ''}: {total / 1e6 / t:6.1f} MB/s, "
              f"{median([r[4]['range_gets'] for r in vals]):.0f} GETs; per 251 MiB: "
              f"weed {w * UNIT / total:.2f} s, curl {cc * UNIT / total:.2f} s")
    rows = {}
    for label, vals in (("view via s3fs", via_s3fs), ("view from s3://", native),
                        ("view from local", local)):
        took, wc, dc, catc, sc = (median([v[i] for v in vals]) for i in range(5))
        if label == "view from local":
            du, sent, gets = median([v[5] for v in vals]), 0, 0
        else:
            du = median([v[6] for v in vals])
            sent = median([v[5]["sent_bytes"] for v in vals])
            gets = median([v[5]["range_gets"] for v in vals])
        rows[label] = (took, wc, dc, catc, sc, sent, du)
        print(f"  {label:16} {tb / 1e6 / took:6.1f} MB/s, wall {took:.2f} s, {gets:.0f} GETs, "
              f"{sent / MIB:.1f} MiB; CPU s: weed {wc:.2f}, daemon {dc:.2f} (user {du:.2f}, "
              f"sys {dc - du:.2f}), cat {catc:.2f}, s3fs {sc:.2f}; "
              f"sum {wc + dc + catc + sc:.2f} = {(wc + dc + catc + sc) / took:.2f} cores")
    s3fs_wall = rows["view via s3fs"][0]
    took, wc, _, catc, _, sent, _ = rows["view from s3://"]
    _, _, lc, lcat, _, _, _ = rows["view from local"]
    # A daemon that cost nothing but the FUSE transport and its copies (its CPU on a hot local
    # read), the server's CPU for the bytes it sends in 1 MiB GETs with If-Match, and the reader:
    # on `cores` cores no faster than their sum / cores, nor than the raw GETs alone.
    t1, w1 = per[(1 << 20, True)]
    floor_cpu = w1 * sent + lc + lcat
    bound = max(floor_cpu / cores, t1 * sent)
    print(f"  bound for s3:// (1 MiB GETs, daemon = its hot local cost): max((weed "
          f"{w1 * sent:.2f} + daemon {lc:.2f} + cat {lcat:.2f}) / {cores}, raw GETs "
          f"{t1 * sent:.2f}) = {bound:.2f} s = {tb / 1e6 / bound:.0f} MB/s = "
          f"{s3fs_wall / bound:.2f}x the s3fs path ({tb / 1e6 / s3fs_wall:.0f} MB/s); "
          f"now {s3fs_wall / took:.2f}x")
    t8, w8 = per[(8 << 20, True)]
    bound8 = max((w8 * sent + lc + lcat) / cores, t8 * sent)
    print(f"  the same with 8 MiB GETs: {bound8:.2f} s = {s3fs_wall / bound8:.2f}x the s3fs path")


if __name__ == "__main__":
    sys.exit(main())
