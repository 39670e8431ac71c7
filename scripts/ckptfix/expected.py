"""The expected target files (§4.2–§4.6), by construction.

For target rank t: MindSpore loads the source files of `rank_list_for_transform(t)` in that
(descending) order; L = first appearance of names over those files. Resharded parameters come
first in L order, each the target block of the global tensor; passthrough parameters follow in L
order, copied from the last loaded file whose local rank is t_local mod N_src.

Safetensors sources follow MindSpore's safetensors transform (mindspore-safetensors.md §2.2): L
is first appearance over each file's entries in DATA-OFFSET order (safetensors 0.7's
numpy.load_file iterates offset_keys(); MindSpore 2.7.2 with it was seen to write that order),
and a target with nothing resharded is not an error: its passthrough entries come from local
rank 0.
"""

from dataclasses import dataclass, field
from typing import Callable, Dict, Iterator, List, Optional

from .case import Case
from .layout import Layout
from .ranklist import ParamLayout, StrategyMap, TargetMaps, rank_list_for_transform, target_maps
from .sources import SourcePlan, SourceRecord, scalar_dims_23


class ExpectationError(ValueError):
    """The case describes a transform MindSpore (and ckptfs) must refuse."""


@dataclass
class ExpectedRecord:
    name: str
    tensor_type: str
    dims: List[int]
    nbytes: int
    chunks: Callable[[], Iterator[bytes]]
    role: str                        # "reshard" or "passthrough"
    source_rank: Optional[int] = None  # passthrough: the global rank copied from


@dataclass
class TargetPlan:
    rank: int
    stage: int
    local: int
    rank_list: List[int]
    records: List[ExpectedRecord] = field(default_factory=list)
    # Before empty tensors are dropped (the .ckpt writer drops them, safetensors keeps them).
    all_records: List[ExpectedRecord] = field(default_factory=list)

    def summary(self) -> dict:
        return {"rank": self.rank, "stage": self.stage, "local": self.local,
                "rank_list": self.rank_list,
                "records": [{"name": r.name, "role": r.role, "dims": r.dims,
                             "dtype": r.tensor_type, "source_rank": r.source_rank}
                            for r in self.records]}


def strategy_map(case: Case, which: str) -> Optional[StrategyMap]:
    side = case.side(which)
    if side is None:
        return None
    params = {}
    for p in case.params:
        spec = getattr(p, which)
        if spec is not None:
            params[p.name] = ParamLayout(spec.layout(), tuple(spec.stages))
    return StrategyMap(params, side.devices, side.stages)


def target_ranks(case: Case) -> List[int]:
    return [0] if case.dst is None else list(range(case.dst.ranks))


def load_order_names(plan: SourcePlan, rank_list: List[int]) -> List[str]:
    """L: first appearance over the loaded files, each in the order it lists its records (every
    record, as the save without deduplication holds them)."""
    seen: Dict[str, None] = {}
    for g in rank_list:
        for rec in plan.file_order(g):
            seen.setdefault(rec.name, None)
    return list(seen)


def _reshard_record(case: Case, plan: SourcePlan, maps: TargetMaps, name: str) -> ExpectedRecord:
    param = case.param(name)
    dst: Layout = (maps.dst[name].layout if maps.dst is not None
                   else Layout.unsharded(len(param.shape)))
    try:
        box = dst.box(maps.t_local, param.shape)
    except ValueError as err:
        raise ExpectationError(f"{name}: {err}") from None
    tensor = plan.bank.get(param)
    return ExpectedRecord(name, param.dtype, [hi - lo for lo, hi in box],
                          tensor.block_nbytes(box), lambda: tensor.block_chunks(box), "reshard")


def passthrough_source(plan: SourcePlan, rank_list: List[int], n_src: int, t_local: int,
                       name: str) -> Optional[int]:
    """The loaded file whose copy MindSpore keeps: same local index, loaded last, has the name."""
    chosen = None
    for g in rank_list:
        if g % n_src == t_local % n_src and plan.record(g, name) is not None:
            chosen = g
    return chosen


def _passthrough_record(plan: SourcePlan, rank_list, maps: TargetMaps, name: str,
                        t_local: int) -> ExpectedRecord:
    g = passthrough_source(plan, rank_list, maps.n_src, t_local, name)
    if g is None:
        raise ExpectationError(f"{name}: no loaded source file of local rank "
                               f"{t_local % maps.n_src} holds it")
    src: SourceRecord = plan.record(g, name)
    return ExpectedRecord(name, src.tensor_type, scalar_dims_23(src), src.nbytes, src.chunks,
                          "passthrough", g)


def plan_target(case: Case, plan: SourcePlan, t: int, src_map=None, dst_map=None,
                load_order: Optional[List[int]] = None) -> TargetPlan:
    """`load_order`: the files MindSpore loads, in order, where that is not
    rank_list_for_transform's list (the by-stage transform loads every file of the stage)."""
    src_map = src_map if src_map is not None else strategy_map(case, "src")
    dst_map = dst_map if dst_map is not None else strategy_map(case, "dst")
    shapes = {p.name: p.shape for p in case.params}
    rank_list = load_order if load_order is not None else \
        rank_list_for_transform(src_map, dst_map, t, shapes)
    maps = target_maps(src_map, dst_map, t)
    missing = [g for g in rank_list if g not in plan.ranks()]
    if missing:
        raise ExpectationError(f"target {t} needs source ranks {missing}, which do not exist")
    safetensors = case.options.source_format == "safetensors"
    if safetensors and src_map is not None and src_map.stages > 1:
        return _plan_target_by_stage(case, plan, t, maps, rank_list)
    names = [n for n in load_order_names(plan, rank_list) if not maps.dropped(n)]
    resharded = [n for n in names if maps.resharded(n)]
    passthrough = [n for n in names if not maps.resharded(n)]
    if not resharded and not safetensors:
        raise ExpectationError(f"target {t}: none of the parameters is in both strategies")
    t_local = maps.t_local if resharded else 0
    target = TargetPlan(t, maps.t_stage, maps.t_local, rank_list)
    target.records += [_reshard_record(case, plan, maps, n) for n in resharded]
    target.records += [_passthrough_record(plan, rank_list, maps, n, t_local)
                       for n in passthrough]
    target.all_records = list(target.records)
    # A 0-byte parameter gets no record from MindSpore's ≥2.3 saver.
    target.records = [r for r in target.records if r.nbytes > 0]
    return target


def _plan_target_by_stage(case: Case, plan: SourcePlan, t: int, maps: TargetMaps,
                          rank_list: List[int]) -> TargetPlan:
    """Safetensors sources saved in pipeline stages: MindSpore transforms each source stage on
    its own (its files, its part of the strategy) and merges the results with dict.update in
    stage order, so an entry sits where the first stage put it and holds the last stage's value
    (mindspore-safetensors.md §2.2; seen so with MindSpore 2.7.2)."""
    merged: Dict[str, ExpectedRecord] = {}
    for st in range(case.src.stages):
        stage_ranks = [g for g in rank_list if g // maps.n_src == st]
        if not stage_ranks:
            continue
        names = [n for n in load_order_names(plan, stage_ranks) if not maps.dropped(n)]
        resharded = [n for n in names if maps.resharded(n)]
        passthrough = [n for n in names if not maps.resharded(n)]
        t_local = maps.t_local if resharded else 0
        records = [_reshard_record(case, plan, maps, n) for n in resharded]
        records += [_passthrough_record(plan, stage_ranks, maps, n, t_local) for n in passthrough]
        for r in records:
            merged[r.name] = r
    target = TargetPlan(t, maps.t_stage, maps.t_local, rank_list)
    target.all_records = list(merged.values())
    target.records = [r for r in target.all_records if r.nbytes > 0]
    return target


def plan_targets(case: Case, plan: SourcePlan) -> List[TargetPlan]:
    src_map, dst_map = strategy_map(case, "src"), strategy_map(case, "dst")
    return [plan_target(case, plan, t, src_map, dst_map) for t in target_ranks(case)]
