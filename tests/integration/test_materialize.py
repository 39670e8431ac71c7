"""`ckptfs materialize`: the view written as real files, compared byte for byte with the files
the fixture generator wrote by construction and with the mount of the same view; resuming,
--ranks, progress lines and --quiet."""

import filecmp
import os
import subprocess

import itest
import ckpt_fixture


def view_args(fx, work):
    args = [fx.src_dir, ]
    if fx.src_strategy:
        args += ["--src-strategy", fx.src_strategy]
    if fx.dst_strategy:
        args += ["--dst-strategy", fx.dst_strategy]
    return args + ["--index-dir", os.path.join(work, "index")]


def materialize(args, fx, work, out, *extra, check=True, view="ckpt"):
    cmd = [args.ckptfs, "materialize"] + view_args(fx, work)[:1] + [out] + view_args(fx, work)[1:]
    if view:
        cmd += ["--view", view]
    return itest.run(cmd + list(extra), timeout=300, check=check)


def partials(root):
    return [p for p in itest.tree_files(root) if os.path.basename(p).startswith(".")]


def check_case(args, name, jobs):
    work = os.path.join(args.work, name)
    fx = ckpt_fixture.make_builtin(name, os.path.join(work, "fixture"), shared=args.shared)
    out = os.path.join(work, "out")
    materialize(args, fx, work, out, "-j", str(jobs))
    problems = ckpt_fixture.compare_tree(fx, out)
    assert not problems, "\n".join(problems)
    assert not partials(out), partials(out)


def check_same_as_mount(args):
    work = os.path.join(args.work, "vs_mount")
    fx = ckpt_fixture.make_builtin("8to4_dtypes", os.path.join(work, "fixture"))
    out = os.path.join(work, "out")
    materialize(args, fx, work, out, view="ckpt,safetensors")  # both, as the mount shows them
    mnt = os.path.join(work, "mnt")
    with itest.mounted(args.ckptfs, fx.src_dir, mnt, src_strategy=fx.src_strategy,
                       dst_strategy=fx.dst_strategy, index_dir=os.path.join(work, "index")):
        # The rank directories; steps/ (every saved step) is the mount's alone.
        shown = [rel for rel in itest.tree_files(mnt) if rel.startswith("rank_")]
        assert shown == itest.tree_files(out), (shown, itest.tree_files(out))
        assert any(rel.endswith(".safetensors") for rel in shown)
        for rel in shown:
            itest.run(["cmp", os.path.join(mnt, rel), os.path.join(out, rel)])
            # The same mtime as the mount shows: the newest source's.
            assert os.stat(os.path.join(mnt, rel)).st_mtime_ns == \
                os.stat(os.path.join(out, rel)).st_mtime_ns, rel


def check_resume(args):
    work = os.path.join(args.work, "resume")
    fx = ckpt_fixture.make_builtin("demo", os.path.join(work, "fixture"))
    out = os.path.join(work, "out")
    materialize(args, fx, work, out)
    before = {rel: os.stat(os.path.join(out, rel)).st_ino for rel in itest.tree_files(out)}
    # A damaged file (cut short, as by a full disk outside our control) and the leftover of an
    # interrupted run: both are redone, the complete files are kept (same inode).
    damaged = os.path.join(out, "rank_1", "checkpoint_1.ckpt")
    os.truncate(damaged, 100)
    leftover = os.path.join(out, "rank_2", ".checkpoint_2.ckpt.partial")
    with open(leftover, "wb") as f:
        f.write(b"garbage")
    os.unlink(os.path.join(out, "rank_3", "checkpoint_3.ckpt"))
    proc = materialize(args, fx, work, out)
    assert "2 complete files kept" in proc.stderr, proc.stderr
    assert "2 of 2 files" in proc.stderr, proc.stderr
    problems = ckpt_fixture.compare_tree(fx, out)
    assert not problems, "\n".join(problems)
    assert not partials(out), partials(out)
    after = {rel: os.stat(os.path.join(out, rel)).st_ino for rel in itest.tree_files(out)}
    assert after["rank_0/checkpoint_0.ckpt"] == before["rank_0/checkpoint_0.ckpt"]
    assert after["rank_2/checkpoint_2.ckpt"] == before["rank_2/checkpoint_2.ckpt"]
    # Nothing left to do: everything kept.
    proc = materialize(args, fx, work, out)
    assert "4 complete files kept" in proc.stderr, proc.stderr
    # A newer source makes the files that read it stale: rewritten, not kept.
    src = os.path.join(fx.src_dir, "rank_0", os.listdir(os.path.join(fx.src_dir, "rank_0"))[0])
    st = os.stat(src)
    os.utime(src, ns=(st.st_atime_ns, st.st_mtime_ns + 5_000_000_000))
    proc = materialize(args, fx, work, out)
    assert "0 complete files kept" in proc.stderr, proc.stderr
    assert not ckpt_fixture.compare_tree(fx, out)


def check_ranks_and_output_modes(args):
    work = os.path.join(args.work, "ranks")
    fx = ckpt_fixture.make_builtin("demo", os.path.join(work, "fixture"))
    out = os.path.join(work, "out")
    proc = materialize(args, fx, work, out, "--ranks", "1,3", "--quiet")
    assert proc.stderr == "", proc.stderr
    assert itest.tree_files(out) == ["rank_1/checkpoint_1.ckpt", "rank_3/checkpoint_3.ckpt"]
    for t in (1, 3):
        assert filecmp.cmp(fx.expected_files()[t], os.path.join(out, f"rank_{t}",
                                                                   f"checkpoint_{t}.ckpt"),
                           shallow=False)
    # Not a terminal: plain lines, ending with the summary.
    proc = materialize(args, fx, work, out, "--ranks", "0-2")
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("materialize: ") and "2 of 2 files" in last, proc.stderr
    assert "1 complete files kept" in last, proc.stderr
    assert "\r" not in proc.stderr
    for bad, words in (("9", "no rank 9"), ("2-1", "runs backwards"), ("x", "not a rank")):
        proc = materialize(args, fx, work, out, "--ranks", bad, check=False)
        assert proc.returncode == 1 and words in proc.stderr, proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def check_memory_is_bounded(args):
    # 0.5 GiB of tensors merged into one file by 2 workers: peak RSS stays far below the data,
    # since each worker holds one 4 MiB buffer and the sources are mapped, not loaded. The
    # fixture is made by another process: a child's peak RSS starts at its parent's.
    work = os.path.join(args.work, "memory")
    fixture = os.path.join(work, "fixture")
    itest.run(["/usr/bin/python3", os.path.join(itest.REPO, "scripts", "ckpt_fixture.py"), "make",
               "--builtin", "bench", fixture, "--no-expected", "--size-gib", "0.5",
               "--dst-devices", "0"], timeout=600)
    out = os.path.join(work, "out")
    cmd = [args.ckptfs, "materialize", os.path.join(fixture, "src"), out, "--src-strategy",
           os.path.join(fixture, "src_strategy.ckpt"), "--index-dir",
           os.path.join(work, "index"), "-j", "2", "-q"]
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)  # this child's own peak, not any other's
    assert os.waitstatus_to_exitcode(status) == 0, proc.stderr.read()
    size = sum(os.path.getsize(os.path.join(out, p)) for p in itest.tree_files(out))
    assert size > 400 << 20, size
    limit = 64 * 1024 + (itest.ASAN_QUARANTINE_KIB if itest.SANITIZED else 0)
    assert usage.ru_maxrss < limit, f"peak RSS {usage.ru_maxrss} KiB for {size} bytes"


def source_state(root):
    return [(rel, os.path.getsize(os.path.join(root, rel)),
             os.stat(os.path.join(root, rel)).st_mtime_ns) for rel in itest.tree_files(root)]


def check_out_inside_source(args):
    """OUT equal to SRC_DIR or inside it (by real path: through a symlink, or with ..) is refused
    in one line naming both, before anything is read or written: the rank_N/ files written there
    would mix with the sources, which would then no longer mount."""
    work = os.path.join(args.work, "inside")
    fx = ckpt_fixture.make_builtin("demo", os.path.join(work, "fixture"))
    before = source_state(fx.src_dir)
    link = os.path.join(work, "link")
    os.symlink(fx.src_dir, link)
    for out in (fx.src_dir, os.path.join(fx.src_dir, "rank_0"),
                os.path.join(fx.src_dir, "new", "out"), os.path.join(link, "out"),
                os.path.join(work, "elsewhere", "..", "fixture", "src")):
        proc = materialize(args, fx, work, out, check=False, view=None)
        lines = itest.stderr_lines(proc)
        assert proc.returncode == 1 and len(lines) == 1, (out, proc.stderr)
        assert "inside the source directory" in lines[0] and \
            os.path.realpath(fx.src_dir) in lines[0], (out, lines)
        assert source_state(fx.src_dir) == before, f"materialize into {out} changed the sources"
    assert not os.path.exists(os.path.join(work, "elsewhere"))
    # A sibling whose name starts like the source's is not inside it.
    out = fx.src_dir + "_out"
    materialize(args, fx, work, out, view=None)
    assert not ckpt_fixture.compare_tree(fx, out)


def check_output_is_a_source(args):
    """Without --view, materialize writes the sources' one format (.ckpt from .ckpt sources,
    .safetensors from .safetensors ones), so its output is itself a source: materialized again
    with the destination strategy on both sides, it gives the expected files byte for byte.
    --view ckpt,safetensors still writes both."""
    for name, ext in (("demo", "ckpt"), ("st_demo", "safetensors")):
        work = os.path.join(args.work, "as_source_" + name)
        fx = ckpt_fixture.make_builtin(name, os.path.join(work, "fixture"))
        want = fx.expected_files() if ext == "ckpt" else fx.expected_safetensors_files()
        out = os.path.join(work, "out")
        materialize(args, fx, work, out, "-q", view=None)
        assert itest.tree_files(out) == sorted(
            f"rank_{t}/{os.path.basename(p)}" for t, p in want.items()), itest.tree_files(out)
        again = os.path.join(work, "again")
        itest.run([args.ckptfs, "materialize", out, again, "--src-strategy", fx.dst_strategy,
                   "--dst-strategy", fx.dst_strategy, "--index-dir", os.path.join(work, "index"),
                   "-q"])
        for t, p in want.items():
            got = os.path.join(again, f"rank_{t}", os.path.basename(p))
            assert filecmp.cmp(p, got, shallow=False), f"{name}: {got} differs from {p}"
        both = os.path.join(work, "both")
        materialize(args, fx, work, both, "-q", view="ckpt,safetensors")
        assert len(itest.tree_files(both)) == 2 * len(want), itest.tree_files(both)


def main():
    args = itest.parse_args()
    checks = itest.Checks(args.only)
    for name, jobs in (("demo", 2), ("8to1_merge", 3), ("pipeline_dst", 1), ("opt_dst", 4),
                       ("4to6", 2), ("crc_oldscalars", 2)):
        checks.run(f"case {name} -j {jobs}", check_case, args, name, jobs)
    checks.run("same bytes and mtimes as the mount", check_same_as_mount, args)
    checks.run("resume keeps complete files, redoes the rest", check_resume, args)
    checks.run("--ranks, plain progress lines, --quiet", check_ranks_and_output_modes, args)
    checks.run("memory bounded", check_memory_is_bounded, args)
    checks.run("OUT inside SRC_DIR refused", check_out_inside_source, args)
    checks.run("the output is a source (one format by default)", check_output_is_a_source, args)
    checks.finish()


if __name__ == "__main__":
    main()
