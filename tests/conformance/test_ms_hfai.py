"""hfai sharded PyTorch checkpoints (PART_*.pt, tests/data/hfai) mounted with a --dst-strategy:
MindSpore's own loader opens every resharded view, and MindSpore's own transform gives the values.

The reference: the merged model (tests/data/hfai/expected, written by the fixture tools, the
tensors torch.load + hfai's merge gives; tests/integration/test_hfai.py checks that) saved as one
full MindSpore checkpoint by `save_checkpoint`, then cut by `transform_checkpoints` with no source
strategy and the same destination strategy. Each mounted `.ckpt` and `.safetensors` view, read by
`load_checkpoint`, holds the same entries with the same dtypes, shapes and bytes as MindSpore's
file of that rank (the entry order is the mount's: hfai has no MindSpore order to follow)."""

import gc
import os

import numpy as np
import pytest

import msconf
import test_hfai
from msconf import ms

DATA = os.path.join(msconf.REPO, "tests", "data", "hfai")
SETS = ["hfai_t113_n4", "hfai_t113_n1", "hfai_t26_n2"]


def ms_tensor(ms_type, array):
    """A MindSpore tensor of the merged array; BFloat16 (raw uint16 bits here) widened exactly."""
    if ms_type == "BFloat16":
        wide = (array.astype(np.uint32) << 16).view(np.float32)
        return ms.Tensor(wide, ms.float32).astype(ms.bfloat16)
    return ms.Tensor(array)


def entries(path):
    """name -> (dtype, shape, raw bytes) of a file as load_checkpoint reads it."""
    fmt = "safetensors" if path.endswith(".safetensors") else "ckpt"
    loaded = ms.load_checkpoint(path, format=fmt)
    out = {k: (str(v.dtype), tuple(v.shape), msconf.raw_bytes(v)) for k, v in loaded.items()}
    del loaded
    gc.collect()  # MindSpore's safetensors reader maps the file while its tensors live
    return out


@pytest.mark.parametrize("name", SETS)
def test_hfai_resharded(ckptfs, tmp_path, name):
    """load_checkpoint of every resharded hfai view == transform_checkpoints of the merged model"""
    workdir = str(tmp_path)
    model = test_hfai.merged_arrays(DATA, name)
    full = os.path.join(workdir, "full", "rank_0")
    os.makedirs(full)
    ms.save_checkpoint([{"name": k, "data": ms_tensor(t, a)} for k, t, a in model],
                       os.path.join(full, "checkpoint_0.ckpt"))
    strategy = test_hfai.write_strategy(os.path.join(workdir, "dst.json"), test_hfai.DST_LAYOUTS)
    reference = msconf.transform(os.path.dirname(full), os.path.join(workdir, "transformed"),
                                 None, strategy)
    files = msconf.tree_files(reference)
    assert files == [f"rank_{r}/checkpoint_{r}.ckpt" for r in range(4)], files
    with msconf.mounted(ckptfs, os.path.join(DATA, name), workdir, dst_strategy=strategy) as mnt:
        for rel in files:
            want = entries(os.path.join(reference, rel))
            for ext in (".ckpt", ".safetensors"):
                view = os.path.join(mnt, rel[:-len(".ckpt")] + ext)
                got = entries(view)
                # An empty tensor has no .ckpt record (MindSpore's transform leaves it out too;
                # its safetensors transform fails on one): only the safetensors view holds it.
                extra = sorted(set(got) - set(want))
                if ext == ".safetensors":
                    extra = [k for k in extra if got[k][2] or 0 not in got[k][1]]
                missing = sorted(set(want) - set(got))
                assert not extra and not missing, \
                    f"{view}: entries {extra} are not MindSpore's, {missing} missing"
                for key, value in want.items():
                    assert got[key] == value, f"{view}: {key} differs from MindSpore's"
