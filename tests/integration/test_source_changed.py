"""A source file modified or truncated after mounting (also with its mtime put back, also through
a descriptor held after it was deleted): reads of the target files that use it fail with EIO,
until remount, and the log names the file; the other target files stay correct. A source
replaced by rename or deleted, and not written, keeps being served."""

import errno
import os
import time

import itest
import ckpt_fixture
from ckptfix.builtins import case, extra, lay, param, side

# dev [2,2]: rows split by the outer axis -> rows by the outer axis, columns by the inner one.
# MindSpore reads target t from source rank t alone, so rank 3 feeds target 3 only.
SPLIT_CASE = case(
    "changed_source", "dev [2,2] rows -> rows x cols", side(4), side(4),
    [param("w", "Float32", [8, 6], lay([2, 2], [1, -1]), lay([2, 2], [1, 0])),
     param("b", "BFloat16", [8, 4, 2], lay([2, 2], [1, -1, -1]), lay([2, 2], [1, 0, -1]))],
    [extra("global_step", "Int64", 5)])


def read_or_errno(path):
    try:
        return itest.read_file(path)
    except OSError as e:
        return e.errno


def check(args, how):
    work = os.path.join(args.work, how.replace(",", "").replace(" ", "_"))
    fx = ckpt_fixture.make(SPLIT_CASE, os.path.join(work, "fixture"))
    mnt = os.path.join(work, "mnt")
    log = os.path.join(work, "log")
    victim_rank = 3
    victim = os.path.realpath(fx.source_files[victim_rank])
    with itest.mounted(args.ckptfs, fx.src_dir, mnt, src_strategy=fx.src_strategy,
                       dst_strategy=fx.dst_strategy, index_dir=os.path.join(work, "index"),
                       log_file=log):
        files = {t["rank"]: (os.path.join(mnt, t["file"].replace("expected/", "")),
                             os.path.join(fx.outdir, t["file"]), victim_rank in t["rank_list"])
                 for t in fx.targets}
        assert any(a for _, _, a in files.values()) and not all(a for _, _, a in files.values())
        held = {t: open(m, "rb") for t, (m, _, _) in files.items()}  # opened before the change
        try:
            for t, (m, want, _) in files.items():
                assert itest.read_file(m) == itest.read_file(want)
            st = os.stat(victim)
            if how in ("modified", "modified, mtime put back"):
                time.sleep(0.02)  # past the ctime's clock tick
                with open(victim, "r+b") as f:
                    f.seek(os.path.getsize(victim) // 2)
                    f.write(b"\x00changed\x00")
                if how != "modified":  # as rsync -a --inplace or touch -r leave it
                    os.utime(victim, ns=(st.st_atime_ns, st.st_mtime_ns))
            elif how == "unlinked, written through a held descriptor, mtime put back":
                # A job rotating checkpoints deletes files the mount holds open; whoever still
                # holds a writable descriptor can rewrite one and put its mtime back (futimens).
                with open(victim, "r+b") as f:
                    os.unlink(victim)
                    time.sleep(0.02)  # past the ctime's clock tick
                    f.seek(os.fstat(f.fileno()).st_size // 2)
                    f.write(b"\x00changed\x00")
                    f.flush()
                    os.utime(f.fileno(), ns=(st.st_atime_ns, st.st_mtime_ns))
                    assert os.fstat(f.fileno()).st_mtime_ns == st.st_mtime_ns
            elif how == "touched, then put back":
                os.utime(victim, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
                assert read_or_errno(next(m for m, _, a in files.values() if a)) == errno.EIO
                os.utime(victim, ns=(st.st_atime_ns, st.st_mtime_ns))
            else:
                with open(victim, "r+b") as f:
                    f.truncate(os.path.getsize(victim) // 2)
            for t, (m, want, affected) in files.items():
                got = read_or_errno(m)
                held[t].seek(0)
                try:
                    got_held = held[t].read()
                except OSError as e:
                    got_held = e.errno
                if affected:
                    assert got == errno.EIO, f"rank {t}: expected EIO, got {type(got)}"
                    assert got_held == errno.EIO, f"rank {t} (open before): expected EIO"
                else:
                    assert got == itest.read_file(want), f"rank {t} (unaffected) differs"
                    assert got_held == itest.read_file(want)
        finally:
            for f in held.values():
                f.close()
    with open(log) as f:
        text = f.read()
    assert victim in text, f"log does not name {victim}:\n{text}"


def check_still_served(args, name, change):
    """After `change(victim)` the mount still holds the old file open and serves it: every target
    reads the bytes of the mount time and nothing fails."""
    work = os.path.join(args.work, name)
    fx = ckpt_fixture.make(SPLIT_CASE, os.path.join(work, "fixture"))
    mnt = os.path.join(work, "mnt")
    victim = os.path.realpath(fx.source_files[3])
    with itest.mounted(args.ckptfs, fx.src_dir, mnt, src_strategy=fx.src_strategy,
                       dst_strategy=fx.dst_strategy, index_dir=os.path.join(work, "index")):
        files = {t["rank"]: (os.path.join(mnt, t["file"].replace("expected/", "")),
                             os.path.join(fx.outdir, t["file"])) for t in fx.targets}
        change(victim)
        for t, (m, want) in files.items():
            got = read_or_errno(m)
            what = f"errno {got}" if isinstance(got, int) else "bytes differ"
            assert got == itest.read_file(want), f"rank {t}: {what}"


def rename_over(victim):
    """A new file of the same size, its second half different, renamed over the source."""
    replacement = victim + ".new"
    with open(victim, "rb") as f:
        data = bytearray(f.read())
    for i in range(len(data) // 2, len(data)):
        data[i] ^= 0xFF
    with open(replacement, "wb") as f:
        f.write(data)
    os.rename(replacement, victim)


def unlink(victim):
    """Deleted (a job rotating its checkpoints), never written again, though the unlink moved
    its ctime."""
    time.sleep(0.02)  # past the ctime's clock tick
    os.unlink(victim)


# 8 MiB of Float32 rows over two source ranks, served whole to one target: MiBs to stream.
STREAM_CASE = case(
    "changed_mid_stream", "2 -> 1 rows, 8 MiB", side(2), None,
    [param("w", "Float32", [2048, 1024], lay([2], [0, -1]), None)], [])


def check_mid_stream(args, how):
    """The source changes while a reader streams the target file 1 MiB at a time, with a block
    already read ahead: the next read fails with EIO, nothing read before differs from the
    expected bytes, and the daemon keeps serving."""
    work = os.path.join(args.work, "stream-" + how)
    fx = ckpt_fixture.make(STREAM_CASE, os.path.join(work, "fixture"))
    mnt = os.path.join(work, "mnt")
    # Rows 0-1023 of w: the first 4 MiB of the target, so the block read ahead holds bytes
    # gathered from the victim before it changed.
    victim = os.path.realpath(fx.source_files[0])
    with itest.mounted(args.ckptfs, fx.src_dir, mnt, src_strategy=fx.src_strategy,
                       index_dir=os.path.join(work, "index")):
        target = fx.targets[0]
        path = os.path.join(mnt, target["file"].replace("expected/", ""))
        want = itest.read_file(os.path.join(fx.outdir, target["file"]))
        with open(path, "rb", buffering=0) as f:
            head = f.read(1 << 20)  # sequential from 0: the next MiB is read ahead now
            assert head == want[:len(head)]
            time.sleep(0.2)  # let the helper finish that block, from the unchanged source
            with open(victim, "r+b") as v:
                if how == "truncated":
                    v.truncate(os.path.getsize(victim) // 2)
                else:
                    v.seek(100)
                    v.write(b"\x00changed\x00")
            try:
                # Exactly the block read ahead: it must not be served once its source changed.
                rest = f.read(1 << 20)
                raise AssertionError(f"read {len(rest)} more bytes after the change, no EIO")
            except OSError as e:
                assert e.errno == errno.EIO, f"expected EIO, got {e}"
        # The daemon is alive and still refuses the changed file, by open or by read.
        assert read_or_errno(path) == errno.EIO


def main():
    args = itest.parse_args()
    checks = itest.Checks(args.only)
    checks.run("source modified after mount", check, args, "modified")
    checks.run("source truncated after mount", check, args, "truncated")
    checks.run("source rewritten in place, mtime put back", check, args,
               "modified, mtime put back")
    checks.run("source touched, then its mtime put back", check, args, "touched, then put back")
    checks.run("source replaced by rename after mount", check_still_served, args, "renamed",
               rename_over)
    checks.run("source deleted after mount", check_still_served, args, "unlinked", unlink)
    checks.run("source deleted, then written through a held descriptor, mtime put back", check,
               args, "unlinked, written through a held descriptor, mtime put back")
    checks.run("source truncated while a reader streams", check_mid_stream, args, "truncated")
    checks.run("source modified while a reader streams", check_mid_stream, args, "modified")
    checks.finish()


if __name__ == "__main__":
    main()
