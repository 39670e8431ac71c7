"""Safetensors sources (MindSpore >= 2.7 `save_checkpoint(..., format="safetensors")`, the
generator's st_* cases): MindSpore's transform of them to `.ckpt` and to safetensors
(`output_format="safetensors"`, with safetensors 0.7.0) writes exactly the two views of the
mount, and both views load with the generator's values. A `unified_safetensors` directory of
them, mounted as a full source (resharded, or merged into rank_0 without --dst-strategy), holds
the same tensors."""

import gc
import os

import pytest

import msconf
from msconf import ckpt_fixture, ms

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


UNIFIED_CASES = ["st_demo", "st_8to4_dtypes", "st_opt_src"]


def entries(view):
    """The entries of a .ckpt or .safetensors file as MindSpore loads them: name -> raw bytes."""
    fmt = "safetensors" if view.endswith(".safetensors") else "ckpt"
    return {name: msconf.raw_bytes(value)
            for name, value in ms.load_checkpoint(view, format=fmt).items()}


def check_unified(ckptfs, workdir, name, whole):
    """unified_safetensors output of `name`'s shards mounted as a full source, with the case's
    destination strategy or (`whole`) without one, == MindSpore's transform of the shards to the
    same destination (None: merged), each file read by MindSpore's load_checkpoint."""
    fx = msconf.make_fixture(name, os.path.join(workdir, "fixture"))
    dst = None if whole else fx.dst_strategy
    unified = os.path.join(workdir, "unified")
    ms.unified_safetensors(fx.src_dir, fx.src_strategy, unified)
    # Entries outside the strategy: MindSpore keeps one copy (rank 0's) in hyper_param.
    hyper = entries(os.path.join(unified, "hyper_param.safetensors"))
    refs = {".ckpt": msconf.transform(fx.src_dir, os.path.join(workdir, "to_ckpt"),
                                      fx.src_strategy, dst),
            ".safetensors": msconf.transform(fx.src_dir, os.path.join(workdir, "to_st"),
                                             fx.src_strategy, dst, output_format="safetensors")}
    with msconf.mounted(ckptfs, unified, workdir, None, dst) as mnt:
        for ext, ref in refs.items():
            files = msconf.tree_files(ref)
            assert [f for f in msconf.tree_files(mnt) if f.endswith(ext)] == files
            for rel in files:
                got, want = entries(os.path.join(mnt, rel)), entries(os.path.join(ref, rel))
                assert sorted(got) == sorted(want), f"{rel}: other entries"
                for key, value in want.items():
                    assert got[key] == hyper.get(key, value), f"{rel}: {key} differs"
                del got
        gc.collect()  # MindSpore's safetensors reader maps the file while its tensors live


@pytest.mark.parametrize("name", UNIFIED_CASES)
def test_unified_safetensors_source(ckptfs, tmp_path, name):
    """unified_safetensors output mounted as a full source == transform_checkpoints of the shards"""
    check_unified(ckptfs, str(tmp_path), name, whole=False)


@pytest.mark.parametrize("name", UNIFIED_CASES)
def test_unified_safetensors_whole(ckptfs, tmp_path, name):
    """unified_safetensors output mounted without --dst-strategy (rank_0, one merged file) ==
    transform_checkpoints of the shards merged (no destination strategy)"""
    check_unified(ckptfs, str(tmp_path), name, whole=True)
