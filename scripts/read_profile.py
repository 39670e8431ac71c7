#!/usr/bin/python3
"""Read modes against the FUSE transport alone, paired, and a system-wide profile of each
(issue 35, docs/PERFORMANCE.md "Where the first read's time goes").

Mounts the bench's `tp4` data (8 -> 4 row ranges, made by scripts/bench.py's generator) as
the default, `-o splice=never` and `-o splice=always` all at once, beside bench/fuse_ceiling
serving the expected files: `static` (every READ answered from one constant buffer: the
transport alone), `csplice` and `cmmap` (its splice and mmap modes: the transport plus the one
copy out of the page cache that any server of cached bytes makes), `cpread`. fs.pipe-max-size is
raised to 4 MiB for the whole run and restored after it. Each ckptfs mount is checked once
against the expected files' checksums. Each round reads every server once (first read,
direct_io, 1 or 2 readers) and then the expected files hot; it prints the medians of each
server's ratio to the hot read and to `static` in the same round.

With --profile, one extra pass per server runs REPEAT first reads back to back under
`perf record -a -g` (cpu-clock: this VM exposes no hardware counters) and prints the share of
all samples in each bucket of kernel and daemon work, idle included, plus the idle share of
both CPUs from /proc/stat over the same pass. The perf data files stay in WORKDIR/perf.

  read_profile.py --build-dir build --workdir $PWD/build/rp [--size-gib 1] [--runs 7]
                  [--readers 1] [--modes static,default,...] [--profile] [--repeat 10] [--top N]
                  [--before OTHER_BUILD/ckptfs]   (modes before-default etc. mount that binary)
"""

import argparse
import contextlib
import os
import re
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench  # noqa: E402

MODES = {"default": [], "never": ["splice=never"], "always": ["splice=always"]}
# bench/fuse_ceiling's modes, as servers of the same expected files.
CEILINGS = {"static": "static", "csplice": "splice", "cmmap": "mmap", "cpread": "pread"}

# Buckets for a sample's own function (first match wins), in the order they are printed.
BUCKETS = [
    ("kernel copy", r"^(rep_movs_alternative|copy_user.*|_copy_to_iter|_copy_from_iter|"
                    r"copy_page_to_iter|copy_page_from_iter|fuse_copy_do|memcpy_orig|"
                    r"__memcpy|__pi_memcpy|memcpy|memcpy_to_page|copy_mc.*)$"),
    ("user memcpy (gather)", r"^__mem(cpy|move)_.*$"),
    ("page pinning", r"^(gup_.*|.*pin_user_pages.*|.*get_user_pages.*|try_grab_.*|follow_.*|"
                     r"unpin_user_.*|iov_iter_extract.*|iov_iter_get_pages.*|__iov_iter_get_pages.*|"
                     r"folio_add_.*|gup_fast.*)$"),
    ("page cache lookup", r"^(filemap_.*|find_get_.*|xas_.*|__filemap_.*|page_cache_.*|"
                          r"folio_try_get.*|next_uptodate_folio|__folio_.*lock.*)$"),
    ("splice / pipe", r"^(.*splice.*|.*pipe.*|anon_pipe_.*|generic_pipe_buf_.*|"
                      r"page_cache_pipe_buf_.*|push_pipe|iter_file_splice_write)$"),
    ("faults / TLB / madvise", r"^(.*fault.*|.*tlb.*|.*flush_tlb.*|zap_.*|unmap_.*|"
                               r"madvise.*|do_madvise|.*_pte_.*|.*pmd.*|set_pte.*|"
                               r"native_flush_tlb.*|smp_call_function.*|.*ipi.*|"
                               r"llist_.*|__sysvec_call_function.*)$"),
    ("FUSE request, per-page copy steps", r"^(fuse_.*|request_wait_answer|__fuse_.*|"
                                          r"queue_request.*|lock_request|unlock_request)$"),
    ("scheduler / wakeups", r"^(.*schedule.*|.*sched_.*|.*wake.*|try_to_wake_up|"
                            r"finish_task_switch.*|__switch_to.*|.*futex.*|update_.*|"
                            r"enqueue_.*|dequeue_.*|pick_.*|select_task_rq.*|"
                            r"native_sched_clock|ttwu_.*|prepare_to_wait.*|"
                            r"finish_wait|autoremove_wake.*|psi_.*|.*hrtimer.*)$"),
    ("syscall entry / exit", r"^(entry_SYSCALL.*|do_syscall_64|syscall_.*|.*syscall_exit.*|"
                             r"__x64_sys_.*|x64_sys_call|ksys_.*|vfs_.*|rw_verify_area|"
                             r"__fdget.*|fput.*|__fget.*|security_.*|apparmor_.*|"
                             r"fsnotify.*|__fsnotify.*|restore_regs_.*|"
                             r"exit_to_user_mode.*|irqentry_.*|clear_bhb.*)$"),
]


LOCKS = r"^(_raw_spin_.*|raw_spin_.*|.*queued_spin_.*|__raw_callee_save_.*|.*spin_lock.*|" \
    r".*spin_unlock.*)$"


def bucket_of(sym, dso, chain):
    """The bucket of one sample: its own function `sym` in `dso`, and the functions that called
    it (`chain`, innermost first)."""
    # A lock is charged to the first caller that is not one (fuse_copy_fill takes the request's
    # lock once per page copied, for instance).
    while re.match(LOCKS, sym) and chain:
        sym, chain = chain[0], chain[1:]
    for name, pattern in BUCKETS:
        if re.match(pattern, sym):
            if name == "kernel copy" and any(c.startswith("filemap_read") for c in chain):
                return "kernel copy (pread)"
            return name
    if dso.startswith("[kernel") or dso == "[unknown]" and not sym.startswith("["):
        return "other kernel"
    return "user code"


ROWS = ["kernel copy", "kernel copy (pread)", "user memcpy (gather)"] + [
    n for n, _ in BUCKETS[2:]] + ["other kernel", "user code"]


def samples(data):
    """(pid, comm, leaf function, dso, callers, period ns) of each sample in a perf data file."""
    out = subprocess.run(["perf", "script", "-i", data, "-F", "comm,pid,period,ip,sym,dso"],
                         text=True, capture_output=True, check=True).stdout
    for block in out.split("\n\n"):
        lines = [ln for ln in block.splitlines() if ln.strip()]
        if not lines:
            continue
        head = re.match(r"\s*(.*?)\s+(\d+)\s+(\d+)\s*$", lines[0])
        if not head:
            continue
        frames = []
        for ln in lines[1:]:
            m = re.match(r"\s*[0-9a-f]+\s+(.*?)(?:\+0x[0-9a-f]+)?\s+\((.*)\)\s*$", ln)
            if m:
                frames.append((m[1], os.path.basename(m[2])))
        if frames:
            yield (int(head[2]), head[1], frames[0][0], frames[0][1],
                   [f for f, _ in frames[1:]], int(head[3]))


def profile(label, files, readers, server_pid, outdir, repeat):
    """REPEAT first reads of `files` under perf record -a -g -> (CPU ms per GiB read by
    {"reader"|"server"|"helpers": {bucket: ms}}, idle ms per GiB, others' ms per GiB, wall ms per GiB,
    {function: the server's ms per GiB})."""
    data = os.path.join(outdir, f"{label}-{readers}r.data")
    split = "files" if readers > 1 else "range"
    loop = " && ".join([f"{bench.Tools.readbench} -q -e -t {readers} -s {split} "
                        + " ".join(files)] * repeat)
    out = subprocess.run(["perf", "record", "-a", "-g", "-e", "cpu-clock", "-c", "200000",
                          "-o", data, "--", "sh", "-c", loop],
                         text=True, capture_output=True, check=True)
    mbps = [float(x) for x in out.stdout.split()]
    gib = repeat * sum(os.path.getsize(f) for f in files) / (1 << 30)
    wall_ms = sum(sum(os.path.getsize(f) for f in files) / (v * 1e6) for v in mbps) * 1e3
    who = {"reader": {}, "server": {}, "helpers": {}}
    top = {}
    idle = others = 0.0
    for pid, comm, sym, dso, chain, period in samples(data):
        ms = period / 1e6
        if pid == 0:
            idle += ms
        elif pid == server_pid:
            b = bucket_of(sym, dso, chain)
            # ckptfs's read-ahead helpers (ckptfs-ahead) apart from the threads that reply.
            w = who["helpers" if comm.endswith("-ahead") else "server"]
            w[b] = w.get(b, 0.0) + ms
            key = ("helper " if comm.endswith("-ahead") else "") + sym
            top[key] = top.get(key, 0.0) + ms / gib
        elif comm == "readbench":
            b = bucket_of(sym, dso, chain)
            who["reader"][b] = who["reader"].get(b, 0.0) + ms
        else:
            others += ms
    # The samples cover the whole loop, the reads' own clock only the reads.
    scale = 1 / gib
    return ({k: {b: v * scale for b, v in d.items()} for k, d in who.items()}, idle * scale,
            others * scale, wall_ms / gib, top)


@contextlib.contextmanager
def ceiling(mnt, mode, ref):
    """Mounts fuse_ceiling in `mode` at mnt -> (its files, its pid)."""
    os.makedirs(mnt, exist_ok=True)
    proc = subprocess.Popen([bench.Tools.fuse_ceiling, mnt, mode, *ref],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        for _ in range(500):
            if bench.is_mounted(mnt) or proc.poll() is not None:
                break
            time.sleep(0.01)
        if not bench.is_mounted(mnt):
            raise RuntimeError(f"fuse_ceiling did not mount: {proc.stderr.read()}")
        yield [os.path.join(mnt, f"f{i}") for i in range(len(ref))], proc.pid
    finally:
        if bench.is_mounted(mnt):
            subprocess.run(["fusermount3", "-u", mnt], capture_output=True)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build-dir", required=True)
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--size-gib", type=float, default=1.0)
    ap.add_argument("--runs", type=int, default=7, help="paired rounds (default 7)")
    ap.add_argument("--readers", type=int, default=1)
    ap.add_argument("--modes", default="static,default,never,always",
                    help="servers to read, in round order: default, never, always (ckptfs "
                    "mounts), static, csplice, cmmap, cpread (fuse_ceiling's modes); a ckptfs "
                    "mode prefixed with 'before-' mounts the --before binary instead")
    ap.add_argument("--before", help="a second ckptfs binary (named ckptfs) for A/B rounds")
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--repeat", type=int, default=10, help="first reads per profiled pass")
    ap.add_argument("--top", type=int, default=0, help="also list each server's N costliest "
                    "functions (ms per GiB)")
    args = ap.parse_args(argv)
    bench.Tools.readbench = os.path.join(args.build_dir, "bench", "readbench")
    bench.Tools.fuse_ceiling = os.path.join(args.build_dir, "bench", "fuse_ceiling")
    bench.Tools.ckptfs = os.path.join(args.build_dir, "ckptfs")
    modes = args.modes.split(",")

    ds = bench.Dataset(os.path.join(args.workdir, "data"), f"tp4-{args.size_gib:g}g",
                       bench.transformer_case(args.size_gib, "tp4"))
    ds.prepare(print)
    ref = ds.expected_files()
    scratch = os.path.join(args.workdir, "scratch")
    os.makedirs(os.path.join(scratch, "logs"), exist_ok=True)
    mounts = bench.Mounts(os.path.join(scratch, "logs"))
    perf_dir = os.path.join(args.workdir, "perf")
    os.makedirs(perf_dir, exist_ok=True)
    split = "files" if args.readers > 1 else "range"
    print(f"load average at start: {os.getloadavg()}")
    with bench.pipe_max_size(4 << 20) as raised, contextlib.ExitStack() as stack:
        if not raised:
            raise SystemExit("cannot raise fs.pipe-max-size to 4 MiB")
        bench.warm(list(ds.source_files) + list(ref))
        files, pids = {}, {}
        stack.callback(mounts.close)
        for mode in modes:
            mnt = os.path.join(scratch, "mnt-" + mode)
            want = bench.checksums(ref)
            if mode in CEILINGS:
                files[mode], pids[mode] = stack.enter_context(ceiling(mnt, CEILINGS[mode], ref))
                if mode == "static":
                    continue
            else:
                ours = bench.Tools.ckptfs
                if mode.startswith("before-"):
                    bench.Tools.ckptfs = args.before
                try:
                    _, pids[mode], _ = mounts.mount(ds, mnt, os.path.join(scratch, "index"),
                                                    options=MODES[mode.removeprefix("before-")])
                finally:
                    bench.Tools.ckptfs = ours
                files[mode] = ds.mount_files(mnt)
            _, _, sums, _ = bench.readbench(files[mode], args.readers, split, evict=True,
                                            checksum=True)
            if [sums[f] for f in files[mode]] != want:
                raise SystemExit(f"{mode}: checksum mismatch")
        for mode in modes:
            bench.readbench(files[mode], args.readers, split)  # warm-up
        mbps = {m: [] for m in modes}
        hot = {m: [] for m in modes}
        for r in range(args.runs):
            for mode in modes:
                mbps[mode].append(bench.readbench(files[mode], args.readers, split,
                                                  evict=True)[0])
                hot[mode].append(bench.readbench(ref)[0])
        print(f"load average after the rounds: {os.getloadavg()}")
        print(f"{args.readers} reader(s), {args.runs} rounds; medians [min..max]")
        for mode in modes:
            to_hot = [v / h for v, h in zip(mbps[mode], hot[mode])]
            line = (f"  {mode:8s} {statistics.median(mbps[mode]):7.0f} MB/s  "
                    f"÷ hot {statistics.median(to_hot):.3f} [{min(to_hot):.3f}..{max(to_hot):.3f}]")
            if "static" in mbps and mode != "static":
                to_t = [v / s for v, s in zip(mbps[mode], mbps["static"])]
                line += (f"  ÷ transport {statistics.median(to_t):.3f} "
                         f"[{min(to_t):.3f}..{max(to_t):.3f}]")
            print(line, flush=True)
        if args.profile:
            table = {}
            for mode in modes:
                table[mode] = profile(mode, files[mode], args.readers, pids[mode], perf_dir,
                                      args.repeat)
                print(f"  profiled {mode}: load average {os.getloadavg()}", flush=True)
            print(f"CPU ms per GiB read, {args.readers} reader(s) (cpu-clock samples of "
                  f"{args.repeat} first reads; reader + server)")
            print(f"  {'bucket':26s}" + "".join(f"{m:>9s}" for m in modes))
            for who in ("server", "helpers", "reader"):
                for n in ROWS:
                    vals = [table[m][0][who].get(n, 0.0) for m in modes]
                    if any(v >= 0.5 for v in vals):
                        print(f"  {who + ': ' + n:26s}" + "".join(f"{v:9.0f}" for v in vals))
                print(f"  {who + ' total':26s}" + "".join(
                    f"{sum(table[m][0][who].values()):9.0f}" for m in modes))
            print(f"  {'idle (both CPUs)':26s}" + "".join(f"{table[m][1]:9.0f}" for m in modes))
            print(f"  {'other processes':26s}" + "".join(f"{table[m][2]:9.0f}" for m in modes))
            print(f"  {'wall (readbench clock)':26s}" + "".join(f"{table[m][3]:9.0f}"
                                                              for m in modes))
            for mode in modes if args.top else []:
                print(f"  {mode}: the server's costliest functions, ms per GiB")
                for sym, ms in sorted(table[mode][4].items(), key=lambda kv: -kv[1])[:args.top]:
                    print(f"    {ms:7.1f}  {sym[:100]}")
    print(f"fs.pipe-max-size restored: {open('/proc/sys/fs/pipe-max-size').read().strip()}")


if __name__ == "__main__":
    sys.exit(main())
