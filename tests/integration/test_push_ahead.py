"""Push-ahead (-o pushahead): a file read through the page cache (here the .safetensors view,
mapped) gets the pages ahead of its reader's faults pushed into the kernel's page cache by the
daemon. The mapped bytes equal the generator's expected view; pushing stays within its window
of the reader; after a source changes, nothing more is pushed, every byte read is either the
mount time's or EIO, and the log names the source; the daemon's memory does not grow with the
bytes pushed; a bad value is refused in one line, pushahead=0 pushes nothing."""

import errno
import mmap
import os
import re
import time

import itest
import ckpt_fixture
from ckptfix.builtins import case, lay, param, side

MIB = 1 << 20
WINDOW = 4 * MIB
# 2 -> 1 rows: one merged file of 32 MiB, its first half from rank 0's file.
CASE = case(
    "push_ahead", "2 -> 1 rows, 32 MiB", side(2), None,
    [param("w", "Float32", [8192, 1024], lay([2], [0, -1]), None)], [])


def setup(args, name):
    work = os.path.join(args.work, name)
    fx = ckpt_fixture.make(CASE, os.path.join(work, "fixture"))
    kwargs = dict(src_strategy=fx.src_strategy, index_dir=os.path.join(work, "index"),
                  log_file=os.path.join(work, "log"), log_level="info")
    rank, path = sorted(fx.expected_safetensors_files().items())[0]
    view = lambda mnt: os.path.join(mnt, f"rank_{rank}", os.path.basename(path))  # noqa: E731
    return work, fx, os.path.join(work, "mnt"), kwargs, view, itest.read_file(path)


def pushed_mib(log):
    """The MiB the unmount line says were pushed."""
    with open(log) as f:
        found = re.findall(r"(\d+) MiB pushed into it ahead", f.read())
    assert found, f"{log}: no unmount line"
    return int(found[-1])


def settle(pid):
    """Waits until the daemon has used no CPU for 0.2 s: its pushes are done."""
    def ticks():
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return int(fields[11]) + int(fields[12])
    last = ticks()
    for _ in range(100):
        time.sleep(0.2)
        now = ticks()
        if now == last:
            return
        last = now


def mapped_bytes(args):
    work, fx, mnt, kwargs, view, want = setup(args, "mapped")
    with itest.mounted(args.ckptfs, fx.src_dir, mnt, options=f"pushahead={WINDOW}", **kwargs):
        (pid,) = itest.daemon_pids(args.ckptfs, mnt)
        with open(view(mnt), "rb") as f, mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ) as m:
            assert len(m) == len(want) > 4 * WINDOW
            assert m[:4096] == want[:4096]  # a fault: its READ starts the pushes
            settle(pid)
            # Read in steps, each a pause: the pushes run ahead of the faults.
            for at in range(0, len(want), MIB):
                assert m[at:at + MIB] == want[at:at + MIB], f"mapped bytes differ at {at}"
    pushed = pushed_mib(kwargs["log_file"])
    # Most of the file arrived pushed, not read by faults; never more than the file.
    assert len(want) // (2 * MIB) <= pushed <= len(want) // MIB, pushed


def stays_in_window(args):
    work, fx, mnt, kwargs, view, want = setup(args, "window")
    with itest.mounted(args.ckptfs, fx.src_dir, mnt, options=f"pushahead={WINDOW}", **kwargs):
        (pid,) = itest.daemon_pids(args.ckptfs, mnt)
        with open(view(mnt), "rb") as f, mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ) as m:
            assert m[:4096] == want[:4096]
            settle(pid)
    pushed = pushed_mib(kwargs["log_file"])
    # The first READ (up to 1 MiB of the kernel's readahead) plus the window.
    assert 1 <= pushed <= WINDOW // MIB + 1, pushed


def source_changed(args):
    work, fx, mnt, kwargs, view, want = setup(args, "changed")
    victim = os.path.realpath(fx.source_files[0])
    with itest.mounted(args.ckptfs, fx.src_dir, mnt, options=f"pushahead={WINDOW}", **kwargs):
        (pid,) = itest.daemon_pids(args.ckptfs, mnt)
        with open(view(mnt), "rb") as f, mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ) as m:
            assert m[:4096] == want[:4096]
            settle(pid)
            # Opened once mapped, so read through the page cache; before the change, as an
            # open after it fails.
            g = open(view(mnt), "rb", buffering=0)
            time.sleep(0.02)  # past the ctime's clock tick
            size = os.path.getsize(victim)
            # Most of the second half of rank 0's rows (about 10-15 MiB of the view), past the
            # window: a push that gathered them after the change would show them.
            with open(victim, "r+b") as v:
                v.seek(size - 6 * MIB)
                v.write(b"\xff" * (5 * MIB))
            fd = g.fileno()
            # Past the window (not pushed): the READ fails, and so does the push after it.
            try:
                os.pread(fd, 4096, 3 * WINDOW)
                raise AssertionError("a read past the window after the change succeeded")
            except OSError as e:
                assert e.errno == errno.EIO, e
            settle(pid)
            eio = 0
            for at in range(0, len(want), MIB):
                try:
                    got = os.pread(fd, MIB, at)
                except OSError as e:
                    assert e.errno == errno.EIO, e
                    eio += 1
                    continue
                assert got == want[at:at + MIB], f"bytes at {at} are neither old nor EIO"
            assert eio > 0
            g.close()
    # Pushed: the window after the first fault, nothing after the change.
    assert pushed_mib(kwargs["log_file"]) <= WINDOW // MIB + 1
    with open(kwargs["log_file"]) as f:
        text = f.read()
    assert victim in text, "the log does not name the changed source"
    assert "push-ahead of inode" in text and "stopped" in text, text


def memory_bounded(args):
    work, fx, mnt, kwargs, view, want = setup(args, "memory")
    with itest.mounted(args.ckptfs, fx.src_dir, mnt, options=f"pushahead={WINDOW}", **kwargs):
        (pid,) = itest.daemon_pids(args.ckptfs, mnt)
        base = itest.status_kib(pid, "VmRSS") * 1024
        file_base = itest.status_kib(pid, "RssFile") * 1024
        with open(f"/proc/{pid}/clear_refs", "w") as f:
            f.write("5")  # resets VmHWM to the current RSS
        with open(view(mnt), "rb") as f, mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ) as m:
            for at in range(0, len(want), MIB):
                assert m[at:at + MIB] == want[at:at + MIB], f"mapped bytes differ at {at}"
                time.sleep(0.005)
        settle(pid)
        grown = itest.status_kib(pid, "VmHWM") * 1024 - base
        # The sources' pages the daemon maps count too; they are the page cache's, not its own.
        mapped = itest.status_kib(pid, "RssFile") * 1024 - file_base
        print(f"     -> daemon peak RSS +{grown / MIB:.1f} MiB, of it source pages mapped "
              f"{mapped / MIB:.1f} MiB", flush=True)
        assert grown - max(mapped, 0) <= 16 * MIB, (grown, mapped)
    assert pushed_mib(kwargs["log_file"]) >= len(want) // (2 * MIB)


def bad_value_and_off(args):
    work, fx, mnt, kwargs, view, want = setup(args, "off")
    for bad in ["pushahead=lots", "pushahead=-1"]:
        quiet = {k: v for k, v in kwargs.items() if k != "log_level"}
        proc = itest.refused_mount(args.ckptfs, fx.src_dir, mnt, options=bad, **quiet)
        lines = itest.stderr_lines(proc)
        assert len(lines) == 1 and bad in lines[0], proc.stderr
    with itest.mounted(args.ckptfs, fx.src_dir, mnt, options="pushahead=0", **kwargs):
        with open(view(mnt), "rb") as f, mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ) as m:
            assert m[:] == want
    assert pushed_mib(kwargs["log_file"]) == 0


def main():
    args = itest.parse_args()
    checks = itest.Checks(args.only)
    checks.run("a mapped file read with push-ahead has the expected bytes", mapped_bytes, args)
    checks.run("pushes stay within the window of the reader's last fault", stays_in_window, args)
    checks.run("a changed source: pushing stops, reads are old bytes or EIO", source_changed, args)
    checks.run("the daemon's peak memory does not grow with the bytes pushed", memory_bounded,
               args)
    checks.run("-o pushahead: a bad value is refused, 0 pushes nothing", bad_value_and_off, args)
    checks.finish()


if __name__ == "__main__":
    main()
