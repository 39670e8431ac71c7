"""Named cases. Each returns a case dict in the JSON format of case.py."""

import re
from typing import Callable, Dict, List, Optional

from . import strategy
from .build import resolve_shared_path

LLAMA_STRATEGY = ("shared:fixtures/real/strategy/"
                  "golden-stick_llama2-13b-2p_ckpt_strategy_rank_0.ckpt")


def lay(dev, tmap, opt=0, stages=(0,), step=None) -> dict:
    d = {"dev_matrix": list(dev), "tensor_map": tmap, "opt_shard_size": opt,
         "stages": list(stages)}
    if step is not None:
        d["opt_shard_step"] = step
    return d


def param(name, dtype, shape, src=None, dst=None) -> dict:
    return {"name": name, "dtype": dtype, "shape": list(shape), "src": src, "dst": dst}


def extra(name, dtype, value, per_rank=True) -> dict:
    return {"name": name, "dtype": dtype, "value": value, "per_rank": per_rank}


def side(devices, stages=1) -> dict:
    return {"devices": devices, "stages": stages}


def case(name, description, src, dst, params, extras=(), seed=1, **options) -> dict:
    return {"name": name, "description": description, "seed": seed, "src": src, "dst": dst,
            "params": params, "extras": list(extras), "options": options}


TRAINING_EXTRAS = [extra("learning_rate", "Float32", 0.001), extra("global_step", "Int64", 1000)]


# -- small models -------------------------------------------------------------------------------

def demo() -> dict:
    h, ffn, vocab, experts = 128, 256, 256, 4
    S, D = [2, 4], [2, 2]
    params = [param("model.embed_tokens.weight", "BFloat16", [vocab, h], lay(S, [0, -1]),
                    lay(D, [1, 0]))]
    for i in range(2):
        pre = f"model.layers.{i}."
        att = pre + "attention."
        params += [
            param(att + "wq.weight", "BFloat16", [h, h], lay(S, [0, -1]), lay(D, [0, -1])),
            param(att + "wk.weight", "BFloat16", [h, h], lay(S, [0, -1]), lay(D, [-1, 1])),
            param(att + "wv.weight", "BFloat16", [h, h], lay(S, [0, -1]), lay(D, [1, 0])),
            param(att + "wo.weight", "BFloat16", [h, h], lay(S, [-1, 0]), lay(D, [-1, 0])),
            param(pre + "attention_norm.weight", "Float32", [h], lay(S, [-1]), lay(D, [-1])),
            param(pre + "feed_forward.w1.weight", "BFloat16", [ffn, h], lay(S, [0, -1]),
                  lay(D, [0, 1])),
            param(pre + "feed_forward.w2.weight", "BFloat16", [h, ffn], lay(S, [-1, 0]),
                  lay(D, [1, 0])),
            param(pre + "moe.experts.weight", "BFloat16", [experts, 32, h], lay(S, [1, 0, -1]),
                  lay(D, [1, -1, 0])),
            param(pre + "ffn_norm.weight", "Float32", [h], lay(S, [-1]), lay(D, [0])),
        ]
    params += [
        param("model.norm_out.weight", "Float32", [h], lay(S, [-1]), lay(D, [0])),
        param("lm_head.weight", "BFloat16", [vocab, h], lay(S, [0, -1]), lay(D, [-1, -1])),
        param("adam_m.model.layers.0.attention.wq.weight", "Float32", [h, h], lay(S, [0, -1]),
              lay(D, [0, -1])),
        param("adam_m.lm_head.weight", "Float32", [vocab, h], lay(S, [0, -1]), lay(D, [-1, 0])),
    ]
    return case("demo", "small transformer: 8 ranks (dev [2,4]) -> 4 ranks (dev [2,2])",
                side(8), side(4), params, TRAINING_EXTRAS, shuffle_layouts=True)


def dtypes_8to4() -> dict:
    S, D = [2, 2, 2], [2, 2]
    params = [
        param("f32.w", "Float32", [16, 24], lay(S, [2, 0]), lay(D, [1, 0])),
        param("f16.w", "Float16", [4, 8, 6], lay(S, [-1, 2, 0]), lay(D, [1, 0, -1])),
        param("bf16.w", "BFloat16", [8, 12, 16], lay(S, [2, 1, 0]), lay(D, [-1, 1, 0])),
        param("i32.w", "Int32", [32, 8], lay(S, [0, -1]), lay(D, [-1, 0])),
        param("i64.w", "Int64", [8, 8], lay(S, [-1, 2]), lay(D, [1, -1])),
        param("f64.w", "Float64", [16, 8], lay(S, [1, 0]), lay(D, [0, 1])),
        param("i8.w", "Int8", [16, 16], lay(S, [2, -1]), lay(D, [0, -1])),
        param("u8.w", "UInt8", [16, 16], lay(S, [-1, -1]), lay(D, [1, 0])),
        param("bool.mask", "Bool", [8, 16], lay(S, [0, 1]), lay(D, [-1, -1])),
        param("i16.w", "Int16", [8, 8], lay(S, [0, -1]), lay(D, [0, -1])),
        param("u16.w", "UInt16", [8, 8], lay(S, [-1, 1]), lay(D, [1, -1])),
        param("u32.w", "UInt32", [16], lay(S, [2]), lay(D, [0])),
        param("u64.w", "UInt64", [8, 4], lay(S, [1, -1]), lay(D, [-1, 1])),
    ]
    extras = [extra("loss_scale", "Float32", 65536.0), extra("epoch_num", "Int64", 3),
              extra("step_num", "Int64", 100), extra("current_iterator_step", "Int32", 7),
              extra("is_overflow", "Bool", False), extra("momentum", "Float64", 0.9),
              extra("half_scalar", "Float16", 0.5), extra("bf16_scalar", "BFloat16", 1.5)]
    return case("8to4_dtypes", "every dtype, 2-D and 3-D, dev [2,2,2] -> dev [2,2]",
                side(8), side(4), params, extras)


def _merge_params(S) -> List[dict]:
    return [
        param("w1", "Float32", [16, 8], lay(S, [1, -1])),
        param("w2", "Float32", [16, 8], lay(S, [-1, 0])),
        param("w3", "BFloat16", [8, 16], lay(S, [0, 1])),
        param("w4", "Float16", [8, 8], lay(S, [1, 0])),
        param("replicated", "Float32", [4, 4], lay(S, [-1, -1])),
        param("cube", "Float32", [4, 8, 8], lay(S, [1, 0, -1])),
        param("bias", "Float32", [8], lay(S, [0])),
    ]


def merge_8to1() -> dict:
    params = _merge_params([2, 4])
    return case("8to1_merge", "dev [2,4] -> unsharded (dst None): one merged file",
                side(8), None, params, TRAINING_EXTRAS)


def split_1to8() -> dict:
    D = [2, 4]
    params = []
    for p in _merge_params(D):
        p["dst"], p["src"] = p["src"], None
        params.append(p)
    params.append(param("moments.bias", "Float32", [8], None, None))
    return case("1to8_split", "unsharded source in rank_0 (src None) -> dev [2,4]; "
                "moments.bias is in no dst strategy (passthrough)",
                None, side(8), params, TRAINING_EXTRAS)


def _opt_params(P, shard_side, plain_side) -> List[dict]:
    """Optimizer-sharded layouts on `shard_side`; `P` is the plain side's dev matrix."""
    def p(name, dtype, shape, sharded, plain):
        return param(name, dtype, shape, **{shard_side: sharded, plain_side: plain})

    return [
        p("d1.weight", "Float32", [8, 4], lay([4, 2], [0, -1], opt=4), lay(P, [0, -1])),
        p("d2.weight", "Float32", [8, 4], lay([4, 2], [0, -1], opt=2), lay(P, [-1, 0])),
        p("all.weight", "BFloat16", [16, 8], lay([4, 2], [-1, -1], opt=-1), lay(P, [0, -1])),
        p("col.weight", "Float32", [16, 8], lay([4, 2], [-1, 0], opt=2), lay(P, [-1, -1])),
        p("inner.weight", "Float16", [16, 8], lay([2, 2, 2], [-1, 0], opt=2), lay(P, [0, -1])),
        p("two_axes.weight", "Float32", [16, 8], lay([2, 2, 2], [-1, 0], opt=4), lay(P, [-1, 0])),
        p("bias", "Float32", [16], lay([4, 2], [-1], opt=4), lay(P, [0])),
        p("cube.weight", "Float32", [8, 4, 4], lay([4, 2], [-1, 0, -1], opt=2),
          lay(P, [0, -1, -1])),
        p("unsharded_opt.weight", "Float32", [8, 8], lay([4, 2], [1, 0]), lay(P, [0, -1])),
    ]


def opt_src() -> dict:
    return case("opt_src", "optimizer-sharded source (dev [4,2] and [2,2,2], sizes 2/4/-1) -> "
                "dev [2]", side(8), side(2), _opt_params([2], "src", "dst"), TRAINING_EXTRAS)


def opt_dst() -> dict:
    return case("opt_dst", "dev [4] -> optimizer-sharded target (dev [4,2] and [2,2,2])",
                side(4), side(8), _opt_params([4], "dst", "src"), TRAINING_EXTRAS)


def _pipeline_src_params() -> List[dict]:
    S, D = [2, 2], [4]
    return [
        param("embed.weight", "BFloat16", [32, 16], lay(S, [1, -1], stages=[0, 1]),
              lay(D, [0, -1])),
        param("layers.0.wq", "Float32", [16, 16], lay(S, [1, -1], stages=[0]), lay(D, [0, -1])),
        param("layers.0.wo", "Float32", [16, 16], lay(S, [-1, 0], stages=[0]), lay(D, [-1, 0])),
        param("layers.1.wq", "Float32", [16, 16], lay(S, [-1, 0], stages=[1]), lay(D, [0, -1])),
        param("layers.1.wo", "Float16", [16, 16], lay(S, [0, 1], stages=[1]), lay(D, [-1, 0])),
        param("head.weight", "Float32", [32, 16], lay(S, [0, -1], stages=[1]), lay(D, [-1, 0])),
        # Optimizer states the (inference) dst strategy does not list: passthrough copies.
        param("adam_m.layers.0.wq", "Float32", [16, 16], lay(S, [1, -1], stages=[0])),
        param("adam_m.layers.1.wq", "Float32", [16, 16], lay(S, [-1, 0], stages=[1])),
    ]


def pipeline_src_dir() -> dict:
    return case("pipeline_src_dir", "source with 2 pipeline stages x 4 (dev [2,2]), per-stage "
                "strategy files in a directory; shared embedding in both stages; stage-only "
                "optimizer states passed through -> dev [4]",
                side(4, 2), side(4), _pipeline_src_params(), TRAINING_EXTRAS,
                src_strategy_form="dir")


def pipeline_src_merged() -> dict:
    params = _pipeline_src_params()
    for p in params:
        p["dst"] = None
    return case("pipeline_src_merged", "source with 2 pipeline stages x 4 and one merged "
                "protobuf strategy (\"<stage>-\" names) -> one merged target (dst None)",
                side(4, 2), None, params, TRAINING_EXTRAS, src_strategy_form="merged")


def pipeline_dst() -> dict:
    S, D = [2, 2], [2]
    params = [
        param("embed.weight", "BFloat16", [32, 16], lay(S, [1, -1]),
              lay(D, [0, -1], stages=[0, 1])),
        param("layers.0.wq", "Float32", [16, 16], lay(S, [1, -1]), lay(D, [0, -1], stages=[0])),
        param("layers.0.wo", "Float32", [16, 16], lay(S, [-1, 0]), lay(D, [-1, 0], stages=[0])),
        param("layers.1.wq", "Float32", [16, 16], lay(S, [-1, 0]), lay(D, [0, -1], stages=[1])),
        param("layers.1.wo", "Float16", [16, 16], lay(S, [0, 1]), lay(D, [-1, -1], stages=[1])),
        param("head.weight", "Float32", [32, 16], lay(S, [0, -1]), lay(D, [-1, 0], stages=[1])),
        param("adam_v.layers.0.wq", "Float32", [16, 16], lay(S, [1, -1]), None),
        # In the dst strategy (stage 1) but not the src one: never dropped, always passthrough.
        param("dst_only.bias", "Float32", [16], None, lay(D, [0], stages=[1])),
    ]
    return case("pipeline_dst", "dev [2,2] -> 2 pipeline stages x 2 (dev [2]), merged dst "
                "strategy; stage filter, shared embedding, dst-only parameter",
                side(4), side(2, 2), params, TRAINING_EXTRAS, dst_strategy_form="merged")


def json_strategies() -> dict:
    S, D = [2, 4], [4]
    params = [
        param("fc1.weight", "Float32", [16, 8], lay(S, [1, -1]), lay(D, [-1, 0])),
        param("fc1.bias", "Float32", [16], lay(S, [1]), lay(D, [0])),
        param("fc2.weight", "BFloat16", [8, 16], lay(S, [-1, 0]), lay(D, [0, -1])),
        param("fc3.weight", "Float16", [8, 8, 4], lay(S, [0, 1, -1]), lay(D, [-1, 0, -1])),
        param("opt.weight", "Float32", [16, 8], lay(S, [-1, 0], opt=2), lay(D, [0, -1])),
    ]
    return case("json", "JSON strategies (C++ writer style) on both sides, dev [2,4] -> [4]",
                side(8), side(4), params, TRAINING_EXTRAS,
                src_strategy_form="json", dst_strategy_form="json")


def json_pipeline() -> dict:
    S, D = [2], [2]
    params = [
        param("a.weight", "Float32", [8, 8], lay(S, [0, -1], stages=[0]),
              lay(D, [-1, 0], stages=[0])),
        param("b.weight", "Float32", [8, 8], lay(S, [-1, 0], stages=[1]),
              lay(D, [0, -1], stages=[1])),
        param("shared.weight", "BFloat16", [8, 4], lay(S, [0, -1], stages=[0, 1]),
              lay(D, [0, -1], stages=[0, 1])),
    ]
    return case("json_pipeline", "2 stages x 2 on both sides; src = one JSON per rank in a "
                "directory, dst = merged JSON (Python merge style)",
                side(2, 2), side(2, 2), params, TRAINING_EXTRAS,
                src_strategy_form="json_dir", strategy_dir_all_ranks=True, dst_strategy_form="json")


def crc_oldscalars() -> dict:
    S, D = [4], [2]
    params = [
        param("w", "Float32", [8, 8], lay(S, [0, -1]), lay(D, [-1, 0])),
        param("v", "BFloat16", [8, 4], lay(S, [-1, -1]), lay(D, [0, -1])),
    ]
    extras = [extra("learning_rate", "Float32", 0.01), extra("momentum", "Float64", 0.9),
              extra("current_iterator_step", "Int32", 12), extra("is_overflow", "Bool", True),
              extra("note", "str", "hello wörld ✓ 𝄞"),
              extra("model_name", "str", "llama", per_rank=False)]
    return case("crc_oldscalars", "CRC trailers and ≤2.2 dims-[0] scalars in the source, "
                "string entries (UTF-32LE) passed through; dev [4] -> [2]",
                side(4), side(2), params, extras, crc=True, old_scalars=True)


def multiaxis() -> dict:
    S, D = [2, 2, 2], [2, 2]
    params = [
        param("e.weight", "Float32", [8, 4], lay(S, [[1, 0], -1]), lay(D, [1, -1])),
        param("m2.weight", "BFloat16", [8, 8], lay(S, [[2, 0], 1]), lay(D, [-1, [1, 0]])),
        param("m3.bias", "Float32", [16], lay(S, [[2, 1, 0]]), lay(D, [[0, 1]])),
        param("m4.weight", "Float16", [4, 8, 4], lay(S, [[0, 2], -1, 1]), lay(D, [1, [0], -1])),
        param("classic.weight", "Float32", [8, 8], lay(S, [2, -1]), lay(D, [0, 1])),
    ]
    return case("multiaxis", "Layout-API strategies: per-dimension TensorMaps (multi-axis "
                "dimensions, 1-D with the extra empty map) next to classic maps; "
                "dev [2,2,2] -> [2,2]",
                side(8), side(4), params, TRAINING_EXTRAS)


def multifile() -> dict:
    S, D = [2, 2], [2]
    params = [
        param("w", "Float32", [8, 8], lay(S, [1, 0]), lay(D, [0, -1])),
        param("b", "Float32", [8], lay(S, [0]), lay(D, [-1])),
    ]
    return case("multifile", "several .ckpt per rank dir (the real one is the newest step: "
                "net-10_1 beats net-9_1, the last in string order), side files, a *.ckpt "
                "directory, stray rank_* entries, a symlinked checkpoint; dev [2,2] -> [2]",
                side(4), side(2), params, TRAINING_EXTRAS, ckpt_name="net-10_1.ckpt",
                decoys=["net-9_1.ckpt", "net-1_5.ckpt", "net-8_100.ckpt"], junk_entries=True,
                symlink_rank=1)


def rank_dirs() -> dict:
    S, D = [4], [2]
    params = [param("w", "Float32", [8, 8], lay(S, [0, -1]), lay(D, [-1, 0]))]
    return case("rankdirs", "zero-padded rank directories (rank_00 .. rank_03); dev [4] -> [2]",
                side(4), side(2), params, TRAINING_EXTRAS, rank_dir_width=2)


def four_to_six() -> dict:
    S, D = [2, 2], [2, 3]
    params = [
        param("a.weight", "Float32", [24, 12], lay(S, [1, 0]), lay(D, [1, 0])),
        param("b.weight", "BFloat16", [24, 12], lay(S, [0, -1]), lay(D, [0, -1])),
        param("c.weight", "Float16", [12, 24], lay(S, [-1, 1]), lay(D, [-1, 0])),
        param("d.bias", "Float32", [36], lay(S, [0]), lay(D, [0])),
        param("e.weight", "Float32", [12, 6, 12], lay(S, [1, -1, 0]), lay(D, [0, 1, -1])),
    ]
    return case("4to6", "4 ranks (dev [2,2]) -> 6 ranks (dev [2,3]): MindSpore refuses, ckptfs "
                "serves box slices; passthrough from t_local mod 4; every source file has the "
                "same record order, so the output order is that order whatever files are loaded",
                side(4), side(6), params, TRAINING_EXTRAS)


def src_chunks(style: str) -> dict:
    S, D = [4], [2]
    params = [
        param("big", "Float32", [64, 32], lay(S, [0, -1]), lay(D, [-1, 0])),
        param("odd", "Float16", [30, 21], lay(S, [-1, -1]), lay(D, [-1, -1])),
        param("small", "Float32", [8], lay(S, [0]), lay(D, [0])),
    ]
    name = "src_chunks" if style == "bytes" else "src_chunks_old"
    what = ("≥2.3 byte chunks" if style == "bytes" else "≤2.2 array_split element chunks")
    return case(name, f"source parameters split into several records ({what}) at a 1000-byte "
                "threshold; dev [4] -> [2]", side(4), side(2), params, TRAINING_EXTRAS,
                src_chunk_bytes=1000, src_chunk_style=style, old_scalars=(style != "bytes"))


# -- llama2-13b strategy with small shapes ------------------------------------------------------

def _natural_key(name: str):
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name)]


def _llama_shape(name: str, ndim: int, hidden=8, ffn=16, vocab=32) -> List[int]:
    if ndim == 1:
        return [hidden]
    if "embedding" in name or "lm_head" in name:
        return [vocab, hidden]
    if re.search(r"feed_forward\.w[13]\.", name):
        return [ffn, hidden]
    if "feed_forward.w2." in name:
        return [hidden, ffn]
    return [hidden, hidden]


def llama13b(dst_devices: Optional[int], shared: Optional[str] = None) -> dict:
    path = resolve_shared_path(LLAMA_STRATEGY, shared)
    specs = strategy.layout_specs(strategy.read_protobuf(path))
    params = []
    for name in sorted(specs, key=_natural_key):
        spec = specs[name]
        tmap = spec.tensor_map
        dtype = "Float32" if len(tmap) == 1 else "Float16"
        src = lay(spec.dev_matrix, tmap, spec.opt_shard_size, step=spec.opt_shard_step)
        dst = lay([dst_devices], tmap) if dst_devices else None
        params.append(param(name, dtype, _llama_shape(name, len(tmap)), src, dst))
    extras = TRAINING_EXTRAS + [extra("epoch_num", "Int64", 1)]
    target = f"{dst_devices} ranks (dev [{dst_devices}], same maps)" if dst_devices else "1 rank"
    return case(f"llama13b_to{dst_devices or 1}",
                f"golden-stick llama2-13b strategy (363 params, dev [2]) as the src strategy, "
                f"hidden 8 -> {target}", side(2), side(dst_devices) if dst_devices else None,
                params, extras, src_strategy_file=LLAMA_STRATEGY)


# -- large generator for benchmarks -------------------------------------------------------------

def bench(size_gib: float = 1.0, src_devices: int = 8, dst_devices: int = 4) -> dict:
    """A transformer of about `size_gib` GiB; tensors are pooled/streamed so memory stays
    bounded. dst_devices 0 = one merged target (parameters > 512 MiB then get chunked)."""
    total = int(size_gib * (1 << 30))
    hidden = 512 if total < (512 << 20) else 1024 if total < (2 << 30) else 2048
    ffn = 2 * hidden
    # Embedding ~15% of the model, in Float32: > 512 MiB once the model is about 4 GiB.
    unit = 256
    vocab = max(unit, int(0.15 * total / (hidden * 4)) // unit * unit)
    layer_bytes = (4 * hidden * hidden + 3 * ffn * hidden) * 2 + 2 * hidden * 4
    layers = max(1, (total - 2 * vocab * hidden * 4) // layer_bytes)
    S = [src_devices]
    D = [dst_devices] if dst_devices else None

    def p(name, dtype, shape, src_map, dst_map):
        return param(name, dtype, shape, lay(S, src_map), lay(D, dst_map) if D else None)

    params = [p("model.tok_embeddings.embedding_weight", "Float32", [vocab, hidden], [0, -1],
                [-1, 0])]
    for i in range(layers):
        pre = f"model.layers.{i}."
        params += [
            p(pre + "attention.wq.weight", "BFloat16", [hidden, hidden], [0, -1], [-1, 0]),
            p(pre + "attention.wk.weight", "BFloat16", [hidden, hidden], [0, -1], [0, -1]),
            p(pre + "attention.wv.weight", "BFloat16", [hidden, hidden], [-1, 0], [0, -1]),
            p(pre + "attention.wo.weight", "BFloat16", [hidden, hidden], [-1, 0], [-1, 0]),
            p(pre + "feed_forward.w1.weight", "BFloat16", [ffn, hidden], [0, -1], [-1, 0]),
            p(pre + "feed_forward.w2.weight", "BFloat16", [hidden, ffn], [-1, 0], [0, -1]),
            p(pre + "feed_forward.w3.weight", "BFloat16", [ffn, hidden], [0, -1], [0, -1]),
            p(pre + "attention_norm.weight", "Float32", [hidden], [0], [-1]),
            p(pre + "ffn_norm.weight", "Float32", [hidden], [0], [-1]),
        ]
    params += [
        p("model.norm_out.weight", "Float32", [hidden], [0], [-1]),
        p("lm_head.weight", "Float32", [vocab, hidden], [-1, 0], [0, -1]),
    ]
    return case("bench", f"~{size_gib} GiB transformer ({layers} layers, hidden {hidden}, vocab "
                f"{vocab}), {src_devices} -> {dst_devices or 'merged'} ranks",
                side(src_devices), side(dst_devices) if dst_devices else None, params,
                TRAINING_EXTRAS, materialize_limit=1 << 20)


def record_order() -> dict:
    """The files of one save list their records in different orders (written by different code
    paths or versions of a training script); every parameter is split over the first device
    axis, so target 0 loads ranks [2, 0] and target 1 ranks [3, 1]."""
    params = [param("a", "Float32", [8, 4], lay([2, 2], [1, -1]), lay([2], [0, -1])),
              param("b", "Float16", [4, 8], lay([2, 2], [-1, 1]), lay([2], [-1, 0])),
              param("c", "Float32", [8], lay([2, 2], [1]), lay([2], [0]))]
    extras = [extra("learning_rate", "Float32", 0.01), extra("rank_state", "Int32", 5),
              extra("epoch_num", "Int64", 3), extra("step_num", "Int64", 30)]
    return case("record_order",
                "4 ranks (dev [2,2]) -> 2 ranks (dev [2]) whose files disagree on the record "
                "order: rank_3 reversed, rank_2 rotated by 2, rank_1 with c moved first; each "
                "target takes the order of the file MindSpore loads first (rank_2, rank_3)",
                side(4), side(2), params, extras, seed=7,
                record_orders={"3": "reversed", "2": "rotated:2", "1": "moved:c:0"})


BUILTINS: Dict[str, Callable[..., dict]] = {
    "demo": lambda **kw: demo(),
    "8to4_dtypes": lambda **kw: dtypes_8to4(),
    "8to1_merge": lambda **kw: merge_8to1(),
    "1to8_split": lambda **kw: split_1to8(),
    "opt_src": lambda **kw: opt_src(),
    "opt_dst": lambda **kw: opt_dst(),
    "pipeline_src_dir": lambda **kw: pipeline_src_dir(),
    "pipeline_src_merged": lambda **kw: pipeline_src_merged(),
    "pipeline_dst": lambda **kw: pipeline_dst(),
    "json": lambda **kw: json_strategies(),
    "json_pipeline": lambda **kw: json_pipeline(),
    "crc_oldscalars": lambda **kw: crc_oldscalars(),
    "multiaxis": lambda **kw: multiaxis(),
    "multifile": lambda **kw: multifile(),
    "rankdirs": lambda **kw: rank_dirs(),
    "4to6": lambda **kw: four_to_six(),
    "src_chunks": lambda **kw: src_chunks("bytes"),
    "src_chunks_old": lambda **kw: src_chunks("elements"),
    "record_order": lambda **kw: record_order(),
    "llama13b_to1": lambda shared=None, **kw: llama13b(None, shared),
    "llama13b_to4": lambda shared=None, **kw: llama13b(4, shared),
    "bench": lambda size_gib=1.0, src_devices=8, dst_devices=4, **kw:
        bench(size_gib, src_devices, dst_devices),
}


def as_safetensors(d: dict) -> dict:
    """The same case with every source file saved as safetensors (MindSpore >= 2.7)."""
    d = dict(d)
    d["name"] = "st_" + d["name"]
    d["description"] = d["description"] + ", safetensors sources"
    d["options"] = dict(d["options"], source_format="safetensors")
    return d


# Safetensors-source twins of the layouts (strings cannot be saved as safetensors).
SAFETENSORS_TWINS = ["demo", "8to4_dtypes", "8to1_merge", "1to8_split", "opt_src", "opt_dst",
                     "pipeline_src_dir", "pipeline_src_merged", "pipeline_dst", "json", "multiaxis",
                     "rankdirs", "4to6", "record_order",
                     "llama13b_to4"]
for _name in SAFETENSORS_TWINS:
    BUILTINS["st_" + _name] = (lambda n: lambda **kw: as_safetensors(BUILTINS[n](**kw)))(_name)
BUILTINS["st_bench"] = lambda **kw: as_safetensors(BUILTINS["bench"](**kw))

# Generated by the self-check and usable by every test; `bench` is for benchmarks only.
SMALL_BUILTINS = [n for n in BUILTINS if n != "bench" and not n.startswith("st_")]
# The safetensors-source twins (tests/integration/test_safetensors.py checks them).
SAFETENSORS_BUILTINS = ["st_" + n for n in SAFETENSORS_TWINS]


def builtin(name: str, **kwargs) -> dict:
    if name not in BUILTINS:
        raise KeyError(f"unknown builtin {name!r}; known: {', '.join(BUILTINS)}")
    return BUILTINS[name](**kwargs)


def describe(name: str, **kwargs) -> str:
    try:
        return builtin(name, **kwargs)["description"]
    except OSError as err:
        return f"(needs the shared dir: {err})"
