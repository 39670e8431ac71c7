"""MindFormers 2.1.0's own `save_checkpoint` (Checkpoint 2.0: metadata.json, common.json, one
safetensors file per rank) for a simulated 4-rank world in one CPU process.

    python mf_save.py OUT_ROOT [--dedup]

Writes OUT_ROOT/latest_checkpointed_iteration.txt, OUT_ROOT/iteration_00000007/... and
OUT_ROOT/full.npz (the full tensors the ranks' slices were cut from). Run as a process of its
own: it patches MindFormers' module state. The ranks are played one after the other in Graph
mode; what a real job gets from its communication group is given by hand (docs/CONFORMANCE.md):
  * the rank and world size (`get_real_rank`, `get_real_group_size`, and metadata.py's
    `get_group_size`, which asks MindSpore's communication group);
  * the barriers (no-ops), and the shared-storage check (the output is one local directory);
  * every rank's layouts, which a job takes from its compiled parallel graph
    (`LayoutAdapter.get_all_layouts`): here `mindspore.parallel.Layout` objects;
  * with --dedup (`remove_redundancy=True`): the scatter of rank 0's balanced plan and the gather
    of what each rank wrote, played in rank order (a gather sees the ranks played so far; a rank
    not yet played counts as "not read back", and MindFormers then records its shards from the
    plan);
  * `mindspore.DeviceCtx`, which 2.1.0 imports (for its load path) and MindSpore 2.7.2 lacks.
The tensor bytes, metadata.json, common.json and the file names are MindFormers' own.
"""

import contextlib
import os
import shutil
import sys

import numpy as np
import mindspore as ms

if not hasattr(ms, "DeviceCtx"):
    ms.DeviceCtx = lambda *a, **k: contextlib.nullcontext()

from mindspore import Parameter, Tensor, nn  # noqa: E402
from mindspore.parallel import Layout  # noqa: E402

import mindformers.checkpoint.checkpoint as C  # noqa: E402
import mindformers.checkpoint.fully_parallel as F  # noqa: E402
import mindformers.checkpoint.metadata as M  # noqa: E402
import mindformers.checkpoint.sharded_tensor as S  # noqa: E402

WORLD = 4
ITERATION = 7
COMMON = {"epoch_num": 2, "step_num": 7, "global_step": 7, "loss_scale": 1024.0,
          "global_batch_size": 32}


def full_tensors():
    rng = np.random.default_rng(2026)
    return {"embedding.weight": rng.standard_normal((16, 8)).astype(np.float16),
            "layers.0.attention.wq.weight": rng.standard_normal((8, 8)).astype(np.float32),
            "layers.0.attention.wo.weight": rng.standard_normal((8, 8)).astype(np.float32),
            "layers.0.norm.weight": rng.standard_normal((8,)).astype(np.float32),
            "layers.0.ffn.w1.weight": rng.standard_normal((12, 8)).astype(np.float32),
            "lm_head.weight": rng.standard_normal((16, 8)).astype(np.float16),
            "step_ids": np.arange(6, dtype=np.int32)}


def layouts():
    """dp x mp = 2 x 2: column- and row-parallel weights, a dp-split embedding, replicas."""
    lay = Layout((2, 2), ("dp", "mp"))
    return {"embedding.weight": lay("dp", "None"),
            "layers.0.attention.wq.weight": lay("mp", "None"),
            "layers.0.attention.wo.weight": lay("None", "mp"),
            "layers.0.norm.weight": lay("None"),
            "layers.0.ffn.w1.weight": lay("mp", "dp"),
            "lm_head.weight": lay(("dp", "mp"), "None"),
            "step_ids": lay("None")}


class Net(nn.Cell):
    def __init__(self, tensors):
        super().__init__()
        for i, (name, value) in enumerate(tensors.items()):
            setattr(self, f"p{i}", Parameter(Tensor(value), name=name))


def local_slice(value, meta):
    """The block of `value` a ShardedTensor describes: its global_offset is one linear index over
    axis_fragmentations (C order)."""
    index, coords = meta.global_offset[0], []
    for parts in reversed(meta.axis_fragmentations):
        coords.append(index % parts)
        index //= parts
    coords.reverse()
    return value[tuple(slice(c * n, (c + 1) * n) for c, n in zip(coords, meta.local_shape))]


def main():
    out, dedup = sys.argv[1], "--dedup" in sys.argv[2:]
    shutil.rmtree(out, ignore_errors=True)
    ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")
    rank = {"now": 0}
    for module in (C, S, M, F):
        if hasattr(module, "get_real_rank"):
            module.get_real_rank = lambda: rank["now"]
        if hasattr(module, "get_real_group_size"):
            module.get_real_group_size = lambda: WORLD
    M.get_group_size = lambda *a: WORLD
    C.barrier_world = lambda *a, **k: None
    C.is_publicly_accessible_path = lambda path: True
    C.LayoutAdapter.is_pynative_mode = staticmethod(lambda: False)

    full = full_tensors()
    dtypes = {np.dtype(np.float32): ms.float32, np.dtype(np.float16): ms.float16,
              np.dtype(np.int32): ms.int32}
    infos = {k: [layouts()[k], dtypes[v.dtype], v.shape] for k, v in full.items()}
    C.LayoutAdapter.get_all_layouts = staticmethod(lambda net: {r: infos for r in range(WORLD)})
    metas = {r: S.get_sharded_tensor_from_strategy_metadata(infos, r) for r in range(WORLD)}

    scattered, gathered = {}, {}

    def scatter_object_list(recv, payloads, src=0):
        if rank["now"] == src:
            scattered.update(enumerate(payloads))
        recv[0] = scattered[rank["now"]]

    def all_gather_object(out_list, obj):
        gathered[rank["now"]] = obj
        for i in range(len(out_list)):
            out_list[i] = gathered.get(i)

    F.scatter_object_list = scatter_object_list
    F.all_gather_object = all_gather_object
    F.synchronize = lambda *a, **k: None

    for r in range(WORLD):
        rank["now"] = r
        local = {k: np.ascontiguousarray(local_slice(v, metas[r][k])) for k, v in full.items()}
        C.save_checkpoint(ITERATION, Net(local), optimizer=None,
                          common_info=C.CommonInfo(**COMMON), save_checkpoint_path=out,
                          sharded_tensor_metas=metas if r == 0 else None,
                          global_model_keys=set(full) if r == 0 else None,
                          remove_redundancy=dedup)
    np.savez(os.path.join(out, "full.npz"), **full)


if __name__ == "__main__":
    main()
