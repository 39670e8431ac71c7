"""The `ckptfs mount` options as a user types them: -o cache (shared mmap works), the default
direct I/O mode (shared mmap where the kernel allows it), -o noreadahead and max_threads=N, -o splice=always and
splicing chosen per READ (the default, -o splice), -o nosplice, a libfuse option, a bad -o value, and -f, which serves until
Ctrl-C and then unmounts."""

import concurrent.futures
import errno
import itertools
import mmap
import os
import re
import signal
import subprocess
import time

import itest
import ckpt_fixture
from ckptfix.builtins import case, lay, param, side


def setup(args, name):
    work = os.path.join(args.work, name)
    fx = ckpt_fixture.make_builtin("8to4_dtypes", os.path.join(work, "fixture"))
    kwargs = dict(src_strategy=fx.src_strategy, dst_strategy=fx.dst_strategy,
                  index_dir=os.path.join(work, "index"), log_file=os.path.join(work, "log"))
    return work, fx, os.path.join(work, "mnt"), kwargs


def mounted_path(mnt, expected_path, rank):
    return os.path.join(mnt, f"rank_{rank}", os.path.basename(expected_path))


def map_shared(path):
    """The whole file through a MAP_SHARED mapping, or the errno of the refusal."""
    with open(path, "rb") as f:
        try:
            m = mmap.mmap(f.fileno(), 0, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ)
        except OSError as e:
            return e.errno
        with m:
            return bytes(m)


def check_all_files(fx, mnt):
    problems = ckpt_fixture.compare_tree(fx, mnt)
    assert not problems, "\n".join(problems)


def cache_mode(args):
    work, fx, mnt, kwargs = setup(args, "cache")
    with itest.mounted(args.ckptfs, fx.src_dir, mnt, options="cache", **kwargs):
        check_all_files(fx, mnt)
        for rank, path in fx.expected_files().items():
            got = map_shared(mounted_path(mnt, path, rank))
            assert got == itest.read_file(path), f"rank {rank}: shared mapping differs"
        check_all_files(fx, mnt)  # re-read, now from the page cache


def direct_mode_shared_mmap(args):
    """The default direct I/O mode maps shared where the kernel takes
    FUSE_DIRECT_IO_ALLOW_MMAP (the daemon says so when it starts), and refuses with ENODEV
    elsewhere."""
    work, fx, mnt, kwargs = setup(args, "direct")
    with itest.mounted(args.ckptfs, fx.src_dir, mnt, log_level="info", **kwargs):
        rank, path = sorted(fx.expected_files().items())[0]
        got = map_shared(mounted_path(mnt, path, rank))
        with open(kwargs["log_file"]) as f:
            mappable = "direct_io files may be mapped" in f.read()
        if mappable:
            assert got == itest.read_file(path), f"rank {rank}: shared mapping differs"
        else:
            assert got == errno.ENODEV, f"expected ENODEV for a shared mapping, got {got!r:.80}"
        check_all_files(fx, mnt)


# 8 MiB over two source ranks merged into one file: enough 1 MiB blocks to read ahead.
STREAM_CASE = case(
    "options_stream", "2 -> 1 rows, 8 MiB", side(2), None,
    [param("w", "Float32", [2048, 1024], lay([2], [0, -1]), None)], [])


def closing_counts(log):
    """(reads served from blocks read ahead, blocks read ahead, reads spliced) from the daemon's
    closing log line, written as it exits just after the unmount."""
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        with open(log) as f:
            closing = [line for line in f if "fuse: served" in line]
        if closing:
            found = re.search(r"\((\d+) from (\d+) blocks read ahead\), (\d+) spliced",
                              closing[-1])
            assert found, closing[-1]
            return tuple(int(g) for g in found.groups())
        time.sleep(0.05)
    raise AssertionError(f"no closing line in {log}")


def read_ahead_counts(args, name, options):
    """Reads the merged file front to back in 1 MiB chunks; returns (reads served from blocks
    read ahead, blocks read ahead, reads spliced) from the daemon's closing log line."""
    work = os.path.join(args.work, name)
    fx = ckpt_fixture.make(STREAM_CASE, os.path.join(work, "fixture"))
    mnt, log = os.path.join(work, "mnt"), os.path.join(work, "log")
    with itest.mounted(args.ckptfs, fx.src_dir, mnt, src_strategy=fx.src_strategy,
                       index_dir=os.path.join(work, "index"), log_file=log, log_level="info",
                       options=options):
        rank, path = sorted(fx.expected_files().items())[0]
        with open(mounted_path(mnt, path, rank), "rb", buffering=0) as f:
            got = b"".join(iter(lambda: f.read(1 << 20), b""))
        assert got == itest.read_file(path), "the merged file differs"
    return closing_counts(log)


def no_read_ahead(args):
    hits, blocks, spliced = read_ahead_counts(args, "readahead", None)
    assert hits > 0 and blocks > 0, f"default mount: {hits} reads from {blocks} blocks ahead"
    assert spliced == 0, f"default mount: {spliced} reads spliced"
    hits, blocks, _ = read_ahead_counts(args, "noreadahead", "noreadahead,max_threads=2")
    assert (hits, blocks) == (0, 0), f"noreadahead: {hits} reads from {blocks} blocks ahead"


def splice_always(args):
    """-o splice=always: the same bytes (compared in read_ahead_counts), the long row runs
    spliced, and read-ahead left with the file's short tail only: it skips blocks that will be
    spliced."""
    hits, blocks, spliced = read_ahead_counts(args, "splice", "splice=always")
    # 8 MiB in 512 KiB READs (1 MiB ones where pipes may hold 2 MiB).
    assert spliced >= 8, f"-o splice=always: only {spliced} reads spliced"
    assert blocks <= 1, f"-o splice=always: {blocks} blocks read ahead"


# 2 -> 2 with the same row split: each target file is one source's rows, 32 MiB.
PAIR_CASE = case(
    "options_pair", "2 -> 2 rows, 2 x 32 MiB", side(2), side(2),
    [param("w", "Float32", [16384, 1024], lay([2], [0, -1]), lay([2], [0, -1]))], [])


def read_whole(path):
    with open(path, "rb", buffering=0) as f:
        return b"".join(iter(lambda: f.read(1 << 20), b""))


def read_halves(path):
    """Two threads read one open file, each half of it in 1 MiB preads (a loader with two
    threads): one file handle, so only the READs in flight tell that two readers read."""
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        half = size // 2

        def part(start, end):
            chunks = []
            while start < end:
                chunks.append(os.pread(fd, min(1 << 20, end - start), start))
                start += len(chunks[-1])
                assert chunks[-1], f"{path}: short read at {start}"
            return b"".join(chunks)

        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            parts = list(pool.map(lambda r: part(*r), [(0, half), (half, size)]))
        return parts[0] + parts[1]
    finally:
        os.close(fd)


def splice_when_busy(args):
    """Where pipes may hold 2 MiB (fs.pipe-max-size raised; root may), the default mount (and
    -o splice, -o splice=auto) splices READs while another READ is served too, whether the
    readers read two files or two threads read one file, and gathers those of a lone reader;
    with -o nosplice or -o splice=never nothing is spliced."""
    knob = "/proc/sys/fs/pipe-max-size"
    with open(knob) as f:
        old = f.read().strip()
    work = os.path.join(args.work, "auto_splice")
    fx = ckpt_fixture.make(PAIR_CASE, os.path.join(work, "fixture"))
    files = sorted(fx.expected_files().items())
    mounts = itertools.count()

    def spliced(options, readers, one_file=False):
        n = next(mounts)
        mnt, log = os.path.join(work, f"mnt{n}"), os.path.join(work, f"log{n}")
        with itest.mounted(args.ckptfs, fx.src_dir, mnt, src_strategy=fx.src_strategy,
                           dst_strategy=fx.dst_strategy, index_dir=os.path.join(work, "index"),
                           log_file=log, log_level="info", options=options):
            if one_file:
                rank, path = files[0]
                data = read_halves(mounted_path(mnt, path, rank))
                assert data == itest.read_file(path), f"rank {rank} differs (2 threads)"
            else:
                paths = [mounted_path(mnt, path, rank) for rank, path in files[:readers]]
                with concurrent.futures.ThreadPoolExecutor(readers) as pool:
                    got = list(pool.map(read_whole, paths))
                for (rank, path), data in zip(files, got):
                    assert data == itest.read_file(path), f"rank {rank} differs ({readers} readers)"
        return closing_counts(log)[2]

    def tries(*how):
        # "Busy" is another READ served within the last 2 ms. Slowed down by a sanitizer on a
        # loaded machine, the two readers' READs can keep out of step for a whole file (once
        # in four TSan runs here), so that try proves nothing: up to three tries.
        got = [spliced(*how)]
        while got[-1] == 0 and len(got) < 3:
            got.append(spliced(*how))
        return got

    try:
        with open(knob, "w") as f:
            f.write(str(4 << 20))
        lone = spliced(None, 1)
        assert lone == 0, f"default mount: a lone reader had {lone} reads spliced"
        busy = tries("splice", 2)
        assert busy[-1] > 0, \
            f"-o splice: two readers at once had no read spliced in {len(busy)} tries"
        # One file handle: told apart from a lone reader by the READs in flight alone.
        one_file = tries("splice", 2, True)
        assert one_file[-1] > 0, \
            f"two threads reading one file had no read spliced in {len(one_file)} tries"
        # The default chooses per READ too, as its sources hold read leases.
        default = tries(None, 2)
        assert default[-1] > 0, \
            f"default mount: two readers at once had no read spliced in {len(default)} tries"
        auto_named = tries("splice=auto", 2)
        assert auto_named[-1] > 0, "-o splice=auto: two readers had no read spliced"
        never = spliced("splice=never", 2)
        assert never == 0, f"-o splice=never: two readers had {never} reads spliced"
        never = spliced("nosplice", 2)
        assert never == 0, f"-o nosplice: two readers had {never} reads spliced"
    finally:
        with open(knob, "w") as f:
            f.write(old)


def libfuse_option(args):
    """A word ckptfs does not know goes to libfuse: allow_other shows in the mount's options."""
    work, fx, mnt, kwargs = setup(args, "allow_other")
    with itest.mounted(args.ckptfs, fx.src_dir, mnt, options="allow_other", **kwargs):
        with open("/proc/self/mounts") as mounts:
            line = next(l for l in mounts if l.split()[1] == os.path.realpath(mnt))
        options = line.split()[3].split(",")
        assert "allow_other" in options and "ro" in options, line
        check_all_files(fx, mnt)


def log_while_serving(args):
    """--log-file holds the info lines as they happen, not only after unmount."""
    work, fx, mnt, kwargs = setup(args, "log_now")
    with itest.mounted(args.ckptfs, fx.src_dir, mnt, log_level="info", **kwargs):
        check_all_files(fx, mnt)
        with open(kwargs["log_file"]) as f:
            text = f.read()
        assert "fuse: protocol" in text, f"log while mounted: {text!r}"


def bad_option_value(args):
    work, fx, mnt, kwargs = setup(args, "bad_value")
    proc = itest.refused_mount(args.ckptfs, fx.src_dir, mnt, options="max_threads=many", **kwargs)
    lines = itest.stderr_lines(proc)
    assert len(lines) == 1 and "max_threads=many" in lines[0], proc.stderr


def foreground(args):
    work, fx, mnt, kwargs = setup(args, "foreground")
    os.makedirs(mnt, exist_ok=True)
    kwargs.pop("log_file")  # in the foreground the log goes to stderr
    cmd = itest.mount_cmd(args.ckptfs, fx.src_dir, mnt, **kwargs) + ["-f"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not itest.is_mounted(mnt):
            assert proc.poll() is None, f"mount -f exited {proc.returncode}: {proc.stderr.read()}"
            assert time.monotonic() < deadline, "no mount after 60 s"
            time.sleep(0.05)
        check_all_files(fx, mnt)
        assert proc.poll() is None, "mount -f returned while mounted"
        proc.send_signal(signal.SIGINT)  # Ctrl-C
        _, err = proc.communicate(timeout=30)
        assert proc.returncode == 0, f"mount -f exited {proc.returncode} on Ctrl-C: {err}"
        assert not itest.is_mounted(mnt), "Ctrl-C left the mount behind"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        itest.unmount(args.ckptfs, mnt)


def main():
    args = itest.parse_args()
    checks = itest.Checks(args.only)
    checks.run("-o cache: shared mmap and re-reads", cache_mode, args)
    checks.run("default direct I/O: shared mmap where the kernel allows it",
               direct_mode_shared_mmap, args)
    checks.run("read-ahead by default, none with -o noreadahead,max_threads=2", no_read_ahead,
               args)
    checks.run("-o splice=always serves long runs by splice", splice_always, args)
    checks.run("2 MiB pipes: splice for concurrent READs only", splice_when_busy, args)
    checks.run("-o allow_other goes to libfuse", libfuse_option, args)
    checks.run("--log-file written while serving", log_while_serving, args)
    checks.run("bad -o value", bad_option_value, args)
    checks.run("-f serves until Ctrl-C", foreground, args)
    checks.finish()


if __name__ == "__main__":
    main()
