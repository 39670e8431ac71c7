"""hfai sharded checkpoints written with real torch.save, and hfai's merge rule (spec
torch-hfai-safetensors.md §1.3-§1.5 save, §1.7 load), written from the spec, not from ckptfs.

`save` lays a state out as `hfai.checkpoint.save` does on each of `nshards` ranks: buffers (rank 0
only, unchunked), every tensor of more than `large_size` bytes flattened and cut with torch.chunk
(one piece per rank), the rest spread over the ranks by the greedy size-balancing split; the
optimizer state likewise. `load` merges PART files the way `hfai.checkpoint.load` does. torch is
imported only when these are called (Debian's python3-torch).
"""

import copy
import heapq
import os
from collections import OrderedDict
from typing import Dict, List, Optional, Sequence

import numpy as np

VERSION = "2.0.0"
LARGE_SIZE = 256 << 20  # hfai's constant: larger tensors are chunked


def count_size(value) -> int:
    import torch
    if torch.is_tensor(value):
        return value.numel() * value.element_size()
    if isinstance(value, dict):
        return sum(count_size(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return sum(count_size(v) for v in value)
    if isinstance(value, (int, float)):
        return 8
    return 0


def split_dict(d: dict, nshards: int, clone: bool) -> List[OrderedDict]:
    """§1.4: keys by decreasing size (numpy argsort reversed) to the least-loaded rank."""
    keys = list(d)
    sizes = [count_size(d[k]) for k in keys]
    order = np.argsort(sizes)[::-1]
    heap = [(0, r) for r in range(nshards)]
    out = [OrderedDict() for _ in range(nshards)]
    for i in order:
        load, r = heapq.heappop(heap)
        value = d[keys[i]]
        out[r][keys[i]] = value.clone() if clone and hasattr(value, "clone") else value
        heapq.heappush(heap, (load + sizes[i], r))
    return out


def _chunk(t, nshards: int, rank: int):
    return t.view(-1).chunk(nshards)[rank].clone()


def save(path: str, state_dict: "OrderedDict", buffer_names: Sequence[str], nshards: int,
         optimizer_state: Optional[dict] = None, others: Optional[dict] = None,
         large_size: int = LARGE_SIZE) -> List[str]:
    """Writes path/PART_000.pt ... as hfai's save does; returns the file names."""
    import torch
    os.makedirs(path, exist_ok=True)
    names = []
    for rank in range(nshards):
        sd = OrderedDict(state_dict)
        buffers = OrderedDict((k, sd.pop(k)) for k in buffer_names)
        large = {}
        for k in list(sd):
            v = sd[k]
            if torch.is_tensor(v) and v.numel() * v.element_size() > large_size:
                large[k] = (v.shape, _chunk(v, nshards, rank))
                del sd[k]
        params = split_dict(sd, nshards, clone=True)[rank]
        if rank == 0:
            params.update(buffers)
        obj = {"__nshards__": nshards, "__version__": VERSION, "model": [(params, large)],
               "optimizer": []}
        if optimizer_state is not None:
            share = copy.deepcopy(optimizer_state)
            large_t = {}
            for k1, st in share["state"].items():
                if not isinstance(st, dict):
                    continue
                for k2 in list(st):
                    v = st[k2]
                    if torch.is_tensor(v) and v.numel() * v.element_size() > large_size:
                        large_t[(k1, k2)] = (v.shape, _chunk(v, nshards, rank))
                        del st[k2]
            share["state"] = split_dict(share["state"], nshards, clone=False)[rank]
            obj["optimizer"] = [(share, large_t)]
        if rank == 0 and others:
            obj.update(others)
        name = os.path.join(path, f"PART_{rank:03d}.pt")
        torch.save(obj, name)
        names.append(name)
    return names


def load(path: str) -> dict:
    """§1.7: every PART file loaded whole with torch.load and merged in memory, as hfai does."""
    import torch
    n = len([f for f in os.listdir(path) if f.startswith("PART_") and f.endswith(".pt")])
    parts = [torch.load(os.path.join(path, f"PART_{i:03d}.pt"), map_location="cpu")
             for i in range(n)]
    merged = parts[0]
    models = []
    for j in range(len(parts[0]["model"])):
        model, chunks = {}, {}
        for p in parts:
            small, large = p["model"][j]
            model.update(small)
            for key, (shape, piece) in large.items():
                chunks.setdefault(key, (shape, []))[1].append(piece)
        for key, (shape, pieces) in chunks.items():
            assert key not in model, key
            model[key] = torch.cat(pieces).view(shape)
        models.append(model)
    merged["model"] = models[0] if len(models) == 1 else models
    optimizers = []
    for j in range(len(parts[0]["optimizer"])):
        share = parts[0]["optimizer"][j][0]
        chunks = {}
        for r, p in enumerate(parts):
            if r:
                share["state"].update(p["optimizer"][j][0]["state"])
            for key, (shape, piece) in p["optimizer"][j][1].items():
                chunks.setdefault(key, (shape, []))[1].append(piece)
        for (k1, k2), (shape, pieces) in chunks.items():
            assert k2 not in share["state"][k1], (k1, k2)
            share["state"][k1][k2] = torch.cat(pieces).view(shape)
        optimizers.append(share)
    if optimizers:
        merged["optimizer"] = optimizers[0] if len(optimizers) == 1 else optimizers
    return merged


def tensor_bytes(t) -> bytes:
    """C-order bytes of a tensor (any dtype, bfloat16 included)."""
    import torch
    if t.numel() == 0:
        return b""
    return t.contiguous().view(-1).view(torch.uint8).numpy().tobytes()


def flat_state(optimizer: dict) -> Dict[str, object]:
    """The merged optimizer's tensors as ckptfs names them: state.<param_id>.<key>."""
    import torch
    return {f"state.{k1}.{k2}": v for k1, st in optimizer["state"].items()
            for k2, v in st.items() if torch.is_tensor(v)}
