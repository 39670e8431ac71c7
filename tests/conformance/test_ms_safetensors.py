"""Safetensors sources (MindSpore >= 2.7 `save_checkpoint(..., format="safetensors")`, the
generator's st_* cases): MindSpore's transform of them to `.ckpt` and to safetensors
(`output_format="safetensors"`, with safetensors 0.7.0) writes exactly the two views of the
mount, and both views load with the generator's values."""

import os

import pytest

import msconf
from msconf import ckpt_fixture

# st_4to6 is in test_ms_nonmultiple.py: MindSpore refuses non-multiple device counts. Pipeline
# sources (st_pipeline_src_*) are transformed with their stages in stage order
# (msconf.pipeline_stages_in_order).
CASES = [n for n in ckpt_fixture.SAFETENSORS_BUILTINS if n != "st_4to6"]


@pytest.mark.parametrize("name", CASES)
def test_safetensors_source(ckptfs, tmp_path, name):
    """transform_checkpoints to ckpt and to safetensors == the two views of the mount"""
    workdir = str(tmp_path)
    fx = msconf.make_fixture(name, os.path.join(workdir, "fixture"))
    src = msconf.strategy_for_mindspore(fx.src_strategy, workdir, "src")
    dst = msconf.strategy_for_mindspore(fx.dst_strategy, workdir, "dst")
    as_ckpt = msconf.transform(fx.src_dir, os.path.join(workdir, "to_ckpt"), src, dst)
    as_st = msconf.transform(fx.src_dir, os.path.join(workdir, "to_safetensors"), src, dst,
                             output_format="safetensors")
    with msconf.mounted(ckptfs, fx.src_dir, workdir, fx.src_strategy, fx.dst_strategy) as mnt:
        assert msconf.tree_files(mnt) == sorted(msconf.tree_files(as_ckpt) +
                                                msconf.tree_files(as_st))
        msconf.assert_same_tree(as_st, mnt, only=".safetensors")
        msconf.assert_same_tree(as_ckpt, mnt, only=".ckpt")
        for t, path in fx.expected_files().items():
            view = os.path.join(mnt, f"rank_{t}", f"checkpoint_{t}")
            msconf.assert_loads_as_expected(view + ".ckpt", path)
            msconf.assert_safetensors_as_expected(view + ".safetensors", path)
