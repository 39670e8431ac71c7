"""MindFormers 2.1.0's own `save_checkpoint` (Checkpoint 2.0: metadata.json, common.json, one
safetensors file per rank for the model and one for its AdamW optimizer) for a simulated 4-rank
world in one CPU process.

    python mf_save.py OUT_ROOT [--dedup]

Writes OUT_ROOT/latest_checkpointed_iteration.txt, OUT_ROOT/iteration_00000007/...,
OUT_ROOT/full.npz and optimizer.npz (the full model and optimizer tensors the ranks' blocks were
cut from, by MindSpore's own `_load_tensor`, the slicing its parallel loader applies to a layout)
and OUT_ROOT/saved_rank_R.npz (the blocks rank R gave MindFormers to save). Run as a process of
its own: it patches MindFormers' module state. The ranks are played one after the other in Graph
mode; what a real job gets from its communication group is given by hand (docs/CONFORMANCE.md):
  * the rank and world size (`get_real_rank`, `get_real_group_size`, and metadata.py's
    `get_group_size`, which asks MindSpore's communication group);
  * the barriers (no-ops), and the shared-storage check (the output is one local directory);
  * every rank's layouts, which a job takes from its compiled parallel graph
    (`LayoutAdapter.get_all_layouts`): here `mindspore.parallel.Layout` objects; an AdamW moment
    takes its weight's layout, global_step none (replicated);
  * the optimizer's state after some steps: its moments and global_step are set to known values
    (a real job gets them by training), so that a wrong or zeroed state cannot pass;
  * with --dedup (`remove_redundancy=True`): the scatter of rank 0's balanced plan and the gather
    of what each rank wrote (for the model side, then the optimizer side), played in rank order
    (a gather sees the ranks played so far; a rank not yet played counts as "not read back", and
    MindFormers then records its shards from the plan);
  * `mindspore.DeviceCtx`, which 2.1.0 imports (for its load path) and MindSpore 2.7.2 lacks.
The tensor bytes, metadata.json, common.json and the file names are MindFormers' own. The
optimizer is MindFormers' own AdamW with a learning-rate schedule, as its trainer builds it (the
schedule is a Cell: no 0-d parameter, which MindFormers 2.1.0's own load_checkpoint cannot
resume from its own save, whichever shape metadata.json gives it: "Slice dimension count ...
does not match tensor dimension count ...", seen with MindSpore's nn.Adam).
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
from mindspore.parallel._tensor import _expand_layout, _load_tensor  # noqa: E402

import mindformers.checkpoint.checkpoint as C  # noqa: E402
import mindformers.checkpoint.fully_parallel as F  # noqa: E402
import mindformers.checkpoint.metadata as M  # noqa: E402
import mindformers.checkpoint.sharded_tensor as S  # noqa: E402
from mindformers.core.optim import AdamW  # noqa: E402

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


# The weights AdamW trains (step_ids is an integer counter, not trained).
TRAINABLE = ("embedding.weight", "layers.0.attention.wq.weight", "layers.0.attention.wo.weight",
             "layers.0.norm.weight", "layers.0.ffn.w1.weight", "lm_head.weight")


class Net(nn.Cell):
    def __init__(self, tensors):
        super().__init__()
        for i, (name, value) in enumerate(tensors.items()):
            setattr(self, f"p{i}", Parameter(Tensor(value), name=name,
                                             requires_grad=name in TRAINABLE))


def adamw(net, state=None):
    """MindFormers' AdamW over `net`, its state set from `state` (name -> array) when given."""
    opt = AdamW(net.trainable_params(), learning_rate=nn.CosineDecayLR(0.0, 3e-4, 100))
    params = opt.parameters_dict()
    for name, value in (state or {}).items():
        params[name].set_data(Tensor(value))
    return opt


MOMENTS = ("adam_m.", "adam_v.")


def optimizer_tensors(model):
    """AdamW's state as MindFormers names it (adam_m./adam_v., float32, per trained weight, and
    global_step), with values no fresh optimizer has."""
    rng = np.random.default_rng(7)
    state = {}
    for name in TRAINABLE:
        for moment in MOMENTS:
            state[moment + name] = rng.standard_normal(model[name].shape).astype(np.float32)
    state["global_step"] = np.array([ITERATION], np.int32)
    return state


def weight_of(name):
    """The model weight an optimizer state belongs to (its layout is the weight's)."""
    for moment in MOMENTS:
        if name.startswith(moment):
            return name[len(moment):]
    return None


def local_slice(value, layout, rank):
    """Rank `rank`'s block of `value` under `layout`, cut by MindSpore's own rule (its parallel
    loader's `_load_tensor`; a dimension split over several device axes is expanded first, as
    MindSpore's `_expand_layout` does)."""
    if layout is None:
        return value
    spec = layout.to_dict()
    dev, tmap, shape = _expand_layout(spec["device_matrix"], spec["tensor_map"], list(value.shape))
    block = _load_tensor(Tensor(value.reshape(shape)), dev, tmap, rank_id=rank)
    parts = [1] * value.ndim
    for axis, dims in enumerate(spec["tensor_map"]):
        for dim in (dims if isinstance(dims, (tuple, list)) else (dims,)):
            if dim != -1:
                parts[axis] *= dev[len(dev) - 1 - dim]
    return block.reshape([n // p for n, p in zip(value.shape, parts)])


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
    optim = optimizer_tensors(full)
    dtypes = {np.dtype(np.float32): ms.float32, np.dtype(np.float16): ms.float16,
              np.dtype(np.int32): ms.int32}
    lay = layouts()
    lay.update({k: lay.get(weight_of(k)) for k in optim})
    infos = {k: [lay[k], dtypes[v.dtype], v.shape] for k, v in {**full, **optim}.items()}
    C.LayoutAdapter.get_all_layouts = staticmethod(lambda net: {r: infos for r in range(WORLD)})
    metas = {r: S.get_sharded_tensor_from_strategy_metadata(infos, r) for r in range(WORLD)}

    # Every rank makes the same collective calls in the same order (the model side's, then the
    # optimizer side's): the n-th call of one rank meets the n-th call of the others.
    scattered, gathered, calls = {}, {}, {}

    def next_call(kind):
        key = (kind, rank["now"])
        calls[key] = calls.get(key, -1) + 1
        return calls[key]

    def scatter_object_list(recv, payloads, src=0):
        n = next_call("scatter")
        if rank["now"] == src:
            scattered[n] = dict(enumerate(payloads))
        recv[0] = scattered[n][rank["now"]]

    def all_gather_object(out_list, obj):
        seen = gathered.setdefault(next_call("gather"), {})
        seen[rank["now"]] = obj
        for i in range(len(out_list)):
            out_list[i] = seen.get(i)

    F.scatter_object_list = scatter_object_list
    F.all_gather_object = all_gather_object
    F.synchronize = lambda *a, **k: None

    for r in range(WORLD):
        rank["now"] = r
        local = {k: np.ascontiguousarray(local_slice(v, lay[k], r)) for k, v in full.items()}
        local_optim = {k: np.ascontiguousarray(local_slice(v, lay[k], r)) for k, v in optim.items()}
        net = Net(local)
        opt = adamw(net, local_optim)
        C.save_checkpoint(ITERATION, net, optimizer=opt,
                          common_info=C.CommonInfo(**COMMON), save_checkpoint_path=out,
                          sharded_tensor_metas=metas if r == 0 else None,
                          global_model_keys=set(full) if r == 0 else None,
                          remove_redundancy=dedup)
        np.savez(os.path.join(out, f"saved_rank_{r}.npz"), **local, **local_optim)
    np.savez(os.path.join(out, "full.npz"), **full)
    np.savez(os.path.join(out, "optimizer.npz"), **optim)


if __name__ == "__main__":
    main()
