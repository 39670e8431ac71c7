"""Bad input makes `ckptfs mount` fail within seconds with one clear line naming the file or
parameter, and leaves no mount behind."""

import os
import shutil
import time

import itest
import ckpt_fixture
from ckptfix import negative


def expect_refusal(args, work, fx, must_name, src_strategy=None, dst_strategy=None,
                   must_not_name=()):
    start = time.monotonic()
    proc = itest.refused_mount(
        args.ckptfs, fx.src_dir, os.path.join(work, "mnt"),
        src_strategy=src_strategy if src_strategy is not None else fx.src_strategy,
        dst_strategy=dst_strategy if dst_strategy is not None else fx.dst_strategy,
        index_dir=os.path.join(work, "index"))
    elapsed = time.monotonic() - start
    assert elapsed < 20, f"refusal took {elapsed:.1f}s"
    lines = itest.stderr_lines(proc)
    assert len(lines) == 1, f"expected one line on stderr, got {len(lines)}: {proc.stderr}"
    message = lines[0]
    for word in must_name:
        assert word in message, f"message does not name {word!r}: {message}"
    for word in must_not_name:
        assert word not in message, f"message names {word!r}, which is not at fault: {message}"
    print(f"     -> {message}")


def fixture(args, name, builtin="8to4_dtypes"):
    work = os.path.join(args.work, name)
    return work, ckpt_fixture.make_builtin(builtin, os.path.join(work, "fixture"))


def missing_rank(args):
    work, fx = fixture(args, "missing_rank")
    negative.remove_rank(fx.outdir, 3)
    expect_refusal(args, work, fx, ["source rank 3", "rank_3/"])


def indivisible(args):
    work = os.path.join(args.work, "indivisible")
    negative.indivisible(os.path.join(work, "fixture"))
    fx = ckpt_fixture.Fixture.load(os.path.join(work, "fixture"))
    expect_refusal(args, work, fx, ["parameter w:", "divide"], must_not_name=["parameter ok"])


def inconsistent(args):
    work, fx = fixture(args, "inconsistent")
    what = negative.inconsistent_slice(fx.outdir, 2)
    victim = what.split(": ")[1].split(" ")[0]
    expect_refusal(args, work, fx, [victim, "rank_2"])


def dtype_disagrees(args):
    work, fx = fixture(args, "dtype_disagrees")
    negative.retype(fx.outdir, [2], "f32.w", "Int32")
    expect_refusal(args, work, fx, ["parameter f32.w:", "rank_2/", "Int32", "Float32"])


def string_split(args):
    work, fx = fixture(args, "string_split")
    negative.retype(fx.outdir, range(len(fx.source_files)), "f32.w", "str")
    expect_refusal(args, work, fx, ["parameter f32.w:", "str", "cannot be resharded"])


def rank_lacks_parameter(args):
    """bf16.w's map uses every device axis: each block has one holder, and rank 2's is gone."""
    work, fx = fixture(args, "rank_lacks_parameter")
    negative.drop_record(fx.outdir, 2, "bf16.w")
    expect_refusal(args, work, fx, ["parameter bf16.w", "source rank 2", "rank_2/"],
                   must_not_name=["f32.w"])


def replica_stands_in(args):
    """f32.w's map leaves one device axis out: every block has two holders, so a rank without
    it is not needed, and the mount serves the expected bytes from the other holder."""
    work, fx = fixture(args, "replica_stands_in")
    negative.drop_record(fx.outdir, 2, "f32.w")
    mnt = os.path.join(work, "mnt")
    with itest.mounted(args.ckptfs, fx.src_dir, mnt, src_strategy=fx.src_strategy,
                       dst_strategy=fx.dst_strategy, index_dir=os.path.join(work, "index")):
        problems = ckpt_fixture.compare_tree(fx, mnt)
        assert not problems, "\n".join(problems)


def per_rank_entry_missing(args, builtin):
    """learning_rate is no strategy's, and each rank saves its own value; target 0 takes it
    from rank 0 (MindSpore's rule). Rank 0's file lacks it: a .ckpt cut between records (the
    format cannot tell), a safetensors file written without it. Neither the mount nor verify
    may take another rank's learning_rate: both refuse, naming the entry and rank 0's file."""
    work, fx = fixture(args, f"per_rank_entry_missing_{builtin}", builtin)
    path = negative.lose_entry(fx.outdir, 0, "learning_rate")
    must_name = ["parameter learning_rate", "target rank 0", "source rank 0",
                 os.path.join("rank_0", os.path.basename(path))]
    expect_refusal(args, work, fx, must_name)
    proc = itest.run([args.ckptfs, "verify", fx.src_dir, "--src-strategy", fx.src_strategy,
                      "--dst-strategy", fx.dst_strategy, "--index-dir",
                      os.path.join(work, "index")], check=False)
    assert proc.returncode != 0, f"verify passed a save missing rank 0's entry: {proc.stdout}"
    fails = [line for line in proc.stdout.splitlines() if line.startswith("FAIL")]
    assert len(fails) == 1 and all(w in fails[0] for w in must_name), proc.stdout


def truncated(args):
    work, fx = fixture(args, "truncated")
    negative.truncate_source(fx.outdir, 1)
    expect_refusal(args, work, fx, ["rank_1/", "byte offset"])


def real_corrupt(args):
    work, fx = fixture(args, "real_corrupt")
    victim = os.path.realpath(fx.source_files[0])
    shutil.copyfile(os.path.join(args.shared, "fixtures/real/corrupt",
                                 "mindformers_golden_router_utf8-mangled.ckpt"), victim)
    expect_refusal(args, work, fx, [victim, "offset"])


def garbage_strategy(args):
    work, fx = fixture(args, "garbage_strategy")
    negative.garbage_strategy(fx.outdir, "src")
    expect_refusal(args, work, fx, [os.path.basename(fx.src_strategy)])


def encrypted(args):
    work, fx = fixture(args, "encrypted")
    negative.encrypted_source(fx.outdir, 0)
    expect_refusal(args, work, fx, ["rank_0", "encrypted"])


def map_length(args, delta):
    work = os.path.join(args.work, f"map_length{delta}")
    negative.tensor_map_length(os.path.join(work, "fixture"), delta)
    fx = ckpt_fixture.Fixture.load(os.path.join(work, "fixture"))
    expect_refusal(args, work, fx,
                   [os.path.basename(fx.src_strategy), "parameter w:", "tensor_map"],
                   must_not_name=["parameter ok"])


def no_strategy(args):
    work, fx = fixture(args, "no_strategy", "1to8_split")
    expect_refusal(args, work, fx, ["strategy"], src_strategy="", dst_strategy="")


def mounted_twice(args):
    work, fx = fixture(args, "twice", "demo")
    mnt = os.path.join(work, "mnt")
    kwargs = dict(src_strategy=fx.src_strategy, dst_strategy=fx.dst_strategy,
                  index_dir=os.path.join(work, "index"))
    with itest.mounted(args.ckptfs, fx.src_dir, mnt, **kwargs):
        proc = itest.run(itest.mount_cmd(args.ckptfs, fx.src_dir, mnt, **kwargs), check=False)
        assert proc.returncode != 0, "a second mount stacked on the first"
        assert "already mounted" in proc.stderr, proc.stderr
    assert not itest.is_mounted(mnt), "one umount left a mount behind"


def main():
    args = itest.parse_args()
    checks = itest.Checks(args.only)
    checks.run("missing rank", missing_rank, args)
    checks.run("dimension not divisible", indivisible, args)
    checks.run("slice shapes inconsistent across ranks", inconsistent, args)
    checks.run("dtype differs across ranks", dtype_disagrees, args)
    checks.run("string entry split by a strategy", string_split, args)
    checks.run("a rank lacks a parameter only it holds", rank_lacks_parameter, args)
    checks.run("a rank lacks a parameter another rank also holds", replica_stands_in, args)
    checks.run("truncated source", truncated, args)
    checks.run("a .ckpt cut before a per-rank entry", per_rank_entry_missing, args, "demo")
    checks.run("a safetensors file without a per-rank entry", per_rank_entry_missing, args,
               "st_demo")
    checks.run("real corrupt source", real_corrupt, args)
    checks.run("garbage strategy", garbage_strategy, args)
    checks.run("encrypted source", encrypted, args)
    checks.run("tensor_map longer than the tensor", map_length, args, 1)
    checks.run("tensor_map shorter than the tensor", map_length, args, -1)
    checks.run("no strategy at all", no_strategy, args)
    checks.run("mounting twice on one mountpoint", mounted_twice, args)
    checks.finish()


if __name__ == "__main__":
    main()
