"""MindFormers 2.1.0's own Checkpoint 2.0 save (tests/conformance/mf_save.py: its
`save_checkpoint` of a model and its AdamW optimizer for a simulated 4-rank world, with and
without `remove_redundancy`; the ranks' slices cut by MindSpore's own layout rule) mounted, and
every view read back by the frameworks: MindFormers' own `load_checkpoint` (mf_load.py, the
trainer's resume path) and MindSpore's `load_checkpoint` give the full model and optimizer state
from the merged view, with common.json's counters, and rank r's block from a view cut by a
destination strategy (the fixture generator's layout math for the named weights)."""

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
# The optimizer's moments are laid out as their weights, as a destination job's strategy gives them.
DST.update({moment + name: DST[name] for name in list(DST) for moment in ("adam_m.", "adam_v.")})


def mindformers_save(root, dedup):
    cmd = [sys.executable, os.path.join(HERE, "mf_save.py"), root] + (["--dedup"] if dedup else [])
    # MindFormers' logger writes output/log under the working directory.
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600,
                          cwd=os.path.dirname(root))
    assert proc.returncode == 0, proc.stderr[-4000:]
    with open(os.path.join(root, "latest_checkpointed_iteration.txt")) as f:
        assert f.read().strip() == "7"
    names = set(os.listdir(os.path.join(root, "iteration_00000007")))
    for rank in range(4) if not dedup else ():
        assert f"opt-{rank:07d}-0000004.safetensors" in names, sorted(names)
    assert any(n.startswith("opt-") for n in names), sorted(names)
    tensors = {}
    for part in ("full.npz", "optimizer.npz"):
        with np.load(os.path.join(root, part)) as saved:
            tensors.update({k: saved[k] for k in saved.files})
    return tensors


def mindformers_load(directory, template, workdir):
    """Every model and optimizer parameter after MindFormers' own load of `directory` into a
    model shaped like `template` (name -> array) and its AdamW (mf_load.py)."""
    os.makedirs(workdir, exist_ok=True)
    shapes, out = os.path.join(workdir, "template.npz"), os.path.join(workdir, "loaded.npz")
    np.savez(shapes, **template)
    proc = subprocess.run([sys.executable, os.path.join(HERE, "mf_load.py"), directory, shapes,
                           out], capture_output=True, text=True, timeout=600, cwd=workdir)
    assert proc.returncode == 0, proc.stderr[-4000:]
    with np.load(out) as loaded:
        return {k: loaded[k] for k in loaded.files}


def assert_state(loaded, want, where):
    """`loaded` holds each of `want`'s tensors with its dtype, shape and values."""
    missing = sorted(set(want) - set(loaded))
    assert not missing, f"{where}: not loaded: {missing}"
    for name, value in want.items():
        got = loaded[name]
        assert got.dtype == value.dtype and got.shape == value.shape, (where, name, got.shape)
        assert np.array_equal(got, value), (where, name)


def write_dst(path):
    items = {name: {"dev_matrix": dev, "tensor_map": tmap, "field": 0,
                    "opt_weight_shard_step": 0, "opt_weight_shard_size": 0}
             for name, (dev, tmap) in DST.items()}
    with open(path, "w") as f:
        json.dump({"parallel_layout_item": items}, f)
    return path


def ms_load(path):
    """mindspore.load_checkpoint of `path`, as numpy arrays."""
    import mindspore as ms
    return {k: v.asnumpy() for k, v in ms.load_checkpoint(path).items()}


@pytest.mark.parametrize("dedup", [False, True], ids=["full save", "remove_redundancy"])
def test_mindformers_metadata_save(ckptfs, tmp_path, dedup):
    """MindFormers' save_checkpoint with AdamW, mounted and loaded by MindFormers and MindSpore

    Checkpoint 2.0 (metadata.json, model- and opt- files): the loaded values are what it saved."""
    from safetensors.numpy import load_file

    root = str(tmp_path / "checkpoint")
    full = mindformers_save(root, dedup)
    model = {k: v for k, v in full.items() if not k.startswith(("adam_", "global_step"))}
    with open(os.path.join(root, "iteration_00000007", "common.json")) as f:
        common = json.load(f)
    with msconf.mounted(ckptfs, root, str(tmp_path / "merged")) as mnt:
        view = load_file(os.path.join(mnt, "rank_0", "checkpoint_0.safetensors"))
        assert sorted(view) == sorted(full)
        assert_state(view, full, "safetensors view")
        assert_state(mindformers_load(os.path.join(mnt, "rank_0"), model, str(tmp_path / "mf0")),
                     full, "MindFormers load_checkpoint of rank_0/")
        loaded = ms_load(os.path.join(mnt, "rank_0", "checkpoint_0.ckpt"))
        assert_state(loaded, full, "mindspore.load_checkpoint of checkpoint_0.ckpt")
        for key in ("epoch_num", "step_num", "global_step", "loss_scale", "global_batch_size"):
            assert float(loaded[key].reshape(-1)[0]) == common[key], key
    dst = write_dst(str(tmp_path / "dst.json"))
    with msconf.mounted(ckptfs, root, str(tmp_path / "cut"), dst_strategy=dst) as mnt:
        for rank in range(4):
            # A name the destination strategy gives is cut by the generator's layout math; the
            # rest (the optimizer state among them) is the block source rank `rank` saved.
            with np.load(os.path.join(root, f"saved_rank_{rank}.npz")) as saved:
                want = {k: saved[k] for k in saved.files}
            for name in DST:
                box = Layout.from_map(*DST[name]).box(rank, full[name].shape)
                want[name] = full[name][tuple(slice(b, e) for b, e in box)]
            rank_dir = os.path.join(mnt, f"rank_{rank}")
            assert_state(ms_load(os.path.join(rank_dir, f"checkpoint_{rank}.ckpt")), want,
                         f"mindspore.load_checkpoint of rank_{rank}")
            template = {k: v for k, v in want.items() if k in model}
            assert_state(mindformers_load(rank_dir, template, str(tmp_path / f"mf-cut{rank}")),
                         want, f"MindFormers load_checkpoint of rank_{rank}/")
