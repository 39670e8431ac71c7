"""What the index is trusted with, and what becomes of a command when the index cannot be.

* A shipped index (`index build --output`, `mount --index`) compares a source's size and mtime,
  which a rewrite in place can keep (names of two same-shaped tensors swapped, the mtime put
  back): the source's headers are checked against the index before a scan of it is used, so
  the mount is refused (planned at mount) or the rank's files fail with EIO and one log line
  (planned on first open), never served from the stale layout. A fresh mount of the rewritten
  source shows that the rewrite changes the served bytes.
* An index directory on a full filesystem: mount, index build and index list warn (or work)
  and go on; `index build --output` fails in one line. Never a signal.
* A damaged data.mdb (page headers, meta pages, a truncated file): no command crashes; a mount
  warns once and scans, `index clear` removes it.
"""

import errno
import os
import struct

import itest
import ckpt_fixture
from ckptfix.builtins import as_safetensors, case, lay, param, side

# Two same-shaped tensors of equal-length names in every source file: swapping their names
# keeps each file's size.
TWINS = case("twins", "two same-shaped tensors, 2 -> 1", side(2), side(1),
             [param("layer.wq", "Float32", [8, 4], lay([2], [0, -1]), lay([1], [-1, -1])),
              param("layer.wk", "Float32", [8, 4], lay([2], [0, -1]), lay([1], [-1, -1]))])
SIGNALS = (-6, -7, -11, 134, 135, 139)


def make_twins(args, name, safetensors=False):
    spec = as_safetensors(TWINS) if safetensors else TWINS
    return ckpt_fixture.make(spec, os.path.join(args.work, name, "fixture"))


def swap_names(path, a=b"layer.wq", b=b"layer.wk"):
    """Swaps two equal-length names in a file's headers, keeping its size and mtime (and atime):
    a rewrite in place no timestamp shows."""
    path = os.path.realpath(path)
    st = os.stat(path)
    with open(path, "rb") as f:
        data = f.read()
    assert data.count(a) == 1 and data.count(b) == 1, (path, data.count(a), data.count(b))
    data = data.replace(a, b"\0" * len(a)).replace(b, a).replace(b"\0" * len(a), b)
    with open(path, "r+b") as f:
        f.write(data)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert os.stat(path).st_size == st.st_size
    return path


def target_bytes(fx, mnt):
    name = os.path.basename(fx.expected_files()[0])
    return itest.read_file(os.path.join(mnt, "rank_0", name))


def fresh_mount_differs(args, fx, work):
    """A mount of the rewritten sources without the shipped index serves other bytes than the
    fixture's expected ones (so a stale layout would be wrong bytes), and those of the rewrite:
    the sources' names now say the other tensor."""
    mnt = os.path.join(work, "fresh")
    with itest.mounted(args.ckptfs, fx.src_dir, mnt, src_strategy=fx.src_strategy,
                       dst_strategy=fx.dst_strategy, index_dir=os.path.join(work, "cache")):
        fresh = target_bytes(fx, mnt)
    assert fresh != itest.read_file(fx.expected_files()[0]), "the swap changes nothing served"


def shipped_rewrite_at_mount(args, safetensors):
    fx = make_twins(args, "st_eager" if safetensors else "eager", safetensors)
    work = os.path.dirname(fx.src_dir)
    idx = os.path.join(work, "idx")
    itest.run([args.ckptfs, "index", "build", fx.src_dir, "--output", idx, "-q"])
    mnt = os.path.join(work, "mnt")
    with itest.mounted(args.ckptfs, fx.src_dir, mnt, src_strategy=fx.src_strategy,
                       dst_strategy=fx.dst_strategy, extra_args=["--index", idx]):
        assert not ckpt_fixture.compare_tree(fx, mnt)
    victim = swap_names(fx.source_files[1])
    fresh_mount_differs(args, fx, work)
    proc = itest.refused_mount(args.ckptfs, fx.src_dir, mnt, src_strategy=fx.src_strategy,
                               dst_strategy=fx.dst_strategy, extra_args=["--index", idx])
    lines = itest.stderr_lines(proc)
    assert len(lines) == 1 and victim in lines[0] and "rebuild" in lines[0], proc.stderr


def shipped_rewrite_ckpt(args):
    """.ckpt sources, planned at mount: refused in one line naming the rewritten file."""
    shipped_rewrite_at_mount(args, safetensors=False)


def shipped_rewrite_safetensors(args):
    """.safetensors sources (names swapped in the JSON header): the same."""
    shipped_rewrite_at_mount(args, safetensors=True)


def shipped_rewrite_lazy(args):
    """Ranks listed from the index's summaries and planned on first open: the mount lists them
    (sizes are unchanged), the first open fails with EIO, and the log names the file once."""
    fx = make_twins(args, "lazy")
    work = os.path.dirname(fx.src_dir)
    idx = os.path.join(work, "idx")
    itest.run([args.ckptfs, "index", "build", fx.src_dir, "--output", idx, "--src-strategy",
               fx.src_strategy, "--dst-strategy", fx.dst_strategy, "-q"])
    victim = swap_names(fx.source_files[0])
    fresh_mount_differs(args, fx, work)
    mnt, log = os.path.join(work, "mnt"), os.path.join(work, "mount.log")
    with itest.mounted(args.ckptfs, fx.src_dir, mnt, src_strategy=fx.src_strategy,
                       dst_strategy=fx.dst_strategy,
                       extra_args=["--index", idx, "--log-file", log]):
        try:
            target_bytes(fx, mnt)
            raise AssertionError("a rank planned from a stale scan was served")
        except OSError as e:
            assert e.errno == errno.EIO, e
    named = [line for line in open(log) if victim in line]
    assert len(named) == 1 and "rebuild" in named[0], open(log).read()


def full_tmpfs(path, size="64k"):
    """A tmpfs at `path` with no free block left."""
    os.makedirs(path, exist_ok=True)
    itest.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", path])
    try:
        with open(os.path.join(path, "filler"), "wb") as f:
            while True:
                f.write(b"\0" * 4096)
                f.flush()
    except OSError as e:
        assert e.errno == errno.ENOSPC, e


def no_signal(what, proc):
    assert proc.returncode not in SIGNALS, f"{what}: killed ({proc.returncode}): {proc.stderr}"


def warnings(proc, src_dir):
    """A command's stderr lines but the mount's summary of the step it serves."""
    return [line for line in itest.stderr_lines(proc)
            if not line.startswith(f"ckptfs: {src_dir}: ")]


def index_on_full_disk(args):
    """The index directory on a full tmpfs: a mount warns once and serves every byte, index
    build (the cache) warns and scans, index list works; index build --output fails in one line
    naming its directory."""
    fx = ckpt_fixture.make_builtin("demo", os.path.join(args.work, "full", "fixture"))
    disk = os.path.join(args.work, "full", "disk")
    full_tmpfs(disk)
    try:
        index = os.path.join(disk, "index")
        listing = itest.run([args.ckptfs, "index", "list", "--index-dir", index], check=False)
        no_signal("index list", listing)
        assert listing.returncode == 0, listing.stderr
        built = itest.run([args.ckptfs, "index", "build", fx.src_dir, "--index-dir", index],
                          check=False)
        no_signal("index build", built)
        assert built.returncode == 0 and len(itest.stderr_lines(built)) == 1, built.stderr
        assert "No space left" in built.stderr, built.stderr
        shipped = os.path.join(disk, "shipped")
        out = itest.run([args.ckptfs, "index", "build", fx.src_dir, "--output", shipped],
                        check=False)
        no_signal("index build --output", out)
        lines = itest.stderr_lines(out)
        assert out.returncode == 1 and len(lines) == 1 and shipped in lines[0], out.stderr
        mnt = os.path.join(args.work, "full", "mnt")
        cmd = itest.mount_cmd(args.ckptfs, fx.src_dir, mnt, src_strategy=fx.src_strategy,
                              dst_strategy=fx.dst_strategy, index_dir=index)
        os.makedirs(mnt, exist_ok=True)
        proc = itest.run(cmd, check=False)
        no_signal("mount", proc)
        try:
            assert proc.returncode == 0, proc.stderr
            assert len(warnings(proc, fx.src_dir)) == 1, proc.stderr
            problems = ckpt_fixture.compare_tree(fx, mnt)
            assert not problems, problems
        finally:
            itest.unmount(args.ckptfs, mnt)
    finally:
        itest.run(["umount", disk])


PAGE = 4096


def page_of(data, flag):
    """The number of the first page past the meta pages whose header has `flag` (2: leaf,
    1: branch) in mp_flags, LMDB's page header being pgno (8), pad (2), flags (2), lower (2),
    upper (2)."""
    for pgno in range(2, len(data) // PAGE):
        (flags,) = struct.unpack_from("<H", data, pgno * PAGE + 10)
        if flags & 0xff == flag:
            return pgno
    return None


def damage(path, how):
    with open(path, "rb") as f:
        data = bytearray(f.read())
    if how == "truncated":
        os.truncate(path, len(data) // 2 if len(data) > 3 * PAGE else PAGE + 100)
        return
    # Every leaf page: the first may be an old copy on the free list, which LMDB never reads.
    leaves = [p for p in range(2, len(data) // PAGE)
              if struct.unpack_from("<H", data, p * PAGE + 10)[0] == 2]
    if how == "page 5 mp_lower 4000":
        struct.pack_into("<H", data, 5 * PAGE + 12, 4000)
    elif how == "leaf mp_lower 4000":
        for p in leaves:
            struct.pack_into("<H", data, p * PAGE + 12, 4000)
    elif how == "leaf mp_upper 2":
        for p in leaves:
            struct.pack_into("<H", data, p * PAGE + 14, 2)
    elif how == "leaf node offset":
        for p in leaves:
            struct.pack_into("<H", data, p * PAGE + 16, 0xfff0)
    elif how == "branch flags":
        pgno = page_of(data, 1) or page_of(data, 2)
        struct.pack_into("<H", data, pgno * PAGE + 10, 0x7f)
    elif how == "meta roots":
        # Both meta pages: the main database's root page number far past the end of the file.
        for meta in (0, 1):
            # PAGEHDRSZ 16, magic 4, version 4, address 8, mapsize 8, then MDB_db free (48),
            # MDB_db main (48) whose md_root is its last 8 bytes.
            struct.pack_into("<Q", data, meta * PAGE + 16 + 24 + 48 + 40, 1 << 40)
    elif how == "meta last page":
        for meta in (0, 1):
            struct.pack_into("<Q", data, meta * PAGE + 16 + 24 + 96, 1 << 50)
    else:
        raise ValueError(how)
    with open(path, "r+b") as f:
        f.write(bytes(data))


DAMAGES = ["page 5 mp_lower 4000", "leaf mp_lower 4000", "leaf mp_upper 2", "leaf node offset",
           "branch flags", "meta roots", "meta last page", "truncated"]


def damaged_pages(args):
    """Each kind of damage to a built index's data.mdb: `index list` and `index build` exit
    without a signal; a mount warns once (naming the index and `index clear`) and scans, or,
    for damage to a page LMDB does not read, says nothing; either way it serves every byte the
    generator expects; `index clear` removes it and the next build starts
    afresh. Every damage is tried; the problems are reported together."""
    fx = ckpt_fixture.make_builtin("8to4_dtypes", os.path.join(args.work, "damaged", "fixture"))
    problems = []
    for how in DAMAGES:
        index = os.path.join(args.work, "damaged", how.replace(" ", "_"))
        itest.run([args.ckptfs, "index", "build", fx.src_dir, "--index-dir", index, "-q"])
        # Intact, it is read without a word (the probe finds nothing wrong in a sound index).
        intact = itest.run([args.ckptfs, "index", "list", "--index-dir", index])
        assert f"{len(fx.source_files)} files in" in intact.stdout and not intact.stderr, intact
        damage(os.path.join(index, "data.mdb"), how)
        listing = itest.run([args.ckptfs, "index", "list", "--index-dir", index], check=False)
        if listing.returncode in SIGNALS:
            problems.append(f"{how}: index list killed ({listing.returncode})")
        mnt = os.path.join(args.work, "damaged", "mnt")
        os.makedirs(mnt, exist_ok=True)
        with itest.unmounting(args.ckptfs, mnt):
            proc = itest.run(itest.mount_cmd(args.ckptfs, fx.src_dir, mnt,
                                             src_strategy=fx.src_strategy,
                                             dst_strategy=fx.dst_strategy, index_dir=index),
                             check=False)
            lines = warnings(proc, fx.src_dir)
            if proc.returncode != 0:
                problems.append(f"{how}: mount exited {proc.returncode}: {proc.stderr.strip()}")
            elif lines and not (len(lines) == 1 and index in lines[0] and
                                "index clear" in lines[0]):
                problems.append(f"{how}: mount did not warn once: {lines}")
            else:  # damage LMDB never reads (a free or overflow page) needs no word
                problems += [f"{how}: {p}" for p in ckpt_fixture.compare_tree(fx, mnt)]
        built = itest.run([args.ckptfs, "index", "build", fx.src_dir, "--index-dir", index],
                          check=False)
        if built.returncode in SIGNALS:
            problems.append(f"{how}: index build killed ({built.returncode})")
        damage(os.path.join(index, "data.mdb"), how)
        cleared = itest.run([args.ckptfs, "index", "clear", "--index-dir", index], check=False)
        if cleared.returncode != 0:
            problems.append(f"{how}: index clear exited {cleared.returncode}: {cleared.stderr}")
            continue
        built = itest.run([args.ckptfs, "index", "build", fx.src_dir, "--index-dir", index])
        if "0 from the index" not in built.stdout:
            problems.append(f"{how}: the build after clear: {built.stdout}")
    assert not problems, "\n".join(problems)


def main():
    args = itest.parse_args()
    args.work = os.path.abspath(args.work)  # the daemon serves from "/"
    checks = itest.Checks(args.only)
    checks.run("shipped index, .ckpt rewritten in place: refused at mount", shipped_rewrite_ckpt,
               args)
    checks.run("shipped index, .safetensors rewritten in place: refused at mount",
               shipped_rewrite_safetensors, args)
    checks.run("shipped index with summaries, source rewritten in place: EIO on first open",
               shipped_rewrite_lazy, args)
    checks.run("index directory on a full tmpfs", index_on_full_disk, args)
    checks.run("damaged data.mdb pages", damaged_pages, args)
    checks.finish()


if __name__ == "__main__":
    main()
