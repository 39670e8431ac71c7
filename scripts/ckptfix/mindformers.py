"""MindFormers metadata checkpoints ("Checkpoint 2.0") by construction, and their expected views.

Written from spec mindspore-safetensors.md §2.6 and its MindFormers 2.1.0 notes, not from ckptfs:
full tensors are cut by a layout (device matrix, tensor map: layout.Layout), each rank's blocks
go to iteration_XXXXXXXX/[prefix-]{model|opt}-IIIIIII-NNNNNNN.safetensors ({"format":"ms"}, the
reference writer's layout; the optimizer file also holds global_step Int32 [1]), and
metadata.json (compact) says per parameter its global shape, layout and chunks (global_offset =
the row-major slice index) and per storage key "('<name>', (<k>,))" the files holding slice k.
Without dedup every rank writes both files and a replicated slice lists every holder; with dedup
each slice goes to its least-loaded holder (MindFormers' balanced rule: slices by (holders,
-size, id)), and only ranks storing something write files, numbered compactly.

The expected views are cut from the same full tensors by the destination layout:
  * .safetensors: every tensor of the target (global_step too), reference writer's layout;
  * .ckpt: stage by stage, the metadata parameters in the files' name order (model file, then
    optimizer file), global_step after the first stage with optimizer states; then common.json's
    counters no file holds (epoch_num, step_num, global_step, global_batch_size as Int64 scalars,
    loss_scale as a Float32 scalar: what MindSpore's Tensor() of the Python values is in a legacy save).
"""

import json
import math
import os
import struct
from typing import Dict, List, Optional

import numpy as np

from . import ckptio, stio
from .data import make_tensor
from .layout import Layout

GLOBAL_STEP = "global_step"


class Param:
    def __init__(self, name, shape, dtype, tensor_map, opt=False, stage=0):
        self.name, self.shape, self.dtype = name, list(shape), dtype
        self.tensor_map, self.opt, self.stage = tensor_map, opt, stage


def _splits_and_block(layout: Layout, local: int):
    return layout.model_splits(), layout.model_block(local)


def slice_index(layout: Layout, local: int) -> int:
    splits, block = _splits_and_block(layout, local)
    k = 0
    for s, b in zip(splits, block):
        k = k * s + b
    return k


def box_of(layout: Layout, local: int, shape):
    splits, block = _splits_and_block(layout, local)
    return tuple((b * (d // s), (b + 1) * (d // s)) for d, s, b in zip(shape, splits, block))


def tensor_entry(name, data, box, dtype):
    shape = [hi - lo for lo, hi in box]
    if not box:  # a scalar: its one element
        blob = np.ascontiguousarray(data.array).tobytes()
        return bytes_entry(name, dtype, shape, blob)
    return stio.Entry(name, dtype, shape, data.block_nbytes(box),
                      lambda d=data, b=box: d.block_chunks(b))


def bytes_entry(name, dtype, shape, blob):
    return stio.Entry(name, dtype, shape, len(blob), lambda b=blob: iter([b]))


class Tree:
    """A written tree: where it is and what the views must hold."""

    def __init__(self, root, iteration_dir, params, tensors, dev_matrix, stages, common,
                 global_step):
        self.root, self.iteration_dir = root, iteration_dir
        self.params, self.tensors = params, tensors
        self.dev_matrix, self.stages = list(dev_matrix), stages
        self.common, self.global_step = common, global_step

    @property
    def devices(self):
        return math.prod(self.dev_matrix)

    def expected(self, outdir, dst: Optional[Dict[str, list]] = None, dst_dev=None,
                 prefix="checkpoint_"):
        """Writes rank_<t>/<prefix><t>.{ckpt,safetensors}; dst maps name -> tensor map over
        dst_dev (None: one merged rank). Returns the relative paths written."""
        written = []
        targets = math.prod(dst_dev) if dst else 1
        gstep = np.array([self.global_step], dtype="<i4").tobytes()
        for t in range(targets):
            entries = []
            for p in self.params:
                data = self.tensors[p.name]
                if dst:
                    lay = Layout.from_map(dst_dev, dst[p.name])
                    box = box_of(lay, t, p.shape)
                else:
                    box = tuple((0, d) for d in p.shape)
                entries.append(tensor_entry(p.name, data, box, p.dtype))
            with_step = any(p.opt for p in self.params)
            if with_step:
                entries.append(bytes_entry(GLOBAL_STEP, "Int32", [1], gstep))
            d = os.path.join(outdir, f"rank_{t}")
            os.makedirs(d, exist_ok=True)
            st = os.path.join(d, f"{prefix}{t}.safetensors")
            stio.write(st, entries, {"format": "ms"})
            # .ckpt: stage by stage (MindSpore merges a pipeline source's stages in stage order); the
            # optimizer files of the first stage that has optimizer states give global_step.
            tensors = entries[:-1] if with_step else entries
            order, step_at = [], None
            for stage in range(self.stages):
                of_stage = {p.name: p for p in self.params if p.stage == stage}
                mine = [e for e in tensors if e.name in of_stage]
                order += stio.writer_order([e for e in mine if not of_stage[e.name].opt])
                order += stio.writer_order([e for e in mine if of_stage[e.name].opt])
                if step_at is None and any(of_stage[e.name].opt for e in mine):
                    step_at = len(order)
                    order.append(entries[-1])
            if step_at is None and with_step:
                order.append(entries[-1])
            with open(os.path.join(d, f"{prefix}{t}.ckpt"), "wb") as f:
                for e in order:
                    if e.nbytes == 0:
                        continue
                    f.write(ckptio.record_header(e.name, e.shape, e.tensor_type, e.nbytes))
                    for chunk in e.chunks():
                        f.write(chunk)
                for key, dtype, fmt in (("epoch_num", "Int64", "<q"), ("step_num", "Int64", "<q"),
                                        ("global_step", "Int64", "<q"),
                                        ("loss_scale", "Float32", "<f"),
                                        ("global_batch_size", "Int64", "<q")):
                    if key == GLOBAL_STEP and with_step:
                        continue  # the optimizer files' own
                    if self.common.get(key) is not None:
                        f.write(ckptio.encode_record(key, [], dtype,
                                                     struct.pack(fmt, self.common[key])))
            written += [os.path.relpath(st, outdir),
                        os.path.join(f"rank_{t}", f"{prefix}{t}.ckpt")]
        return written


def write_tree(root, params: List[Param], dev_matrix, iteration=1000, dedup=False,
               prefix="", seed=7, common=None, global_step=None, stages=1, latest=True):
    """Writes ROOT/latest_checkpointed_iteration.txt and ROOT/iteration_<8>/ by construction."""
    common = dict(common if common is not None else
                  {"epoch_num": 3, "step_num": 250, "global_step": iteration,
                   "loss_scale": 1024.0, "global_batch_size": 64,
                   "consumed_samples": 64000, "ckpt_status": None})
    global_step = iteration if global_step is None else global_step
    n = math.prod(dev_matrix)
    world = n * stages
    it_dir = os.path.join(root, f"iteration_{iteration:08d}")
    os.makedirs(it_dir, exist_ok=True)
    if latest:
        with open(os.path.join(root, "latest_checkpointed_iteration.txt"), "w") as f:
            f.write(f"{iteration}")
    tensors = {p.name: make_tensor(p.shape, p.dtype, seed, p.name) for p in params}
    layouts = {p.name: Layout.from_map(dev_matrix, p.tensor_map) for p in params}

    # Who stores slice k of each parameter.
    holders = {}  # (name, k) -> [global ranks]
    for p in params:
        for local in range(n):
            k = slice_index(layouts[p.name], local)
            holders.setdefault((p.name, k), []).append(p.stage * n + local)
    if dedup:
        load = {r: 0 for r in range(world)}
        stored = {}
        shard_ids = {key: i for i, key in enumerate(sorted(holders))}
        size = {p.name: math.prod(layouts[p.name].model_splits()) for p in params}
        nbytes = {p.name: tensors[p.name].nbytes // size[p.name] for p in params}
        for key in sorted(holders, key=lambda key: (len(holders[key]), -nbytes[key[0]],
                                                    shard_ids[key])):
            r = min(holders[key], key=lambda r: (load[r], r))
            load[r] += nbytes[key[0]]
            stored[key] = [r]
    else:
        stored = holders
    writers = sorted({r for rs in stored.values() for r in rs})
    file_id = {r: i for i, r in enumerate(writers)} if dedup else {r: r for r in range(world)}
    total = len(writers) if dedup else world
    head = f"{prefix}-" if prefix else ""

    def file_name(kind, r):
        return f"{head}{kind}-{file_id[r]:07d}-{total:07d}.safetensors"

    gstep = np.array([global_step], dtype="<i4").tobytes()
    for r in writers:
        local = r % n
        for kind, want_opt in (("model", False), ("opt", True)):
            entries = []
            for p in params:
                if p.opt != want_opt or p.stage != r // n:
                    continue
                k = slice_index(layouts[p.name], local)
                if r not in stored[(p.name, k)]:
                    continue
                entries.append(tensor_entry(p.name, tensors[p.name],
                                            box_of(layouts[p.name], local, p.shape), p.dtype))
            # A save without optimizer states writes no optimizer files.
            if kind == "opt" and any(p.opt for p in params):
                entries.append(bytes_entry(GLOBAL_STEP, "Int32", [1], gstep))
            if entries:
                stio.write(os.path.join(it_dir, file_name(kind, r)), entries, {"format": "ms"})

    meta = {}
    for p in params:
        lay = layouts[p.name]
        ranks = list(range(p.stage * n, (p.stage + 1) * n))
        chunks = []
        for local in range(n):  # rank order, as MindFormers lists them
            box = box_of(lay, local, p.shape)
            chunks.append({"global_offset": [slice_index(lay, local)],
                           "local_shape": [hi - lo for lo, hi in box]})
        meta[p.name] = {
            "properties": {"dtype": p.dtype, "replica_id": [0] * n, "allow_shape_mismatch": False,
                           "allow_to_save": True},
            "global_shape": p.shape, "axis_fragmentations": lay.model_splits(),
            "layout": {"device_matrix": list(dev_matrix), "tensor_map": p.tensor_map,
                       "interleaved_parallel": False, "alias_name": [], "rank_list": ranks},
            "chunk": chunks}
    storage = {}
    for (name, k), rs in sorted(stored.items()):
        p = next(q for q in params if q.name == name)
        kind = "opt" if p.opt else "model"
        storage[f"('{name}', ({k},))"] = [
            {"file_name": file_name(kind, r), "storage_rank": r, "rank_group": holders[(name, k)]}
            for r in rs]
    with open(os.path.join(it_dir, "metadata.json"), "w") as f:
        json.dump({"state_dict_metadata": meta, "storage_data": storage}, f,
                  separators=(",", ":"))
    with open(os.path.join(it_dir, "common.json"), "w") as f:
        json.dump(common, f)
    return Tree(root, it_dir, params, tensors, dev_matrix, stages, common, global_step)


def demo_params():
    """A small model over a (dp=2, mp=2) device matrix [2, 2]: row, column, multi-axis and
    replicated splits, several dtypes, with Adam moments in the optimizer file."""
    ps = [Param("embed.weight", [16, 8], "Float16", [0, -1]),
          Param("layer.w", [8, 12], "Float32", [-1, 0]),
          Param("layer.multi", [8, 6], "BFloat16", [[1, 0], -1]),
          Param("norm.gamma", [12], "Float32", [-1]),
          Param("head.bias", [4], "Int32", [0]),
          Param("scale", [], "Float32", [])]
    for p in list(ps):
        if p.dtype.startswith(("Float", "BFloat")):
            for m in ("adam_m", "adam_v"):
                ps.append(Param(f"{m}.{p.name}", p.shape, "Float32", p.tensor_map, opt=True))
    return ps
