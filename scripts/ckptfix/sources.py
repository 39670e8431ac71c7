"""What each source rank's checkpoint holds, in file order, before anything is written.

The same description drives the writer and the expected-file builder (passthrough records are
copies of source records), so both agree on every byte by construction.
"""

from dataclasses import dataclass
from typing import Callable, Dict, Iterator, List

from . import ckptio, data, stio
from .case import Case, CaseError, ParamSpec, parse_record_order


@dataclass
class SourceRecord:
    name: str
    tensor_type: str
    dims: List[int]       # exactly as written to the source file
    nbytes: int
    chunks: Callable[[], Iterator[bytes]]
    kind: str             # "sliced" (per src layout), "full" (unsharded or per-rank), "extra"

    @property
    def is_scalar(self) -> bool:
        return self.tensor_type != ckptio.STRING_TYPE and self.dims in ([], [0])


class TensorBank:
    """Lazily built tensor contents of a case, keyed by (name, variant).

    variant 0 is the global tensor every layout slices; variant g+1 is the rank-specific tensor
    that rank g stores for a parameter outside the src strategy; decoys use other seeds.
    """

    def __init__(self, case: Case, seed_offset: int = 0):
        self.case = case
        self.seed = case.seed + seed_offset
        self._cache: Dict[tuple, data.TensorData] = {}

    def get(self, param: ParamSpec, variant: int = 0) -> data.TensorData:
        key = (param.name, variant)
        if key not in self._cache:
            self._cache[key] = data.make_tensor(param.shape, param.dtype, self.seed, param.name,
                                                variant, self.case.options.materialize_limit)
        return self._cache[key]


def source_ranks(case: Case) -> List[int]:
    return [0] if case.src is None else list(range(case.src.ranks))


def _block_record(param: ParamSpec, tensor: data.TensorData, box, kind: str) -> SourceRecord:
    return SourceRecord(param.name, param.dtype, [hi - lo for lo, hi in box],
                        tensor.block_nbytes(box), lambda: tensor.block_chunks(box), kind)


# Training writes the same step counters into every rank's file; ckptfs refuses files whose
# counters disagree, so these never get rank-specific values.
STEP_COUNTERS = ("global_step", "epoch_num", "step_num")


def _extra_record(case: Case, extra, rank: int) -> SourceRecord:
    per_rank = extra.per_rank and extra.name not in STEP_COUNTERS
    value = data.rank_variant(extra.dtype, extra.value, rank) if per_rank else extra.value
    content = data.scalar_bytes(extra.dtype, value)
    if extra.dtype == ckptio.STRING_TYPE or case.options.old_scalars:
        dims = [0]
    else:
        dims = []
    return SourceRecord(extra.name, extra.dtype, dims, len(content), lambda: iter([content]),
                        "extra")


def source_records(case: Case, rank: int, bank: TensorBank) -> List[SourceRecord]:
    """Records of global source rank `rank`: its stage's parameters in case order, then extras."""
    records = []
    if case.src is None:
        for p in case.params:
            t = bank.get(p)
            records.append(_block_record(p, t, data.full_box(p.shape), "full"))
    else:
        stage, local = divmod(rank, case.src.devices)
        for p in case.params:
            if p.src is None:
                # Not in the src strategy: saved whole, and different on every rank.
                t = bank.get(p, variant=rank + 1)
                records.append(_block_record(p, t, data.full_box(p.shape), "full"))
            elif stage in p.src.stages:
                t = bank.get(p)
                records.append(_block_record(p, t, p.src.layout().box(local, p.shape), "sliced"))
    records.extend(_extra_record(case, e, rank) for e in case.extras)
    return records


def reordered(records: List[SourceRecord], how, rank: int) -> List[SourceRecord]:
    """`records` in the file order Options.record_orders gives rank `rank`."""
    form = parse_record_order(how)
    names = [r.name for r in records]
    if form[0] == "reversed":
        order = names[::-1]
    elif form[0] == "rotated":
        k = form[1] % len(names)
        order = names[k:] + names[:k]
    elif form[0] == "moved":
        if form[1] not in names:
            raise CaseError(f"record_orders: rank {rank} has no record {form[1]!r}")
        order = [n for n in names if n != form[1]]
        order.insert(form[2], form[1])
    else:
        order = form[1]
        if sorted(order) != sorted(names):
            raise CaseError(f"record_orders: rank {rank} holds {names}, not {order}")
    by_name = {r.name: r for r in records}
    return [by_name[n] for n in order]


def redundancy_groups(case: Case) -> Dict[str, List[tuple]]:
    """Per src-strategy parameter, its groups of global ranks holding identical blocks (the
    optimizer shard splits groups), members ascending, groups sorted (spec safetensors §3.2)."""
    groups = {}
    for p in case.params:
        if p.src is None or case.src is None:
            continue
        layout = p.src.layout()
        found = []
        for stage in p.src.stages:
            by_block: Dict[tuple, List[int]] = {}
            for local in range(case.src.devices):
                by_block.setdefault(layout.block(local), []).append(stage * case.src.devices +
                                                                     local)
            found += [tuple(g) for g in by_block.values()]
        groups[p.name] = sorted(found)
    return groups


def dedup_savers(case: Case) -> Dict[str, set]:
    """Which ranks save each src-strategy parameter under remove_redundancy=True: for every
    distinct group G, the parameters having G, by name, go round robin to G's members (the
    writer's rule of spec safetensors §3.3, MindSpore >= 2.6)."""
    by_group: Dict[tuple, List[str]] = {}
    for name, groups in sorted(redundancy_groups(case).items()):
        for g in groups:
            by_group.setdefault(g, []).append(name)
    savers: Dict[str, set] = {}
    for g, names in by_group.items():
        for k, name in enumerate(names):
            savers.setdefault(name, set()).add(g[k % len(g)])
    return savers


class SourcePlan:
    """Source records of every rank, computed once."""

    def __init__(self, case: Case, bank: TensorBank):
        self.case = case
        self.bank = bank
        self._records = {g: source_records(case, g, bank) for g in source_ranks(case)}
        for key, how in case.options.record_orders.items():
            self._records[int(key)] = reordered(self._records[int(key)], how, int(key))

    def ranks(self) -> List[int]:
        return list(self._records)

    def records(self, rank: int) -> List[SourceRecord]:
        return self._records[rank]

    def written_records(self, rank: int) -> List[SourceRecord]:
        """What rank `rank`'s file holds: every record, or under remove_redundancy only the
        strategy parameters the rank saves (entries outside the strategy are in every file)."""
        if not self.case.options.remove_redundancy:
            return self._records[rank]
        savers = dedup_savers(self.case)
        return [r for r in self._records[rank]
                if r.kind != "sliced" or rank in savers.get(r.name, ())]

    def file_order(self, rank: int) -> List[SourceRecord]:
        """Every record of rank `rank` in the order its file lists them: safetensors files in the
        reference writer's order, unless record_orders gives the rank another one."""
        records = self._records[rank]
        if self.case.options.source_format == "safetensors" and \
                str(rank) not in self.case.options.record_orders:
            return stio.writer_order(records)
        return records

    def record(self, rank: int, name: str):
        return next((r for r in self._records[rank] if r.name == name), None)

    def total_bytes(self) -> int:
        return sum(r.nbytes for recs in self._records.values() for r in recs)


def scalar_dims_23(record: SourceRecord) -> List[int]:
    """Dims a ≥2.3 re-save writes: 0-d tensors lose their [0]; strings keep it (§4.4 step 5)."""
    if record.tensor_type == ckptio.STRING_TYPE:
        return list(record.dims)
    if record.dims == [0]:
        return []
    return list(record.dims)

