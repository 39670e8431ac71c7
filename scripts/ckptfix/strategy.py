"""Strategy files (spec §2): protobuf written as MindSpore writes it (§2.6), JSON (§2.3),
per-stage directories and merged pipeline files (§2.4); plus a reader for existing files.
"""

import json
import os
import shutil
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

import numpy as np

from . import wire
from .case import Case, CaseError, LayoutSpec, ParamSpec

STRATEGY_FILE_PREFIX = "ckpt_strategy_rank_"


# -- protobuf encoding --------------------------------------------------------------------------

def _per_dim_maps(tensor_map) -> List[List[int]]:
    """Layout-API form: one list per dimension, [-1] when unsplit, plus an empty list for 1-D."""
    maps = [list(e) if isinstance(e, list) else [e] for e in tensor_map]
    if len(maps) == 1:
        maps.append([])
    return maps


def encode_layouts(spec: dict) -> bytes:
    """A ParallelLayouts message. `spec` holds the (possibly overridden) written values."""
    tensor_map = spec["tensor_map"]
    if any(isinstance(e, list) for e in tensor_map):
        maps = _per_dim_maps(tensor_map)
    else:
        maps = [list(tensor_map)]
    out = wire.len_field(1, wire.repeated_varints(1, spec["dev_matrix"]))
    for m in maps:
        out += wire.len_field(2, wire.repeated_varints(1, m))
    # MindSpore always writes one ParamSplitShape and one IndicesOffset, empty here (§2.6).
    out += wire.len_field(3, wire.repeated_varints(1, spec.get("param_split_shape", [])))
    out += wire.len_field(4, wire.repeated_varints(1, spec.get("indices_offset", [])))
    out += wire.varint_field(5, spec.get("field", 0))
    out += wire.varint_field(6, spec["opt_weight_shard_step"])
    out += wire.varint_field(7, spec["opt_weight_shard_size"])
    return out


def encode_layout_item(name: str, spec: dict) -> bytes:
    return wire.len_field(3, wire.string_field(1, name) + wire.len_field(2, encode_layouts(spec)))


def encode_strategy_item(node_name: str, stage: int, strategies: List[List[int]]) -> bytes:
    body = wire.varint_field(1, stage)
    for s in strategies:
        body += wire.len_field(2, wire.repeated_varints(1, s))
    return wire.len_field(2, wire.string_field(1, node_name) + wire.len_field(2, body))


@dataclass
class Entry:
    """One parameter as it appears in one strategy file."""
    name: str          # written name ("<stage>-" prefixed in merged files)
    stage: int
    param: ParamSpec
    written: dict      # dev_matrix, tensor_map, opt_weight_shard_step/size (+ overrides)


def encode_protobuf(entries: List[Entry]) -> bytes:
    out = wire.varint_field(1, 1)  # current_stage is a save counter; MindSpore writes 1
    for e in entries:
        out += encode_strategy_item(f"MatMul_{e.param.name}", e.stage, [_split_factors(e)])
    for e in entries:
        out += encode_layout_item(e.name, e.written)
    return out


def _split_factors(e: Entry) -> List[int]:
    """The operator strategy MindSpore would record: per-dimension split counts."""
    dev = e.written["dev_matrix"]
    counts = []
    for entry in e.written["tensor_map"]:
        values = entry if isinstance(entry, list) else [entry]
        n = 1
        for v in values:
            if 0 <= v < len(dev):
                n *= dev[len(dev) - 1 - v]
        counts.append(n)
    return counts


# -- JSON encoding ------------------------------------------------------------------------------

def _json_layout(e: Entry) -> dict:
    if any(isinstance(v, list) for v in e.written["tensor_map"]):
        raise CaseError(f"{e.param.name}: multi-axis maps cannot be written as JSON (§2.3)")
    return {"dev_matrix": e.written["dev_matrix"], "tensor_map": e.written["tensor_map"],
            "tensor_shape": e.written.get("tensor_shape", e.param.shape), "field": 0,
            "opt_weight_shard_step": e.written["opt_weight_shard_step"],
            "opt_weight_shard_size": e.written["opt_weight_shard_size"]}


def encode_json(entries: List[Entry], merged: bool) -> bytes:
    layouts = {e.name: _json_layout(e) for e in entries}
    items = {f"MatMul_{e.param.name}": {"stage": e.stage, "parallel_strategy": [_split_factors(e)]}
             for e in entries}
    doc = {"current_stage": 1, "parallel_strategy_item": items, "parallel_layout_item": layouts}
    if merged:
        # Python's merge_pipeline_strategys: json.dump defaults, insertion order.
        return json.dumps(doc).encode()
    # MindSpore's C++ writer: compact, keys sorted.
    return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()


# -- per side -----------------------------------------------------------------------------------

def _written_spec(spec: LayoutSpec, override: Optional[dict]) -> dict:
    written = {"dev_matrix": list(spec.dev_matrix), "tensor_map": spec.tensor_map,
               "opt_weight_shard_step": spec.opt_shard_step or 0,
               "opt_weight_shard_size": spec.opt_shard_size}
    written.update(override or {})
    return written


def stage_entries(case: Case, which: str, stage: int, prefixed: bool) -> List[Entry]:
    overrides = case.options.strategy_overrides.get(which, {})
    entries = []
    for p in case.params:
        spec: Optional[LayoutSpec] = getattr(p, which)
        if spec is None or stage not in spec.stages:
            continue
        name = f"{stage}-{p.name}" if prefixed else p.name
        entries.append(Entry(name, stage, p, _written_spec(spec, overrides.get(p.name))))
    if case.options.shuffle_layouts:
        # Files list layouts in hash order; readers must not depend on it.
        order = np.random.default_rng([case.seed, stage, 7]).permutation(len(entries))
        entries = [entries[i] for i in order]
    return entries


def write_side(case: Case, which: str, outdir: str) -> Optional[str]:
    """Writes `<outdir>/<which>_strategy{.ckpt,.json,/}`; returns its path (None if unsharded)."""
    side = case.side(which)
    if side is None:
        return None
    form = case.options.src_strategy_form if which == "src" else case.options.dst_strategy_form
    stages = range(side.stages)
    if form in ("dir", "json_dir"):
        ext = ".json" if form == "json_dir" else ".ckpt"
        path = os.path.join(outdir, f"{which}_strategy")
        os.makedirs(path)
        for s in stages:
            entries = stage_entries(case, which, s, prefixed=False)
            if ext == ".json":
                blob = encode_json(entries, merged=False)
            else:
                blob = encode_protobuf(entries)
            ranks = (range(s * side.devices, (s + 1) * side.devices)
                     if case.options.strategy_dir_all_ranks else [s * side.devices])
            for g in ranks:
                with open(os.path.join(path, f"{STRATEGY_FILE_PREFIX}{g}{ext}"), "wb") as f:
                    f.write(blob)
        return path
    merged = form == "merged" or side.stages > 1
    entries = [e for s in stages for e in stage_entries(case, which, s, prefixed=merged)]
    if form == "json":
        path = os.path.join(outdir, f"{which}_strategy.json")
        blob = encode_json(entries, merged)
    else:
        path = os.path.join(outdir, f"{which}_strategy.ckpt")
        blob = encode_protobuf(entries)
    with open(path, "wb") as f:
        f.write(blob)
    return path


def copy_existing(source_path: str, outdir: str, which: str) -> str:
    path = os.path.join(outdir, f"{which}_strategy.ckpt")
    shutil.copyfile(source_path, path)
    return path


# -- reading protobuf strategies ----------------------------------------------------------------

@dataclass
class ReadLayout:
    name: str
    dev_matrix: List[int]
    tensor_maps: List[List[int]]
    param_split_shape: List[int]
    indices_offset: List[int]
    field: int
    opt_step: int
    opt_size: int

    def tensor_map(self):
        """Classic map, or the nested per-dimension form when more than one TensorMap (§2.2)."""
        if len(self.tensor_maps) == 1:
            return list(self.tensor_maps[0])
        dims = [m for m in self.tensor_maps if m]
        return [m[0] if len(m) == 1 else list(m) for m in dims]


@dataclass
class ReadStrategy:
    current_stage: int
    items: List[Tuple[str, int]] = field(default_factory=list)   # (node_name, stage)
    layouts: List[ReadLayout] = field(default_factory=list)


def _sub(fields, number):
    return [f.value for f in fields if f.number == number]


def decode_protobuf(blob: bytes) -> ReadStrategy:
    top = list(wire.iter_fields(blob))
    result = ReadStrategy(next((f.value for f in top if f.number == 1), 0))
    for item in _sub(top, 2):
        fields = list(wire.iter_fields(item))
        node = bytes(_sub(fields, 1)[0]).decode()
        strategys = list(wire.iter_fields(_sub(fields, 2)[0]))
        result.items.append((node, next((f.value for f in strategys if f.number == 1), 0)))
    for item in _sub(top, 3):
        fields = list(wire.iter_fields(item))
        name = bytes(_sub(fields, 1)[0]).decode()
        lay = list(wire.iter_fields(_sub(fields, 2)[0]))

        def ints(number, sub=1):
            return [wire.repeated_ints(list(wire.iter_fields(v)), sub) for v in _sub(lay, number)]

        def scalar(number):
            values = [f.value for f in lay if f.number == number]
            return wire.as_signed64(values[-1]) if values else 0

        dev = ints(1)
        split = ints(3)
        offsets = ints(4)
        result.layouts.append(ReadLayout(name, dev[0] if dev else [], ints(2),
                                         split[0] if split else [], offsets[0] if offsets else [],
                                         scalar(5), scalar(6), scalar(7)))
    return result


def read_protobuf(path: str) -> ReadStrategy:
    with open(path, "rb") as f:
        return decode_protobuf(f.read())


def layout_specs(strategy: ReadStrategy) -> Dict[str, LayoutSpec]:
    """name -> LayoutSpec of a single-stage file (stage = its first strategy item's)."""
    stage = strategy.items[0][1] if strategy.items else 0
    out = {}
    for lay in strategy.layouts:
        out[lay.name] = LayoutSpec(list(lay.dev_matrix), lay.tensor_map(), lay.opt_size,
                                   lay.opt_step, [stage])
    return out
