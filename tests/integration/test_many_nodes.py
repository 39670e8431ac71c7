"""One checkpoint mounted by many nodes, each exposing only its own target ranks (--ranks).

* A mount with --ranks shows exactly those rank directories, and each of their files is
  byte-identical to the fixture generator's expected file (sliced from the full tensors, not by
  ckptfs); a rank the destination does not have is refused in one line.
* Only the source files the exposed ranks load are opened: the others may even be unreadable,
  or absent (a node's copy of its share), also for materialize and a mount listed from a shipped
  index; a needed one missing or damaged is refused in one line naming it.
"""

import os
import shutil
import subprocess

import itest
import ckpt_fixture
from ckptfix import builtins
from ckptfix.builtins import case, lay, param, side

# Rows of 8 source ranks -> rows of 4 target ranks: target t loads source ranks 2t and 2t + 1.
ROWS_8TO4 = case("rows_8to4", "dev [8] rows -> dev [4] rows", side(8), side(4),
                 [param("w", "Float32", [16, 6], lay([8], [0, -1]), lay([4], [0, -1])),
                  param("b", "BFloat16", [8, 4], lay([8], [0, -1]), lay([4], [0, -1]))])


def fixture(args, name):
    case = ROWS_8TO4 if name == "rows_8to4" else builtins.builtin(name, shared=args.shared)
    return ckpt_fixture.make(case, os.path.join(args.work, name, "fixture"), shared=args.shared)


def compare_ranks(fx, mnt, ranks):
    """Problems of a mount that should show exactly `ranks` of the fixture's targets."""
    expected = fx.expected_files()
    got = sorted(n for n in os.listdir(mnt) if n != "steps")
    want = sorted(f"rank_{t}" for t in ranks)
    problems = [] if got == want else [f"rank directories {got}, expected {want}"]
    for t in ranks:
        actual = os.path.join(mnt, f"rank_{t}", os.path.basename(expected[t]))
        # ls -l before any read: the size is exact.
        if os.stat(actual).st_size != os.path.getsize(expected[t]):
            problems.append(f"rank {t}: size {os.stat(actual).st_size} before a read")
        diff = ckpt_fixture.describe_difference(expected[t], actual)
        if diff:
            problems.append(f"rank {t}: {diff}")
    return problems


def mount_ranks(args, fx, mnt, ranks_text, index_dir, extra=()):
    return itest.mounted(args.ckptfs, fx.src_dir, mnt, src_strategy=fx.src_strategy,
                         dst_strategy=fx.dst_strategy, index_dir=index_dir,
                         extra_args=["--ranks", ranks_text, *extra])


def some_ranks(args):
    fx = fixture(args, "demo")  # 8 source ranks -> 4 target ranks
    work = os.path.join(args.work, "demo")
    for text, ranks in (("1,3", [1, 3]), ("0-1", [0, 1]), ("2", [2])):
        mnt = os.path.join(work, "mnt_" + text.replace(",", "_"))
        with mount_ranks(args, fx, mnt, text, os.path.join(work, "index")):
            problems = compare_ranks(fx, mnt, ranks)
            assert not problems, problems


def pipeline_ranks(args):
    for name in ("pipeline_dst", "pipeline_src_dir", "opt_src", "4to6"):
        fx = fixture(args, name)
        work = os.path.join(args.work, name)
        n = len(fx.expected_files())
        for ranks in ([n - 1], [0, n // 2]):
            text = ",".join(map(str, ranks))
            mnt = os.path.join(work, "mnt_" + text.replace(",", "_"))
            with mount_ranks(args, fx, mnt, text, os.path.join(work, "index")):
                problems = compare_ranks(fx, mnt, ranks)
                assert not problems, (name, problems)


def unneeded_sources_untouched(args):
    """Target rank 1 loads three of the 8 source ranks; the others are overwritten with junk that
    any scan refuses, and the mount still serves rank 1 exactly."""
    fx = fixture(args, "rows_8to4")
    work = os.path.join(args.work, "rows_junk")
    # Rows 4-7 of w and 2-3 of b are on source ranks 2 and 3; entries not resharded would come
    # from t_local mod 8 = 1, so its file is read for the record list.
    needed = {1, 2, 3}
    for g, path in fx.source_files.items():
        if g not in needed:
            with open(os.path.realpath(path), "wb") as f:
                f.write(b"not a checkpoint")
    mnt = os.path.join(work, "mnt")
    with mount_ranks(args, fx, mnt, "1", os.path.join(work, "index")):
        problems = compare_ranks(fx, mnt, [1])
        assert not problems, problems
    # The same sources without --ranks: the junk is refused (so it really is junk).
    itest.refused_mount(args.ckptfs, fx.src_dir, mnt, src_strategy=fx.src_strategy,
                        dst_strategy=fx.dst_strategy, index_dir=os.path.join(work, "index"))


def refused(args):
    fx = fixture(args, "demo")
    work = os.path.join(args.work, "demo_refused")
    mnt = os.path.join(work, "mnt")
    for text, words in (("4", "the view has no rank 4"), ("0-2,x", "'x' is not a rank"),
                        ("3-1", "runs backwards")):
        proc = itest.refused_mount(args.ckptfs, fx.src_dir, mnt, src_strategy=fx.src_strategy,
                                   dst_strategy=fx.dst_strategy,
                                   index_dir=os.path.join(work, "index"),
                                   extra_args=["--ranks", text])
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and words in lines[0], proc.stderr


def shipped_index(args):
    """`index build --output` writes an index a mount opens read-only; a changed source is
    refused in one line naming it."""
    fx = fixture(args, "demo")
    work = os.path.join(args.work, "shipped")
    idx = os.path.join(work, "idx")
    out = itest.run([args.ckptfs, "index", "build", fx.src_dir, "--output", idx]).stdout
    assert "source tensors/s" in out, out
    before = {n: os.stat(os.path.join(idx, n)).st_mtime_ns for n in os.listdir(idx)}
    mnt = os.path.join(work, "mnt")
    with mount_ranks(args, fx, mnt, "1,3", None, extra=["--index", idx]):
        problems = compare_ranks(fx, mnt, [1, 3])
        assert not problems, problems
    after = {n: os.stat(os.path.join(idx, n)).st_mtime_ns for n in os.listdir(idx)}
    assert before == after, (before, after)
    victim = os.path.realpath(fx.source_files[2])
    st = os.stat(victim)
    os.utime(victim, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    proc = itest.refused_mount(args.ckptfs, fx.src_dir, mnt, src_strategy=fx.src_strategy,
                               dst_strategy=fx.dst_strategy,
                               extra_args=["--index", idx, "--ranks", "1"])
    assert victim in proc.stderr and "rebuild" in proc.stderr, proc


def build_summaries(args, fx, idx, extra=()):
    """A shipped index with the target summaries of the fixture's view."""
    return itest.run([args.ckptfs, "index", "build", fx.src_dir, "--output", idx,
                      "--src-strategy", fx.src_strategy, "--dst-strategy", fx.dst_strategy,
                      *extra]).stdout


def planned_ranks(log_file):
    """The ranks the daemon logged as planned on first open."""
    with open(log_file) as f:
        return sorted(int(line.split("rank ", 1)[1].split(":")[0]) for line in f
                      if "planned on first open" in line)


def lazy_ranks(args):
    """With an index built with the strategies, the mount lists its ranks with exact sizes and
    plans nothing; opening one file plans its rank only; every byte matches the generator's."""
    fx = fixture(args, "demo")
    work = os.path.join(args.work, "lazy")
    idx = os.path.join(work, "idx")
    out = build_summaries(args, fx, idx)
    assert "4 target ranks summarized" in out, out
    mnt, log = os.path.join(work, "mnt"), os.path.join(work, "mount.log")
    expected = fx.expected_files()
    # The mount takes the files the index was built from and does not list the source
    # directory: a rank directory the strategy has no place for goes unseen (listed, it would be
    # refused).
    stray = os.path.join(fx.src_dir, "rank_99")
    os.makedirs(stray)
    with open(os.path.join(stray, "checkpoint_99.ckpt"), "wb"):
        pass
    try:
        with mount_ranks(args, fx, mnt, "1,3", None,
                         extra=["--index", idx, "--log-file", log, "--log-level", "info"]) as m:
            # ls -l before any open: exact sizes, and still nothing planned.
            for t in (1, 3):
                listed = os.stat(os.path.join(m, f"rank_{t}", os.path.basename(expected[t])))
                assert listed.st_size == os.path.getsize(expected[t]), (t, listed.st_size)
                assert os.stat(os.path.join(m, f"rank_{t}", f"checkpoint_{t}.safetensors")).st_size
            assert sorted(os.listdir(os.path.join(m, "rank_1"))) == [
                "checkpoint_1.ckpt", "checkpoint_1.safetensors"]
            assert planned_ranks(log) == [], planned_ranks(log)
            actual = os.path.join(m, "rank_3", os.path.basename(expected[3]))
            assert not ckpt_fixture.describe_difference(expected[3], actual)
            assert planned_ranks(log) == [3], planned_ranks(log)
            problems = compare_ranks(fx, m, [1, 3])
            assert not problems, problems
            assert planned_ranks(log) == [1, 3], planned_ranks(log)
    finally:
        shutil.rmtree(stray)
    # The .safetensors files match an eager mount's (planned at mount, without the index).
    eager = os.path.join(work, "eager")
    with mount_ranks(args, fx, eager, "1", os.path.join(work, "cache")) as e, \
            mount_ranks(args, fx, mnt, "1", None, extra=["--index", idx]) as m:
        name = "rank_1/checkpoint_1.safetensors"
        assert itest.read_file(os.path.join(e, name)) == itest.read_file(os.path.join(m, name))


def lazy_ranks_relative_index(args):
    """A relative --index is the one in the mount command's working directory, also when a rank
    is planned on first open, after the daemon left that directory."""
    fx = fixture(args, "demo")
    work = os.path.join(args.work, "relative")
    build_summaries(args, fx, os.path.join(work, "idx"))
    mnt = os.path.join(work, "mnt")
    os.makedirs(mnt)
    expected = fx.expected_files()
    with itest.unmounting(args.ckptfs, mnt):
        cmd = itest.mount_cmd(args.ckptfs, fx.src_dir, mnt, src_strategy=fx.src_strategy,
                              dst_strategy=fx.dst_strategy, extra_args=["--index", "idx"])
        proc = subprocess.run(cmd, cwd=work, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
        actual = os.path.join(mnt, "rank_1", os.path.basename(expected[1]))
        assert not ckpt_fixture.describe_difference(expected[1], actual)


def lazy_ranks_other_view(args):
    """Summaries of another view are not used: the mount says so and plans at mount; a source
    changed since the build is refused in one line naming it."""
    fx = fixture(args, "demo")
    work = os.path.join(args.work, "lazy_other")
    idx = os.path.join(work, "idx")
    build_summaries(args, fx, idx, extra=["--view", "ckpt"])
    mnt, log = os.path.join(work, "mnt"), os.path.join(work, "mount.log")
    with mount_ranks(args, fx, mnt, "2", None,
                     extra=["--index", idx, "--log-file", log, "--log-level", "info"]) as m:
        problems = compare_ranks(fx, m, [2])
        assert not problems, problems
    text = open(log).read()
    assert planned_ranks(log) == [], text
    victim = os.path.realpath(fx.source_files[2])
    st = os.stat(victim)
    os.utime(victim, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    build_summaries(args, fx, os.path.join(work, "idx2"))
    os.utime(victim, ns=(st.st_atime_ns, st.st_mtime_ns))
    proc = itest.refused_mount(args.ckptfs, fx.src_dir, mnt, src_strategy=fx.src_strategy,
                               dst_strategy=fx.dst_strategy,
                               extra_args=["--index", os.path.join(work, "idx2"), "--ranks", "1"])
    lines = itest.stderr_lines(proc)
    assert len(lines) == 1 and victim in lines[0] \
        and "rebuild" in lines[0], proc


def lazy_ranks_changed_strategy(args):
    """The index holds the strategies as parsed at build (a mount does not parse them), found by
    the digest of the files' bytes: a strategy file changed since the build, even to the same
    size, is not taken from the index; a damaged one is refused in one line naming it."""
    fx = fixture(args, "demo")
    work = os.path.join(args.work, "lazy_strategy")
    os.makedirs(work, exist_ok=True)
    dst = os.path.join(work, os.path.basename(fx.dst_strategy))
    shutil.copyfile(fx.dst_strategy, dst)
    idx = os.path.join(work, "idx")
    itest.run([args.ckptfs, "index", "build", fx.src_dir, "--output", idx, "--src-strategy",
               fx.src_strategy, "--dst-strategy", dst, "-q"])
    size = os.path.getsize(dst)
    with open(dst, "wb") as f:
        f.write(b"\x0a\xff" * (size // 2) + b"\x00" * (size % 2))
    proc = itest.refused_mount(args.ckptfs, fx.src_dir, os.path.join(work, "mnt"),
                               src_strategy=fx.src_strategy, dst_strategy=dst,
                               extra_args=["--index", idx, "--ranks", "1"])
    lines = itest.stderr_lines(proc)
    assert dst in lines[-1] and len(lines) <= 2, proc


def partial_sources(args):
    """A node's copy of the source may hold only the ranks its targets read: target 1 of rows_8to4
    reads source ranks 1, 2 and 3. Mount and materialize with --ranks 1 serve the generator's
    bytes when the other ranks are absent, or are junk (a `rank_N` file, or a checkpoint any scan
    refuses), which is neither required nor opened; a needed rank missing or junk is refused in
    one line naming it; a mount listed from a shipped index's summaries reads the same share.
    Such a copy is told the step (--step 1_1; see partial_copy_needs_step), except where a shipped
    index's summaries pin it."""
    fx = fixture(args, "rows_8to4")
    work = os.path.join(args.work, "partial")
    needed, others = [1, 2, 3], [0, 4, 5, 6, 7]
    expected = fx.expected_files()[1]
    strategies = ["--src-strategy", fx.src_strategy, "--dst-strategy", fx.dst_strategy]
    step = ["--step", "1_1"]  # a partial copy cannot know the newest step saved on every rank

    def rank_dir(root, g):
        return os.path.join(root, os.path.basename(os.path.dirname(fx.source_files[g])))

    def copy_of(name, ranks):
        root = os.path.join(work, name)
        for g in ranks:  # the files themselves, not links to the fixture's
            shutil.copytree(os.path.dirname(fx.source_files[g]), rank_dir(root, g))
        return root

    def junk(path):
        with open(path, "wb") as f:
            f.write(b"garbage")

    def serves(src, name):
        mnt = os.path.join(work, "mnt_" + name)
        with itest.mounted(args.ckptfs, src, mnt, src_strategy=fx.src_strategy,
                           dst_strategy=fx.dst_strategy, index_dir=os.path.join(work, "i_" + name),
                           extra_args=["--ranks", "1", *step]):
            problems = compare_ranks(fx, mnt, [1])
            assert not problems, (name, problems)
        out = os.path.join(work, "out_" + name)
        itest.run([args.ckptfs, "materialize", src, out, *strategies, "--ranks", "1", *step,
                   "--view", "ckpt", "--index-dir", os.path.join(work, "i_" + name), "-q"],
                  timeout=300)
        assert itest.tree_files(out) == [f"rank_1/{os.path.basename(expected)}"], name
        assert not ckpt_fixture.describe_difference(
            expected, os.path.join(out, "rank_1", os.path.basename(expected))), name

    def refused(src, name, words):
        mnt = os.path.join(work, "mnt_" + name)
        proc = itest.refused_mount(args.ckptfs, src, mnt, src_strategy=fx.src_strategy,
                                   dst_strategy=fx.dst_strategy,
                                   index_dir=os.path.join(work, "i_" + name),
                                   extra_args=["--ranks", "1", *step])
        out = os.path.join(work, "out_" + name)
        mat = itest.run([args.ckptfs, "materialize", src, out, *strategies, "--ranks", "1", *step,
                         "--index-dir", os.path.join(work, "i_" + name)], check=False)
        for p in (proc, mat):
            lines = itest.stderr_lines(p)
            assert p.returncode != 0 and len(lines) == 1 and words in lines[0], (name, p.stderr)
            # Only the rank read is named: the others are not asked for.
            assert not any(f"rank_{g}/" in lines[0] for g in others), (name, lines[0])

    serves(copy_of("only", needed), "only")
    src = copy_of("junk", needed)
    for g in others[:3]:
        junk(rank_dir(src, g))  # a file where the rank directory would be
    for g in others[3:]:
        os.makedirs(rank_dir(src, g))
        junk(os.path.join(rank_dir(src, g), os.path.basename(fx.source_files[g])))
    serves(src, "junk")
    # The same sources without --ranks: the junk is refused (so it really is junk).
    itest.refused_mount(args.ckptfs, src, os.path.join(work, "mnt_all"),
                        src_strategy=fx.src_strategy, dst_strategy=fx.dst_strategy,
                        index_dir=os.path.join(work, "i_all"))
    refused(copy_of("lacks_2", [1, 3]), "lacks_2", "rank_2/ (source rank 2)")
    src = copy_of("file_2", [1, 3])
    junk(rank_dir(src, 2))
    refused(src, "file_2", rank_dir(src, 2).rsplit("/", 1)[1] + " is not a directory")
    src = copy_of("junk_2", [1, 3])
    os.makedirs(rank_dir(src, 2))
    junk(os.path.join(rank_dir(src, 2), os.path.basename(fx.source_files[2])))
    refused(src, "junk_2", os.path.join(rank_dir(src, 2), os.path.basename(fx.source_files[2])))
    # Listed from a shipped index's target summaries: only the ranks read need be there.
    src = copy_of("lazy", needed + others)
    idx = os.path.join(work, "idx")
    itest.run([args.ckptfs, "index", "build", src, "--output", idx, *strategies, "-q"])
    for g in others:
        shutil.rmtree(rank_dir(src, g))
    mnt, log = os.path.join(work, "mnt_lazy"), os.path.join(work, "lazy.log")
    with itest.mounted(args.ckptfs, src, mnt, src_strategy=fx.src_strategy,
                       dst_strategy=fx.dst_strategy,
                       extra_args=["--ranks", "1", "--index", idx, "--log-file", log,
                                   "--log-level", "info"]):
        problems = compare_ranks(fx, mnt, [1])
        assert not problems, problems
    assert planned_ranks(log) == [1], open(log).read()
    # An index without summaries (built without the strategies): the directory is listed.
    plain = os.path.join(work, "idx_plain")
    itest.run([args.ckptfs, "index", "build", copy_of("plain", needed + others), "--output",
               plain, "-q"])
    for g in others:
        shutil.rmtree(rank_dir(os.path.join(work, "plain"), g))
    with itest.mounted(args.ckptfs, os.path.join(work, "plain"), mnt,
                       src_strategy=fx.src_strategy, dst_strategy=fx.dst_strategy,
                       extra_args=["--ranks", "1", "--index", plain, *step]):
        problems = compare_ranks(fx, mnt, [1])
        assert not problems, problems


def partial_copy_needs_step(args):
    """A partial copy without --step is refused; with --step it serves the step named. A node's
    copy holding only source ranks 0-3 of 8, where step 1_2 was saved on those ranks only: the
    newest step on every rank (1_1, as a node with the full source chooses) cannot be known
    there, so the default `latest` (given or not) is refused in one line naming the newest step
    present; --step 1_1 serves the generator's bytes, never reading the 1_2 files (junk here)."""
    fx = fixture(args, "demo")  # 8 source ranks -> 4 target ranks; target 0 reads sources 0-1
    work = os.path.join(args.work, "partial_step")
    node = os.path.join(work, "nodeA")
    for g in range(4):
        rank = os.path.dirname(fx.source_files[g])
        dst = os.path.join(node, os.path.basename(rank))
        shutil.copytree(rank, dst)
        shutil.copy(fx.source_files[g], os.path.join(dst, "checkpoint-1_2.ckpt"))
    strategies = ["--src-strategy", fx.src_strategy, "--dst-strategy", fx.dst_strategy]
    index_dir = os.path.join(work, "index")
    mount = itest.refused_mount(args.ckptfs, node, os.path.join(work, "mnt_refused"),
                                src_strategy=fx.src_strategy, dst_strategy=fx.dst_strategy,
                                index_dir=index_dir, extra_args=["--ranks", "0"])
    mat = itest.run([args.ckptfs, "materialize", node, os.path.join(work, "out"), *strategies,
                     "--ranks", "0", "--step", "latest", "--index-dir", index_dir], check=False)
    for p in (mount, mat):
        lines = itest.stderr_lines(p)
        assert p.returncode != 0 and len(lines) == 1, p.stderr
        assert "only 4 of the 8 source ranks" in lines[0] and "--step" in lines[0], lines[0]
        assert "newest here is 1_2" in lines[0], lines[0]
    assert not os.path.exists(os.path.join(work, "out")), "a refused materialize wrote output"
    for g in range(2):  # what target 0 reads: junk at 1_2, so reading it would be refused
        with open(os.path.join(node, f"rank_{g}", "checkpoint-1_2.ckpt"), "wb") as f:
            f.write(b"garbage")
    mnt = os.path.join(work, "mnt")
    with itest.mounted(args.ckptfs, node, mnt, src_strategy=fx.src_strategy,
                       dst_strategy=fx.dst_strategy, index_dir=index_dir,
                       extra_args=["--ranks", "0", "--step", "1_1"]):
        problems = compare_ranks(fx, mnt, [0])
        assert not problems, problems


NODE_SCRIPT = r"""
set -e
mount --bind -o ro "$IDX" "$IDX"
mount --bind -o ro "$SRC" "$SRC"
mkdir -p "$MNT"
"$CKPTFS" mount "$SRC" "$MNT" --src-strategy "$SS" --dst-strategy "$DS" --index "$IDX" \
    --ranks "$RANKS"
trap '"$CKPTFS" umount "$MNT"' EXIT
for t in $(echo "$RANKS" | tr ',' ' '); do
  cmp "$EXP/rank_$t/checkpoint_$t.ckpt" "$MNT/rank_$t/checkpoint_$t.ckpt"
done
"""


def two_nodes(args):
    """Two mounts in their own mount namespaces, each a node with its ranks, over one source
    tree and one index, both bind-mounted read-only; both serve byte-exact files at once and
    neither writes the shared paths."""
    import subprocess
    itest.require_tool("unshare", "util-linux")
    fx = fixture(args, "demo")
    work = os.path.join(args.work, "nodes")
    idx = os.path.join(work, "idx")
    build_summaries(args, fx, idx)  # each node lists its ranks from it, plans them on open
    def snapshot():
        out = {}
        for root in (idx, fx.src_dir):
            for d, _, files in os.walk(root):
                for n in files:
                    st = os.stat(os.path.join(d, n))
                    out[os.path.join(d, n)] = (st.st_size, st.st_mtime_ns)
        return out
    before = snapshot()
    expected_dir = os.path.dirname(os.path.dirname(fx.expected_files()[0]))
    procs = []
    for node, ranks in enumerate(("0,1", "2,3")):
        env = dict(os.environ, IDX=idx, SRC=fx.src_dir, MNT=os.path.join(work, f"mnt{node}"),
                   CKPTFS=args.ckptfs, SS=fx.src_strategy, DS=fx.dst_strategy, RANKS=ranks,
                   EXP=expected_dir)
        procs.append(subprocess.Popen(["unshare", "-m", "--propagation", "private", "sh", "-c",
                                       NODE_SCRIPT], env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
    for p in procs:
        out, _ = p.communicate(timeout=120)
        assert p.returncode == 0, out
    assert snapshot() == before


BIND_SCRIPT = r"""
set -e
mkdir -p "$RO"
mount --bind -o ro "$SRC" "$RO"
if touch "$RO/probe" 2>/dev/null; then echo "the bind mount is writable"; exit 1; fi
trap '"$CKPTFS" umount "$MNT" 2>/dev/null || true' EXIT
"$CKPTFS" index build "$RO" --output "$IDX" --src-strategy "$SS" --dst-strategy "$DS" -q
for how in index cache; do
  if [ $how = index ]; then extra="--index $IDX"; else extra="--index-dir $CACHE"; fi
  "$CKPTFS" mount "$RO" "$MNT" --src-strategy "$SS" --dst-strategy "$DS" $extra
  for t in 0 1 2 3; do
    cmp "$EXP/rank_$t/checkpoint_$t.ckpt" "$MNT/rank_$t/checkpoint_$t.ckpt"
  done
  "$CKPTFS" umount "$MNT"
done
"""


def read_only_bind_source(args):
    """Sources seen through a read-only bind mount at another path (as a node sees a shared
    file system): the index is built from that path and both a mount with it and one without
    serve every target byte-exact."""
    import subprocess
    itest.require_tool("unshare", "util-linux")
    fx = fixture(args, "demo")
    work = os.path.join(args.work, "bind")
    os.makedirs(work)
    expected_dir = os.path.dirname(os.path.dirname(fx.expected_files()[0]))
    env = dict(os.environ, SRC=fx.src_dir, RO=os.path.join(work, "ro_src"),
               IDX=os.path.join(work, "idx"), CACHE=os.path.join(work, "cache"),
               MNT=os.path.join(work, "mnt"), CKPTFS=args.ckptfs, SS=fx.src_strategy,
               DS=fx.dst_strategy, EXP=expected_dir)
    proc = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", BIND_SCRIPT],
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def main():
    args = itest.parse_args()
    checks = itest.Checks(args.only)
    checks.run("some_ranks", some_ranks, args)
    checks.run("pipeline_ranks", pipeline_ranks, args)
    checks.run("unneeded_sources_untouched", unneeded_sources_untouched, args)
    checks.run("refused", refused, args)
    checks.run("partial_sources", partial_sources, args)
    checks.run("partial_copy_needs_step", partial_copy_needs_step, args)
    checks.run("shipped_index", shipped_index, args)
    checks.run("lazy_ranks", lazy_ranks, args)
    checks.run("lazy_ranks_relative_index", lazy_ranks_relative_index, args)
    checks.run("lazy_ranks_other_view", lazy_ranks_other_view, args)
    checks.run("lazy_ranks_changed_strategy", lazy_ranks_changed_strategy, args)
    checks.run("two_nodes", two_nodes, args)
    checks.run("read_only_bind_source", read_only_bind_source, args)
    checks.finish()


if __name__ == "__main__":
    main()
