"""MindFormers 2.1.0's own Checkpoint 2.0 save (tests/conformance/mf_save.py: its
`save_checkpoint` for a simulated 4-rank world, with and without `remove_redundancy`) mounted:
the merged view holds the full tensors the ranks' slices were cut from, `load_checkpoint` reads
its `.ckpt` with common.json's counters, and a destination strategy cuts it as the fixture
generator's layout math says."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import msconf
from ckptfix.layout import Layout

HERE = os.path.dirname(os.path.abspath(__file__))
pytestmark = pytest.mark.framework("MindFormers")

# The same model on 4 ranks laid out otherwise. Names a destination strategy leaves out pass
# through as MindSpore's transform passes them: the block of source rank t mod 4, so only the
# replicated ones (norm, step_ids) are left out; wo is named but kept whole.
DST = {"embedding.weight": ([4], [-1, 0]),
       "layers.0.attention.wq.weight": ([2, 2], [0, 1]),
       "layers.0.attention.wo.weight": ([4], [-1, -1]),
       "layers.0.ffn.w1.weight": ([4], [0, -1]),
       "lm_head.weight": ([2, 2], [-1, 1])}


def mindformers_save(root, dedup):
    cmd = [sys.executable, os.path.join(HERE, "mf_save.py"), root] + (["--dedup"] if dedup else [])
    # MindFormers' logger writes output/log under the working directory.
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600,
                          cwd=os.path.dirname(root))
    assert proc.returncode == 0, proc.stderr[-4000:]
    with open(os.path.join(root, "latest_checkpointed_iteration.txt")) as f:
        assert f.read().strip() == "7"
    with np.load(os.path.join(root, "full.npz")) as full:
        return {k: full[k] for k in full.files}


def write_dst(path):
    items = {name: {"dev_matrix": dev, "tensor_map": tmap, "field": 0,
                    "opt_weight_shard_step": 0, "opt_weight_shard_size": 0}
             for name, (dev, tmap) in DST.items()}
    with open(path, "w") as f:
        json.dump({"parallel_layout_item": items}, f)
    return path


@pytest.mark.parametrize("dedup", [False, True], ids=["full save", "remove_redundancy"])
def test_mindformers_metadata_save(ckptfs, tmp_path, dedup):
    """MindFormers' save_checkpoint (Checkpoint 2.0) mounted == the tensors it saved"""
    from safetensors.numpy import load_file
    import mindspore as ms

    root = str(tmp_path / "checkpoint")
    full = mindformers_save(root, dedup)
    with open(os.path.join(root, "iteration_00000007", "common.json")) as f:
        common = json.load(f)
    with msconf.mounted(ckptfs, root, str(tmp_path / "merged")) as mnt:
        view = load_file(os.path.join(mnt, "rank_0", "checkpoint_0.safetensors"))
        assert sorted(view) == sorted(full)
        for name, value in full.items():
            assert np.array_equal(view[name], value), name
        loaded = ms.load_checkpoint(os.path.join(mnt, "rank_0", "checkpoint_0.ckpt"))
        for name, value in full.items():
            assert np.array_equal(loaded[name].asnumpy(), value), name
        for key in ("epoch_num", "step_num", "global_step", "loss_scale", "global_batch_size"):
            assert float(loaded[key].asnumpy()) == common[key], key
    dst = write_dst(str(tmp_path / "dst.json"))
    with msconf.mounted(ckptfs, root, str(tmp_path / "cut"), dst_strategy=dst) as mnt:
        for rank in range(4):
            loaded = ms.load_checkpoint(os.path.join(mnt, f"rank_{rank}",
                                                     f"checkpoint_{rank}.ckpt"))
            for name, value in full.items():
                want = value
                if name in DST:
                    box = Layout.from_map(*DST[name]).box(rank, value.shape)
                    want = value[tuple(slice(b, e) for b, e in box)]
                assert np.array_equal(loaded[name].asnumpy(), want), (rank, name)
