"""Strategies written by `ckptfs strategy new` (for checkpoints that come without one): MindSpore
reads them with the layouts the rules meant, and its own `transform_checkpoints` with them writes
exactly the mounted bytes, as the destination of a full checkpoint and as the source strategy of
files saved in that layout, in the protobuf and the JSON form alike.

The model, its rules and the expected cuts are those of tests/integration/test_strategy_new.py: a
llama-like layer (row- and column-split weights, a vocabulary-split embedding, a replicated norm
and bias) saved whole by the fixture generator, cut 4-way tensor-parallel."""

import os

import pytest

import msconf
import test_strategy_new as tp
from msconf import itest, ms

FORMS = {"protobuf": "tp4.ckpt_strategy", "json": "tp4.json"}


def write_strategy(ckptfs, fx, workdir, form):
    path = os.path.join(workdir, FORMS[form])
    itest.run([ckptfs, "strategy", "new", fx.src_dir, "--devices", str(tp.DEVICES), *tp.RULES,
               "-o", path])
    return path


def map_for(shape, dim):
    """MindSpore's tensor map of a tensor split along `dim` of a one-axis mesh (or replicated)."""
    if dim is not None and dim < 0:
        dim += len(shape)
    return [0 if d == dim else -1 for d in range(len(shape))]


@pytest.mark.parametrize("form", list(FORMS))
def test_strategy_new_transform(ckptfs, tmp_path, form):
    """transform_checkpoints(full, dst=strategy new) == mount; MindSpore reads the rules' layouts"""
    workdir = str(tmp_path)
    fx = msconf.make_fixture(tp.case(), os.path.join(workdir, "fixture"))
    strategy = write_strategy(ckptfs, fx, workdir, form)
    layouts = ms.build_searched_strategy(strategy)
    assert sorted(layouts) == sorted(name for name, _, _, _ in tp.MODEL)
    for name, _, shape, dim in tp.MODEL:
        assert [list(d.dim) for d in layouts[name].dev_matrix] == [[tp.DEVICES]], name
        assert [list(m.dim) for m in layouts[name].tensor_map] == [map_for(shape, dim)], name

    out = msconf.transform(fx.src_dir, os.path.join(workdir, "transformed"), None, strategy)
    assert msconf.tree_files(out) == [f"rank_{t}/checkpoint_{t}.ckpt" for t in range(tp.DEVICES)]
    # MindSpore's cut is the rules' cut of the generator's tensors (NumPy, independently).
    full = tp.full_tensors(fx)
    for t in range(tp.DEVICES):
        loaded = ms.load_checkpoint(os.path.join(out, f"rank_{t}", f"checkpoint_{t}.ckpt"))
        for name, _, _, dim in tp.MODEL:
            want = tp.block(full[name][1], dim, t)
            assert list(loaded[name].shape) == list(want.shape), (t, name)
            assert msconf.raw_bytes(loaded[name]) == want.tobytes(), \
                f"rank {t} {name}: MindSpore's values differ"
    converted = msconf.ckpt_to_safetensors(out, os.path.join(workdir, "converted"))
    with msconf.mounted(ckptfs, fx.src_dir, workdir, dst_strategy=strategy) as mnt:
        msconf.assert_same_tree(out, mnt, only=".ckpt")
        msconf.assert_same_tree(converted, mnt, only=".safetensors")


@pytest.mark.parametrize("form", list(FORMS))
def test_strategy_new_as_source(ckptfs, tmp_path, form):
    """transform_checkpoints(saved in the layout, src=strategy new) == mount with --src-strategy"""
    workdir = str(tmp_path)
    fx = msconf.make_fixture(tp.case(), os.path.join(workdir, "fixture"))
    strategy = write_strategy(ckptfs, fx, workdir, form)
    # Files saved in the written layout, by MindSpore itself.
    saved = msconf.transform(fx.src_dir, os.path.join(workdir, "saved"), None, strategy)
    merged = msconf.transform(saved, os.path.join(workdir, "merged"), strategy, None)
    assert msconf.tree_files(merged) == ["rank_0/checkpoint_0.ckpt"]
    with msconf.mounted(ckptfs, saved, workdir, src_strategy=strategy) as mnt:
        msconf.assert_same_tree(merged, mnt, only=".ckpt")
    full = tp.full_tensors(fx)
    loaded = ms.load_checkpoint(os.path.join(merged, "rank_0", "checkpoint_0.ckpt"))
    for name, _, _, _ in tp.MODEL:
        assert msconf.raw_bytes(loaded[name]) == full[name][1].tobytes(), name
