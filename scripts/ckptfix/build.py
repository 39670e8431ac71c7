"""Writing a whole fixture: source tree, strategies, expected tree and the resolved case.json.

    OUTDIR/src/rank_<g>/<ckpt_name>            (+ decoys and junk when asked)
    OUTDIR/src_strategy{.ckpt,.json,/}          (absent when the source is unsharded)
    OUTDIR/dst_strategy{.ckpt,.json,/}          (absent when the target is unsharded)
    OUTDIR/expected/rank_<t>/checkpoint_<t>.ckpt
    OUTDIR/expected/rank_<t>/checkpoint_<t>.safetensors  (what the safetensors view must be)
    OUTDIR/case.json                           (the case, resolved, plus a "fixture" section)
"""

import json
import os
import shutil
from dataclasses import dataclass, field
from typing import Dict, List, Optional

from . import ckptio, stio, strategy
from .case import Case, CaseError, format_json
from .expected import TargetPlan, plan_targets
from .sources import SourcePlan, TensorBank, source_records

# "shared:<path>" names a file of the tests' own data folder (tests/data), which holds real
# fixtures under the same relative paths as the project's shared/ folder.
DEFAULT_SHARED = os.path.normpath(os.path.join(os.path.dirname(__file__), "..", "..", "tests",
                                               "data"))


def shared_dir(explicit: Optional[str] = None) -> str:
    return explicit or os.environ.get("CKPTFS_SHARED_DIR") or DEFAULT_SHARED


def resolve_shared_path(spec: str, shared: Optional[str]) -> str:
    if spec.startswith("shared:"):
        return os.path.join(shared_dir(shared), spec[len("shared:"):])
    return spec


@dataclass
class Fixture:
    """Paths of a generated fixture; what tests need to mount and compare."""
    outdir: str
    case: Case
    src_dir: str
    src_strategy: Optional[str]
    dst_strategy: Optional[str]
    expected_dir: Optional[str]
    source_files: Dict[int, str] = field(default_factory=dict)
    targets: List[dict] = field(default_factory=list)

    def mount_args(self) -> List[str]:
        args = []
        if self.src_strategy:
            args += ["--src-strategy", self.src_strategy]
        if self.dst_strategy:
            args += ["--dst-strategy", self.dst_strategy]
        return args

    def expected_files(self) -> Dict[int, str]:
        """target rank -> expected file path."""
        return {t["rank"]: os.path.join(self.outdir, t["file"]) for t in self.targets}

    def expected_safetensors_files(self) -> Dict[int, str]:
        """target rank -> expected .safetensors view."""
        return {t["rank"]: os.path.join(self.outdir, t["safetensors_file"])
                for t in self.targets}

    @staticmethod
    def load(outdir: str) -> "Fixture":
        with open(os.path.join(outdir, "case.json"), encoding="utf-8") as f:
            doc = json.load(f)
        fx = doc["fixture"]

        def path(p):
            return os.path.join(outdir, p) if p else None

        return Fixture(outdir, Case.from_dict(doc), path(fx["src_dir"]), path(fx["src_strategy"]),
                       path(fx["dst_strategy"]), path(fx["expected_dir"]),
                       {int(g): path(p) for g, p in fx["source_files"].items()}, fx["targets"])


def _rank_dir_name(case: Case, rank: int) -> str:
    return f"rank_{rank:0{case.options.rank_dir_width}d}" if case.options.rank_dir_width \
        else f"rank_{rank}"


def write_checkpoint(path: str, records, crc: bool = False,
                     chunk_limit: int = ckptio.MINDSPORE_CHUNK_BYTES,
                     chunk_style: str = "bytes") -> int:
    with ckptio.CheckpointWriter(path, crc=crc) as w:
        for r in records:
            w.add(r.name, r.dims, r.tensor_type, r.nbytes, r.chunks(), chunk_limit, chunk_style)
    return w.size


MINDSPORE_METADATA = {"format": "ms"}


# What MindSpore >= 2.7 adds for CheckpointConfig(remove_redundancy=True) (the key order of a
# two-key metadata varies from run to run in MindSpore; this writer keeps this one).
DEDUP_METADATA = {"format": "ms", "remove_redundancy": "True"}


def write_safetensors_source(path: str, records, dedup: bool = False,
                             keep_order: bool = False) -> int:
    """A MindSpore >= 2.7 save_checkpoint(..., format="safetensors") of `records` (keep_order:
    in their order instead of the reference writer's)."""
    entries = []
    for r in records:
        if r.tensor_type not in stio.CODE_OF:
            raise CaseError(f"{r.name}: a {r.tensor_type} entry cannot be saved as safetensors")
        shape = [] if r.is_scalar else list(r.dims)
        entries.append(stio.Entry(r.name, r.tensor_type, shape, r.nbytes, r.chunks))
    return stio.write(path, entries, DEDUP_METADATA if dedup else MINDSPORE_METADATA, keep_order)


def source_file_name(case: Case) -> str:
    name = case.options.ckpt_name
    if case.options.source_format == "safetensors":
        return os.path.splitext(name)[0] + ".safetensors"
    return name


def _write_sources(case: Case, plan: SourcePlan, src_dir: str) -> Dict[int, str]:
    opts = case.options
    safetensors = opts.source_format == "safetensors"

    def write_one(path, records, keep_order=False):
        if safetensors:
            write_safetensors_source(path, records, opts.remove_redundancy, keep_order)
        else:
            write_checkpoint(path, records, opts.crc, opts.src_chunk_bytes, opts.src_chunk_style)

    files = {}
    decoy_banks = [TensorBank(case, seed_offset=1000 + i) for i in range(len(opts.decoys))]
    for g in plan.ranks():
        rank_dir = os.path.join(src_dir, _rank_dir_name(case, g))
        os.makedirs(rank_dir)
        real = os.path.join(rank_dir, source_file_name(case))
        target = real
        if g == opts.symlink_rank:
            blobs = os.path.join(src_dir, "blobs")
            os.makedirs(blobs, exist_ok=True)
            target = os.path.join(blobs, f"rank{g}" + os.path.splitext(real)[1])
        write_one(target, plan.written_records(g), str(g) in opts.record_orders)
        if target != real:
            os.symlink(os.path.relpath(target, rank_dir), real)
        for decoy, bank in zip(opts.decoys, decoy_banks):
            # Same structure, other data: reading a decoy gives wrong bytes, not an error.
            if safetensors:
                decoy = os.path.splitext(decoy)[0] + ".safetensors"
            write_one(os.path.join(rank_dir, decoy), source_records(case, g, bank))
        if opts.junk_entries:
            _write_junk(rank_dir)
        files[g] = real
    if opts.junk_entries:
        _write_junk_top(src_dir)
    return files


def _write_junk(rank_dir: str) -> None:
    """Entries sorting after the real file that the file-choice rule (§4.6) must skip."""
    with open(os.path.join(rank_dir, "zz_notes.meta"), "w") as f:
        f.write("side file\n")
    with open(os.path.join(rank_dir, "zzz.CKPT"), "wb") as f:
        f.write(b"not a checkpoint (wrong case)")
    with open(os.path.join(rank_dir, "zzz.ckpt.tmp"), "wb") as f:
        f.write(b"unfinished save")
    with open(os.path.join(rank_dir, ".hidden.ckpt"), "wb") as f:
        f.write(b"hidden")
    os.makedirs(os.path.join(rank_dir, "zzzz_dir.ckpt"))


def _write_junk_top(src_dir: str) -> None:
    for name in ("rank_x", "rank_1_old", "logs"):
        os.makedirs(os.path.join(src_dir, name))
        with open(os.path.join(src_dir, name, "garbage.ckpt"), "wb") as f:
            f.write(b"\xff\xff not a checkpoint")
    with open(os.path.join(src_dir, "rank_99"), "wb") as f:
        f.write(b"a file, not a rank directory")


def _write_expected(plans: List[TargetPlan], expected_dir: str) -> List[dict]:
    targets = []
    for tp in plans:
        rel = os.path.join("expected", f"rank_{tp.rank}", f"checkpoint_{tp.rank}.ckpt")
        path = os.path.join(os.path.dirname(expected_dir), rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        write_checkpoint(path, tp.records)
        summary = tp.summary()
        summary["file"] = rel
        summary["size"] = os.path.getsize(path)
        st_rel = os.path.join("expected", f"rank_{tp.rank}", f"checkpoint_{tp.rank}.safetensors")
        st_path = os.path.join(os.path.dirname(expected_dir), st_rel)
        # The safetensors view: every record a safetensors file can hold, empty tensors too.
        entries = [stio.Entry(r.name, r.tensor_type, list(r.dims), r.nbytes, r.chunks)
                   for r in tp.all_records if r.tensor_type in stio.CODE_OF]
        stio.write(st_path, entries, MINDSPORE_METADATA)
        summary["safetensors_file"] = st_rel
        summary["safetensors_left_out"] = [r.name for r in tp.all_records
                                           if r.tensor_type not in stio.CODE_OF]
        targets.append(summary)
    return targets


def _prepare_outdir(outdir: str) -> None:
    if os.path.isdir(outdir) and os.listdir(outdir):
        if not os.path.exists(os.path.join(outdir, "case.json")):
            raise CaseError(f"{outdir} is not empty and holds no earlier fixture")
        shutil.rmtree(outdir)
    os.makedirs(outdir, exist_ok=True)


def _check_existing_strategy(case: Case, path: str) -> None:
    """The params' src layouts must be what the existing file says."""
    specs = strategy.layout_specs(strategy.read_protobuf(path))
    for p in case.params:
        if p.src is None:
            if p.name in specs:
                raise CaseError(f"{p.name}: in {path} but given no src layout")
            continue
        got = specs.get(p.name)
        if got is None or (got.dev_matrix, got.tensor_map, got.opt_shard_size) != \
                (p.src.dev_matrix, p.src.tensor_map, p.src.opt_shard_size):
            raise CaseError(f"{p.name}: src layout differs from {path}")


def make(case, outdir: str, shared: Optional[str] = None,
         expected: Optional[bool] = None) -> Fixture:
    """Generates the fixture for `case` (a Case or a dict) into `outdir`."""
    if isinstance(case, dict):
        case = Case.from_dict(case)
    write_expected = case.options.expected if expected is None else expected
    case.options.expected = write_expected
    case.resolve(check_dst=write_expected)
    _prepare_outdir(outdir)
    bank = TensorBank(case)
    plan = SourcePlan(case, bank)
    # Plan the targets before writing anything, so an impossible case leaves no half fixture.
    plans = plan_targets(case, plan) if write_expected else []

    src_dir = os.path.join(outdir, "src")
    source_files = _write_sources(case, plan, src_dir)
    if case.options.src_strategy_file:
        existing = resolve_shared_path(case.options.src_strategy_file, shared)
        _check_existing_strategy(case, existing)
        src_strategy = strategy.copy_existing(existing, outdir, "src")
    else:
        src_strategy = strategy.write_side(case, "src", outdir)
    dst_strategy = strategy.write_side(case, "dst", outdir)
    expected_dir = os.path.join(outdir, "expected") if write_expected else None
    targets = _write_expected(plans, expected_dir) if write_expected else []

    fixture = Fixture(outdir, case, src_dir, src_strategy, dst_strategy, expected_dir,
                      source_files, targets)
    _write_case_json(fixture)
    return fixture


def _write_case_json(fx: Fixture) -> None:
    def rel(p):
        return os.path.relpath(p, fx.outdir) if p else None

    doc = fx.case.to_dict()
    doc["fixture"] = {
        "src_dir": rel(fx.src_dir),
        "src_strategy": rel(fx.src_strategy),
        "dst_strategy": rel(fx.dst_strategy),
        "expected_dir": rel(fx.expected_dir),
        "source_files": {str(g): rel(p) for g, p in fx.source_files.items()},
        "targets": fx.targets,
    }
    with open(os.path.join(fx.outdir, "case.json"), "w", encoding="utf-8") as f:
        f.write(format_json(doc) + "\n")
