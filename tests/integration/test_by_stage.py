"""-o by_stage: the _part<stage> files MindSpore >= 2.3's by-stage transform writes for a pipeline
source (one call per source stage), compared with the generator's by-construction files."""

import os

import itest
import ckpt_fixture
from ckptfix import builtins, by_stage


def one_stage_target(name):
    """A builtin whose target is made one stage: every dst layout moves to stage 0."""
    case = builtins.builtin(name)
    case["name"] += "_to_one_stage"
    case["dst"]["stages"] = 1
    for p in case["params"]:
        if p.get("dst"):
            p["dst"]["stages"] = [0]
    return case


def merged_source_strategy():
    """pipeline_src_dir with its source strategy as one merged file ("<stage>-" names)."""
    case = builtins.builtin("pipeline_src_dir")
    case["name"] = "pipeline_src_merged_file"
    case["options"]["src_strategy_form"] = "merged"
    return case


def by_stage_view(args, name):
    work = os.path.join(args.work, name)
    if name == "json_pipeline":
        case = one_stage_target(name)
    elif name == "pipeline_src_merged_file":
        case = merged_source_strategy()
    else:
        case = builtins.builtin(name)
    fx = ckpt_fixture.make(case, os.path.join(work, "fixture"), shared=args.shared)
    expected = os.path.join(work, "expected_by_stage")
    names = by_stage.write_expected(fx, expected)
    mnt = os.path.join(work, "mnt")
    with itest.mounted(args.ckptfs, fx.src_dir, mnt, src_strategy=fx.src_strategy,
                       dst_strategy=fx.dst_strategy, index_dir=os.path.join(work, "index"),
                       options="by_stage"):
        top = sorted(n for n in os.listdir(mnt) if n != "steps")
        assert top == sorted(f"rank_{l}" for l in names), top
        for l, files in sorted(names.items()):
            assert sorted(os.listdir(os.path.join(mnt, f"rank_{l}"))) == sorted(files)
            for f in files:
                want = os.path.join(expected, f"rank_{l}", f)
                got = os.path.join(mnt, f"rank_{l}", f)
                diff = ckpt_fixture.describe_difference(want, got)
                assert not diff, f"{got}: {diff}"


def not_a_pipeline(args):
    work = os.path.join(args.work, "not_a_pipeline")
    fx = ckpt_fixture.make_builtin("8to4_dtypes", os.path.join(work, "fixture"))
    mnt = os.path.join(work, "mnt")
    os.makedirs(mnt)
    proc = itest.run(itest.mount_cmd(args.ckptfs, fx.src_dir, mnt, src_strategy=fx.src_strategy,
                                     dst_strategy=fx.dst_strategy, options="by_stage",
                                     index_dir=os.path.join(work, "index")), check=False)
    itest.unmount(args.ckptfs, mnt)
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr.splitlines() == [
        "ckptfs: -o by_stage writes one _part<stage> file per stage of a pipeline source: it "
        "needs a source strategy of several stages and a destination strategy of one stage (the "
        "source has 1 stage, the destination 1 stage)"], proc.stderr


def main():
    args = itest.parse_args()
    checks = itest.Checks(args.only)
    for name in ("pipeline_src_dir", "pipeline_src_merged_file", "json_pipeline"):
        checks.run(f"by_stage {name}", by_stage_view, args, name)
    checks.run("by_stage without a pipeline source is refused", not_a_pipeline, args)
    checks.finish()


if __name__ == "__main__":
    main()
