"""Spliced READs under read leases, in the default mount: a source opened for writing while two
readers are served spliced READs of it waits for the READs in flight; later READs fail with EIO,
and no READ ever returns bytes that differ from the expected ones (a mix of old and new). A
source that cannot be leased (open for writing when the mount starts) is never spliced."""

import concurrent.futures
import contextlib
import errno
import os
import random
import re
import threading
import time

import itest
import ckpt_fixture
from ckptfix.builtins import case, lay, param, side

# 2 -> 2 with the same row split: each target file is one source's rows, 32 MiB, read in long
# runs (spliced when two READs are served at once).
PAIR_CASE = case(
    "lease_pair", "2 -> 2 rows, 2 x 32 MiB", side(2), side(2),
    [param("w", "Float32", [8192, 1024], lay([2], [0, -1]), lay([2], [0, -1]))], [])

CHUNK = 1 << 20


def target_path(mnt, expected_path, rank):
    return os.path.join(mnt, f"rank_{rank}", os.path.basename(expected_path))


def closing_spliced(log):
    """Reads spliced, from the daemon's closing log line (written as it exits after unmount)."""
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        with open(log) as f:
            closing = [line for line in f if "fuse: served" in line]
        if closing:
            found = re.search(r"\), (\d+) spliced", closing[-1])
            assert found, closing[-1]
            return int(found.group(1))
        time.sleep(0.05)
    raise AssertionError(f"no closing line in {log}")


def read_passes(path, want, stop):
    """Reads `path` front to back in 1 MiB preads, pass after pass, comparing every chunk with
    `want`, until a READ fails with EIO after `stop` was set. Returns (passes, chunks compared,
    failed with EIO). A chunk that differs is an assertion: a mix of old and new bytes."""
    passes = chunks = 0
    fd = os.open(path, os.O_RDONLY)
    try:
        while True:
            off = 0
            while off < len(want):
                stopping = stop.is_set()
                try:
                    got = os.pread(fd, CHUNK, off)
                except OSError as e:
                    assert e.errno == errno.EIO, f"{path} at {off}: {e}"
                    return passes, chunks, True
                assert got, f"{path}: short read at {off}"
                if got != want[off:off + len(got)]:
                    bad = next(i for i in range(len(got)) if got[i] != want[off + i])
                    raise AssertionError(
                        f"{path}: bytes differ from the expected ones at {off + bad} without EIO")
                chunks += 1
                off += len(got)
            passes += 1
            if stopping and passes > 50:
                return passes, chunks, False  # the writer's change never showed: a failure
    finally:
        os.close(fd)


def writer_while_spliced(args):
    """Many times over: two readers stream the file of source 0 (spliced, as two READs are
    served at once) while a writer opens that source and overwrites half of it. Every chunk read
    is the expected bytes or the READ fails with EIO; after the write, reads fail with EIO; the
    daemon logs the lease it let go."""
    work = os.path.join(args.work, "writer")
    fx = ckpt_fixture.make(PAIR_CASE, os.path.join(work, "fixture"))
    rank, expected = sorted(fx.expected_files().items())[0]
    want = itest.read_file(expected)
    victim = os.path.realpath(fx.source_files[0])
    original = itest.read_file(victim)
    rng = random.Random(35)
    spliced_total = waited_total = 0
    rounds = 10
    for n in range(rounds):
        with open(victim, "wb") as f:  # as before the last round's write
            f.write(original)
        mnt, log = os.path.join(work, f"mnt{n}"), os.path.join(work, f"log{n}")
        with itest.mounted(args.ckptfs, fx.src_dir, mnt, src_strategy=fx.src_strategy,
                           dst_strategy=fx.dst_strategy, index_dir=os.path.join(work, "index"),
                           log_file=log, log_level="info"):
            path = target_path(mnt, expected, rank)
            stop = threading.Event()
            with concurrent.futures.ThreadPoolExecutor(2) as pool:
                readers = [pool.submit(read_passes, path, want, stop) for _ in range(2)]
                time.sleep(rng.uniform(0.02, 0.3))
                with open(victim, "r+b") as f:  # waits for the spliced READs in flight
                    f.seek(len(original) // 4)
                    f.write(bytes(b ^ 0xFF for b in original[len(original) // 4:
                                                            3 * len(original) // 4]))
                stop.set()
                results = [r.result(timeout=120) for r in readers]
            for passes, chunks, failed in results:
                assert failed, f"round {n}: {passes} passes after the write, no EIO"
            try:
                itest.read_file(path)
                raise AssertionError(f"round {n}: a new read of the changed source gave bytes")
            except OSError as e:
                assert e.errno == errno.EIO, e
        spliced_total += closing_spliced(log)
        with open(log) as f:
            noted = re.findall(r"lease let go after (\d+) spliced READs in flight", f.read())
        assert noted, f"round {n}: the daemon did not log the broken lease ({log})"
        waited_total += sum(int(x) for x in noted)
    print(f"{rounds} rounds: {spliced_total} READs spliced, the writer waited for "
          f"{waited_total} in flight")
    assert spliced_total > 0, "no READ was spliced: the test proves nothing"


def unleased_stays_gathered(args):
    """Sources held open for writing (O_RDWR) when the mount starts get no lease: two readers at
    once read the right bytes, none spliced, and the log names the sources. Once the writers are
    gone, a new mount splices them."""
    work = os.path.join(args.work, "unleased")
    fx = ckpt_fixture.make(PAIR_CASE, os.path.join(work, "fixture"))
    files = sorted(fx.expected_files().items())
    mounts = iter(range(100))

    def spliced():
        n = next(mounts)
        mnt, log = os.path.join(work, f"mnt{n}"), os.path.join(work, f"log{n}")
        with itest.mounted(args.ckptfs, fx.src_dir, mnt, src_strategy=fx.src_strategy,
                           dst_strategy=fx.dst_strategy, index_dir=os.path.join(work, "index"),
                           log_file=log, log_level="info"):
            paths = [target_path(mnt, path, rank) for rank, path in files]
            with concurrent.futures.ThreadPoolExecutor(2) as pool:
                got = list(pool.map(itest.read_file, paths))
            for (rank, path), data in zip(files, got):
                assert data == itest.read_file(path), f"rank {rank} differs"
        with open(log) as f:
            return closing_spliced(log), f.read()

    sources = [os.path.realpath(p) for p in fx.source_files.values()]
    held = [os.open(p, os.O_RDWR) for p in sources]
    try:
        count, text = spliced()
        assert count == 0, f"sources open for writing: {count} READs spliced"
        assert "0 of 2 sources leased, 2 not" in text, text
        for p in sources:
            named = os.path.join(os.path.basename(os.path.dirname(p)), os.path.basename(p))
            assert f"{named}: open for writing" in text, f"{p} not named:\n{text}"
    finally:
        for fd in held:
            os.close(fd)
    # "Busy" is another READ within 2 ms: on a loaded machine the readers can keep out of step.
    for _ in range(3):
        count, text = spliced()
        if count > 0:
            break
    assert "2 of 2 sources leased" in text, text
    assert count > 0, "leased sources, two readers: no READ spliced in 3 tries"


@contextlib.contextmanager
def pipes_of_4_mib():
    """A spliced 1 MiB READ needs a 2 MiB pipe: fs.pipe-max-size raised for the test (root)."""
    knob = "/proc/sys/fs/pipe-max-size"
    with open(knob) as f:
        old = f.read().strip()
    with open(knob, "w") as f:
        f.write(str(4 << 20))
    try:
        yield
    finally:
        with open(knob, "w") as f:
            f.write(old)


def main():
    args = itest.parse_args()
    checks = itest.Checks(args.only)
    with pipes_of_4_mib():
        checks.run("a writer waits for spliced READs, then they fail, never mixed",
                   writer_while_spliced, args)
        checks.run("a source open for writing at mount is never spliced",
                   unleased_stays_gathered, args)
    checks.finish()


if __name__ == "__main__":
    main()
