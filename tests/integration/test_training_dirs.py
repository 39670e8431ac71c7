"""Training output directories as jobs leave them: which step a mount serves (--step), what it
says about it, and the inputs it refuses at mount with one exact line."""

import os
import shutil

import itest
import ckpt_fixture
from ckptfix import builtins, training

TWELVE = [(e, 2) for e in range(1, 13)]


def tree(args, name, steps=TWELVE, **kwargs):
    work = os.path.join(args.work, name)
    return work, training.make_training(training.twelve_saves_case(), os.path.join(work, "t"),
                                        steps, **kwargs)


def mount_and_compare(args, work, tr, step, extra=(), src_strategy=True):
    """Mounts with `extra` arguments, checks the bytes against `step`'s expected files and
    returns the mount's stderr."""
    mnt = os.path.join(work, "mnt")
    os.makedirs(mnt, exist_ok=True)
    cmd = itest.mount_cmd(args.ckptfs, tr.src_dir, mnt,
                          src_strategy=tr.src_strategy if src_strategy else None,
                          dst_strategy=tr.dst_strategy,
                          index_dir=os.path.join(work, "index")) + list(extra)
    proc = itest.run(cmd, check=False)
    try:
        assert proc.returncode == 0, f"mount failed: {proc.stderr}"
        problems = ckpt_fixture.compare_tree(tr.expected(step), mnt)
        assert not problems, "\n".join(problems)
    finally:
        itest.unmount(args.ckptfs, mnt)
    return proc.stderr


def refusal(args, work, src_dir, extra=(), src_strategy=None, dst_strategy=None):
    """The one stderr line of a refused mount (which must leave no mount behind)."""
    proc = itest.refused_mount(args.ckptfs, src_dir, os.path.join(work, "mnt"),
                               timeout=120, src_strategy=src_strategy, dst_strategy=dst_strategy,
                               index_dir=os.path.join(work, "index"), extra_args=list(extra))
    assert proc.returncode == 1, f"exit {proc.returncode}: {proc.stderr}"
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, f"expected one line, got: {proc.stderr}"
    print(f"     -> {lines[0]}")
    return lines[0]


def expect_line(got, want):
    assert got == want, f"\n got: {got}\nwant: {want}"


def twelve_saves(args):
    """MindSpore's .ckpt transform would serve net-9_2.ckpt here (string order); ckptfs serves
    the newest step, ignores the partial save, the graph file and the breakpoint file."""
    work, tr = tree(args, "twelve", expected_steps=[(12, 2), (9, 2)], breakpoints={1: (12, 2)},
                    partial=(13, 2))
    err = mount_and_compare(args, work, tr, (12, 2))
    expect_line(err.strip(),
                f"ckptfs: {tr.src_dir}: epoch 12 step 2 on all 2 ranks; 11 older checkpoints "
                f"ignored; 1 breakpoint checkpoint ignored (on rank_1 only)")
    err = mount_and_compare(args, work, tr, (9, 2), ["--step", "9_2"])
    expect_line(err.strip(),
                f"ckptfs: {tr.src_dir}: epoch 9 step 2 on all 2 ranks (--step 9_2); 8 older "
                f"checkpoints ignored; 3 newer checkpoints ignored; 1 breakpoint checkpoint "
                f"ignored (on rank_1 only)")


def twelve_safetensors_saves(args):
    case = training.twelve_saves_case()
    case["options"]["source_format"] = "safetensors"
    work = os.path.join(args.work, "twelve_st")
    tr = training.make_training(case, os.path.join(work, "t"), TWELVE, expected_steps=[(12, 2)])
    err = mount_and_compare(args, work, tr, (12, 2))
    expect_line(err.strip(),
                f"ckptfs: {tr.src_dir}: epoch 12 step 2 on all 2 ranks; 11 older checkpoints "
                f"ignored")


def newest_on_some_ranks(args):
    work, tr = tree(args, "partial_step", steps=[(1, 2), (2, 2), (3, 2)],
                    expected_steps=[(2, 2)])
    os.remove(tr.files[(3, 2)][1])
    err = mount_and_compare(args, work, tr, (2, 2))
    expect_line(err.strip(),
                f"ckptfs: {tr.src_dir}: epoch 2 step 2 on all 2 ranks; 1 older checkpoint "
                f"ignored; epoch 3 step 2 is not on every rank (missing on rank_1), not served")


def breakpoint_when_asked(args):
    work, tr = tree(args, "breakpoint", steps=[(1, 2), (2, 2)], breakpoints={1: (2, 2)})
    line = refusal(args, work, tr.src_dir, ["--step", "breakpoint"], tr.src_strategy)
    expect_line(line, f"ckptfs: {tr.src_dir}: --step breakpoint: no matching file on rank_0 "
                      f"(1 of 2 ranks have one)")


def mixed_steps_refused(args):
    work, tr = tree(args, "mixed", steps=[(1, 2), (2, 2)])
    os.remove(tr.files[(2, 2)][0])
    os.remove(tr.files[(1, 2)][1])
    r0, r1 = tr.rank_dirs[0], tr.rank_dirs[1]
    line = refusal(args, work, tr.src_dir, (), tr.src_strategy)
    expect_line(line,
                f"ckptfs: {tr.src_dir}: the one checkpoint of each rank would mix steps across "
                f"ranks: epoch 1 step 2 on rank_0 (rank_0/net-1_2.ckpt); epoch 2 step 2 on "
                f"rank_1 (rank_1/net-2_2.ckpt); choose one step with --step EPOCH_STEP, or name "
                f"the files with --step FILE-GLOB --allow-mixed-steps")
    # Named explicitly and allowed: the files' counters disagree too, and that is accepted.
    mnt = os.path.join(work, "mnt")
    cmd = itest.mount_cmd(args.ckptfs, tr.src_dir, mnt, src_strategy=tr.src_strategy,
                          index_dir=os.path.join(work, "index")) + \
        ["--step", "net-*.ckpt", "--allow-mixed-steps"]
    proc = itest.run(cmd, check=False)
    try:
        assert proc.returncode == 0, proc.stderr
        assert os.path.getsize(os.path.join(mnt, "rank_0", "checkpoint_0.ckpt")) > 0
    finally:
        itest.unmount(args.ckptfs, mnt)
    assert os.path.isdir(r0) and os.path.isdir(r1)


def counters_disagree(args, fmt="ckpt"):
    """A file named as step 2 that holds step 1's counters (a copy gone wrong)."""
    case = training.twelve_saves_case()
    if fmt == "safetensors":
        case["options"]["source_format"] = "safetensors"
    work = os.path.join(args.work, f"counters_{fmt}")
    tr = training.make_training(case, os.path.join(work, "t"), [(1, 2), (2, 2)])
    shutil.copyfile(tr.files[(1, 2)][1], tr.files[(2, 2)][1])
    line = refusal(args, work, tr.src_dir, (), tr.src_strategy)
    f0, f1 = tr.files[(2, 2)][0], tr.files[(2, 2)][1]
    expect_line(line,
                f"ckptfs: the chosen checkpoints are of different steps: global_step = 2002 on "
                f"rank 0 ({f0}); global_step = 1002 on rank 1 ({f1}); choose one step with "
                f"--step EPOCH_STEP, or name the files with --step FILE-GLOB "
                f"--allow-mixed-steps")


def mindformers_output(args):
    work, tr = tree(args, "mindformers", steps=[(1, 2), (2, 2)], layout="mindformers")
    err = mount_and_compare(args, work, tr, (2, 2), src_strategy=False)
    root = os.path.join(tr.src_dir, "checkpoint")
    strategy = os.path.join(tr.src_dir, "strategy")
    expect_line(err.strip(),
                f"ckptfs: {root}: epoch 2 step 2 on all 2 ranks; 1 older checkpoint ignored; "
                f"source strategy {strategy} (a MindFormers output directory; --src-strategy "
                f"overrides it)")


def unrelated_files_one_line(args):
    work, tr = tree(args, "junk", steps=[(1, 2)])
    for name in ("notes.txt", "README"):
        with open(os.path.join(tr.rank_dirs[0], name), "w") as f:
            f.write("x")
    os.makedirs(os.path.join(tr.src_dir, "logs"))
    err = mount_and_compare(args, work, tr, (1, 2))
    lines = err.strip().splitlines()
    assert len(lines) == 2, err
    expect_line(lines[1],
                f"ckptfs: warning: {tr.src_dir}: ignored 3 entries that are not checkpoints "
                f"(logs, rank_0/README, rank_0/notes.txt); --log-level debug says why")


# -- item 3: sources that do not fit the source strategy ----------------------------------------

def fixture(args, name, builtin):
    work = os.path.join(args.work, name)
    return work, ckpt_fixture.make_builtin(builtin, os.path.join(work, "fixture"))


def swapped_strategies(args):
    """8 rank directories, the 4-device target strategy given as the source."""
    work, fx = fixture(args, "swapped", "8to4_dtypes")
    line = refusal(args, work, fx.src_dir, (), fx.dst_strategy, fx.src_strategy)
    expect_line(line,
                f"ckptfs: {fx.src_dir}: 8 rank directories, but the source strategy "
                f"{fx.dst_strategy} describes 4 ranks (4 devices x 1 stage): rank_4/, rank_5/, "
                f"rank_6/, rank_7/ have no place in it; give the strategy the checkpoints were "
                f"saved with (for a pipeline job, the directory of every stage's file)")


def fewer_rank_dirs(args):
    work, fx = fixture(args, "fewer", "8to4_dtypes")
    shutil.rmtree(os.path.dirname(fx.source_files[3]))
    shutil.rmtree(os.path.dirname(fx.source_files[5]))
    line = refusal(args, work, fx.src_dir, (), fx.src_strategy, fx.dst_strategy)
    expect_line(line,
                f"ckptfs: {fx.src_dir}: 6 rank directories, but the source strategy "
                f"{fx.src_strategy} describes 8 ranks (8 devices x 1 stage): missing rank_3/ "
                f"(source rank 3), rank_5/ (source rank 5); copy in every rank's checkpoint, or "
                f"give the strategy the checkpoints were saved with")


def strategy_of_another_model(args):
    """The real llama2-13b strategy (2 devices) on a 2-rank checkpoint of another model."""
    work, tr = tree(args, "other_model", steps=[(1, 2)])
    llama = os.path.join(work, "llama_strategy.ckpt")
    shutil.copyfile(ckpt_fixture.resolve_shared_path(builtins.LLAMA_STRATEGY, args.shared),
                    llama)
    line = refusal(args, work, tr.src_dir, (), llama, None)
    assert line.startswith(f"ckptfs: the source strategy {llama} names 363 parameters of stage 0 "
                           f"that no source file of that stage (rank_0/ .. rank_1/) holds: "), line
    assert line.endswith(" and 359 more; give the strategy these checkpoints were saved with"), line


def dst_strategy_of_another_model(args):
    """The right source strategy and the llama2-13b strategy as --dst-strategy: the fault is the
    destination strategy's, and the line names that file (not the source strategy)."""
    work, tr = tree(args, "other_model_dst", steps=[(1, 2)])
    llama = os.path.join(work, "llama_strategy.ckpt")
    shutil.copyfile(ckpt_fixture.resolve_shared_path(builtins.LLAMA_STRATEGY, args.shared),
                    llama)
    line = refusal(args, work, tr.src_dir, (), tr.src_strategy, llama)
    assert line.startswith(f"ckptfs: the destination strategy {llama} names "), line
    assert tr.src_strategy not in line and "source strategy" not in line, line
    assert line.endswith("give a destination strategy of this model"), line


def verify_names_step(args):
    """verify of a training directory says which step it checked, as a mount does."""
    work, tr = tree(args, "verify_step", steps=[(1, 2), (2, 2)])
    base = [args.ckptfs, "verify", tr.src_dir, "--src-strategy", tr.src_strategy,
            "--index-dir", os.path.join(work, "index")]
    proc = itest.run(base)
    assert proc.stdout.startswith("verify: all well: epoch 2 step 2 on all 2 ranks; "), proc.stdout
    proc = itest.run(base + ["--step", "1_2"])
    assert proc.stdout.startswith("verify: all well: epoch 1 step 2 on all 2 ranks "), proc.stdout


def quiet(args):
    """-q (before or after the subcommand) leaves stderr empty on success: no chosen-step line;
    index build -q prints nothing either."""
    work, tr = tree(args, "quiet", steps=[(1, 2), (2, 2)])
    for where in ("after", "before"):
        extra = ["-q"] if where == "after" else []
        mnt = os.path.join(work, "mnt")
        os.makedirs(mnt, exist_ok=True)
        cmd = itest.mount_cmd(args.ckptfs, tr.src_dir, mnt, src_strategy=tr.src_strategy,
                              index_dir=os.path.join(work, "index")) + extra
        if where == "before":
            cmd.insert(1, "-q")
        with itest.unmounting(args.ckptfs, mnt):
            proc = itest.run(cmd, check=False)
            assert proc.returncode == 0 and proc.stderr == "", (where, proc.stderr)
            assert itest.is_mounted(mnt)
    for cmd in (["index", "build", tr.src_dir, "-q"], ["-q", "index", "build", tr.src_dir]):
        proc = itest.run([args.ckptfs] + cmd + ["--index-dir", os.path.join(work, "index2")])
        assert proc.stdout == "" and proc.stderr == "", (cmd, proc.stdout, proc.stderr)


def missing_stage(args):
    """A 2-stage pipeline job given only stage 0's strategy file."""
    work, fx = fixture(args, "missing_stage", "pipeline_src_dir")
    only = os.path.join(work, "stage0_only")
    os.makedirs(only)
    first = sorted(os.listdir(fx.src_strategy))[0]
    shutil.copyfile(os.path.join(fx.src_strategy, first), os.path.join(only, first))
    n = len(fx.source_files)
    half = n // 2
    line = refusal(args, work, fx.src_dir, (), only, fx.dst_strategy)
    extra = ", ".join(f"rank_{g}/" for g in range(half, min(n, half + 4)))
    more = f" and {half - 4} more" if half > 4 else ""
    expect_line(line,
                f"ckptfs: {fx.src_dir}: {n} rank directories, but the source strategy {only} "
                f"describes {half} ranks ({half} devices x 1 stage): {extra}{more} have no place "
                f"in it; give the strategy the checkpoints were saved with (for a pipeline job, "
                f"the directory of every stage's file)")


def weights_only_save(args):
    """A save without optimizer states under a training strategy that lists them mounts (and
    serves what it has); the same save lacking a weight is refused."""
    from ckptfix import negative
    work, fx = fixture(args, "weights_only", "pipeline_src_dir")
    for g in range(4):
        negative.drop_record(fx.outdir, g, "adam_m.layers.0.wq")
    mnt = os.path.join(work, "mnt")
    with itest.mounted(args.ckptfs, fx.src_dir, mnt, src_strategy=fx.src_strategy,
                       dst_strategy=fx.dst_strategy, index_dir=os.path.join(work, "index")):
        names = [r.tag for r in ckpt_fixture.read_records(
            os.path.join(mnt, "rank_0", "checkpoint_0.ckpt"))]
        assert "adam_m.layers.0.wq" not in names and "layers.0.wq" in names, names
    for g in range(4):
        negative.drop_record(fx.outdir, g, "layers.0.wo")
    line = refusal(args, work, fx.src_dir, (), fx.src_strategy, fx.dst_strategy)
    expect_line(line,
                f"ckptfs: the source strategy {fx.src_strategy} names 1 parameter of stage 0 that "
                f"no source file of that stage (rank_0/ .. rank_3/) holds: layers.0.wo; give the "
                f"strategy these checkpoints were saved with")


def main():
    args = itest.parse_args()
    checks = itest.Checks(args.only)
    checks.run("12 saves: the newest step, not the last name", twelve_saves, args)
    checks.run("newest step missing on a rank", newest_on_some_ranks, args)
    checks.run("breakpoint only when asked", breakpoint_when_asked, args)
    checks.run("mixed steps refused, allowed when named", mixed_steps_refused, args)
    checks.run("step counters disagree", counters_disagree, args)
    checks.run("step counters disagree (safetensors)", counters_disagree, args, "safetensors")
    checks.run("12 safetensors saves", twelve_safetensors_saves, args)
    checks.run("MindFormers output/ directory", mindformers_output, args)
    checks.run("unrelated files: one summary line", unrelated_files_one_line, args)
    checks.run("swapped strategies refused", swapped_strategies, args)
    checks.run("fewer rank directories refused", fewer_rank_dirs, args)
    checks.run("strategy of another model refused", strategy_of_another_model, args)
    checks.run("destination strategy of another model: named", dst_strategy_of_another_model,
               args)
    checks.run("verify names the step it checked", verify_names_step, args)
    checks.run("-q: nothing on stderr, before or after the subcommand", quiet, args)
    checks.run("missing pipeline stage refused", missing_stage, args)
    checks.run("weights-only save; a missing weight refused", weights_only_save, args)
    checks.finish()


if __name__ == "__main__":
    main()
