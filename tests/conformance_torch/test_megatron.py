"""Megatron-Core (0.16.1, pinned in requirements.txt) saves torch_dist checkpoints itself in this
run: a tiny GPTModel (4 layers, SwiGLU) on four processes joined by gloo on CPU
(scripts/megatron_fixture.py), in two layouts: TP 2 x PP 2 x DP 1, and TP 2 x PP 1 x DP 2, where
every model shard has two data-parallel replicas (plain model state, no distributed optimizer)
holding different values, and Megatron writes each shard once, from its main replica. For each
layout: the saved files hold every chunk of every model tensor once, from a rank of
data-parallel rank 0 (read from DCP's .metadata by torch); ckptfs's merged view of the save root
equals the full tensors the generator assembled from every rank's own main-replica shards; and
Megatron-Core's own dist_checkpointing.load of the same directory into the model on one process
(TP 1 x PP 1) equals the view."""

import gc
import itertools
import json
import os
import re
import subprocess
import sys

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

import itest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(REPO, "scripts", "megatron_fixture.py")


def run_script(*args):
    """A gloo group now and then hangs at teardown: under a timeout, once more if it must."""
    for attempt in (1, 2):
        try:
            subprocess.run([sys.executable, SCRIPT, *args], check=True, timeout=900)
            return
        except subprocess.TimeoutExpired:
            if attempt == 2:
                raise


# (TP, PP, DP) on four processes; each save costs minutes on this lane's CPU.
LAYOUTS = [(2, 2, 1), (2, 1, 2)]


@pytest.fixture(scope="session", params=LAYOUTS, ids=lambda l: "tp%d-pp%d-dp%d" % l)
def saved(request, tmp_path_factory):
    out = str(tmp_path_factory.mktemp("megatron"))
    run_script(out, *map(str, request.param))
    return out


@pytest.fixture(scope="session")
def mounted_view(ckptfs, saved, tmp_path_factory):
    mnt = str(tmp_path_factory.mktemp("mnt"))
    index = str(tmp_path_factory.mktemp("index"))
    with itest.mounted(ckptfs, os.path.join(saved, "save"), mnt, index_dir=index):
        # Copies, so that no mapping of the mounted file outlives the mount.
        with safe_open(os.path.join(mnt, "model.safetensors"), "pt") as f:
            view = {name: f.get_tensor(name).clone() for name in f.keys()}
        gc.collect()
    yield view


def same(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)


def overlap(a, b):
    return all(oa < ob + sb and ob < oa + sa
               for oa, sa, ob, sb in zip(a.offsets, a.sizes, b.offsets, b.sizes))


def test_saved_files_hold_each_chunk_once(saved):
    """Megatron-Core torch_dist: every model chunk is saved once, from its main replica"""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import MetadataIndex

    iter_dir = os.path.join(saved, "save", "iter_0000007")
    with open(os.path.join(saved, "reference.json")) as f:
        reference = json.load(f)
    dp_rank = reference["layout"]["dp_rank"]
    assert len(dp_rank) == 4
    metadata = FileSystemReader(iter_dir).read_metadata()
    for name in reference["tensors"]:
        meta = metadata.state_dict_metadata[name]
        chunks = meta.chunks
        # Pairwise disjoint and as many elements as the tensor: each element once.
        assert sum(c.sizes.numel() for c in chunks) == meta.size.numel(), name
        for a, b in itertools.combinations(chunks, 2):
            assert not overlap(a, b), name
        for c in chunks:
            path = str(metadata.storage_data[MetadataIndex(name, c.offsets)].relative_path)
            writer = int(re.fullmatch(r"__(\d+)_\d+\.distcp", path).group(1))
            assert dp_rank[writer] == 0, f"{name} {list(c.offsets)}: written by rank {writer}"
    # Every byte of every .distcp file belongs to one stored item: no unlisted second copy.
    items = {}
    for info in metadata.storage_data.values():
        items.setdefault(str(info.relative_path), []).append((info.offset, info.length))
    files = sorted(n for n in os.listdir(iter_dir) if n.endswith(".distcp"))
    assert sorted(items) == files
    for name in files:
        end = 0
        for offset, length in sorted(items[name]):
            assert offset == end, name
            end += length
        assert end == os.path.getsize(os.path.join(iter_dir, name)), name


def test_merged_view_equals_saved_tensors(saved, mounted_view):
    """Megatron-Core torch_dist: the merged view equals the saved full tensors"""
    expected = load_file(os.path.join(saved, "reference.safetensors"))
    assert sorted(mounted_view) == sorted(expected)
    for name, t in expected.items():
        assert same(mounted_view[name], t), name


def test_megatron_load_other_layout_equals_view(saved, mounted_view, tmp_path):
    """Megatron-Core dist_checkpointing.load on TP 1 x PP 1 equals the merged view"""
    out = str(tmp_path / "loaded.safetensors")
    run_script("--load", os.path.join(saved, "save", "iter_0000007"), out)
    loaded = load_file(out)
    assert sorted(loaded) == sorted(mounted_view)
    for name, t in loaded.items():
        assert same(mounted_view[name], t), name
