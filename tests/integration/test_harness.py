"""The test command's own integration test: the demo fixture mounts, serves every target
byte-exact and unmounts, in whichever build runs it (Release, ASan+UBSan, TSan).

scripts/test-selftest.sh runs the command's stages on this test with CKPTFS_INJECT_FAILURE=1 (a
check fails) or CKPTFS_INJECT_SKIP=1 (the test ends as skipped) and expects each stage to fail:
a failure or a skip that a stage let pass would be a hole in the command, not in ckptfs.
"""

import os

import itest
import ckpt_fixture


def demo_served(args):
    work = os.path.join(args.work, "demo")
    fx = ckpt_fixture.make_builtin("demo", os.path.join(work, "fixture"))
    mnt = os.path.join(work, "mnt")
    with itest.mounted(args.ckptfs, fx.src_dir, mnt, src_strategy=fx.src_strategy,
                       dst_strategy=fx.dst_strategy, index_dir=os.path.join(work, "index")):
        problems = ckpt_fixture.compare_tree(fx, mnt)
        assert not problems, "\n".join(problems)


def injected_failure():
    raise AssertionError("failure injected (CKPTFS_INJECT_FAILURE=1)")


def main():
    args = itest.parse_args()
    if os.environ.get("CKPTFS_INJECT_SKIP") == "1":
        itest.skip("skip injected (CKPTFS_INJECT_SKIP=1)")
    checks = itest.Checks(args.only)
    checks.run("the demo fixture mounts and serves every target byte-exact", demo_served, args)
    if os.environ.get("CKPTFS_INJECT_FAILURE") == "1":
        checks.run("injected failure", injected_failure)
    checks.finish()


if __name__ == "__main__":
    main()
