"""Real models' DCP checkpoints served resharded (issue 32, item 5): an MLP saved by 4 processes
under FSDP2 (`fully_shard`) and under tensor parallelism (`parallelize_module`, ColwiseParallel
and RowwiseParallel), and the DTensor Shard(1)/Replicate case of test_torch_dcp.py, each loaded by
torch with `dcp.load` into 2 processes laid out another way; the mount with a strategy that
`ckptfs strategy new` writes for that layout must give every process's local shards in its
rank_<k> file, and the merged view of the models must equal `dcp_to_torch_save`'s output."""

import os

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

import itest

# (saved case, layout dcp.load reads it into, `ckptfs strategy new` rules for that layout)
RESHARDS = {
    "fsdp2-to-tp": ("fsdp2_model", "tp", ["--split", r"w1\.(weight|bias)=0",
                                          "--split", r"w2\.weight=1", "--replicate", ".*"]),
    "tp-to-fsdp2": ("tp_model", "fsdp2", ["--split", ".*=0"]),
    "mesh-to-shard0": ("tp", "shard0", ["--split", "col|row|norm=0", "--replicate", ".*"]),
}


def same(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)


def read_view(path):
    """load_file of a mounted file, copied: its tensors map the file, which would keep the mount
    busy at unmount."""
    return {k: v.clone() for k, v in load_file(path).items()}


def source(saved, models, case):
    return os.path.join(models if case.endswith("_model") else saved, case)


@pytest.mark.parametrize("name", sorted(RESHARDS))
def test_resharded_view_equals_dcp_load_local_shards(name, ckptfs, saved, models, torch_script,
                                                      tmp_path):
    """Each rank_<k> file of the resharded view holds what dcp.load gives process k"""
    case, layout, rules = RESHARDS[name]
    src = source(saved, models, case)
    strategy = str(tmp_path / "dst.ckpt")
    itest.run([ckptfs, "strategy", "new", src, "--devices", "2", *rules, "-o", strategy])
    loaded = str(tmp_path / "loaded")
    torch_script("--load", layout, src, loaded)
    mnt = str(tmp_path / "mnt")
    with itest.mounted(ckptfs, src, mnt, dst_strategy=strategy, index_dir=str(tmp_path / "ix")):
        for rank in (0, 1):
            want = load_file(os.path.join(loaded, f"rank_{rank}.safetensors"))
            path = os.path.join(mnt, f"rank_{rank}", f"checkpoint_{rank}.safetensors")
            got = read_view(path)
            assert sorted(got) == sorted(want), rank
            for key, t in want.items():
                assert same(got[key], t), (rank, key)
            with safe_open(path, framework="pt") as f:  # the lazy reader too
                for key in f.keys():
                    assert same(f.get_tensor(key), want[key]), (rank, key)


@pytest.mark.parametrize("case", ["fsdp2_model", "tp_model"])
def test_model_merged_view_equals_dcp_to_torch_save(case, ckptfs, saved, models, tmp_path):
    """A real model's merged view equals dcp_to_torch_save's output, tensor for tensor"""
    src = source(saved, models, case)
    full = str(tmp_path / "full.pt")
    dcp_to_torch_save(src, full)
    want = torch.load(full, weights_only=True)
    mnt = str(tmp_path / "mnt")
    with itest.mounted(ckptfs, src, mnt, index_dir=str(tmp_path / "ix")):
        got = read_view(os.path.join(mnt, "model.safetensors"))
    assert sorted(got) == sorted(want)
    for key, t in want.items():
        assert same(got[key], t), key
