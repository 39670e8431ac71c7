"""PyTorch writes Distributed Checkpoint (DCP) directories itself in this run (torch 2.6.0 on CPU,
processes joined by the gloo backend: plain tensors, FSDP2's Shard(0) with uneven and empty
shards, tensor-parallel Shard(1) on a 2x2 mesh with replicated tensors, non-tensor items, two
files per rank), and ckptfs's merged view of each is compared with what torch's own tools make of
the same directory: `dcp_to_torch_save`'s file, `dcp.load` into full tensors, and the
`safetensors.torch` loaders reading the mounted file."""

import gc
import json
import os
import re
import subprocess
import sys

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


# Per case, a --shard-size cutting its few hundred bytes into several shards.
SHARD_SIZES = {"plain": 64, "fsdp": 100, "tp": 300, "threads": 64, "objects": 40}


@pytest.mark.parametrize("case", sorted(SHARD_SIZES))
def test_sharded_view_loads_like_save_pretrained(ckptfs, saved, case, tmp_path):
    """--shard-size: a loader reading model.safetensors.index.json and load_file on each shard
    gets dcp_to_torch_save's tensors, cut as save_pretrained cuts them"""
    src = os.path.join(saved, case)
    out = str(tmp_path / "full.pt")
    dcp_to_torch_save(src, out)
    full = {k: v for k, v in flatten(torch.load(out, weights_only=False)).items()
            if isinstance(v, torch.Tensor)}
    shards = itest.hf_split(list(full), {k: t.numel() * t.element_size() for k, t in full.items()},
                            SHARD_SIZES[case])
    assert len(shards) > 1, shards
    files = [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))]
    mnt = str(tmp_path / "mnt")
    with itest.mounted(ckptfs, src, mnt, index_dir=str(tmp_path / "index"),
                       extra_args=["--shard-size", str(SHARD_SIZES[case])]):
        assert sorted(os.listdir(mnt)) == sorted(files + ["model.safetensors.index.json"])
        with open(os.path.join(mnt, "model.safetensors.index.json")) as f:
            index = json.load(f)
        assert index == {
            "metadata": {"total_size": sum(t.numel() * t.element_size() for t in full.values())},
            "weight_map": {n: files[i] for i, names in enumerate(shards) for n in names}}
        loaded = {}
        for name in sorted(set(index["weight_map"].values())):
            # Copies: load_file's tensors map the file, which must be closed to unmount.
            shard = {k: v.clone() for k, v in load_file(os.path.join(mnt, name)).items()}
            assert sorted(shard) == sorted(n for n, f in index["weight_map"].items() if f == name)
            loaded.update(shard)
            del shard
        gc.collect()
    assert sorted(loaded) == sorted(full)
    for name, t in full.items():
        assert same(loaded[name], t), name


def test_rename_map_gives_a_loaders_names(ckptfs, saved, tmp_path):
    """--rename: the mounted file holds dcp_to_torch_save's tensors under the first matching
    rule's names"""
    src = os.path.join(saved, "fsdp")
    rules = tmp_path / "rename.txt"
    rules.write_text("# a loader's names\n"
                     "layers\\.([0-9]+)\\.w\tmodel.layers.\\1.weight\n"
                     "layers\\.([0-9]+)\\.b\tmodel.layers.\\1.bias\n"
                     "(.*)\tmodel.\\1\n")
    out = str(tmp_path / "full.pt")
    dcp_to_torch_save(src, out)
    full = flatten(torch.load(out, weights_only=False))
    renamed = {}
    for name, t in full.items():
        m = re.fullmatch(r"layers\.([0-9]+)\.(w|b)", name)
        key = (f"model.layers.{m.group(1)}.{'weight' if m.group(2) == 'w' else 'bias'}" if m
               else f"model.{name}")
        renamed[key] = t
    mnt = str(tmp_path / "mnt")
    with itest.mounted(ckptfs, src, mnt, index_dir=str(tmp_path / "index"),
                       extra_args=["--rename", str(rules)]):
        mounted = {k: v.clone() for k, v in load_file(os.path.join(mnt, "model.safetensors")).items()}
        gc.collect()
    assert sorted(mounted) == sorted(renamed)
    for name, t in renamed.items():
        assert same(mounted[name], t), name
