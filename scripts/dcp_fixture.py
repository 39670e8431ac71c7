#!/usr/bin/env python3
"""Writes small PyTorch Distributed Checkpoint (DCP) directories with real torch, for ckptfs's
tests (tests/data/dcp/). Needs torch (CPU is enough) and safetensors; run it from a venv that has
them, never from the test suite:

    /work/venv-torch/bin/python scripts/dcp_fixture.py OUTDIR

Each case is one directory OUTDIR/<case>/ written by torch.distributed.checkpoint.save with a
FileSystemWriter (processes joined by the gloo backend), plus OUTDIR/<case>.reference.safetensors
holding the full tensors the case started from (the independent oracle: written by the
safetensors package from the same full tensors before any sharding), and, for cases with a
non-tensor item, OUTDIR/<case>.objects.json naming the BYTE_IO items expected.

Cases:
  plain       one process: plain tensors of several dtypes and ranks, and a non-contiguous one
  fsdp        4 ranks, DTensor Shard(0) (FSDP2's placement), including 5 rows over 4 ranks
              (2, 2, 1, 0 rows: torch's split gives a zero-size shard) and 3 rows over 4
  tp          4 ranks on a 2x2 mesh: Shard(1) over one axis, Replicate over the other; fully
              replicated tensors; a 2-D Shard(0), Shard(1) tensor
  objects     2 ranks: tensors plus non-tensor values (BYTE_IO items: an int, a list, a dict of
              strings, bytes)
  threads     2 ranks, FileSystemWriter(thread_count=2): two files per rank

Damaged copies for the refusal tests, OUTDIR/bad/<kind>/.metadata: fsdp's .metadata loaded with
pickle, changed as named, and pickled again (the data files are fsdp's); `bad_size` and
`compressed` also get their own one-item __0_0.distcp:
  overlap      a chunk of layers.0.w moved one row up onto its neighbour
  gap          a chunk of layers.0.w one row short
  bounds       the last chunk of layers.0.w moved past the tensor's end
  past_end     the item of layers.0.w's first chunk placed past its file's end
  items_overlap  the item of layers.0.b's first chunk starting inside layers.0.w's
  foreign      planner_data holding an argparse.Namespace (a global outside the allow-list)
  bad_size     a chunk saved as a view of a larger storage (data/0 twice the chunk's bytes)
  compressed   an item with transform_descriptors ['stream.zstd/1'], as torch >= 2.7 writes
  no_storage   a chunk whose storage entry is missing

    python scripts/dcp_fixture.py --bad OUTDIR   only (re)writes OUTDIR/bad from OUTDIR/fsdp

Models (for the conformance lane's resharding checks, not tests/data/dcp):
    python scripts/dcp_fixture.py --models OUTDIR
writes OUTDIR/<case>/ for a small MLP (two Linear layers and a LayerNorm, seeded) saved through
`get_model_state_dict` by 4 processes:
  fsdp2_model  FSDP2: `fully_shard` on a 4-rank mesh (every parameter Shard(0))
  tp_model     `parallelize_module`: ColwiseParallel w1 (Shard(0)), RowwiseParallel w2 (weight
               Shard(1), bias replicated), LayerNorm plain on every rank
and
    python scripts/dcp_fixture.py --load LAYOUT SRC OUT
loads SRC with `dcp.load` into 2 processes laid out another way and writes what each process
holds, OUT/rank_<k>.safetensors (the local shard of every tensor, the whole tensor if it is
replicated or plain there):
  tp       the MLP under `parallelize_module` (ColwiseParallel w1, RowwiseParallel w2)
  fsdp2    the MLP under `fully_shard` (every parameter Shard(0))
  shard0   DTensors built from SRC's .metadata: Shard(0) where the first dimension splits in
           two, otherwise plain tensors
"""

import json
import os
import sys
import tempfile

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.multiprocessing as mp
from safetensors.torch import save_file


def full_tensors(case):
    g = torch.Generator().manual_seed(1234 + sum(map(ord, case)))

    def rnd(*shape, dtype=torch.float32):
        t = torch.randn(*shape, generator=g)
        return t.to(dtype)

    if case == "plain":
        return {
            "w": rnd(6, 4),
            "b": rnd(4, dtype=torch.bfloat16),
            "h": rnd(3, 2, 5, dtype=torch.float16),
            "ids": torch.arange(7, dtype=torch.int64) * 3 - 5,
            "mask": torch.tensor([True, False, True]),
            "scalar": torch.tensor(2.5, dtype=torch.float64),
            "t": rnd(5, 3),  # saved transposed-back below: a non-contiguous source view
            "empty": torch.zeros(0, 4),
        }
    if case == "fsdp":
        return {
            "layers.0.w": rnd(16, 8),
            "layers.0.b": rnd(8, dtype=torch.bfloat16),
            "odd": rnd(5, 3),
            "few": rnd(3, 2),
            "big": rnd(10, 4, dtype=torch.float16),
        }
    if case == "tp":
        return {
            "col": rnd(8, 12),  # Shard(1) over tp, Replicate over dp
            "row": rnd(6, 10),  # Shard(0) over dp, Shard(1) over tp
            "norm": rnd(12),  # Replicate everywhere
            "plain": rnd(3, 3, dtype=torch.bfloat16),  # a plain tensor on every rank
        }
    if case == "objects":
        return {"w": rnd(4, 4), "v": rnd(6, dtype=torch.float16)}
    if case == "threads":
        return {"a": rnd(8, 4), "b": rnd(8, 2), "c": rnd(4), "d": rnd(2, 6)}
    raise ValueError(case)


def local_state(case, rank, world, full):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    if case == "plain":
        sd = {k: v for k, v in full.items() if k != "t"}
        sd["t"] = full["t"].t().contiguous().t()  # strides (1, 5)
        return sd
    if case in ("fsdp", "objects", "threads"):
        mesh = init_device_mesh("cpu", (world,))
        sd = {k: distribute_tensor(v, mesh, [Shard(0)]) for k, v in full.items()}
        if case == "objects":
            sd["step"] = 42
            sd["extra"] = {"name": "run-7", "lr": [0.1, 0.01]}
            sd["blob"] = b"\x00\x01opaque"
        return sd
    if case == "tp":
        mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
        return {
            "col": distribute_tensor(full["col"], mesh, [Replicate(), Shard(1)]),
            "row": distribute_tensor(full["row"], mesh, [Shard(0), Shard(1)]),
            "norm": distribute_tensor(full["norm"], mesh, [Replicate(), Replicate()]),
            "plain": full["plain"].clone(),
        }
    raise ValueError(case)


WORLD = {"plain": 1, "fsdp": 4, "tp": 4, "objects": 2, "threads": 2}


def leave():
    """Ends a worker whose work is done and synced (the barrier before it). gloo's teardown,
    destroy_process_group, now and then hangs in a futex once the other workers have left (twice
    in a row in one run of the conformance lane), so a finished worker exits without it."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def worker(rank, world, case, out, port):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        full = full_tensors(case)
        sd = local_state(case, rank, world, full)
        writer = dcp.FileSystemWriter(out, thread_count=2 if case == "threads" else 1)
        dcp.save(sd, storage_writer=writer)
        dist.barrier()
    except BaseException:
        dist.destroy_process_group()
        raise
    leave()


MODEL_WORLD = 4
LOAD_WORLD = 2


def mlp():
    import torch.nn as nn

    class MLP(nn.Module):
        def __init__(self):
            super().__init__()
            self.w1 = nn.Linear(16, 32)
            self.w2 = nn.Linear(32, 16)
            self.norm = nn.LayerNorm(16)

    torch.manual_seed(7)  # the same full parameters in every process
    model = MLP()
    with torch.no_grad():  # LayerNorm starts as ones and zeros: make it worth comparing
        model.norm.weight.uniform_(0.5, 1.5)
        model.norm.bias.uniform_(-0.5, 0.5)
    return model


def laid_out(model, layout, world):
    from torch.distributed._composable.fsdp import fully_shard
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                                   parallelize_module)

    mesh = init_device_mesh("cpu", (world,))
    if layout == "tp":
        return parallelize_module(model, mesh, {"w1": ColwiseParallel(), "w2": RowwiseParallel()})
    fully_shard(model, mesh=mesh)
    return model


def model_worker(rank, world, case, out, port):
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        model = laid_out(mlp(), "tp" if case == "tp_model" else "fsdp2", world)
        dcp.save(get_model_state_dict(model), storage_writer=dcp.FileSystemWriter(out))
        dist.barrier()
    except BaseException:
        dist.destroy_process_group()
        raise
    leave()


def load_worker(rank, world, layout, src, out, port):
    from torch.distributed.checkpoint.state_dict import get_model_state_dict
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard, distribute_tensor

    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        if layout == "shard0":
            mesh = init_device_mesh("cpu", (world,))
            md = dcp.FileSystemReader(src).read_metadata()
            state = {}
            for name, item in md.state_dict_metadata.items():
                if not hasattr(item, "chunks"):
                    continue
                empty = torch.zeros(item.size, dtype=item.properties.dtype)
                split = len(item.size) > 0 and item.size[0] % world == 0
                state[name] = distribute_tensor(empty, mesh, [Shard(0)]) if split else empty
        else:
            model = mlp()
            with torch.no_grad():  # nothing of the seeded values may survive the load
                for p in model.parameters():
                    p.zero_()
            state = get_model_state_dict(laid_out(model, layout, world))
        dcp.load(state, checkpoint_id=src)
        local = {k: (v.to_local() if isinstance(v, DTensor) else v).contiguous()
                 for k, v in state.items()}
        save_file(local, os.path.join(out, f"rank_{rank}.safetensors"))
        dist.barrier()
    except BaseException:
        dist.destroy_process_group()
        raise
    leave()


def free_port():
    """A port no one listens on now: fixed ports collide with other runs of this script."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def make_bad(root):
    import argparse
    import copy
    import pickle

    from torch.distributed.checkpoint.filesystem import _StorageInfo
    from torch.distributed.checkpoint.metadata import (ChunkStorageMetadata, Metadata,
                                                       MetadataIndex, TensorProperties,
                                                       TensorStorageMetadata)

    with open(os.path.join(root, "fsdp", ".metadata"), "rb") as f:
        base = pickle.load(f)

    def write(kind, md):
        out = os.path.join(root, "bad", kind)
        os.makedirs(out, exist_ok=True)
        with open(os.path.join(out, ".metadata"), "wb") as f:
            pickle.dump(md, f)
        return out

    def moved(md, fqn, index, offsets=None, sizes=None):
        """Chunk `index` of `fqn` given new offsets/sizes, its storage key following it."""
        chunk = md.state_dict_metadata[fqn].chunks[index]
        old = MetadataIndex(fqn, chunk.offsets)
        new_offsets = torch.Size(offsets) if offsets is not None else chunk.offsets
        new_sizes = torch.Size(sizes) if sizes is not None else chunk.sizes
        md.state_dict_metadata[fqn].chunks[index] = ChunkStorageMetadata(new_offsets, new_sizes)
        info = md.storage_data.pop(old)
        md.storage_data[MetadataIndex(fqn, new_offsets, index)] = info
        return md

    write("overlap", moved(copy.deepcopy(base), "layers.0.w", 1, offsets=[3, 0]))
    write("gap", moved(copy.deepcopy(base), "layers.0.w", 1, sizes=[3, 8]))
    write("bounds", moved(copy.deepcopy(base), "layers.0.w", 3, offsets=[13, 0]))
    md = copy.deepcopy(base)
    md.storage_data[MetadataIndex("layers.0.w", torch.Size([0, 0]))].offset = 100000
    write("past_end", md)
    md = copy.deepcopy(base)
    md.storage_data[MetadataIndex("layers.0.b", torch.Size([0]))].offset = 1000
    write("items_overlap", md)
    md = copy.deepcopy(base)
    md.planner_data = argparse.Namespace(lr=0.1)
    write("foreign", md)
    md = copy.deepcopy(base)
    del md.storage_data[MetadataIndex("odd", torch.Size([2, 0]))]
    write("no_storage", md)

    # One-tensor checkpoints written item by item as FileSystemWriter does (torch.save into the
    # data file), with DCP's own metadata classes.
    def one_item(kind, saved, chunk_shape, extra=None):
        out = os.path.join(root, "bad", kind)
        os.makedirs(out, exist_ok=True)
        path = os.path.join(out, "__0_0.distcp")
        with open(path, "wb") as f:
            torch.save(saved, f)
        info = _StorageInfo("__0_0.distcp", 0, os.path.getsize(path))
        if extra:
            info.__dict__.update(extra)
        md = Metadata(
            state_dict_metadata={"w": TensorStorageMetadata(
                TensorProperties(dtype=torch.float32), torch.Size(chunk_shape),
                [ChunkStorageMetadata(torch.Size([0] * len(chunk_shape)),
                                      torch.Size(chunk_shape))])},
            storage_data={MetadataIndex("w", torch.Size([0] * len(chunk_shape)), 0): info})
        write(kind, md)

    one_item("bad_size", torch.arange(32, dtype=torch.float32).reshape(8, 4)[:4], [4, 4])
    one_item("compressed", torch.ones(4, 4), [4, 4],
             {"transform_descriptors": ["stream.zstd/1"]})


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "--bad":
        make_bad(sys.argv[2])
        return
    if len(sys.argv) == 3 and sys.argv[1] == "--models":
        for case in ["fsdp2_model", "tp_model"]:
            out = os.path.join(sys.argv[2], case)
            os.makedirs(out, exist_ok=True)
            mp.spawn(model_worker, args=(MODEL_WORLD, case, out, free_port()), nprocs=MODEL_WORLD,
                     join=True)
        return
    if len(sys.argv) == 5 and sys.argv[1] == "--load":
        layout, src, out = sys.argv[2:]
        os.makedirs(out, exist_ok=True)
        mp.spawn(load_worker, args=(LOAD_WORLD, layout, src, out, free_port()), nprocs=LOAD_WORLD,
                 join=True)
        return
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    root = sys.argv[1]
    os.makedirs(root, exist_ok=True)
    for case in ["plain", "fsdp", "tp", "objects", "threads"]:
        out = os.path.join(root, case)
        os.makedirs(out, exist_ok=True)
        mp.spawn(worker, args=(WORLD[case], case, out, free_port()), nprocs=WORLD[case], join=True)
        save_file({k: v.contiguous() for k, v in full_tensors(case).items()},
                  os.path.join(root, case + ".reference.safetensors"))
        if case == "objects":
            with open(os.path.join(root, case + ".objects.json"), "w") as f:
                json.dump(["blob", "step", "extra.name", "extra.lr"], f)
    make_bad(root)
    print("torch", torch.__version__)


if __name__ == "__main__":
    main()
