"""Broken inputs for negative tests. Functions either damage an existing fixture directory in
place (it keeps its case.json, whose expected files no longer apply) or build a small standalone
fixture that ckptfs must refuse. Each returns a short description of what was done.
"""

import os
import shutil
from typing import Optional

import numpy as np

from . import ckptio, stio
from .build import Fixture, make, write_checkpoint
from .builtins import case, extra, lay, param, side
from .sources import SourceRecord


def _fixture(outdir: str) -> Fixture:
    return Fixture.load(outdir)


def remove_rank(outdir: str, rank: int) -> str:
    fx = _fixture(outdir)
    rank_dir = os.path.dirname(fx.source_files[rank])
    shutil.rmtree(rank_dir)
    return f"removed {rank_dir}"


def truncate_source(outdir: str, rank: int, keep: Optional[int] = None) -> str:
    """Cuts the rank's checkpoint; by default in the middle of its last record's content."""
    path = os.path.realpath(_fixture(outdir).source_files[rank])
    if keep is None:
        last = ckptio.read_records(path)[-1]
        keep = last.offset + last.length - max(1, len(last.content) // 2)
    with open(path, "r+b") as f:
        f.truncate(keep)
    return f"truncated {path} to {keep} bytes"


def _rewrite(fx: Fixture, path: str, records) -> None:
    rewritten = [SourceRecord(r.tag, r.tensor_type, r.dims, len(r.content),
                              lambda c=r.content: iter([c]), "raw") for r in records]
    os.remove(path)
    write_checkpoint(path, rewritten, crc=fx.case.options.crc)


def _records(path: str):
    return ckptio.join_chunks(ckptio.read_records(path))


def inconsistent_slice(outdir: str, rank: int, name: Optional[str] = None) -> str:
    """Rewrites one sliced parameter of the rank with one row less than its peers hold."""
    fx = _fixture(outdir)
    path = os.path.realpath(fx.source_files[rank])
    records = _records(path)
    sliced = {p.name for p in fx.case.params if p.src is not None or fx.case.src is None}
    victim = next(r for r in records
                  if (name is None and r.tag in sliced and r.dims and r.dims[0] > 1)
                  or r.tag == name)
    row_bytes = len(victim.content) // victim.dims[0]
    victim.content = victim.content[:-row_bytes]
    victim.dims = [victim.dims[0] - 1] + victim.dims[1:]
    _rewrite(fx, path, records)
    return f"{path}: {victim.tag} now has dims {victim.dims}"


def retype(outdir: str, ranks, name: str, tensor_type: str) -> str:
    """Relabels parameter `name` in the given ranks' checkpoints as `tensor_type`, bytes and
    dims unchanged (Float32 as Int32: a dtype that disagrees with the other ranks; any type as
    "str": an entry with no element grid to cut)."""
    fx = _fixture(outdir)
    paths = []
    for rank in ranks:
        path = os.path.realpath(fx.source_files[rank])
        records = _records(path)
        victim = next(r for r in records if r.tag == name)
        victim.tensor_type = tensor_type
        _rewrite(fx, path, records)
        paths.append(path)
    return f"{name} relabelled {tensor_type} in {', '.join(paths)}"


def drop_record(outdir: str, rank: int, name: str) -> str:
    """Removes parameter `name` from the rank's checkpoint (.ckpt or .safetensors)."""
    fx = _fixture(outdir)
    path = os.path.realpath(fx.source_files[rank])
    if path.endswith(".safetensors"):
        _drop_safetensors_entry(path, name)
    else:
        records = [r for r in _records(path) if r.tag != name]
        _rewrite(fx, path, records)
    return f"{path}: {name} removed"


def lose_entry(outdir: str, rank: int, name: str) -> str:
    """The rank's file without `name` as a save cut short leaves it: a .ckpt cut at the record
    boundary before it (the format cannot tell; the records after it go too), a safetensors file
    written without it. Returns the file's path."""
    path = os.path.realpath(_fixture(outdir).source_files[rank])
    if path.endswith(".safetensors"):
        drop_record(outdir, rank, name)
    else:
        cut = next(r for r in ckptio.read_records(path) if r.tag == name)
        truncate_source(outdir, rank, keep=cut.offset)
    return path


def _drop_safetensors_entry(path: str, name: str) -> None:
    """Rewrites a safetensors file without `name`, its other entries and metadata as they were."""
    meta, entries, start = stio.read_header(path)
    if name not in entries:
        raise ValueError(f"{path} has no entry {name}")
    with open(path, "rb") as f:
        data = f.read()
    kept = [stio.Entry(k, stio.TYPE_OF[code], shape, end - begin,
                       lambda b=start + begin, e=start + end: iter([data[b:e]]))
            for k, (code, shape, begin, end) in entries.items() if k != name]
    os.remove(path)
    stio.write(path, kept, meta)


def garbage_strategy(outdir: str, which: str = "src") -> str:
    """Replaces the side's strategy (every file of a directory form) with bytes that are
    neither protobuf nor JSON: a layout-item field whose length runs far past the end."""
    fx = _fixture(outdir)
    path = fx.src_strategy if which == "src" else fx.dst_strategy
    if path is None:
        raise ValueError(f"the {which} side is unsharded: no strategy to damage")
    junk = b"\x1a\xf0\xff\xff\x0f this is not a strategy {" + np.random.default_rng(5).bytes(64)
    files = ([os.path.join(path, n) for n in sorted(os.listdir(path))]
             if os.path.isdir(path) else [path])
    for f in files:
        with open(f, "wb") as out:
            out.write(junk)
    return f"garbage written to {', '.join(files)}"


def encrypted_source(outdir: str, rank: int, mode: str = "gcm") -> str:
    """Replaces the rank's checkpoint with what an encrypted save starts with (§1.8)."""
    path = os.path.realpath(_fixture(outdir).source_files[rank])
    rng = np.random.default_rng(9)
    iv = rng.bytes(16)
    ciphertext = rng.bytes(200)
    block = b""
    if mode == "gcm":
        block += rng.bytes(16)  # GCM tag
    rest = len(iv).to_bytes(4, "little") + iv + len(ciphertext).to_bytes(4, "little") + ciphertext
    block += len(rest).to_bytes(4, "little") + rest
    with open(path, "wb") as f:
        f.write(ckptio.ENCRYPTION_MAGICS[mode] + block)
    return f"{path} now looks {mode.upper()}-encrypted"


# -- standalone broken fixtures -----------------------------------------------------------------

def indivisible(outdir: str) -> str:
    """A dimension of 12 rows that the 8-way target split cannot divide."""
    c = case("neg_indivisible", "dim 0 of w (12) does not divide by the target's 8-way split",
             side(4), side(8),
             [param("w", "Float32", [12, 8], lay([4], [0, -1]), lay([8], [0, -1])),
              param("ok", "Float32", [8, 8], lay([4], [0, -1]), lay([8], [0, -1]))],
             [extra("global_step", "Int64", 5)])
    make(c, outdir, expected=False)
    return "w: global [12, 8], target split 8 on dim 0"


def tensor_map_length(outdir: str, delta: int = 1, which: str = "src") -> str:
    """The `which` strategy's map for `w` has one entry more (delta 1) or less (-1) than the
    tensor's rank; the checkpoints themselves are consistent."""
    tmap = [0, -1] + [-1] * max(0, delta) if delta >= 0 else [0]
    c = case("neg_map_length", f"w's {which} tensor_map written as {tmap} for a 2-D tensor",
             side(4), side(2),
             [param("w", "Float32", [8, 8], lay([4], [0, -1]), lay([2], [-1, 0])),
              param("ok", "Float32", [8, 4], lay([4], [0, -1]), lay([2], [0, -1]))],
             [extra("global_step", "Int64", 5)],
             strategy_overrides={which: {"w": {"tensor_map": tmap}}})
    make(c, outdir, expected=False)
    return f"w: {which} tensor_map {tmap} for shape [8, 8]"


NEGATIVES = {
    "remove-rank": remove_rank,
    "truncate": truncate_source,
    "inconsistent-slice": inconsistent_slice,
    "garbage-strategy": garbage_strategy,
    "encrypted": encrypted_source,
    "indivisible": indivisible,
    "map-length": tensor_map_length,
}
