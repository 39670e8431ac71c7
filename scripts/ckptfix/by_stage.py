"""Expected files of MindSpore's by-stage transform (mindspore-formats.md §4.7), by construction.

For a pipeline source (S stages of N devices) and a one-stage destination (M devices),
`transform_checkpoints` called once per source stage s with that stage's strategy file writes
rank_<l>/checkpoint_<l>_part<s>.ckpt for l in 0..M-1: the transform (§4.3-4.4) of the stage's
rank directories s*N .. s*N+N-1, taken as ranks 0..N-1 and all loaded in ascending order, to
target l, with the destination strategy restricted to the names the stage's strategy lists.
"""

import os
from typing import Dict, List

from .build import Fixture, write_checkpoint
from .expected import plan_target
from .ranklist import ParamLayout, StrategyMap
from .sources import SourcePlan, TensorBank


class StagePlan:
    """The source plan of one stage, its ranks renumbered from 0 (what MindSpore loads)."""

    def __init__(self, plan: SourcePlan, stage: int, devices: int):
        self.plan = plan
        self.base = stage * devices
        self.devices = devices
        self.bank = plan.bank
        self.case = plan.case

    def ranks(self) -> List[int]:
        return list(range(self.devices))

    def records(self, rank: int):
        return self.plan.records(self.base + rank)

    def file_order(self, rank: int):
        return self.plan.file_order(self.base + rank)

    def record(self, rank: int, name: str):
        return self.plan.record(self.base + rank, name)


def write_expected(fx: Fixture, outdir: str) -> Dict[int, List[str]]:
    """Writes OUTDIR/rank_<l>/checkpoint_<l>_part<s>.ckpt; returns l -> file names."""
    case = fx.case
    if case.src is None or case.src.stages < 2 or case.dst is None or case.dst.stages != 1:
        raise ValueError("the by-stage transform needs a pipeline source and a one-stage target")
    plan = SourcePlan(case, TensorBank(case))
    out: Dict[int, List[str]] = {}
    for stage in range(case.src.stages):
        src_params = {p.name: ParamLayout(p.src.layout(), (0,)) for p in case.params
                      if p.src is not None and stage in p.src.stages}
        dst_params = {p.name: ParamLayout(p.dst.layout(), (0,)) for p in case.params
                      if p.dst is not None and p.name in src_params}
        src_map = StrategyMap(src_params, case.src.devices, 1)
        dst_map = StrategyMap(dst_params, case.dst.devices, 1)
        stage_plan = StagePlan(plan, stage, case.src.devices)
        for l in range(case.dst.devices):
            # The by-stage transform loads every file of the stage, in ascending rank order.
            target = plan_target(case, stage_plan, l, src_map, dst_map,
                                 load_order=stage_plan.ranks())
            name = f"checkpoint_{l}_part{stage}.ckpt"
            path = os.path.join(outdir, f"rank_{l}", name)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            write_checkpoint(path, target.records)
            out.setdefault(l, []).append(name)
    return out
