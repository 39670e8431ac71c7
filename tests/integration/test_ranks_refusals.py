"""`ckptfs ranks T --src DIR` refuses what `ckptfs mount DIR --ranks T` refuses, with the same
line (one code path): a rank outside the destination, a source strategy of another device count,
a strategy of another model, a missing rank directory the rank reads, an unreadable strategy.
Without --src it still refuses a rank outside the destination with the mount's line. A rank
directory the rank does not read may be absent for both."""

import os
import shutil

import itest
import ckpt_fixture


def refusal(proc):
    assert proc.returncode == 1, (proc.returncode, proc.stdout, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ckptfs: "), proc.stderr
    return lines[0]


def same_refusals(args):
    work = os.path.join(args.work, "same")
    demo = ckpt_fixture.make_builtin("demo", os.path.join(work, "demo"))
    other = ckpt_fixture.make_builtin("8to4_dtypes", os.path.join(work, "other"))
    junk = os.path.join(work, "junk.ckpt")
    with open(junk, "wb") as f:
        f.write(b"not a strategy")
    src = os.path.join(work, "src")
    shutil.copytree(demo.src_dir, src)
    index = os.path.join(work, "index")
    mnt = os.path.join(work, "mnt")
    cases = [
        ("a rank the destination lacks", 9, demo.src_strategy, demo.dst_strategy,
         "the view has no rank 9"),
        ("a source strategy of 4 ranks for 8 directories", 1, demo.dst_strategy,
         demo.dst_strategy, "8 rank directories, but the source strategy"),
        ("a strategy of another model", 1, other.src_strategy, demo.dst_strategy,
         "that no source file of that stage"),
        ("an unreadable strategy", 1, junk, demo.dst_strategy, "junk.ckpt"),
        # Target 1 reads source ranks 0-3 (`ckptfs ranks 1 --minimal`).
        ("a missing rank directory", 1, demo.src_strategy, demo.dst_strategy,
         "is missing: rank_2/ (source rank 2)"),
    ]
    for name, target, src_strategy, dst_strategy, words in cases:
        if name == "a missing rank directory":
            shutil.rmtree(os.path.join(src, "rank_2"))
        strategies = ["--src-strategy", src_strategy, "--dst-strategy", dst_strategy]
        mount = itest.run([args.ckptfs, "mount", src, mnt, "--ranks", str(target), "--index-dir",
                           index] + strategies, check=False)
        assert not itest.is_mounted(mnt), name
        ranks = itest.run([args.ckptfs, "ranks", str(target), "--src", src, "--index-dir",
                           index] + strategies, check=False)
        line = refusal(mount)
        assert words in line, (name, line)
        assert refusal(ranks) == line, (name, ranks.stderr, line)
    # Without --src: the rank check is the same one.
    proc = itest.run([args.ckptfs, "ranks", "9", "--src-strategy", demo.src_strategy,
                      "--dst-strategy", demo.dst_strategy], check=False)
    assert "the view has no rank 9 (its ranks are 0 to 3" in refusal(proc), proc.stderr


def accepted_alike(args):
    # What mount serves, ranks --src answers, with the list MindSpore would give.
    work = os.path.join(args.work, "ok")
    demo = ckpt_fixture.make_builtin("demo", os.path.join(work, "demo"))
    strategies = ["--src-strategy", demo.src_strategy, "--dst-strategy", demo.dst_strategy]
    plain = itest.run([args.ckptfs, "ranks", "1"] + strategies).stdout
    checked = itest.run([args.ckptfs, "ranks", "1", "--src", demo.src_dir, "--index-dir",
                         os.path.join(work, "index")] + strategies)
    assert checked.stdout == plain and plain.strip(), (checked.stdout, plain)
    assert checked.stderr == "", checked.stderr
    # A source rank target 1 does not read (it reads 0-3) may be absent, the step then given
    # (the newest saved on every rank cannot be known from some of them).
    src = os.path.join(work, "src")
    shutil.copytree(demo.src_dir, src)
    shutil.rmtree(os.path.join(src, "rank_5"))
    checked = itest.run([args.ckptfs, "ranks", "1", "--src", src, "--step", "1_1", "--index-dir",
                         os.path.join(work, "index")] + strategies)
    assert checked.stdout == plain and checked.stderr == "", (checked.stdout, checked.stderr)


def partial_alike(args):
    """A source holding only the ranks target 1 reads (0-3 of 8): a strategy of another model,
    on either side, is refused in the very line a source with every rank gets."""
    work = os.path.join(args.work, "partial")
    demo = ckpt_fixture.make_builtin("demo", os.path.join(work, "demo"))
    other = ckpt_fixture.make_builtin("8to4_dtypes", os.path.join(work, "other"))
    part = os.path.join(work, "part")
    shutil.copytree(demo.src_dir, part)
    for g in range(4, 8):
        shutil.rmtree(os.path.join(part, f"rank_{g}"))
    mnt = os.path.join(work, "mnt")
    for name, src_strategy, dst_strategy in (
            ("source", other.src_strategy, demo.dst_strategy),
            ("destination", demo.src_strategy, other.dst_strategy)):
        # With the step given, as a partial copy needs.
        strategies = ["--src-strategy", src_strategy, "--dst-strategy", dst_strategy,
                      "--step", "1_1"]
        lines = []
        for src in (demo.src_dir, part):
            lines.append(refusal(itest.run(
                [args.ckptfs, "ranks", "1", "--src", src, "--index-dir",
                 os.path.join(work, "index")] + strategies, check=False)))
            mount = itest.run([args.ckptfs, "mount", src, mnt, "--ranks", "1", "--index-dir",
                               os.path.join(work, "index")] + strategies, check=False)
            assert not itest.is_mounted(mnt), name
            assert refusal(mount) == lines[-1], (name, mount.stderr, lines[-1])
        assert lines[0] == lines[1] and f"the {name} strategy" in lines[0], (name, lines)


def main():
    args = itest.parse_args()
    args.ckptfs = os.path.abspath(args.ckptfs)
    checks = itest.Checks(args.only)
    checks.run("ranks --src refuses what mount --ranks refuses, in the same line", same_refusals,
               args)
    checks.run("ranks --src accepts what mount serves", accepted_alike, args)
    checks.run("only the ranks read: another model refused alike", partial_alike, args)
    checks.finish()


if __name__ == "__main__":
    main()
