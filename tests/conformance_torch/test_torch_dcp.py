"""PyTorch writes Distributed Checkpoint (DCP) directories itself in this run (torch 2.6.0 on CPU,
processes joined by the gloo backend: plain tensors, FSDP2's Shard(0) with uneven and empty
shards, tensor-parallel Shard(1) on a 2x2 mesh with replicated tensors, non-tensor items, two
files per rank), and ckptfs's merged view of each is compared with what torch's own tools make of
the same directory: `dcp_to_torch_save`'s file, `dcp.load` into full tensors, and the
`safetensors.torch` loaders reading the mounted file."""

import os

import pytest
import torch
import torch.distributed.checkpoint as dcp
from safetensors import safe_open
from safetensors.torch import load_file
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

import itest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CASES = ["plain", "fsdp", "tp", "objects", "threads"]


def flatten(tree, prefix=""):
    """A nested state dict as DCP names its items: keys joined with '.'."""
    out = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flatten(value, name + "."))
        else:
            out[name] = value
    return out


def same(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)


@pytest.fixture
def view(ckptfs, saved, request, tmp_path):
    """The case's merged view, mounted; yields (source directory, mounted model.safetensors)."""
    src = os.path.join(saved, request.param)
    mnt = str(tmp_path / "mnt")
    with itest.mounted(ckptfs, src, mnt, index_dir=str(tmp_path / "index")):
        yield src, os.path.join(mnt, "model.safetensors")


@pytest.mark.parametrize("view", CASES, indirect=True)
def test_merged_view_equals_dcp_to_torch_save(view, tmp_path):
    """The merged view equals dcp_to_torch_save's output, tensor for tensor"""
    src, path = view
    out = str(tmp_path / "full.pt")
    dcp_to_torch_save(src, out)
    full = flatten(torch.load(out, weights_only=False))
    tensors = {k: v for k, v in full.items() if isinstance(v, torch.Tensor)}
    mounted = load_file(path)
    assert sorted(mounted) == sorted(tensors)
    for name, t in tensors.items():
        assert same(mounted[name], t), name
    # Non-tensor items (objects) are named at mount, never served as tensors.
    assert set(full) - set(tensors) == {n for n in full if n not in mounted}


@pytest.mark.parametrize("view", CASES, indirect=True)
def test_merged_view_equals_dcp_load(view):
    """dcp.load into full tensors gives the merged view's values"""
    src, path = view
    with safe_open(path, framework="pt") as f:
        names = list(f.keys())
        shapes = {n: f.get_slice(n).get_shape() for n in names}
        mounted = {n: f.get_tensor(n) for n in names}
    state = {n: torch.empty(shapes[n], dtype=mounted[n].dtype) for n in names}
    dcp.load(state, checkpoint_id=src)
    for name in names:
        assert same(mounted[name], state[name]), name


@pytest.mark.parametrize("view", CASES, indirect=True)
def test_slices_read_lazily(view):
    """safe_open's get_slice reads parts of the mounted file as torch slices them"""
    src, path = view
    reference = load_file(os.path.join(os.path.dirname(src), os.path.basename(src) +
                                       ".reference.safetensors"))
    with safe_open(path, framework="pt") as f:
        for name, t in reference.items():
            if t.dim() == 0 or t.shape[0] < 2:
                continue
            half = t.shape[0] // 2
            got = f.get_slice(name)[half:]
            assert same(got, t[half:]), name
