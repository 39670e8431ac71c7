"""The daemon's read-ahead memory is bounded for the whole mount (-o readahead_max, 256 MiB by
default): 640 handles of one mounted file, each read half-way in 1 MiB reads (far past the
read that starts read-ahead) and kept open, raise the daemon's peak RSS by no more than the cap
and a margin; the half-read bytes are right; a file opened afterwards is still read ahead (blocks
of the idle handles are taken back); a bad value is refused in one line; readahead_max=0 turns
read-ahead off."""

import json
import os
import time

import itest
import ckpt_fixture
from ckptfix.builtins import case, lay, param, side

MIB = 1 << 20
HANDLES = 640
# 2 -> 1 rows: one merged file of 8 MiB.
CASE = case(
    "readahead_memory", "2 -> 1 rows, 8 MiB", side(2), None,
    [param("w", "Float32", [2048, 1024], lay([2], [0, -1]), None)], [])
DEFAULT_CAP = 256 * MIB
# Beyond the blocks read ahead: the reply buffers, the worker threads and their stacks, and the
# huge pages a freed block leaves half used (measured: 8-9 MiB). Under ASan, the quarantine of
# freed heap blocks and an eighth of what is touched for shadow memory (see margin()). TSan's
# own memory dwarfs the figure: its stage does not run this test.
MARGIN = 64 * MIB + (itest.ASAN_QUARANTINE_KIB * 1024 if itest.SANITIZED else 0)


def margin(cap):
    return MARGIN + (cap // 8 if itest.SANITIZED else 0)


def stats(mnt):
    with open(os.path.join(mnt, ".ckptfs", "stats.json")) as f:
        return json.load(f)


def setup(args, name):
    work = os.path.join(args.work, name)
    fx = ckpt_fixture.make(CASE, os.path.join(work, "fixture"))
    kwargs = dict(src_strategy=fx.src_strategy, index_dir=os.path.join(work, "index"),
                  log_file=os.path.join(work, "log"))
    rank, path = sorted(fx.expected_files().items())[0]
    return work, fx, os.path.join(work, "mnt"), kwargs, (rank, path)


def half_read_handles(args, name, options, handles, cap):
    """Opens `handles` handles of the merged file, reads each half-way and keeps it open; the
    daemon's peak RSS must grow by less than `cap` + MARGIN. Then a new handle is read whole,
    and must be served from blocks read ahead."""
    work, fx, mnt, kwargs, (rank, path) = setup(args, name)
    want = itest.read_file(path)
    half = len(want) // 2
    with itest.mounted(args.ckptfs, fx.src_dir, mnt, options=options, **kwargs):
        target = os.path.join(mnt, f"rank_{rank}", os.path.basename(path))
        pids = itest.daemon_pids(args.ckptfs, mnt)
        assert len(pids) == 1, f"daemon of {mnt}: {pids}"
        pid = pids[0]
        with open(target, "rb", buffering=0) as f:  # the daemon's first buffers, once
            f.read(2 * MIB)
        base = itest.status_kib(pid, "VmRSS") * 1024
        with open(f"/proc/{pid}/clear_refs", "w") as f:
            f.write("5")  # resets VmHWM to the current RSS
        fds = []
        try:
            for i in range(handles):
                fd = os.open(target, os.O_RDONLY)
                fds.append(fd)
                got = b"".join(os.read(fd, MIB) for _ in range(half // MIB))
                assert got == want[:len(got)], f"handle {i}: the first {len(got)} bytes differ"
                # Read-ahead waits while another file was read in the last 2 ms (the CPUs are
                # busy then); a loader moving from one file to the next is slower than that.
                time.sleep(0.003)
            time.sleep(0.3)  # the helpers finish the blocks queued last
            peak = itest.status_kib(pid, "VmHWM") * 1024
            grown = peak - base
            print(f"     -> {handles} half-read handles: daemon RSS {base / MIB:.0f} MiB before, "
                  f"peak {peak / MIB:.0f} MiB (+{grown / MIB:.0f} MiB; cap {cap / MIB:.0f} MiB)",
                  flush=True)
            assert grown <= cap + margin(cap), (
                f"{handles} half-read handles raised the daemon's RSS by {grown / MIB:.0f} MiB, "
                f"over the cap of {cap / MIB:.0f} MiB + {margin(cap) / MIB:.0f} MiB")
            before = stats(mnt)["read_ahead_hits"]
            with open(target, "rb", buffering=0) as f:
                got = b"".join(iter(lambda: f.read(MIB), b""))
            assert got == want, "the file read after the half-read ones differs"
            hits = stats(mnt)["read_ahead_hits"] - before
            assert hits >= 4, f"a file opened past the cap: only {hits} reads from read-ahead"
        finally:
            for fd in fds:
                os.close(fd)


def default_cap(args):
    half_read_handles(args, "default", None, HANDLES, DEFAULT_CAP)


def small_cap(args):
    half_read_handles(args, "small", "readahead_max=32M", 200, 32 * MIB)


def bad_value_and_off(args):
    work, fx, mnt, kwargs, (rank, path) = setup(args, "bad")
    for bad in ["readahead_max=lots", "readahead_max=-1", "readahead_max=12Q"]:
        proc = itest.refused_mount(args.ckptfs, fx.src_dir, mnt, options=bad, **kwargs)
        lines = itest.stderr_lines(proc)
        assert len(lines) == 1 and bad in lines[0], proc.stderr
    with itest.mounted(args.ckptfs, fx.src_dir, mnt, options="readahead_max=0", **kwargs):
        target = os.path.join(mnt, f"rank_{rank}", os.path.basename(path))
        with open(target, "rb", buffering=0) as f:
            got = b"".join(iter(lambda: f.read(MIB), b""))
        assert got == itest.read_file(path), "readahead_max=0: the file differs"
        s = stats(mnt)
        assert (s["read_ahead_hits"], s["read_ahead_blocks"]) == (0, 0), s


def main():
    args = itest.parse_args()
    checks = itest.Checks(args.only)
    checks.run(f"{HANDLES} half-read handles stay within the default cap", default_cap, args)
    checks.run("-o readahead_max=32M: 200 half-read handles stay within it", small_cap, args)
    checks.run("-o readahead_max: a bad value is refused, 0 turns read-ahead off",
               bad_value_and_off, args)
    checks.finish()


if __name__ == "__main__":
    main()
