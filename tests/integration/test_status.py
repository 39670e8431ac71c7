"""What a mount is doing: MOUNTPOINT/.ckptfs/ (sources.json, plan/<dir>.json, stats.json, log),
the user.ckptfs.* extended attributes, and the daemon's info lines (first open, failed read).

The plan's extents are checked by preading the source files they name and comparing with the
record bytes found by the fixture tools' own parsers (ckptfix.ckptio for .ckpt, the JSON header
for .safetensors) in the files read through the mount and in the generator's expected files."""

import ctypes
import errno
import json
import os
import shutil
import struct
import time

import itest
import ckpt_fixture
from ckptfix import ckptio
from ckptfix import mindformers as mf


def demo(args, name, case="demo"):
    work = os.path.join(args.work, name)
    fx = ckpt_fixture.make_builtin(case, os.path.join(work, "fixture"))
    return work, fx


def kw(fx, work, **more):
    out = dict(src_strategy=fx.src_strategy, dst_strategy=fx.dst_strategy,
               index_dir=os.path.join(work, "index"))
    out.update(more)
    return out


def load_json(path):
    with open(path) as f:
        return json.load(f)


def records_of(data, name):
    """name -> (dtype, shape, content bytes) by the fixture tools' parsers."""
    out = {}
    if name.endswith(".safetensors"):
        (n,) = struct.unpack("<Q", data[:8])
        header = json.loads(data[8:8 + n])
        for key, t in header.items():
            if key == "__metadata__":
                continue
            b, e = t["data_offsets"]
            out[key] = (t["dtype"], t["shape"], data[8 + n + b:8 + n + e])
    elif name.endswith(".ckpt"):
        for r in ckptio.join_chunks(ckptio.parse_records(data)):
            out[r.tag] = (r.tensor_type, r.dims, r.content)
    return out


def extent_bytes(extent, sources, handles):
    """[(target offset, bytes)] of one extent, pread from its source file."""
    out = []
    for i in range(extent.get("count", 1)):
        at = extent["at"] + i * extent.get("at_stride", 0)
        if "hex" in extent:
            out.append((at, bytes.fromhex(extent["hex"])))
            continue
        path = sources[extent["file"]]
        if path not in handles:
            handles[path] = os.open(path, os.O_RDONLY)
        off = extent["offset"] + i * extent.get("stride", 0)
        out.append((at, os.pread(handles[path], extent["length"], off)))
    return out


def check_plan(mnt, plan_name, expected_root=None):
    """Every record of every file of plan/<plan_name>: its extents, pread from the sources, give
    the record's bytes in the mounted file (and in the expected file); names, dtypes, shapes and
    ranges agree with an independent parse. Returns (records, records with several extents)."""
    plan = load_json(os.path.join(mnt, ".ckptfs", "plan", plan_name))
    handles = {}
    checked = assembled = 0
    try:
        for f in plan["files"]:
            data = itest.read_file(os.path.join(mnt, f["file"]))
            assert len(data) == f["size"], f["file"]
            if expected_root:
                want = itest.read_file(os.path.join(expected_root, f["file"]))
                assert data == want, f"{f['file']} differs from the expected file"
            parsed = records_of(data, f["file"])
            if f["format"] in ("ckpt", "safetensors"):
                assert sorted(parsed) == sorted(r["name"] for r in f["records"]), f["file"]
            for rec in f["records"]:
                pieces = []
                for e in rec["extents"]:
                    pieces += extent_bytes(e, f["sources"], handles)
                pieces.sort()
                for at, b in pieces:
                    assert data[at:at + len(b)] == b, f"{f['file']} {rec['name']} at {at}"
                # The pieces tile the ranges exactly, in order.
                tiles = []
                for off, length in rec["ranges"]:
                    tiles.append(data[off:off + length])
                assert b"".join(b for _, b in pieces) == b"".join(tiles), rec["name"]
                dtype, shape, content = parsed[rec["name"]]
                assert b"".join(tiles) == content, f"{f['file']} {rec['name']}: ranges"
                assert rec["dtype"] == dtype, (rec["name"], rec["dtype"], dtype)
                if rec["shape"] or shape not in ([], [0]):
                    assert rec["shape"] == shape, (rec["name"], rec["shape"], shape)
                checked += 1
                if len(rec["extents"]) > 1 or any(e.get("count", 1) > 1 for e in rec["extents"]):
                    assert len(set(e.get("file") for e in rec["extents"])) >= 1
                    assembled += 1
    finally:
        for fd in handles.values():
            os.close(fd)
    return checked, assembled


def status_tree(args):
    work, fx = demo(args, "tree")
    mnt = os.path.join(work, "mnt")
    log = os.path.join(work, "daemon.log")
    with itest.mounted(args.ckptfs, fx.src_dir, mnt, log_file=log, log_level="info",
                       **kw(fx, work)):
        # Not listed (not even by ls -a, find or os.listdir), yet there by name.
        listing = itest.run(["ls", mnt]).stdout.split()
        assert ".ckptfs" not in listing and "rank_0" in listing, listing
        assert ".ckptfs" not in itest.run(["ls", "-a", mnt]).stdout.split()
        assert ".ckptfs" not in os.listdir(mnt)
        assert not [p for p in itest.run(["find", mnt]).stdout.split() if ".ckptfs" in p]
        assert os.path.isdir(os.path.join(mnt, ".ckptfs"))
        assert "sources.json" in itest.run(["ls", os.path.join(mnt, ".ckptfs")]).stdout.split()
        assert sorted(os.listdir(os.path.join(mnt, ".ckptfs"))) == [
            "log", "plan", "sources.json", "stats.json"]
        copy = os.path.join(work, "copy")
        os.makedirs(copy)
        ranks = sorted(n for n in os.listdir(mnt) if n.startswith("rank_"))
        itest.run(["cp", "-r"] + [os.path.join(mnt, r) for r in ranks] + [copy])
        assert sorted(os.listdir(copy)) == ranks
        # Read-only.
        for name in ["sources.json", "stats.json", "log", "plan/rank_0.json"]:
            try:
                open(os.path.join(mnt, ".ckptfs", name), "r+b")
                raise AssertionError(f"{name} opened for writing")
            except OSError as e:
                assert e.errno in (errno.EROFS, errno.EACCES), e

        sources = load_json(os.path.join(mnt, ".ckptfs", "sources.json"))
        assert "epoch 1 step 1" in sources["chosen"], sources["chosen"]
        src_dir = os.path.abspath(fx.src_dir)
        src_files = sorted(os.path.join(src_dir, r, n) for r in os.listdir(src_dir)
                           for n in os.listdir(os.path.join(src_dir, r)))
        assert sorted(s["path"] for s in sources["sources"]) == src_files
        for s in sources["sources"]:
            st = os.stat(s["path"])
            assert s["size"] == st.st_size and s["mtime_ns"] == st.st_mtime_ns, s
            assert s["format"] == "ckpt" and s["step"] == "1_1", s
            assert s["path"].endswith(f"rank_{s['rank']}/" + os.path.basename(s["path"]))

        plans = sorted(os.listdir(os.path.join(mnt, ".ckptfs", "plan")))
        assert plans == [r + ".json" for r in ranks], plans
        total = assembled = 0
        for p in plans:
            c, a = check_plan(mnt, p, fx.expected_dir)
            total += c
            assembled += a
        assert total > 20 and assembled > 5, (total, assembled)

        # cat, cp and json.load of a file that shows size 0.
        stats_path = os.path.join(mnt, ".ckptfs", "stats.json")
        assert os.stat(stats_path).st_size == 0
        json.loads(itest.run(["cat", stats_path]).stdout)
        itest.run(["cp", stats_path, os.path.join(work, "stats.json")])
        before = load_json(os.path.join(work, "stats.json"))
        target = os.path.join(mnt, "rank_2", "checkpoint_2.ckpt")
        size = os.path.getsize(target)
        with open(target, "rb") as f:
            f.read()
        after = load_json(stats_path)
        assert after["reads"] > before["reads"] and after["bytes"] >= before["bytes"] + size, after
        f2 = after["files"]["rank_2/checkpoint_2.ckpt"]
        assert f2["opens"] >= 1 and f2["bytes"] >= size and f2["eio"] == 0, f2
        for key in ["read_ahead_hits", "read_ahead_blocks", "spliced", "eio"]:
            assert isinstance(after[key], int), key

        # Logged as it happens, at info: the first open of a file.
        deadline = time.monotonic() + 5
        while "first open of rank_2/checkpoint_2.ckpt" not in open(log).read():
            assert time.monotonic() < deadline, open(log).read()
            time.sleep(0.05)
        ring = itest.run(["cat", os.path.join(mnt, ".ckptfs", "log")]).stdout
        assert "first open of rank_2/checkpoint_2.ckpt" in ring, ring
        assert f"mounted {os.path.realpath(mnt)}" in ring, ring


def xattrs(args):
    work, fx = demo(args, "xattrs")
    mnt = os.path.join(work, "mnt")
    with itest.mounted(args.ckptfs, fx.src_dir, mnt, **kw(fx, work)):
        path = os.path.join(mnt, "rank_1", "checkpoint_1.ckpt")
        assert sorted(os.listxattr(path)) == ["user.ckptfs.layout", "user.ckptfs.sources"]
        plan = load_json(os.path.join(mnt, ".ckptfs", "plan", "rank_1.json"))
        ckpt_plan = next(f for f in plan["files"] if f["file"] == "rank_1/checkpoint_1.ckpt")
        srcs = os.getxattr(path, "user.ckptfs.sources").decode().split("\n")
        assert srcs == ckpt_plan["sources"], srcs
        layout = os.getxattr(path, "user.ckptfs.layout").decode()
        assert layout.startswith(f"ckpt {os.path.getsize(path)} bytes, "
                                 f"{len(ckpt_plan['records'])} records"), layout
        assert ".ckptfs/plan/rank_1.json" in layout, layout
        st = os.path.join(mnt, "rank_1", "checkpoint_1.safetensors")
        assert os.getxattr(st, "user.ckptfs.layout").decode().startswith("safetensors "), st
        # Unknown names, directories, status files: no data.
        for p, name in [(path, "user.other"), (os.path.join(mnt, "rank_1"), "user.ckptfs.sources"),
                        (os.path.join(mnt, ".ckptfs", "stats.json"), "user.ckptfs.sources")]:
            try:
                os.getxattr(p, name)
                raise AssertionError(f"{p} has {name}")
            except OSError as e:
                assert e.errno == errno.ENODATA, e
        assert os.listxattr(os.path.join(mnt, "rank_1")) == []
        # The size probe, and a buffer too small: ERANGE.
        libc = ctypes.CDLL(None, use_errno=True)
        libc.getxattr.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_void_p, ctypes.c_size_t]
        libc.listxattr.argtypes = [ctypes.c_char_p, ctypes.c_void_p, ctypes.c_size_t]
        n = libc.getxattr(path.encode(), b"user.ckptfs.layout", None, 0)
        assert n == len(layout.encode()), (n, layout)
        buf = ctypes.create_string_buffer(8)
        assert libc.getxattr(path.encode(), b"user.ckptfs.layout", buf, 8) == -1
        assert ctypes.get_errno() == errno.ERANGE
        assert libc.listxattr(path.encode(), None, 0) == len(
            b"user.ckptfs.sources\0user.ckptfs.layout\0")
        assert libc.listxattr(path.encode(), buf, 8) == -1 and ctypes.get_errno() == errno.ERANGE
        # Read-only.
        for fn in [lambda: os.setxattr(path, "user.x", b"1"),
                   lambda: os.removexattr(path, "user.ckptfs.layout")]:
            try:
                fn()
                raise AssertionError("attribute changed")
            except OSError as e:
                assert e.errno in (errno.EROFS, errno.ENOTSUP), e
        # The tool users read attributes with (Debian package attr, scripts/install-deps.sh).
        assert shutil.which("getfattr"), "getfattr is not installed: bash scripts/install-deps.sh"
        out = itest.run(["getfattr", "-d", path]).stdout
        assert "user.ckptfs.layout=" in out and "user.ckptfs.sources=" in out, out


def failed_read_logged(args):
    work, fx = demo(args, "failed")
    mnt = os.path.join(work, "mnt")
    log = os.path.join(work, "daemon.log")
    with itest.mounted(args.ckptfs, fx.src_dir, mnt, log_file=log, log_level="info",
                       **kw(fx, work)):
        target = os.path.join(mnt, "rank_0", "checkpoint_0.ckpt")
        plan = load_json(os.path.join(mnt, ".ckptfs", "plan", "rank_0.json"))
        fd = os.open(target, os.O_RDONLY)
        try:
            # A source the file reads changes after the open: the next read fails.
            rec = plan["files"][0]["records"][0]
            src = plan["files"][0]["sources"][rec["extents"][0]["file"]]
            with open(src, "ab") as f:
                f.write(b"x")
            at = rec["ranges"][0][0]
            try:
                os.pread(fd, 4096, at)
                raise AssertionError("a read of a changed source succeeded")
            except OSError as e:
                assert e.errno == errno.EIO, e
        finally:
            os.close(fd)
        text = open(log).read()
        assert f"read of rank_0/checkpoint_0.ckpt at byte offset {at} " in text, text
        assert "Input/output error (EIO)" in text and f"changed since mounted: {src}" in text, text
        stats = load_json(os.path.join(mnt, ".ckptfs", "stats.json"))
        assert stats["eio"] >= 1 and stats["files"]["rank_0/checkpoint_0.ckpt"]["eio"] >= 1, stats
        assert "changed since mounted" in open(os.path.join(mnt, ".ckptfs", "log")).read()


def refused_open_counted(args):
    """An open refused with EIO (a source the file reads changed since the mount) is counted in
    stats.json like a failed read: in the total and in the file's own "eio", and logged."""
    work, fx = demo(args, "refused_open")
    mnt = os.path.join(work, "mnt")
    with itest.mounted(args.ckptfs, fx.src_dir, mnt, log_level="info", **kw(fx, work)):
        plan = load_json(os.path.join(mnt, ".ckptfs", "plan", "rank_0.json"))
        for src in plan["files"][0]["sources"]:
            with open(src, "ab") as f:
                f.write(b"x")
        target = os.path.join(mnt, "rank_0", "checkpoint_0.ckpt")
        try:
            os.close(os.open(target, os.O_RDONLY))
            raise AssertionError("an open of a file whose sources changed succeeded")
        except OSError as e:
            assert e.errno == errno.EIO, e
        stats = load_json(os.path.join(mnt, ".ckptfs", "stats.json"))
        assert stats["eio"] == 1, stats
        entry = stats["files"].get("rank_0/checkpoint_0.ckpt")
        assert entry is not None and entry["eio"] == 1 and entry["opens"] == 0, stats
        log = open(os.path.join(mnt, ".ckptfs", "log")).read()
        assert "open of rank_0/checkpoint_0.ckpt failed" in log, log


def unwritable_log_file(args):
    work, fx = demo(args, "badlog")
    mnt = os.path.join(work, "mnt")
    blocker = os.path.join(work, "a_file")
    open(blocker, "w").close()
    bad = os.path.join(blocker, "daemon.log")  # under a regular file: never writable
    for foreground in [False, True]:
        proc = itest.refused_mount(args.ckptfs, fx.src_dir, mnt, log_file=bad,
                                   extra_args=["-f"] if foreground else [], **kw(fx, work))
        lines = itest.stderr_lines(proc)
        assert len(lines) == 1 and f"--log-file {bad}" in lines[0], proc.stderr


def ranks_view(args):
    work, fx = demo(args, "ranks")
    mnt = os.path.join(work, "mnt")
    with itest.mounted(args.ckptfs, fx.src_dir, mnt, extra_args=["--ranks", "1"], **kw(fx, work)):
        assert os.listdir(os.path.join(mnt, ".ckptfs", "plan")) == ["rank_1.json"]
        c, a = check_plan(mnt, "rank_1.json", fx.expected_dir)
        assert c > 5 and a > 0, (c, a)
        used = {s["path"] for s in load_json(os.path.join(mnt, ".ckptfs", "sources.json"))["sources"]}
        plan = load_json(os.path.join(mnt, ".ckptfs", "plan", "rank_1.json"))
        assert {p for f in plan["files"] for p in f["sources"]} <= used


def shipped_index_view(args):
    """Ranks listed from a shipped index and planned on first open: plan/rank_N.json names the
    sources the rank reads (its extents pread from them give the record bytes), and sources.json
    lists those of the ranks planned so far, their scans from the index."""
    work, fx = demo(args, "shipped")
    idx = os.path.join(work, "shipped")
    itest.run([args.ckptfs, "index", "build", fx.src_dir, "--output", idx,
               "--src-strategy", fx.src_strategy, "--dst-strategy", fx.dst_strategy])
    mnt = os.path.join(work, "mnt")
    with itest.mounted(args.ckptfs, fx.src_dir, mnt, src_strategy=fx.src_strategy,
                       dst_strategy=fx.dst_strategy, extra_args=["--index", idx]):
        assert load_json(os.path.join(mnt, ".ckptfs", "sources.json"))["sources"] == []
        c, a = check_plan(mnt, "rank_1.json", fx.expected_dir)
        assert c > 5 and a > 0, (c, a)
        sources = load_json(os.path.join(mnt, ".ckptfs", "sources.json"))["sources"]
        plan = load_json(os.path.join(mnt, ".ckptfs", "plan", "rank_1.json"))
        named = {p for f in plan["files"] for p in f["sources"]}
        assert named and named <= {s["path"] for s in sources}, (named, sources)
        assert all(s["from_index"] and os.path.isabs(s["path"]) for s in sources), sources
        assert len({s["path"] for s in sources}) == len(sources), sources


def by_stage_view(args):
    from ckptfix import builtins, by_stage
    work = os.path.join(args.work, "by_stage")
    fx = ckpt_fixture.make(builtins.builtin("pipeline_src_dir"), os.path.join(work, "fixture"),
                           shared=args.shared)
    expected = os.path.join(work, "expected_by_stage")
    by_stage.write_expected(fx, expected)
    mnt = os.path.join(work, "mnt")
    with itest.mounted(args.ckptfs, fx.src_dir, mnt, options="by_stage", **kw(fx, work)):
        plans = os.listdir(os.path.join(mnt, ".ckptfs", "plan"))
        assert plans, plans
        for p in plans:
            c, _ = check_plan(mnt, p, expected)
            assert c > 0, p
        part = load_json(os.path.join(mnt, ".ckptfs", "plan", sorted(plans)[0]))["files"]
        assert any("_part" in f["file"] for f in part), part


def hfai_view(args):
    data = os.path.join(args.shared, "hfai", "hfai_t26_n2")
    work = os.path.join(args.work, "hfai")
    mnt = os.path.join(work, "mnt")
    with itest.mounted(args.ckptfs, data, mnt, index_dir=os.path.join(work, "index")):
        assert os.listdir(os.path.join(mnt, ".ckptfs", "plan")) == ["root.json"]
        c, a = check_plan(mnt, "root.json")
        assert c > 10, c
        root = load_json(os.path.join(mnt, ".ckptfs", "plan", "root.json"))
        assert {f["file"] for f in root["files"]} >= {"model.safetensors", "extra.json"}
        assert os.getxattr(os.path.join(mnt, "model.safetensors"),
                           "user.ckptfs.layout").decode().startswith("safetensors ")
        fmts = {s["format"] for s in load_json(os.path.join(mnt, ".ckptfs", "sources.json"))["sources"]}
        assert fmts == {"torch"}, fmts


def mindformers_view(args):
    work = os.path.join(args.work, "mindformers")
    tree = mf.write_tree(os.path.join(work, "src"), mf.demo_params(), [2, 2])
    files = tree.expected(os.path.join(work, "expected"))
    mnt = os.path.join(work, "mnt")
    with itest.mounted(args.ckptfs, tree.root, mnt, index_dir=os.path.join(work, "index")):
        for p in os.listdir(os.path.join(mnt, ".ckptfs", "plan")):
            c, _ = check_plan(mnt, p)
            assert c > 0, p
        assert load_json(os.path.join(mnt, ".ckptfs", "sources.json"))["sources"]


def steps_view(args):
    work, fx = demo(args, "steps")
    mnt = os.path.join(work, "mnt")
    with itest.mounted(args.ckptfs, fx.src_dir, mnt, **kw(fx, work)):
        steps = os.listdir(os.path.join(mnt, "steps"))
        assert steps, "no steps/"
        step = os.path.join(mnt, "steps", steps[0])
        # The status tree is at the root only; step files still carry the attributes.
        assert ".ckptfs" not in os.listdir(step)
        f = os.path.join(step, "rank_0", "checkpoint_0.ckpt")
        srcs = os.getxattr(f, "user.ckptfs.sources").decode().split("\n")
        assert all(os.path.isfile(s) for s in srcs), srcs
        assert os.getxattr(f, "user.ckptfs.layout").decode().startswith("ckpt ")
        with open(f, "rb") as fh:
            fh.read(10)
        stats = load_json(os.path.join(mnt, ".ckptfs", "stats.json"))
        assert stats["files"][f"steps/{steps[0]}/rank_0/checkpoint_0.ckpt"]["reads"] >= 1, stats


def main():
    args = itest.parse_args()
    checks = itest.Checks(args.only)
    checks.run("status tree: hidden, JSON, plan extents, stats, log", status_tree, args)
    checks.run("xattrs of target files", xattrs, args)
    checks.run("a failed read is logged at info and counted", failed_read_logged, args)
    checks.run("a refused open is counted and logged", refused_open_counted, args)
    checks.run("an unwritable --log-file is refused in one line", unwritable_log_file, args)
    checks.run("--ranks: plan of the exposed ranks only", ranks_view, args)
    checks.run("shipped index: plans and sources of ranks planned on first open",
               shipped_index_view, args)
    checks.run("-o by_stage plans", by_stage_view, args)
    checks.run("hfai root files: plan/root.json", hfai_view, args)
    checks.run("MindFormers metadata checkpoint plans", mindformers_view, args)
    checks.run("steps/: attributes, no status tree", steps_view, args)
    checks.finish()


if __name__ == "__main__":
    main()
