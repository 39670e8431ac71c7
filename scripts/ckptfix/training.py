"""Training output directories by construction: one case saved at several steps, laid out as
MindSpore's ModelCheckpoint or MindFormers leave them, with what training leaves beside them.

    OUTDIR/steps/<E>_<S>/                  a complete fixture per step (its own data, seed and
                                           step counters; expected/ only where asked)
    OUTDIR/train/rank_<g>/net-<E>_<S>.ckpt                     layout "mindspore"
    OUTDIR/output/checkpoint/rank_<g>/net_rank_<g>-<E>_<S>.ckpt layout "mindformers"
    OUTDIR/output/strategy/ckpt_strategy_rank_<g>.ckpt          (its src strategy)

The rank files of a step are copies of that step's fixture sources, so the expected files of a
step (OUTDIR/steps/<E>_<S>/expected) are exactly what mounting the tree at that step must give.
"""

import copy
import os
import shutil
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

from .build import Fixture, make

Step = Tuple[int, int]


@dataclass
class TrainingTree:
    outdir: str
    src_dir: str                       # what `ckptfs mount` is given
    rank_dirs: Dict[int, str]          # global rank -> its directory in the tree
    src_strategy: Optional[str]        # None in the mindformers layout (output/strategy is used)
    dst_strategy: Optional[str]
    steps: Dict[Step, Fixture] = field(default_factory=dict)
    files: Dict[Step, Dict[int, str]] = field(default_factory=dict)  # step -> rank -> file
    breakpoints: Dict[int, str] = field(default_factory=dict)        # rank -> breakpoint file
    layout: str = "mindspore"
    prefix: str = "net"
    suffix: str = ".ckpt"              # ".safetensors" for format="safetensors" saves

    def file_name(self, rank: int, step: Step, breakpoint: bool = False) -> str:
        tail = "_breakpoint" if breakpoint else ""
        stem = f"{self.prefix}_rank_{rank}" if self.layout == "mindformers" else self.prefix
        return f"{stem}-{step[0]}_{step[1]}{tail}{self.suffix}"

    def expected(self, step: Step) -> Fixture:
        return self.steps[step]


def _with_step(case: dict, index: int, step: Step) -> dict:
    """The case as saved at `step`: other tensor data, and the step counters of that step."""
    c = copy.deepcopy(case)
    c["seed"] = int(c.get("seed", 0)) + 7919 * (index + 1)
    extras = [e for e in c.get("extras", [])
              if e["name"] not in ("global_step", "epoch_num", "step_num")]
    extras += [{"name": "global_step", "dtype": "Int64", "value": step[0] * 1000 + step[1],
                "per_rank": False},
               {"name": "epoch_num", "dtype": "Int64", "value": step[0], "per_rank": False},
               {"name": "step_num", "dtype": "Int64", "value": step[1], "per_rank": False}]
    c["extras"] = extras
    return c


def _place(source: str, dest: str) -> None:
    os.makedirs(os.path.dirname(dest), exist_ok=True)
    shutil.copyfile(os.path.realpath(source), dest)


def save_step(tree: TrainingTree, case: dict, index: int, step: Step, ranks=None,
              expected: bool = True, breakpoint: bool = False) -> Dict[int, str]:
    """Writes `step` into the tree (for `ranks`, default all) the way a save finishes: each file
    first as `<name>.tmp`, then renamed. Returns rank -> file."""
    fx_dir = os.path.join(tree.outdir, "steps", f"{step[0]}_{step[1]}" +
                          ("_breakpoint" if breakpoint else ""))
    fx = make(_with_step(case, index, step), fx_dir, expected=expected)
    out = {}
    for g, path in sorted(fx.source_files.items()):
        if ranks is not None and g not in ranks:
            continue
        dest = os.path.join(tree.rank_dirs[g], tree.file_name(g, step, breakpoint))
        _place(path, dest + ".tmp")
        os.rename(dest + ".tmp", dest)
        out[g] = dest
    if breakpoint:
        tree.breakpoints.update(out)
    else:
        tree.steps[step] = fx
        tree.files.setdefault(step, {}).update(out)
    return out


def make_training(case: dict, outdir: str, steps: List[Step], layout: str = "mindspore",
                  expected_steps: Optional[List[Step]] = None,
                  breakpoints: Optional[Dict[int, Step]] = None,
                  partial: Optional[Step] = None, side_files: bool = True) -> TrainingTree:
    """Saves `case` at every step of `steps`, in that order (each with its own data).

    expected_steps: steps whose expected files are written (default: the last one).
    breakpoints: rank -> step of a `*_breakpoint.ckpt` file on that rank (other data again).
    partial: a step whose save is still under way: a truncated `.ckpt.tmp` on every rank.
    side_files: the graph `.meta` (ModelCheckpoint) or `meta.json` (MindFormers) of a run.
    """
    if layout not in ("mindspore", "mindformers"):
        raise ValueError(f"unknown layout {layout!r}")
    expected_steps = [steps[-1]] if expected_steps is None else expected_steps
    os.makedirs(outdir, exist_ok=True)
    if layout == "mindspore":
        src_dir = os.path.join(outdir, "train")
        rank_root = src_dir
    else:
        src_dir = os.path.join(outdir, "output")
        rank_root = os.path.join(src_dir, "checkpoint")
    n_ranks = 1
    if case.get("src"):
        n_ranks = case["src"]["devices"] * case["src"].get("stages", 1)
    rank_dirs = {g: os.path.join(rank_root, f"rank_{g}") for g in range(n_ranks)}
    for d in rank_dirs.values():
        os.makedirs(d, exist_ok=True)
    tree = TrainingTree(outdir, src_dir, rank_dirs, None, None, layout=layout)
    if case.get("options", {}).get("source_format") == "safetensors":
        tree.suffix = ".safetensors"

    for i, step in enumerate(steps):
        save_step(tree, case, i, step, expected=step in expected_steps)
    first = tree.steps[steps[0]]
    tree.dst_strategy = first.dst_strategy
    if layout == "mindspore":
        tree.src_strategy = first.src_strategy
    elif first.src_strategy:
        strategy_dir = os.path.join(src_dir, "strategy")
        os.makedirs(strategy_dir)
        sources = ([os.path.join(first.src_strategy, n) for n in sorted(os.listdir(
            first.src_strategy))] if os.path.isdir(first.src_strategy) else [first.src_strategy])
        for g, path in enumerate(sources):
            shutil.copyfile(path, os.path.join(strategy_dir, f"ckpt_strategy_rank_{g}.ckpt"))

    for j, (g, step) in enumerate(sorted((breakpoints or {}).items())):
        save_step(tree, case, len(steps) + j, step, ranks=[g], expected=False, breakpoint=True)
    if partial is not None:
        for g, d in rank_dirs.items():
            whole = tree.files[steps[-1]][g]
            with open(whole, "rb") as f:
                head = f.read(max(1, os.path.getsize(whole) // 2))
            with open(os.path.join(d, tree.file_name(g, partial)) + ".tmp", "wb") as f:
                f.write(head)
    if side_files:
        for g, d in rank_dirs.items():
            name = f"{tree.prefix}-graph.meta" if layout == "mindspore" else "meta.json"
            with open(os.path.join(d, name), "w") as f:
                f.write("{}\n" if layout == "mindformers" else "graph\n")
    return tree


def twelve_saves_case() -> dict:
    """A small 2 -> 1 case for the 12-save ModelCheckpoint trees."""
    from .builtins import TRAINING_EXTRAS, case, lay, param, side
    params = [param("w", "Float32", [4, 6], lay([2], [0, -1]), None),
              param("b", "Float32", [6], lay([2], [-1]), None)]
    return case("training", "2 ranks saved at many steps", side(2), None, params,
                TRAINING_EXTRAS)

