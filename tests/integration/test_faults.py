"""Faults and load: many reader processes on every target at random offsets and sizes; a source
deleted or made unreadable during reads; kill -9 of the daemon during reads, then umount and a
remount on the same mountpoint; two mounts of the same sources started at once sharing one
index directory. Each gives the expected bytes or EIO, never a hang, a crash or mixed bytes."""

import errno
import multiprocessing
import os
import random
import signal
import subprocess
import threading
import time

import itest
import ckpt_fixture

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


def daemon_pids(mnt):
    """Processes serving `mnt`: a ckptfs mount whose arguments name it."""
    pids = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if b"mount" in argv and mnt.encode() in argv:
            pids.append(int(pid))
    return pids


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
        pids = daemon_pids(mnt)
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


def main():
    args = itest.parse_args()
    checks = itest.Checks(args.only)
    checks.run(f"{READERS} readers x every target x {ROUNDS} rounds", many_readers, args)
    checks.run("kill -9 during reads, then a remount", kill_daemon_during_reads, args)
    checks.run("two mounts at once sharing one index", two_mounts_one_index, args)
    checks.run("a source deleted while mounted", source_gone_or_unreadable, args, "deleted")
    checks.run("a source made unreadable while mounted", source_gone_or_unreadable, args,
               "unreadable")
    checks.finish()


if __name__ == "__main__":
    main()
