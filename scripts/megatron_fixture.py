#!/usr/bin/env python3
"""Writes a small Megatron-Core `torch_dist` checkpoint with real Megatron-Core, for ckptfs's tests
(tests/data/megatron/) and the PyTorch conformance lane. Needs torch and megatron-core (CPU is
enough; tests/conformance_torch/requirements.txt pins both); run it from such a venv, never from
the ctest suite:

    build/megatron-venv/bin/python scripts/megatron_fixture.py OUTDIR [TP PP [DP]]
    build/megatron-venv/bin/python scripts/megatron_fixture.py --load ITER_DIR OUT.safetensors

A tiny GPTModel (4 layers, SwiGLU MLP, Megatron's local layer spec) is built on TP x PP x DP
processes (default 2 x 2 x 1) joined by the gloo backend, and saved with
megatron.core.dist_checkpointing.save into OUTDIR/save/iter_0000007/, with
OUTDIR/save/latest_checkpointed_iteration.txt beside it, as Megatron's training loop lays it out.
The state dict also holds a ShardedObject (`rng_state`, per rank, as the training loop saves) and
one optimizer tensor under an `optimizer.distributed.` key (the dp_reshardable key form), so the
summary lines can be checked.

With DP > 1 each model shard has DP replicas; Megatron saves a shard only from its main replica
(replica_id all zeros: data-parallel rank 0). Each process fills its parameters from its own
seed, so the replicas differ on purpose: a copy taken from another replica would show in the
values. (Plain model state, as under DDP; no distributed optimizer.)

The oracle, OUTDIR/reference.safetensors, holds every model tensor whole, assembled in this
script from each rank's local main-replica ShardedTensor data at its global offset (never from
the saved files); OUTDIR/reference.json names its keys, the stacked ones, and the object and
optimizer items, and (`layout`) the TP, PP and DP sizes and each global rank's data-parallel
rank.

--load: Megatron-Core's own dist_checkpointing.load of ITER_DIR into the same model on one process
(TP 1 x PP 1, another layout than the save's), every model tensor whole in OUT.safetensors.

Megatron-Core 0.16.1 assumes a GPU in its save path (torch.cuda.synchronize in preload_tensors,
an all-reduce tensor on torch.cuda.current_device()): those two are stood in for here.
"""

import copy
import json
import os
import sys

# No pool of compile workers (Megatron imports torch.compile'd fusions): the ranks leave with
# os._exit, which would leave such a pool behind.
os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")

import torch  # noqa: E402
import torch.distributed as dist
import torch.multiprocessing as mp
from safetensors.torch import save_file

ITERATION = 7


def leave():
    """A gloo group now and then hangs at teardown after a finished save: the save is complete
    (its collectives are done), so a rank leaves without one, ending first the worker processes
    the save started (they would outlive it)."""
    import multiprocessing
    for child in multiprocessing.active_children():
        child.terminate()
        child.join(10)
    os._exit(0)


def cpu_stand_ins():
    torch.cuda.synchronize = lambda *a, **k: None
    torch.cuda.current_device = lambda: "cpu"


def build_model(tp, pp):
    from megatron.core import parallel_state
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer import TransformerConfig

    parallel_state.initialize_model_parallel(tp, pp)
    config = TransformerConfig(num_layers=4, hidden_size=16, num_attention_heads=4,
                               ffn_hidden_size=24, gated_linear_unit=True,
                               use_cpu_initialization=True, tensor_model_parallel_size=tp,
                               pipeline_model_parallel_size=pp, params_dtype=torch.float32,
                               pipeline_dtype=torch.float32, add_bias_linear=False)
    torch.manual_seed(100 + dist.get_rank())
    model = GPTModel(config=config, transformer_layer_spec=get_gpt_layer_local_spec(),
                     vocab_size=32, max_sequence_length=8,
                     pre_process=parallel_state.is_pipeline_first_stage(),
                     post_process=parallel_state.is_pipeline_last_stage(),
                     share_embeddings_and_output_weights=False)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape))
    return model


def local_shards(sharded):
    """(key, global shape, global offset, data) of every main-replica ShardedTensor of this rank."""
    from megatron.core.dist_checkpointing.mapping import ShardedTensor
    from megatron.core.dist_checkpointing.dict_utils import nested_values
    out = []
    from megatron.core.dist_checkpointing.mapping import is_main_replica
    for sh in nested_values(sharded):
        # A replicated tensor's main replica is the copy saved (ranks' replicas differ here).
        if isinstance(sh, ShardedTensor) and is_main_replica(sh.replica_id):
            offset = sh.global_offset  # elements, the prepended (layer) axes first
            data = sh.data.reshape((1,) * sh.prepend_axis_num + tuple(sh.data.shape))
            out.append((sh.key, tuple(sh.global_shape), tuple(offset), data.clone()))
    return out


def worker(rank, world, tp, pp, out, port):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    cpu_stand_ins()
    from megatron.core import dist_checkpointing, parallel_state
    from megatron.core.dist_checkpointing.mapping import ShardedObject, ShardedTensor

    model = build_model(tp, pp)
    sharded = model.sharded_state_dict()
    # What the training loop adds beside the model: per-rank RNG state (a ShardedObject) and, with
    # the distributed optimizer, buffers keyed optimizer.distributed.* (here one small stand-in).
    sharded["rng_state"] = ShardedObject("rng_state", {"seed": 1234, "rank": rank},
                                         (world,), (rank,), replica_id=0)
    g = torch.Generator().manual_seed(7 + rank)
    sharded["optimizer"] = ShardedTensor.from_rank_offsets(
        "optimizer.distributed.dp_group_idx_0.gbuf_idx_0.dtype_(torch.float32, "
        "torch.float32).bucket_idx_0.exp_avg", torch.randn(6, generator=g), (0, rank, world))
    # SwiGLU's linear_fc1 is a ShardedTensorFactory (its W and V halves): built here on a copy,
    # as save builds it.
    from megatron.core.dist_checkpointing.mapping import apply_factories
    built = copy.deepcopy(sharded)
    apply_factories(built)
    shards = local_shards(built)
    iter_dir = os.path.join(out, "save", f"iter_{ITERATION:07d}")
    if rank == 0:
        os.makedirs(iter_dir, exist_ok=True)
    dist.barrier()
    dist_checkpointing.save(sharded, iter_dir)
    torch.save({"shards": shards, "dp_rank": parallel_state.get_data_parallel_rank()},
               os.path.join(out, f"shards_{rank}.pt"))
    leave()


def write_reference(out, gathered, layout):
    full, stacked = {}, set()
    for rank_state in gathered:
        for key, shape, offset, data in rank_state["shards"]:
            if key.startswith("optimizer."):
                continue
            t = full.setdefault(key, torch.full(shape, float("nan"), dtype=data.dtype))
            t[tuple(slice(o, o + s) for o, s in zip(offset, data.shape))] = data
            if ".layers." in key and len(shape) > 1 and shape[0] == 4:
                stacked.add(key)
    for key, t in full.items():
        assert not torch.isnan(t).any(), f"{key}: not every element was saved"
    save_file(full, os.path.join(out, "reference.safetensors"))
    with open(os.path.join(out, "reference.json"), "w") as f:
        json.dump({"iteration": ITERATION, "tensors": sorted(full), "stacked": sorted(stacked),
                   "num_layers": 4,
                   "layout": dict(layout, dp_rank=[r["dp_rank"] for r in gathered])}, f,
                  indent=1)


def load_worker(rank, iter_dir, out, port):
    """Megatron's own load of `iter_dir` into the same model on 1 process (TP 1 x PP 1): every
    model tensor whole, written to `out` (safetensors)."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=1)
    cpu_stand_ins()
    from megatron.core import dist_checkpointing
    from megatron.core.dist_checkpointing.mapping import apply_factories

    model = build_model(1, 1)
    sharded = model.sharded_state_dict()
    loaded = dist_checkpointing.load(sharded, iter_dir)
    model.load_state_dict(loaded, strict=False)
    built = model.sharded_state_dict()
    apply_factories(built)
    full = {}
    for key, shape, offset, data in local_shards(built):
        t = full.setdefault(key, torch.full(shape, float("nan"), dtype=data.dtype))
        t[tuple(slice(o, o + s) for o, s in zip(offset, data.shape))] = data
    save_file(full, out)
    leave()


def main():
    if sys.argv[1] == "--load":
        mp.spawn(load_worker, args=(sys.argv[2], sys.argv[3], 29500 + os.getpid() % 1000),
                 nprocs=1, join=True)
        return
    out = sys.argv[1]
    tp, pp = (int(sys.argv[2]), int(sys.argv[3])) if len(sys.argv) > 3 else (2, 2)
    dp = int(sys.argv[4]) if len(sys.argv) > 4 else 1
    world = tp * pp * dp  # Megatron takes DP as world / (TP x PP)
    os.makedirs(out, exist_ok=True)
    port = 29500 + os.getpid() % 1000
    if os.environ.get("MEGATRON_FIXTURE_REFERENCE_ONLY") != "1":
        mp.spawn(worker, args=(world, tp, pp, out, port), nprocs=world, join=True)
    gathered = []
    for rank in range(world):
        path = os.path.join(out, f"shards_{rank}.pt")
        gathered.append(torch.load(path))
    with open(os.path.join(out, "save", "latest_checkpointed_iteration.txt"), "w") as f:
        f.write(str(ITERATION))
    write_reference(out, gathered, {"tp": tp, "pp": pp, "dp": dp})
    for rank in range(world):
        os.remove(os.path.join(out, f"shards_{rank}.pt"))


if __name__ == "__main__":
    main()
