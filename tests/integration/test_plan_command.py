"""`ckptfs plan`: the bytes each target needs from each source and the bytes fetched in 4 KiB,
1 MiB and 8 MiB blocks, from the plan alone (issue 33).

* figures_match_the_plan_files: for a resharded fixture (8 ranks to 4), `ckptfs plan --json`
  gives, per target file and source and for all files together, the same need and fetched bytes
  as an independent count (scripts/bench_s3.py's touched_blocks, numpy over the extents of the
  mount's .ckptfs/plan/<file>.json); the text output names every target with its ratios.
* shipped_index: with --index (ranks planned lazily) the figures are the same.
"""

import json
import os
import sys

import itest
import ckpt_fixture

sys.path.insert(0, os.path.join(itest.REPO, "scripts"))
import bench_s3  # noqa: E402

BLOCKS = (4 << 10, 1 << 20, 8 << 20)


def fixture(args):
    return ckpt_fixture.make_builtin("bench", os.path.join(args.work, "fixture"), size_gib=0.02,
                                     src_devices=8, dst_devices=4)


def view(fx):
    return ["--src-strategy", fx.src_strategy, "--dst-strategy", fx.dst_strategy, "--view", "ckpt"]


def plan_json(args, fx, *extra):
    out = itest.run([args.ckptfs, "plan", fx.src_dir, *view(fx), "--json", "-q", *extra]).stdout
    return json.loads(out)


def expected(args, fx):
    """{file: (need, [fetched per block])} from the mount's plan files, counted with numpy."""
    mnt = os.path.join(args.work, "mnt")
    want = {}
    with itest.mounted(args.ckptfs, fx.src_dir, mnt, src_strategy=fx.src_strategy,
                       dst_strategy=fx.dst_strategy,
                       index_dir=os.path.join(args.work, "index"),
                       extra_args=["--view", "ckpt"]):
        plan_dir = os.path.join(mnt, ".ckptfs", "plan")
        for name in sorted(os.listdir(plan_dir)):
            with open(os.path.join(plan_dir, name)) as f:
                plan = json.load(f)
            rank = name.split(".")[0]
            fetched = [bench_s3.touched_blocks(plan, b)[0] for b in BLOCKS]
            want[rank] = (bench_s3.touched_blocks(plan, BLOCKS[0])[1], fetched)
    return want


def got_by_rank(report):
    out = {}
    for f in report["files"]:
        need = sum(s["need"] for s in f["sources"])
        fetched = [sum(s["fetched"][str(b)] for s in f["sources"]) for b in BLOCKS]
        out[f["file"].split("/")[0]] = (need, fetched)
    return out


def check_figures(args):
    fx = fixture(args)
    want = expected(args, fx)
    report = plan_json(args, fx, "--index-dir", os.path.join(args.work, "index"))
    got = got_by_rank(report)
    assert got == want, f"ckptfs plan {got} != counted from the plan files {want}"
    assert report["blocks"] == list(BLOCKS), report["blocks"]
    # All four targets together read every source byte once: need == sum of the files' needs.
    all_need = sum(s["need"] for s in report["all"]["sources"])
    assert all_need == sum(v[0] for v in want.values()), (all_need, want)
    text = itest.run([args.ckptfs, "plan", fx.src_dir, *view(fx), "-q", "--index-dir",
                      os.path.join(args.work, "index")]).stdout
    for t in range(4):
        assert f"rank_{t}/checkpoint_{t}.ckpt: needs " in text, text
    assert "all 4 files: needs " in text and "8 MiB: " in text, text
    print(text.splitlines()[0])


def check_shipped_index(args):
    fx = fixture(args)
    shipped = os.path.join(args.work, "shipped")
    itest.run([args.ckptfs, "index", "build", fx.src_dir, "--output", shipped, "-q", *view(fx)])
    eager = got_by_rank(plan_json(args, fx, "--index-dir", os.path.join(args.work, "index")))
    lazy = got_by_rank(plan_json(args, fx, "--index", shipped))
    assert lazy == eager, (lazy, eager)


def main():
    args = itest.parse_args()
    checks = itest.Checks(args.only)
    checks.run("figures match the plan files", check_figures, args)
    checks.run("the same with a shipped index", check_shipped_index, args)
    checks.finish()


if __name__ == "__main__":
    main()
