"""Saves whose files list the same records in different orders (the generator's `record_orders`:
a file reversed, rotated, one record moved, per-rank entries between the parameters). MindSpore
reads each loaded file in its own order and keeps first appearance over the files in load order
(descending ranks), so a target's records follow the file it loads first. The mount writes
exactly what `transform_checkpoints` writes, and MindSpore's order is the one the generator
derives by that rule."""

import os

import pytest

import msconf
from msconf import ckpt_fixture
from ckptfix import by_stage, ckptio
from ckptfix.builtins import as_safetensors, case, extra, lay, param, side

INTERLEAVED = ["learning_rate", "a", "global_step", "b", "rank_state", "c"]


def small(dst_devices, dst_dev):
    """4 ranks (dev [2,2]) -> dst_devices ranks (dst_dev; None: one merged file); every target
    loads all four files."""
    def dst(tmap):
        return lay(dst_dev, tmap) if dst_dev else None

    params = [param("a", "Float32", [8, 4], lay([2, 2], [1, 0]), dst([0, -1])),
              param("b", "Float16", [4, 8], lay([2, 2], [-1, 0]), dst([-1, 0])),
              param("c", "Float32", [8], lay([2, 2], [1]), dst([-1]))]
    extras = [extra("learning_rate", "Float32", 0.01), extra("rank_state", "Int32", 5),
              extra("global_step", "Int64", 30)]
    return case("record_order_small", "4 ranks, every file loaded", side(4),
                side(dst_devices) if dst_dev else None, params, extras, seed=7)


def with_orders(d, orders):
    return dict(d, options=dict(d["options"], record_orders=orders))


def builtin(name, orders):
    return with_orders(ckpt_fixture.builtin(name, shared=msconf.DATA_SHARED), orders)


CASES = {
    # the layout: 4 ranks resharded to 2, rank_3 reversed
    "4to2_reversed": lambda: with_orders(small(2, [2]), {"3": "reversed"}),
    "4to4_rotated": lambda: with_orders(small(4, [2, 2]), {"3": "rotated:2"}),
    "4to4_moved_in_second_file": lambda: with_orders(small(4, [2, 2]), {"2": "moved:c:0"}),
    "4to2_interleaved_per_rank_entries":
        lambda: with_orders(small(2, [2]), {"3": INTERLEAVED}),
    "4to1_merge_three_orders":
        lambda: with_orders(small(1, None), {"3": "reversed", "1": "rotated:3",
                                             "0": "moved:b:5"}),
    "demo": lambda: builtin("demo", {"7": "rotated:3", "5": "reversed",
                                     "6": "moved:learning_rate:1"}),
    "1to8_split": lambda: builtin("1to8_split", {"0": "reversed"}),
    "pipeline_src_dir": lambda: builtin("pipeline_src_dir", {"7": "reversed", "2": "rotated:3"}),
    "pipeline_src_merged": lambda: builtin("pipeline_src_merged",
                                           {"5": "reversed", "1": "moved:embed.weight:3"}),
    "pipeline_dst": lambda: builtin("pipeline_dst", {"3": "reversed", "0": "rotated:2"}),
}
# Safetensors sources in another order than the reference writer's (a writer that keeps the
# order it is given): MindSpore reads each file in data-offset order, by the same rule.
ST_CASES = ["4to2_reversed", "4to2_interleaved_per_rank_entries", "4to1_merge_three_orders",
            "pipeline_src_merged", "pipeline_dst"]


def names(path):
    return [r.tag for r in ckptio.join_chunks(ckptio.read_records(path))]


def check(ckptfs, workdir, case):
    fx = msconf.make_fixture(case, os.path.join(workdir, "fixture"))
    src = msconf.strategy_for_mindspore(fx.src_strategy, workdir, "src")
    dst = msconf.strategy_for_mindspore(fx.dst_strategy, workdir, "dst")
    out = msconf.transform(fx.src_dir, os.path.join(workdir, "transformed"), src, dst)
    for t, path in fx.expected_files().items():
        # MindSpore's order is the generator's: the first loaded file's, then first appearance.
        got = os.path.join(out, f"rank_{t}", f"checkpoint_{t}.ckpt")
        assert names(got) == names(path), f"target {t}: MindSpore wrote {names(got)}"
    with msconf.mounted(ckptfs, fx.src_dir, workdir, fx.src_strategy, fx.dst_strategy) as mnt:
        msconf.assert_same_tree(out, mnt, only=".ckpt")
        for t, path in fx.expected_files().items():
            msconf.assert_loads_as_expected(os.path.join(mnt, f"rank_{t}", f"checkpoint_{t}.ckpt"),
                                            path)


@pytest.mark.parametrize("name", list(CASES))
def test_record_order(ckptfs, tmp_path, name):
    """files of a save in different record orders: transform_checkpoints == mount"""
    check(ckptfs, str(tmp_path), CASES[name]())


@pytest.mark.parametrize("name", ST_CASES)
def test_record_order_safetensors(ckptfs, tmp_path, name):
    """safetensors files of a save in different data orders: transform_checkpoints == mount"""
    check(ckptfs, str(tmp_path), as_safetensors(CASES[name]()))


def test_record_order_by_stage(ckptfs, tmp_path):
    """files of a pipeline save in different record orders: by-stage transform == -o by_stage"""
    from mindspore.parallel.checkpoint_transform import _transform_checkpoint_by_stage

    # The by-stage transform loads every file of a stage in ascending rank order: each part
    # follows its stage's lowest rank (rank_0 here, rank_4 for stage 1), not the highest.
    case = builtin("pipeline_src_dir", {"0": "rotated:2", "2": "reversed", "7": "reversed"})
    fx = msconf.make_fixture(case, str(tmp_path / "fixture"))
    out = str(tmp_path / "by_stage")
    for name in sorted(os.listdir(fx.src_strategy)):
        _transform_checkpoint_by_stage(fx.src_dir, out, "checkpoint_",
                                       os.path.join(fx.src_strategy, name), fx.dst_strategy)
    # MindSpore's order is the generator's (every file of the stage loaded, lowest rank first).
    want = str(tmp_path / "expected_by_stage")
    by_stage.write_expected(fx, want)
    assert msconf.tree_files(out) == msconf.tree_files(want)
    for rel in msconf.tree_files(out):
        assert names(os.path.join(out, rel)) == names(os.path.join(want, rel)), rel
    with msconf.mounted(ckptfs, fx.src_dir, str(tmp_path), fx.src_strategy, fx.dst_strategy,
                        args=["-o", "by_stage"]) as mnt:
        msconf.assert_same_tree(out, mnt)
