"""Effective layout maps of a target rank (§4.2) and `rank_list_for_transform` (§4.5).

The rank list matters to the oracle because MindSpore loads exactly these files, in descending
rank order, and the output's parameter order is first appearance over them (§4.4).
"""

import math
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Set, Tuple

from .layout import Layout, LayoutError, coords_of


class NotAChain(LayoutError):
    """The two device matrices have no common refinement MindSpore can plan with."""


@dataclass(frozen=True)
class ParamLayout:
    layout: Layout
    stages: Tuple[int, ...] = (0,)


@dataclass
class StrategyMap:
    """One side's strategy: parameter name -> layout and pipeline stages."""
    params: Dict[str, ParamLayout]
    devices: int
    stages: int = 1


@dataclass
class TargetMaps:
    t_stage: int
    t_local: int
    n_src: int
    n_dst: int
    src: Optional[Dict[str, ParamLayout]]      # None = unsharded side
    dst: Optional[Dict[str, ParamLayout]]
    src_orig: Optional[Dict[str, ParamLayout]]
    dst_orig: Optional[Dict[str, ParamLayout]]

    def dropped(self, name: str) -> bool:
        """§4.4 step 1: the parameter belongs to another target stage."""
        src_side = self.src_orig is None or (name in self.src_orig and name not in self.src)
        dst_side = self.dst_orig is None or (name in self.dst_orig and name not in self.dst)
        return src_side and dst_side

    def resharded(self, name: str) -> bool:
        """§4.4 step 2 (assumes not dropped)."""
        return ((self.src is None or name in self.src)
                and (self.dst is None or name in self.dst))


def target_maps(src: Optional[StrategyMap], dst: Optional[StrategyMap], t: int) -> TargetMaps:
    n_src = src.devices if src else 1
    n_dst = dst.devices if dst else 1
    t_stage, t_local = divmod(t, n_dst)
    if dst is None:
        eff_dst = None
        eff_src = dict(src.params) if src else None
    else:
        eff_dst = {n: p for n, p in dst.params.items() if t_stage in p.stages}
        removed = set(dst.params) - set(eff_dst)
        eff_src = {n: p for n, p in src.params.items() if n not in removed} if src else None
    return TargetMaps(t_stage, t_local, n_src, n_dst, eff_src, eff_dst,
                      src.params if src else None, dst.params if dst else None)


# -- the per-parameter needed-rank rule (§4.5 a–f) ----------------------------------------------

def _suffix_products(sizes: Sequence[int]) -> List[int]:
    out = [1]
    for s in reversed(sizes):
        out.append(out[-1] * s)
    return out


def _pad(sizes, dims, total):
    """§4.5 b: a smaller layout gets an outer replication axis up to `total` devices."""
    n = math.prod(sizes)
    if n == total:
        return tuple(sizes), dims
    if total % n:
        raise NotAChain(f"device counts {n} and {total} are not multiples")
    return (total // n,) + tuple(sizes), tuple(tuple(a + 1 for a in axes) for axes in dims)


def _unified_axes(products: List[int]) -> List[int]:
    """Sizes of the unified axes, outer first, from the sorted suffix-product boundaries."""
    for lo, hi in zip(products, products[1:]):
        if hi % lo:
            raise NotAChain(f"suffix products {products} are not a divisibility chain")
    return [hi // lo for lo, hi in zip(products, products[1:])][::-1]


def _axis_runs(sizes, boundaries_desc) -> List[List[int]]:
    """For each original axis, the unified axes (outer first) it is made of."""
    runs = []
    inner = math.prod(sizes)
    for size in sizes:
        outer_bound = inner
        inner = inner // size
        # Unified axis u spans products (boundaries_desc[u+1], boundaries_desc[u]].
        runs.append([u for u in range(len(boundaries_desc) - 1)
                     if boundaries_desc[u] <= outer_bound and boundaries_desc[u + 1] >= inner])
    return runs


def _usage(sizes, dims, boundaries_desc, unified_sizes) -> Dict[int, Tuple[int, int]]:
    """§4.5 d: unified axis -> (tensor dimension, product of its axes down to this one)."""
    runs = _axis_runs(sizes, boundaries_desc)
    used = {}
    for j, axes in enumerate(dims):
        product = 1
        for a in axes:
            for u in runs[a]:
                product *= unified_sizes[u]
                used[u] = (j, product)
    return used


def mindspore_needed(src: Layout, dst: Layout, t_local: int) -> Set[int]:
    """Local source ranks MindSpore gathers for one parameter (§4.5 a–f)."""
    src_sizes, src_dims = src.expanded()
    dst_sizes, dst_dims = dst.expanded()
    total = max(math.prod(src_sizes), math.prod(dst_sizes))
    src_sizes, src_dims = _pad(src_sizes, src_dims, total)
    dst_sizes, dst_dims = _pad(dst_sizes, dst_dims, total)
    products = sorted(set(_suffix_products(src_sizes)) | set(_suffix_products(dst_sizes)))
    unified = _unified_axes(products)
    boundaries_desc = products[::-1]
    src_used = _usage(src_sizes, src_dims, boundaries_desc, unified)
    dst_used = _usage(dst_sizes, dst_dims, boundaries_desc, unified)
    gathered = {u for u, use in src_used.items() if dst_used.get(u) != use}
    target = coords_of(t_local, unified)
    n_src = src.devices
    needed = set()
    for r in range(total):
        c = coords_of(r, unified)
        if all(c[u] == target[u] for u in range(len(unified)) if u not in gathered):
            needed.add(r % n_src)
    return needed


def _overlaps(a, b) -> bool:
    return all(lo1 < hi2 and lo2 < hi1 for (lo1, hi1), (lo2, hi2) in zip(a, b))


def minimal_needed(src: Layout, dst: Layout, t_local: int, shape: Sequence[int]) -> Set[int]:
    """Local source ranks whose blocks intersect the target block."""
    want = dst.box(t_local, shape)
    return {r for r in range(src.devices) if _overlaps(src.box(r, shape), want)}


def needed_local_ranks(src: Layout, dst: Layout, t_local: int,
                       shape: Optional[Sequence[int]] = None) -> Set[int]:
    """MindSpore's rule; where MindSpore cannot plan (device counts that are not multiples,
    e.g. 4 -> 6), the ckptfs extension: ranks whose blocks intersect, plus t_local mod N_src
    (which passthrough parameters are read from)."""
    try:
        return mindspore_needed(src, dst, t_local)
    except NotAChain:
        if shape is None:
            raise
        return minimal_needed(src, dst, t_local, shape) | {t_local % src.devices}


def rank_list_for_transform(src: Optional[StrategyMap], dst: Optional[StrategyMap], t: int,
                            shapes: Optional[Dict[str, Sequence[int]]] = None) -> List[int]:
    """Global source ranks, descending (≥2.4), whose files MindSpore loads for target `t`."""
    if src is None:
        return [0]
    maps = target_maps(src, dst, t)
    if not maps.src:
        raise LayoutError("the effective source strategy is empty")
    needed: Set[int] = set()
    for name, p in maps.src.items():
        if maps.dst is not None and name not in maps.dst:
            continue
        dst_layout = (maps.dst[name].layout if maps.dst is not None
                      else Layout.unsharded(p.layout.ndim))
        shape = shapes.get(name) if shapes else None
        needed |= needed_local_ranks(p.layout, dst_layout, maps.t_local, shape)
    stages = sorted({s for p in maps.src.values() for s in p.stages})
    return sorted((s * maps.n_src + r for s in stages for r in needed), reverse=True)
