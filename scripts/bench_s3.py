#!/usr/bin/python3
"""ckptfs over object storage (issue 33): a checkpoint on a real S3 server (SeaweedFS on
127.0.0.1, started and stopped here by tests/integration/s3harness.py) read through Debian's
s3fs, all figures from one run. The data is the fixture generator's `bench` transformer (8
ranks resharded 8 -> 4, --size-gib, 0.25 by default), every byte served checked against its
expected files.

Figures (medians over --runs paired runs; MB/s = 10^6 bytes/s; "GETs" are the server's ranged
GETs, "fetched" the bytes it sent; s3fs is remounted before every run, so every read is cold):
  mount     mount time, GETs and bytes fetched while mounting: with an empty index (a first
            mount), with the index that mount filled (a remount after s3fs remounted, as after a
            reboot or on another day), and with a shipped index (`index build --output`); and
            per run, how many sources' scans came from the index (.ckptfs/sources.json; "lazy":
            a shipped index plans on first open and lists none there)
  cat       `cat` of the view's .ckpt files (one process, and one per file at once as a node's
            trainers load their ranks) against `cat` of the sources through the same s3fs, one
            process and one per source (in parallel); ratios per pair, and the CPU seconds s3fs
            spent on each (--cat-only: just these figures)
  first     (--first-byte only) open + the first 4 KiB of rank_0 through s3fs with the shipped
            index, then the whole view read rank by rank
  ranks 0   a mount with --ranks 0 reading its one target: bytes fetched / target size
  blocks    the plan of rank 0 (MOUNTPOINT/.ckptfs/plan/rank_0.json): bytes of the source
            blocks its extents touch at 4 KiB, 64 KiB, 1 MiB and 8 MiB / bytes it needs
  goals     issue 33's, each with its figure and ratio to the goal: a cold cat of the view
            >= 0.9x the MB/s of one cat per source in parallel (paired per run; also with one
            cat per view file at once); a remount with
            the default index fetches no tensor data (bytes sent while mounting); `mount
            --index` over s3fs <= 0.2 s

    scripts/bench_s3.py [--size-gib 0.25] [--runs 3] [--work build/bench-s3]
                        [--cat-only | --mount-only | --native-only | --first-byte]
                        [--s3-options OPTS]
"""

import argparse
import contextlib
import glob
import json
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(REPO, "tests", "integration"))

import numpy as np  # noqa: E402

import ckpt_fixture  # noqa: E402
import s3harness  # noqa: E402

MIB = 1 << 20
BUCKET = "ckpt"
PREFIX = "train"
BLOCKS = (4 << 10, 64 << 10, 1 << 20, 8 << 20)


def log(msg):
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def is_mounted(path):
    with open("/proc/self/mounts") as f:
        return any(line.split()[1] == path for line in f)


def median(values):
    return statistics.median(values) if values else float("nan")


# -- the plan's block amplification ------------------------------------------------------------

def touched_blocks(plan, block, size_of=os.path.getsize):
    """(bytes of the distinct source blocks of `block` bytes the plan's extents touch, the last
    block of a source cut at its end; bytes the extents copy). An extent copies `length` bytes
    at `offset` of source `file` (an index into its plan file's `sources`), `count` times
    `stride` apart."""
    starts, ends, keys, paths = [], [], [], {}
    need = 0
    for f in plan["files"]:
        for rec in f.get("records", []):
            for e in rec.get("extents", []):
                if "file" not in e:  # bytes held in the daemon's memory
                    continue
                path = f["sources"][e["file"]]
                key = paths.setdefault(path, len(paths))
                count = e.get("count", 1)
                offs = e["offset"] + e.get("stride", 0) * np.arange(count, dtype=np.int64)
                starts.append(offs // block)
                ends.append((offs + e["length"] - 1) // block)
                keys.append(np.full(count, key, dtype=np.int64))
                need += e["length"] * count
    if not starts:
        return 0, 0
    s, e, k = np.concatenate(starts), np.concatenate(ends), np.concatenate(keys)
    total = 0
    for path, key in paths.items():
        sel = k == key
        order = np.argsort(s[sel], kind="stable")
        ss, ee = s[sel][order], e[sel][order]
        reach = np.maximum.accumulate(ee)
        # A new group of blocks starts where a run begins past every block before it.
        new = np.ones(len(ss), dtype=bool)
        new[1:] = ss[1:] > reach[:-1]
        first = ss[new]
        last = np.maximum.reduceat(ee, np.flatnonzero(new))
        total += int(np.minimum((last + 1) * block, size_of(path)).sum() - (first * block).sum())
    return total, need


# -- the bench ---------------------------------------------------------------------------------

class Bench:
    def __init__(self, args, server):
        self.args, self.server = args, server
        self.work = os.path.realpath(args.work)
        self.s3 = os.path.join(self.work, "s3")
        self.mnt = os.path.join(self.work, "view")
        self.failures = []
        self.goals = []  # (name, figure text, ratio to the goal: >= 1 met)

    def fresh_s3fs(self):
        """s3fs mounted anew: nothing of an earlier run is cached in it or in the kernel."""
        s3harness.unmount_s3fs(self.s3)
        self.server.mount_s3fs(BUCKET, self.s3)
        return os.path.join(self.s3, PREFIX)

    def mount_cmd(self, src, extra):
        fx = self.fx
        return [self.args.ckptfs, "mount", src, self.mnt, "--src-strategy", fx.src_strategy,
                "--dst-strategy", fx.dst_strategy, "--view", "ckpt", "-q", *extra]

    @contextlib.contextmanager
    def mounted(self, src, extra):
        os.makedirs(self.mnt, exist_ok=True)
        try:
            start = time.monotonic()
            proc = subprocess.run(self.mount_cmd(src, extra), capture_output=True, text=True,
                                  timeout=600)
            took = time.monotonic() - start
            if proc.returncode != 0:
                raise SystemExit(f"bench_s3: mount failed: {proc.stderr.strip()}")
            yield took
        finally:
            if is_mounted(self.mnt):
                subprocess.run([self.args.ckptfs, "umount", self.mnt], capture_output=True,
                               timeout=120)
            if is_mounted(self.mnt):
                subprocess.run(["fusermount3", "-u", "-z", self.mnt], capture_output=True)

    def cat(self, files, parallel=False):
        """Seconds to cat `files` to /dev/null, in one process or one process per file."""
        start = time.monotonic()
        if parallel:
            procs = [subprocess.Popen(["cat", f], stdout=subprocess.DEVNULL) for f in files]
            rcs = [p.wait() for p in procs]
        else:
            rcs = [subprocess.run(["cat", *files], stdout=subprocess.DEVNULL).returncode]
        took = time.monotonic() - start
        if any(rcs):
            raise SystemExit(f"bench_s3: cat {files[0]} ... failed")
        return took

    def view_files(self, ranks=None):
        out = []
        for t, path in sorted(self.fx.expected_files().items()):
            if ranks is None or t in ranks:
                out.append((os.path.join(self.mnt, f"rank_{t}", os.path.basename(path)), path))
        return out

    def check(self, label, ranks=None):
        for got, want in self.view_files(ranks):
            diff = ckpt_fixture.describe_difference(want, got)
            if diff:
                self.failures.append(f"{label}: {diff}")

    def setup(self):
        a = self.args
        os.makedirs(self.work, exist_ok=True)
        fixture = os.path.join(self.work, f"fixture-{a.size_gib:g}")
        if os.path.isfile(os.path.join(fixture, "case.json")):
            self.fx = ckpt_fixture.Fixture.load(fixture)
        else:
            log(f"generating the bench fixture, {a.size_gib:g} GiB, 8 -> 4")
            shutil.rmtree(fixture, ignore_errors=True)
            self.fx = ckpt_fixture.make_builtin("bench", fixture, size_gib=a.size_gib,
                                                src_devices=8, dst_devices=4)
        self.server.make_bucket(BUCKET)
        start = time.monotonic()
        self.src_bytes = self.server.upload_dir(self.fx.src_dir, BUCKET, PREFIX)
        self.sources = sorted(glob.glob(os.path.join(self.fx.src_dir, "rank_*", "*.ckpt")))
        self.target_bytes = sum(os.path.getsize(p) for p in self.fx.expected_files().values())
        log(f"uploaded {self.src_bytes / MIB:.0f} MiB in {time.monotonic() - start:.1f} s; "
            f"{len(self.sources)} sources, {len(self.fx.targets)} targets "
            f"({self.target_bytes / MIB:.0f} MiB)")
        self.shipped = os.path.join(self.work, "shipped")
        shutil.rmtree(self.shipped, ignore_errors=True)
        src = self.fresh_s3fs()
        subprocess.run([a.ckptfs, "index", "build", src, "--output", self.shipped, "-q",
                        "--src-strategy", self.fx.src_strategy, "--dst-strategy",
                        self.fx.dst_strategy, "--view", "ckpt"], check=True)

    def measure(self, fn):
        before = self.server.counters()
        value = fn()
        return value, self.server.counters() - before

    def s3fs_cpu(self):
        """CPU seconds (user + system, all threads) of the s3fs serving self.s3 so far."""
        mnt = os.path.realpath(self.s3).encode()
        newest = (-1, 0.0)  # (start time, CPU seconds): the last run's s3fs may still be exiting
        for pid in (p for p in os.listdir("/proc") if p.isdigit()):
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    args = f.read().split(b"\0")
                if os.path.basename(args[0]) != b"s3fs" or mnt not in args:
                    continue
                with open(f"/proc/{pid}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                newest = max(newest, (int(fields[19]), (int(fields[11]) + int(fields[12])) /
                                      os.sysconf("SC_CLK_TCK")))
            except (OSError, IndexError, ValueError):
                continue
        return newest[1]

    def measure_cat(self, files, parallel=False):
        """(seconds, server counters, s3fs CPU seconds) of a cat of `files`."""
        cpu = self.s3fs_cpu()
        t, c = self.measure(lambda: self.cat(files, parallel))
        return t, c, self.s3fs_cpu() - cpu

    def mount_figures(self, runs):
        rows = {"empty index": [], "index remount": [], "shipped index": []}
        for r in range(runs):
            idx = os.path.join(self.work, f"index-{r}")
            shutil.rmtree(idx, ignore_errors=True)
            for label, extra in (("empty index", ["--index-dir", idx]),
                                 ("index remount", ["--index-dir", idx]),
                                 ("shipped index", ["--index", self.shipped])):
                src = self.fresh_s3fs()
                before = self.server.counters()
                with self.mounted(src, extra) as took:
                    c = self.server.counters() - before
                    with open(os.path.join(self.mnt, ".ckptfs", "sources.json")) as f:
                        sources = json.load(f)["sources"]
                hits = sum(1 for s in sources if s["from_index"])
                rows[label].append((took, c["range_gets"], c["sent_bytes"], hits, len(sources)))
            shutil.rmtree(idx, ignore_errors=True)
        print("\nmount over s3fs (median of %d; fetched while mounting):" % runs)
        for label, vals in rows.items():
            print(f"  {label:15} {median([v[0] for v in vals]):6.3f} s  "
                  f"{median([v[1] for v in vals]):6.0f} GETs  "
                  f"{median([v[2] for v in vals]) / MIB:8.1f} MiB "
                  f"({median([v[2] for v in vals]) / self.src_bytes:.2f}x the sources); "
                  f"scans from the index per run: "
                  f"{', '.join(f'{v[3]}/{v[4]}' if v[4] else 'lazy' for v in vals)}")
        remount = median([v[2] for v in rows["index remount"]])
        # Headers are a few KiB per source; tensor data would be most of a source.
        limit = 64 * 1024 * len(self.sources)
        self.goals.append(("remount with the default index fetches no tensor data",
                           f"{remount / 1024:.0f} KiB fetched (goal <= {limit // 1024} KiB)",
                           limit / remount if remount else float("inf")))
        shipped = median([v[0] for v in rows["shipped index"]])
        self.goals.append(("mount --index over s3fs <= 0.2 s", f"{shipped:.3f} s",
                           0.2 / shipped))
        return rows

    def cat_figures(self, runs):
        view, view_par, seq, par = [], [], [], []
        for r in range(runs):
            src = self.fresh_s3fs()
            with self.mounted(src, ["--index", self.shipped]):
                files = [v for v, _ in self.view_files()]
                view.append(self.measure_cat(files))
                if r == 0:
                    self.check("cat of the view")
            # A node's trainers load their ranks at once: one cat per target file.
            src = self.fresh_s3fs()
            with self.mounted(src, ["--index", self.shipped]):
                view_par.append(self.measure_cat(files, parallel=True))
            remote = [os.path.join(src, os.path.relpath(p, self.fx.src_dir)) for p in self.sources]
            self.fresh_s3fs()
            seq.append(self.measure_cat(remote))
            self.fresh_s3fs()
            par.append(self.measure_cat(remote, parallel=True))
        print(f"\ncold cat through s3fs (median of {runs}; MB/s of the bytes each side reads):")
        for label, vals, size in (("view .ckpt, 1 cat", view, self.target_bytes),
                                  (f"view, {len(files)} cats", view_par, self.target_bytes),
                                  ("sources, 1 cat", seq, self.src_bytes),
                                  ("sources, 8 cats", par, self.src_bytes)):
            print(f"  {label:21} {size / 1e6 / median([v[0] for v in vals]):7.1f} MB/s  "
                  f"{median([v[1]['range_gets'] for v in vals]):5.0f} GETs  "
                  f"{median([v[1]['sent_bytes'] for v in vals]) / MIB:7.1f} MiB fetched  "
                  f"s3fs CPU {median([v[2] for v in vals]):.2f} s")
        def ratios(mine, other):
            return [(self.target_bytes / v[0]) / (self.src_bytes / o[0])
                    for v, o in zip(mine, other)]
        for label, mine, other in (("1 cat / 1 cat", view, seq), ("1 cat / 8 cats", view, par),
                                   (f"{len(files)} cats / 8 cats", view_par, par)):
            r = ratios(mine, other)
            print(f"  ratio view / sources ({label}): median {median(r):.2f} "
                  f"(runs {', '.join(f'{x:.2f}' for x in r)})")
        one, each = median(ratios(view, par)), median(ratios(view_par, par))
        self.goals.append(("cold cat of the view >= 0.9x parallel cat of the sources",
                           f"{one:.2f}x (goal 0.9x)", one / 0.9))
        self.goals.append(("the same, a cat per target file at once",
                           f"{each:.2f}x (goal 0.9x)", each / 0.9))
        self.target_figures(runs)

    def plan_of_rank0(self):
        """rank_0's plan, from a mount of the local copy (the same files, so the same extents:
        a mount with a shipped index names its sources "?" in the plan files); read once."""
        if getattr(self, "plan0", None) is not None:
            return self.plan0
        idx = os.path.join(self.work, "index-plan")
        shutil.rmtree(idx, ignore_errors=True)
        with self.mounted(self.fx.src_dir, ["--index-dir", idx, "--ranks", "0"]):
            with open(os.path.join(self.mnt, ".ckptfs", "plan", "rank_0.json")) as f:
                self.plan0 = json.load(f)
        shutil.rmtree(idx, ignore_errors=True)
        return self.plan0

    def target_figures(self, runs):
        """Issue 33's goal read for one target: a cold cat of rank_0 from a mount of the whole
        view, against one cat per source that rank_0 takes bytes from, in parallel. Both sides
        deliver rank_0's bytes (the cats inside their files), so the ratio is of times."""
        plan = self.plan_of_rank0()
        used = sorted({f["sources"][e["file"]] for f in plan["files"]
                       for rec in f.get("records", []) for e in rec.get("extents", [])
                       if "file" in e})
        rows = []
        for r in range(runs):
            src = self.fresh_s3fs()
            with self.mounted(src, ["--index", self.shipped]):
                target = self.view_files({0})[0][0]
                view = self.measure_cat([target])
                if r == 0:
                    self.check("cat of rank_0", {0})
            self.fresh_s3fs()
            remote = [os.path.join(src, os.path.relpath(p, self.fx.src_dir)) for p in used]
            rows.append((view, self.measure_cat(remote, parallel=True)))
        size = os.path.getsize(self.fx.expected_files()[0])
        r = [c[0] / v[0] for v, c in rows]
        print(f"\none target, cold (median of {runs}): rank_0 ({size / MIB:.1f} MiB) in "
              f"{median([v[0] for v, _ in rows]):.3f} s, {median([v[1]['range_gets'] for v, _ in rows]):.0f} GETs; "
              f"its {len(used)} sources' cats in parallel {median([c[0] for _, c in rows]):.3f} s; "
              f"time ratio sources / target: median {median(r):.2f} "
              f"(runs {', '.join(f'{x:.2f}' for x in r)})")
        self.goals.append(("one target: its cold cat in <= 1/0.9 the time of its sources' cats",
                           f"{median(r):.2f}x (goal 0.9x)", median(r) / 0.9))

    def first_byte_figures(self, runs):
        """A fresh s3fs and a mount with the shipped index; the time to open rank_0 and read its
        first 4 KiB (what a loader waits for before its first record), then the rest of the view
        read rank by rank. The first bytes wait for the sources' structure checks (as far as the
        read goes, index/deferred_check.h) and for s3fs to fetch what they read."""
        first, whole = [], []
        for r in range(runs):
            src = self.fresh_s3fs()
            with self.mounted(src, ["--index", self.shipped]):
                files = [v for v, _ in self.view_files()]
                start = time.monotonic()
                with open(files[0], "rb") as f:
                    f.read(4096)
                first.append(time.monotonic() - start)
                self.cat(files)
                whole.append(time.monotonic() - start)
        print(f"\nfirst bytes through s3fs (median of {runs}):")
        print(f"  open + first 4 KiB of rank_0  {median(first):6.3f} s  "
              f"(runs {', '.join(f'{x:.3f}' for x in first)})")
        print(f"  then the whole view           {median(whole):6.3f} s  "
              f"(runs {', '.join(f'{x:.3f}' for x in whole)})")

    def ranks0_figures(self, runs):
        target = self.fx.expected_files()[0]
        size = os.path.getsize(target)
        rows = []
        for r in range(runs):
            src = self.fresh_s3fs()
            before = self.server.counters()
            with self.mounted(src, ["--index", self.shipped, "--ranks", "0"]):
                files = [v for v, _ in self.view_files({0})]
                t = self.cat(files)
                c = self.server.counters() - before
                rows.append((t, c))
                if r == 0:
                    self.check("--ranks 0", {0})
        plan = self.plan_of_rank0()
        fetched = median([c["sent_bytes"] for _, c in rows])
        print(f"\n--ranks 0 (median of {runs}): target {size / MIB:.1f} MiB, fetched "
              f"{fetched / MIB:.1f} MiB in {median([c['range_gets'] for _, c in rows]):.0f} "
              f"GETs: {fetched / size:.2f}x; {size / 1e6 / median([t for t, _ in rows]):.1f} MB/s")
        print("  blocks the plan of rank 0 touches in its sources / bytes it needs:")
        for block in BLOCKS:
            touched, need = touched_blocks(plan, block)
            print(f"    {block // 1024:5} KiB blocks: {touched / MIB:7.1f} MiB / "
                  f"{need / MIB:.1f} MiB = {touched / need:.2f}x")


# -- straight from S3 (issue 33, step 2): no s3fs -----------------------------------------------

def daemon_pid(ckptfs, mnt):
    """The pid of the ckptfs daemon serving `mnt`, None if it is not found."""
    binary = os.path.realpath(ckptfs)
    for pid in os.listdir("/proc"):
        try:
            if not pid.isdigit() or os.path.realpath(f"/proc/{pid}/exe") != binary:
                continue
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if mnt.encode() in f.read().split(b"\0"):
                    return int(pid)
        except OSError:
            continue
    return None


def status_kib(pid, field):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


class DaemonMemory:
    """While in its `with`: the daemon's peak anonymous memory (RssAnon, sampled every 10 ms:
    the daemon's own, where VmHWM also counts the page cache of a spool's file it maps); after
    it, `figures` = (VmHWM KiB, peak RssAnon KiB). The pid is looked for again whenever it is
    gone: the mount command that started the daemon may still be exiting at first."""

    def __init__(self, ckptfs, mnt):
        self.ckptfs, self.mnt = ckptfs, mnt
        self.pid = None
        self.anon = 0
        self.figures = (0, 0)

    def read(self, field):
        for _ in range(2):
            self.pid = self.pid or daemon_pid(self.ckptfs, self.mnt)
            if not self.pid:
                return 0
            try:
                return status_kib(self.pid, field)
            except OSError:
                self.pid = None
        return 0

    def __enter__(self):
        self.stop = threading.Event()

        def sample():
            while not self.stop.wait(0.01):
                self.anon = max(self.anon, self.read("RssAnon"))
        self.thread = threading.Thread(target=sample)
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join()
        self.figures = (self.read("VmHWM"), self.anon)


def native_figures(bench, runs):
    """Paired runs of a cold `cat` of the view through s3fs (shipped index) and from
    `mount s3://...` (index filled once beforehand; and with a shipped index of the bucket,
    `--index`), then of `--ranks 0` the same two ways and
    from s3:// with -o s3_amplify=1.1 (the bytes goal's setting): MB/s, GETs, bytes fetched /
    bytes of the target, and the daemon's peak resident set."""
    os.environ.update(AWS_ACCESS_KEY_ID=s3harness.ACCESS_KEY,
                      AWS_SECRET_ACCESS_KEY=s3harness.SECRET_KEY, AWS_REGION=s3harness.REGION)
    url = f"s3://{BUCKET}/{PREFIX}"
    s3 = ["--s3-endpoint", bench.server.endpoint]
    idx = os.path.join(bench.work, "index-native")
    shutil.rmtree(idx, ignore_errors=True)
    subprocess.run([bench.args.ckptfs, "index", "build", url, "--index-dir", idx, "-q", *s3],
                   check=True)
    # A shipped index of the bucket, as nodes mount it (each rank planned on its first open).
    shipped = os.path.join(bench.work, "shipped-native")
    shutil.rmtree(shipped, ignore_errors=True)
    subprocess.run([bench.args.ckptfs, "index", "build", url, "--output", shipped, "-q",
                    "--src-strategy", bench.fx.src_strategy, "--dst-strategy",
                    bench.fx.dst_strategy, *s3], check=True)
    if bench.args.s3_options:
        s3 += ["-o", bench.args.s3_options]
    over_s3fs, native, native_shipped, ranks0, s3fs0, exact0 = [], [], [], [], [], []
    for r in range(runs):
        with bench.mounted(bench.fresh_s3fs(), ["--index", bench.shipped]):
            files = [v for v, _ in bench.view_files()]
            over_s3fs.append(bench.measure(lambda: bench.cat(files)))
        with bench.mounted(bench.fresh_s3fs(), ["--index", bench.shipped, "--ranks", "0"]):
            files = [v for v, _ in bench.view_files({0})]
            s3fs0.append(bench.measure(lambda: bench.cat(files)))
        # (figures, label of the byte check, mount arguments, ranks read: None for all)
        for vals, label, extra, ranks in (
                (native, "cat of the view from s3://", ["--index-dir", idx], None),
                (native_shipped, "cat of the view from s3:// with a shipped index",
                 ["--index", shipped], None),
                (ranks0, "--ranks 0 from s3://", ["--index-dir", idx, "--ranks", "0"], {0}),
                # The bytes goal's setting: GETs coalesced only while they fetch <= 1.1x what
                # is needed.
                (exact0, "--ranks 0 from s3://, s3_amplify=1.1",
                 ["--index-dir", idx, "--ranks", "0", "-o", "s3_amplify=1.1"], {0})):
            with bench.mounted(url, [*extra, *s3]):
                files = [v for v, _ in bench.view_files(ranks)]
                with DaemonMemory(bench.args.ckptfs, bench.mnt) as memory:
                    (t, c) = bench.measure(lambda: bench.cat(files))
                vals.append((t, c, *memory.figures))
                if r == 0:
                    bench.check(label, ranks)
    size0 = os.path.getsize(bench.fx.expected_files()[0])
    print(f"\nstraight from S3 vs through s3fs (median of {runs} paired cold runs):")
    for label, vals, size in (("s3fs, view .ckpt", over_s3fs, bench.target_bytes),
                              ("s3://, view .ckpt", native, bench.target_bytes),
                              ("s3://, view, --index", native_shipped, bench.target_bytes),
                              ("s3fs, --ranks 0", s3fs0, size0),
                              ("s3://, --ranks 0", ranks0, size0),
                              ("s3://, -r 0, 1.1x", exact0, size0)):
        fetched = median([v[1]["sent_bytes"] for v in vals])
        rss = (f", daemon peak RSS {median([v[2] for v in vals]) / 1024:.0f} MiB "
               f"({median([v[3] for v in vals]) / 1024:.0f} anonymous)") if len(vals[0]) > 2 else ""
        print(f"  {label:21} {size / 1e6 / median([v[0] for v in vals]):7.1f} MB/s  "
              f"{median([v[1]['range_gets'] for v in vals]):6.0f} GETs  "
              f"{fetched / MIB:7.1f} MiB fetched = {fetched / size:.2f}x the target{rss}")
    for label, base, vals in (("view", over_s3fs, native),
                              ("view, shipped index", over_s3fs, native_shipped),
                              ("--ranks 0", s3fs0, ranks0),
                              ("--ranks 0, s3_amplify=1.1", s3fs0, exact0)):
        ratios = [o[0] / n[0] for o, n in zip(base, vals)]
        print(f"  speed s3:// / s3fs, {label}: median {median(ratios):.2f} "
              f"(runs {', '.join(f'{x:.2f}' for x in ratios)}; goal >= 1.5)")
    shutil.rmtree(idx, ignore_errors=True)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size-gib", type=float, default=0.25)
    ap.add_argument("--runs", type=int, default=3, help="paired runs per figure (default 3)")
    ap.add_argument("--work", default=os.path.join(REPO, "build", "bench-s3"))
    ap.add_argument("--ckptfs", default=os.path.join(REPO, "build", "ckptfs"))
    ap.add_argument("--native-only", action="store_true",
                    help="only the straight-from-S3 figures (native_figures)")
    ap.add_argument("--cat-only", action="store_true",
                    help="only the cold cat figures through s3fs (cat_figures)")
    ap.add_argument("--first-byte", action="store_true",
                    help="only the time to the first bytes through s3fs (first_byte_figures)")
    ap.add_argument("--s3-options", default="",
                    help="-o options of the s3:// mounts (e.g. readahead_max=1024M)")
    ap.add_argument("--mount-only", action="store_true",
                    help="only the mount figures over s3fs (mount_figures)")
    args = ap.parse_args(argv)
    try:
        s3harness.ensure_tools()
    except s3harness.Unavailable as e:
        raise SystemExit(f"bench_s3: {e}")
    os.makedirs(args.work, exist_ok=True)
    with s3harness.S3Server(os.path.join(os.path.realpath(args.work), "server")) as server:
        bench = Bench(args, server)
        try:
            bench.setup()
            log(f"S3 server {server.endpoint}; s3fs without use_cache")
            if args.cat_only:
                bench.cat_figures(args.runs)
            elif args.first_byte:
                bench.first_byte_figures(args.runs)
            elif args.mount_only:
                bench.mount_figures(args.runs)
            elif not args.native_only:
                bench.mount_figures(args.runs)
                bench.cat_figures(args.runs)
                bench.ranks0_figures(args.runs)
            if not args.cat_only and not args.mount_only and not args.first_byte:
                native_figures(bench, args.runs)
        finally:
            s3harness.unmount_s3fs(bench.s3)
    print(f"\ngoals (load average {os.getloadavg()[0]:.1f}):")
    for name, figure, ratio in bench.goals:
        print(f"  {'met ' if ratio >= 1 else 'MISS'} {name}: {figure}; {ratio:.2f} of the goal")
    for f in bench.failures:
        print(f"MISMATCH {f}")
    return 1 if bench.failures else 0


if __name__ == "__main__":
    sys.exit(main())
