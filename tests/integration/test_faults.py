"""Faults and load: many reader processes on every target at random offsets and sizes; a source
deleted or made unreadable during reads; the strategy files replaced by a rename and rewritten in
place during reads; kill -9 of the daemon during reads, then umount and a remount on the same
mountpoint; kill -9 during `index build` and during a mount's indexing, then a mount on that
index; two mounts of the same sources started at once sharing one index directory. Each gives
the expected bytes or EIO, never a hang, a crash or mixed bytes."""

import errno
import multiprocessing
import os
import random
import re
import signal
import subprocess
import threading
import time

import itest
import ckpt_fixture
from ckptfix.builtins import case, lay, param, side

READERS = 8
ROUNDS = 10


def mount_kwargs(fx, work, **extra):
    return dict(src_strategy=fx.src_strategy, dst_strategy=fx.dst_strategy,
                index_dir=os.path.join(work, "index"), **extra)


def target_pairs(fx, mnt):
    """(mounted path, expected path) for every target file."""
    return [(os.path.join(mnt, f"rank_{t}", os.path.basename(p)), p)
            for t, p in sorted(fx.expected_files().items())]


def reader(pairs, seed, rounds):
    """Whole files and windows at random offsets and sizes (0, 1, across records, past EOF),
    each compared with the expected bytes; returns a list of problems."""
    rng = random.Random(seed)
    problems = []
    for _ in range(rounds):
        for mounted, expected in pairs:
            want = itest.read_file(expected)
            size = len(want)
            fd = os.open(mounted, os.O_RDONLY)
            try:
                if os.pread(fd, size + 10, 0) != want:
                    problems.append(f"{mounted}: whole file differs")
                for _ in range(8):
                    off = rng.choice([0, size - 1, size, size + 5, rng.randrange(size + 1)])
                    length = rng.choice([0, 1, 7, 4096, 65536, rng.randrange(1, size + 2)])
                    got = os.pread(fd, length, max(off, 0))
                    if got != want[max(off, 0):max(off, 0) + length]:
                        problems.append(f"{mounted}: [{off}, +{length}) differs")
            finally:
                os.close(fd)
    return problems


def many_readers(args):
    """8 reader processes x every target x 10 rounds, whole files and random windows."""
    work = os.path.join(args.work, "readers")
    fx = ckpt_fixture.make_builtin("8to4_dtypes", os.path.join(work, "fixture"))
    mnt = os.path.join(work, "mnt")
    with itest.mounted(args.ckptfs, fx.src_dir, mnt, **mount_kwargs(fx, work)):
        pairs = target_pairs(fx, mnt)
        with multiprocessing.Pool(READERS) as pool:
            results = pool.starmap(reader, [(pairs, seed, ROUNDS) for seed in range(READERS)])
    problems = [p for r in results for p in r]
    assert not problems, "\n".join(problems[:20])


def kill_daemon_during_reads(args):
    """kill -9 while readers stream: their reads fail (ENOTCONN) rather than hang; a new mount
    on the same mountpoint detaches the dead one, says so and serves the right bytes; the index
    stays usable."""
    work = os.path.join(args.work, "kill")
    fx = ckpt_fixture.make_builtin("8to4_dtypes", os.path.join(work, "fixture"))
    mnt = os.path.join(work, "mnt")
    kwargs = mount_kwargs(fx, work)
    with itest.mounted(args.ckptfs, fx.src_dir, mnt, **kwargs):
        pairs = target_pairs(fx, mnt)
        outcome = []

        def stream():
            try:
                while True:
                    for mounted, _ in pairs:
                        itest.read_file(mounted)
            except OSError as e:
                outcome.append(e.errno)

        threads = [threading.Thread(target=stream, daemon=True) for _ in range(4)]
        for t in threads:
            t.start()
        time.sleep(0.3)
        pids = itest.daemon_pids(args.ckptfs, mnt)
        assert pids, "no daemon found"
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
        for t in threads:
            t.join(timeout=30)
        assert not any(t.is_alive() for t in threads), "a reader hangs after kill -9"
        assert outcome and all(e in (errno.ENOTCONN, errno.ECONNABORTED) for e in outcome), outcome

        # A new mount on the same mountpoint detaches the dead one, says so, and serves.
        again = itest.run(itest.mount_cmd(args.ckptfs, fx.src_dir, mnt, **kwargs), check=False)
        assert again.returncode == 0, again.stderr
        assert "gone" in again.stderr, again.stderr
        problems = ckpt_fixture.compare_tree(fx, mnt)
        assert not problems, "\n".join(problems)
    listing = itest.run([args.ckptfs, "index", "list", "--index-dir", kwargs["index_dir"]])
    assert f"{len(fx.source_files)} files in" in listing.stdout, listing.stdout


def two_mounts_one_index(args):
    """Two mounts of the same sources started at the same moment, on a fresh index directory
    they share: both serve the expected bytes."""
    work = os.path.join(args.work, "two")
    fx = ckpt_fixture.make_builtin("8to4_dtypes", os.path.join(work, "fixture"))
    mnts = [os.path.join(work, f"mnt{i}") for i in range(2)]
    for m in mnts:
        os.makedirs(m, exist_ok=True)
    kwargs = mount_kwargs(fx, work)
    procs = [subprocess.Popen(itest.mount_cmd(args.ckptfs, fx.src_dir, m, **kwargs),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for m in mnts]
    try:
        for p in procs:
            _, err = p.communicate(timeout=120)
            assert p.returncode == 0, err
        for m in mnts:
            problems = ckpt_fixture.compare_tree(fx, m)
            assert not problems, "\n".join(problems)
    finally:
        for m in mnts:
            itest.unmount(args.ckptfs, m)


def source_gone_or_unreadable(args, how):
    """A source deleted while mounted keeps being served from the open file (right bytes); one
    made unreadable (chmod 000, which moves its ctime) fails with EIO. Never mixed bytes."""
    work = os.path.join(args.work, how)
    fx = ckpt_fixture.make_builtin("8to4_dtypes", os.path.join(work, "fixture"))
    mnt = os.path.join(work, "mnt")
    victim = os.path.realpath(fx.source_files[0])
    with itest.mounted(args.ckptfs, fx.src_dir, mnt, **mount_kwargs(fx, work)):
        pairs = target_pairs(fx, mnt)
        if how == "deleted":
            os.unlink(victim)
        else:
            time.sleep(0.02)
            os.chmod(victim, 0)
        eio = 0
        for mounted, expected in pairs:
            try:
                got = itest.read_file(mounted)
            except OSError as e:
                assert e.errno == errno.EIO, e
                eio += 1
                continue
            assert got == itest.read_file(expected), f"{mounted}: bytes differ"
        if how == "deleted":
            assert eio == 0, f"{eio} targets failed after an unlink"
        else:
            assert eio > 0, "no read failed after chmod 000"


def strategy_replaced(args):
    """The strategy files are read once, at mount: replaced by a rename (each by the other
    side's) and then rewritten in place with garbage while 4 threads stream every target, the
    mount goes on serving the view it planned, byte for byte. A new mount of the garbage is
    refused in one line naming the file."""
    work = os.path.join(args.work, "strategy_replaced")
    fx = ckpt_fixture.make_builtin("8to4_dtypes", os.path.join(work, "fixture"))
    mnt = os.path.join(work, "mnt")
    kwargs = mount_kwargs(fx, work)
    with itest.mounted(args.ckptfs, fx.src_dir, mnt, **kwargs):
        pairs = [(m, itest.read_file(e)) for m, e in target_pairs(fx, mnt)]
        problems, stop = [], threading.Event()

        def stream():
            while not stop.is_set():
                for mounted, want in pairs:
                    try:
                        if itest.read_file(mounted) != want:
                            problems.append(f"{mounted}: bytes differ")
                    except OSError as e:
                        problems.append(f"{mounted}: {e}")

        threads = [threading.Thread(target=stream, daemon=True) for _ in range(4)]
        for t in threads:
            t.start()
        src, dst = itest.read_file(fx.src_strategy), itest.read_file(fx.dst_strategy)
        for path, other in ((fx.src_strategy, dst), (fx.dst_strategy, src)):
            with open(path + ".new", "wb") as f:
                f.write(other)
            os.rename(path + ".new", path)
        time.sleep(0.3)
        for path in (fx.src_strategy, fx.dst_strategy):
            with open(path, "r+b") as f:
                f.write(bytes(range(256)) * 4)
        time.sleep(0.3)
        stop.set()
        for t in threads:
            t.join(timeout=60)
        assert not any(t.is_alive() for t in threads), "a reader hangs"
        assert not problems, "\n".join(problems[:20])
        for mounted, want in pairs:  # opened after the changes
            assert itest.read_file(mounted) == want, mounted
    proc = itest.run(itest.mount_cmd(args.ckptfs, fx.src_dir, mnt, **kwargs), check=False)
    with itest.unmounting(args.ckptfs, mnt):
        assert proc.returncode == 1, proc.stderr
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and fx.src_strategy in lines[0], proc.stderr


# Enough sources that indexing them takes a while to interrupt.
KILL_SOURCES = 120
KILL_CASE = case(
    "kill_indexing", f"{KILL_SOURCES} source ranks -> 2", side(KILL_SOURCES), side(2),
    [param("w", "Float32", [KILL_SOURCES * 2, 64], lay([KILL_SOURCES], [0, -1]),
           lay([2], [0, -1]))], [])


def index_counts(stderr):
    m = re.search(r"(\d+) source files: (\d+) from the index, (\d+) scanned", stderr)
    assert m, f"no index summary in:\n{stderr}"
    return int(m.group(2)), int(m.group(3))


def killed_while_indexing(args, what):
    """kill -9 of `ckptfs index build` (what="build") or of a mount still indexing
    (what="mount") at growing delays, on one index directory: after each kill the index lists,
    and a mount on it takes what it holds, scans the rest and serves the expected bytes."""
    work = os.path.join(args.work, f"kill_{what}")
    fx = ckpt_fixture.make(KILL_CASE, os.path.join(work, "fixture"))
    index = os.path.join(work, "index")
    mnt = os.path.join(work, "mnt")
    os.makedirs(mnt, exist_ok=True)
    if what == "build":
        cmd = [args.ckptfs, "index", "build", fx.src_dir, "--index-dir", index]
    else:
        cmd = itest.mount_cmd(args.ckptfs, fx.src_dir, os.path.join(work, "mnt_killed"),
                              src_strategy=fx.src_strategy, dst_strategy=fx.dst_strategy,
                              index_dir=index)
        os.makedirs(os.path.join(work, "mnt_killed"), exist_ok=True)
    interrupted = 0
    for delay in (0.005, 0.01, 0.02, 0.03, 0.05, 0.1, 0.3):
        # A new fingerprint for every source, so each run has everything to index again.
        for path in fx.source_files.values():
            os.utime(os.path.realpath(path))
        with itest.unmounting(args.ckptfs, os.path.join(work, "mnt_killed")):
            proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            time.sleep(delay)
            if proc.poll() is None:
                interrupted += 1
            proc.kill()
            proc.wait(timeout=60)
        itest.run([args.ckptfs, "index", "list", "--index-dir", index])
        mount = itest.mount_cmd(args.ckptfs, fx.src_dir, mnt, src_strategy=fx.src_strategy,
                                dst_strategy=fx.dst_strategy, index_dir=index)
        mount.insert(1, "--log-level=info")
        with itest.unmounting(args.ckptfs, mnt):
            proc = itest.run(mount, timeout=300)
            from_index, scanned = index_counts(proc.stderr)
            assert from_index + scanned == KILL_SOURCES, (from_index, scanned)
            problems = ckpt_fixture.compare_tree(fx, mnt)
            assert not problems, "\n".join(problems)
        print(f"     killed after {delay}s: next mount took {from_index} from the index, "
              f"scanned {scanned}")
    assert interrupted > 0, "every run had ended before its kill: nothing was interrupted"


def main():
    args = itest.parse_args()
    checks = itest.Checks(args.only)
    checks.run(f"{READERS} readers x every target x {ROUNDS} rounds", many_readers, args)
    checks.run("kill -9 during reads, then a remount", kill_daemon_during_reads, args)
    checks.run("two mounts at once sharing one index", two_mounts_one_index, args)
    checks.run("a source deleted while mounted", source_gone_or_unreadable, args, "deleted")
    checks.run("a source made unreadable while mounted", source_gone_or_unreadable, args,
               "unreadable")
    checks.run("strategy files replaced and rewritten during reads", strategy_replaced, args)
    checks.run("kill -9 during index build, then a mount", killed_while_indexing, args, "build")
    checks.run("kill -9 during a mount's indexing, then a mount", killed_while_indexing, args,
               "mount")
    checks.finish()


if __name__ == "__main__":
    main()
