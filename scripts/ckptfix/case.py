"""The case description: a model (parameters with global shapes and per-side layouts), the two
device/stage setups, passthrough extras and file-format options. JSON in, JSON out.

A side (`src`/`dst`) of null means "unsharded" (MindSpore's strategy argument None). Inside a
sharded side, a parameter whose layout for that side is null is not in that strategy; on the
source side such a parameter is saved whole in every rank file, with rank-specific data so that a
reader taking it from the wrong rank is caught.
"""

import copy
import json
import re
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Union

from . import ckptio
from .layout import Layout, LayoutError

STRATEGY_FORMS = ("protobuf", "merged", "json", "dir", "json_dir")
SCALAR_TYPES = ("Bool", "Int8", "UInt8", "Int16", "UInt16", "Int32", "UInt32", "Int64",
                "UInt64", "Float16", "Float32", "Float64", "BFloat16")


class CaseError(ValueError):
    pass


def step_order_key(name: str):
    """The order ckptfs chooses among a rank's checkpoints by: the last two integers of the
    name (missing ones -1), then the name. MindSpore's own .ckpt transform takes plain string
    order instead (net-9_1.ckpt after net-10_1.ckpt); ckptfs deliberately does not."""
    ints = [int(t) for t in re.findall(r"\d+", name)]
    last = ([-1, -1] + ints)[-2:]
    return (last[0], last[1], name)


def _is_flat(value) -> bool:
    """Scalars, and lists/dicts of at most one level of scalar lists, print on one line."""
    if isinstance(value, list):
        return all(not isinstance(v, (dict, list)) or
                   (isinstance(v, list) and all(not isinstance(x, (dict, list)) for x in v))
                   for v in value)
    return not isinstance(value, dict)


def format_json(value, indent: int = 0) -> str:
    """JSON with one parameter/layout per block and short lists inline, for readable cases."""
    pad = " " * (indent + 2)
    if _is_flat(value):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, list):
        items = [pad + format_json(v, indent + 2) for v in value]
        return "[\n" + ",\n".join(items) + "\n" + " " * indent + "]"
    items = [f"{pad}{json.dumps(k)}: {format_json(v, indent + 2)}" for k, v in value.items()]
    return "{\n" + ",\n".join(items) + "\n" + " " * indent + "}"


def parse_record_order(how) -> tuple:
    """Options.record_orders' `how` as ("reversed",), ("rotated", K), ("moved", NAME, I) or
    ("names", [...])."""
    if isinstance(how, list):
        return ("names", list(how))
    parts = str(how).split(":")
    try:
        if parts == ["reversed"]:
            return ("reversed",)
        if parts[0] == "rotated" and len(parts) == 2:
            return ("rotated", int(parts[1]))
        if parts[0] == "moved" and len(parts) == 3:
            return ("moved", parts[1], int(parts[2]))
    except ValueError:
        pass
    raise CaseError(f"record_orders: {how!r} is not reversed, rotated:K, moved:NAME:I or a list "
                    "of names")


@dataclass
class LayoutSpec:
    dev_matrix: List[int]
    tensor_map: List[Union[int, List[int]]]
    opt_shard_size: int = 0
    # None = derive the value MindSpore writes (only meaningful when opt_shard_size != 0).
    opt_shard_step: Optional[int] = None
    stages: List[int] = field(default_factory=lambda: [0])

    @staticmethod
    def from_dict(d: dict) -> "LayoutSpec":
        known = {"dev_matrix", "tensor_map", "opt_shard_size", "opt_shard_step", "stages"}
        unknown = set(d) - known
        if unknown:
            raise CaseError(f"unknown layout keys {sorted(unknown)}")
        step = d.get("opt_shard_step")
        return LayoutSpec(list(d["dev_matrix"]), copy.deepcopy(d["tensor_map"]),
                          int(d.get("opt_shard_size", 0)),
                          None if step in (None, "auto") else int(step),
                          list(d.get("stages", [0])))

    def to_dict(self) -> dict:
        return {"dev_matrix": self.dev_matrix, "tensor_map": self.tensor_map,
                "opt_shard_size": self.opt_shard_size, "opt_shard_step": self.opt_shard_step,
                "stages": self.stages}

    @property
    def multi_axis(self) -> bool:
        """Written as per-dimension TensorMaps (Layout-API form, §2.2)."""
        return any(isinstance(e, list) for e in self.tensor_map)

    def layout(self) -> Layout:
        return Layout.from_map(self.dev_matrix, self.tensor_map, self.opt_shard_size,
                               self.opt_shard_step or 0)

    def resolve_step(self) -> None:
        if self.opt_shard_step is not None:
            return
        if self.opt_shard_size == 0:
            self.opt_shard_step = 0
            return
        # Provisional step 1 just to build the layout; MindSpore's value is the replica stride.
        probe = Layout.from_map(self.dev_matrix, self.tensor_map, self.opt_shard_size, 1)
        self.opt_shard_step = probe.mindspore_opt_step()


@dataclass
class ParamSpec:
    name: str
    dtype: str
    shape: List[int]
    src: Optional[LayoutSpec] = None
    dst: Optional[LayoutSpec] = None

    @staticmethod
    def from_dict(d: dict) -> "ParamSpec":
        def side(key):
            return LayoutSpec.from_dict(d[key]) if d.get(key) is not None else None
        return ParamSpec(d["name"], d["dtype"], list(d["shape"]), side("src"), side("dst"))

    def to_dict(self) -> dict:
        return {"name": self.name, "dtype": self.dtype, "shape": self.shape,
                "src": self.src.to_dict() if self.src else None,
                "dst": self.dst.to_dict() if self.dst else None}

    @property
    def nbytes(self) -> int:
        n = ckptio.element_size(self.dtype)
        for d in self.shape:
            n *= d
        return n


@dataclass
class ExtraSpec:
    """A scalar or string entry that no strategy lists (learning_rate, global_step, notes)."""
    name: str
    dtype: str
    value: Union[int, float, bool, str]
    # Rank g > 0 stores a rank-specific variant, so the passthrough source rank is observable
    # (never for the step counters global_step, epoch_num, step_num: see sources.py).
    per_rank: bool = True

    @staticmethod
    def from_dict(d: dict) -> "ExtraSpec":
        return ExtraSpec(d["name"], d["dtype"], d["value"], bool(d.get("per_rank", True)))

    def to_dict(self) -> dict:
        return {"name": self.name, "dtype": self.dtype, "value": self.value,
                "per_rank": self.per_rank}


@dataclass
class SideSpec:
    devices: int
    stages: int = 1

    @staticmethod
    def from_dict(d: Optional[dict]) -> Optional["SideSpec"]:
        if d is None:
            return None
        return SideSpec(int(d["devices"]), int(d.get("stages", 1)))

    def to_dict(self) -> dict:
        return {"devices": self.devices, "stages": self.stages}

    @property
    def ranks(self) -> int:
        return self.devices * self.stages


@dataclass
class Options:
    crc: bool = False
    # ≤2.2 convention in the SOURCE files: 0-d tensors carry dims [0].
    old_scalars: bool = False
    # Name of the real checkpoint in every rank directory; decoys must be older steps (by the
    # last two integers of the name, see step_order_key).
    ckpt_name: str = "checkpoint-1_1.ckpt"
    # "ckpt", or "safetensors": every source file is written as <ckpt_name stem>.safetensors
    # with {"format": "ms"} metadata, as MindSpore >= 2.7's save_checkpoint(format=...) does.
    source_format: str = "ckpt"
    decoys: List[str] = field(default_factory=list)
    # Non-checkpoint entries that a correct reader ignores (side files, hidden files, a
    # `*.ckpt` directory, stray `rank_*` names that are not rank directories).
    junk_entries: bool = False
    # Zero-padded rank directory names (`rank_03`), which MindSpore accepts.
    rank_dir_width: int = 0
    # Rank whose real checkpoint is a symlink into `src/blobs/` (-1: none).
    symlink_rank: int = -1
    src_strategy_form: str = "protobuf"
    dst_strategy_form: str = "protobuf"
    # In dir forms: one file per global rank (identical within a stage) instead of per stage.
    strategy_dir_all_ranks: bool = False
    shuffle_layouts: bool = False
    # An existing protobuf strategy used as the src strategy (copied): a path, or
    # "shared:<path relative to the shared dir>".
    src_strategy_file: Optional[str] = None
    # Source-side chunking; expected files always use MindSpore's 512 MiB byte chunks.
    src_chunk_bytes: int = ckptio.MINDSPORE_CHUNK_BYTES
    src_chunk_style: str = "bytes"
    # Deliberately wrong strategy contents for negative tests: {"src"|"dst": {param: {key: v}}}.
    strategy_overrides: Dict[str, Dict[str, dict]] = field(default_factory=dict)
    # Tensors larger than this are generated row by row from a pool instead of materialized.
    materialize_limit: int = 64 << 20
    # CheckpointConfig(remove_redundancy=True): each block of a src-strategy parameter is in
    # only one file of the ranks holding it (sources.dedup_savers); expected files stay the
    # transform of the save without deduplication.
    remove_redundancy: bool = False
    # Source ranks whose file lists its records in another order than the case's (files written
    # by different code paths or versions of a training script): {"<rank>": how}, how being
    # "reversed", "rotated:K" (the first K records moved to the end), "moved:NAME:I" (NAME moved
    # to index I) or the list of every record name in file order. Safetensors files so ordered
    # keep that order in their data (and header), as a writer other than the reference one may.
    record_orders: Dict[str, Union[str, List[str]]] = field(default_factory=dict)
    expected: bool = True

    @staticmethod
    def from_dict(d: Optional[dict]) -> "Options":
        d = dict(d or {})
        opts = Options()
        for key, value in d.items():
            if not hasattr(opts, key):
                raise CaseError(f"unknown option {key!r}")
            setattr(opts, key, copy.deepcopy(value))
        return opts

    def to_dict(self) -> dict:
        return copy.deepcopy(self.__dict__)


@dataclass
class Case:
    name: str
    seed: int
    src: Optional[SideSpec]
    dst: Optional[SideSpec]
    params: List[ParamSpec]
    extras: List[ExtraSpec] = field(default_factory=list)
    options: Options = field(default_factory=Options)
    description: str = ""

    @staticmethod
    def from_dict(d: dict) -> "Case":
        return Case(d.get("name", "case"), int(d.get("seed", 0)),
                    SideSpec.from_dict(d.get("src")), SideSpec.from_dict(d.get("dst")),
                    [ParamSpec.from_dict(p) for p in d["params"]],
                    [ExtraSpec.from_dict(e) for e in d.get("extras", [])],
                    Options.from_dict(d.get("options")), d.get("description", ""))

    @staticmethod
    def load(path: str) -> "Case":
        with open(path, encoding="utf-8") as f:
            return Case.from_dict(json.load(f))

    def to_dict(self) -> dict:
        return {"name": self.name, "description": self.description, "seed": self.seed,
                "src": self.src.to_dict() if self.src else None,
                "dst": self.dst.to_dict() if self.dst else None,
                "params": [p.to_dict() for p in self.params],
                "extras": [e.to_dict() for e in self.extras],
                "options": self.options.to_dict()}

    def param(self, name: str) -> ParamSpec:
        for p in self.params:
            if p.name == name:
                return p
        raise KeyError(name)

    def side(self, which: str) -> Optional[SideSpec]:
        return self.src if which == "src" else self.dst

    # -- validation -----------------------------------------------------------------------------

    def resolve(self, check_dst: bool = True) -> "Case":
        """Fills derived values (optimizer steps) and checks consistency; returns self."""
        names = [p.name for p in self.params] + [e.name for e in self.extras]
        dupes = {n for n in names if names.count(n) > 1}
        if dupes:
            raise CaseError(f"duplicate names {sorted(dupes)}")
        for p in self.params:
            if p.dtype not in ckptio.NUMPY_DTYPES:
                raise CaseError(f"{p.name}: unsupported dtype {p.dtype}")
            if not p.shape or any(d <= 0 for d in p.shape):
                raise CaseError(f"{p.name}: shape {p.shape} must have dimensions > 0")
        for e in self.extras:
            if e.dtype not in SCALAR_TYPES + (ckptio.STRING_TYPE,):
                raise CaseError(f"{e.name}: unsupported extra dtype {e.dtype}")
        self._resolve_side("src", check_shapes=True)
        self._resolve_side("dst", check_shapes=check_dst)
        opts = self.options
        for form in (opts.src_strategy_form, opts.dst_strategy_form):
            if form not in STRATEGY_FORMS:
                raise CaseError(f"unknown strategy form {form!r}")
        if any(step_order_key(d) >= step_order_key(opts.ckpt_name) for d in opts.decoys):
            raise CaseError("every decoy must be an older step than ckpt_name (numeric order "
                            "by the last two integers of the name)")
        if self.src is None and self.dst is None:
            raise CaseError("both sides unsharded: MindSpore drops every parameter")
        ranks = 1 if self.src is None else self.src.ranks
        for key, how in opts.record_orders.items():
            if not str(key).isdigit() or int(key) >= ranks:
                raise CaseError(f"record_orders: {key!r} is not a source rank (0..{ranks - 1})")
            parse_record_order(how)
        return self

    def _resolve_side(self, which: str, check_shapes: bool) -> None:
        side = self.side(which)
        for p in self.params:
            spec: Optional[LayoutSpec] = getattr(p, which)
            if spec is None:
                continue
            if side is None:
                raise CaseError(f"{p.name}: {which} layout given but the {which} side is unsharded")
            try:
                spec.resolve_step()
                layout = spec.layout()
                if check_shapes:
                    layout.check_shape(p.shape, p.name)
            except LayoutError as err:
                raise CaseError(f"{p.name} ({which}): {err}") from None
            if layout.devices != side.devices:
                raise CaseError(f"{p.name} ({which}): device matrix {spec.dev_matrix} is not "
                                f"{side.devices} devices")
            if not spec.stages or any(not 0 <= s < side.stages for s in spec.stages):
                raise CaseError(f"{p.name} ({which}): stages {spec.stages} outside "
                                f"0..{side.stages - 1}")
        if side is not None:
            for stage in range(side.stages):
                if not any(getattr(p, which) and stage in getattr(p, which).stages
                           for p in self.params):
                    raise CaseError(f"{which} stage {stage} holds no parameter")
