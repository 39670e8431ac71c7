#!/usr/bin/python3
"""Self-check of the fixture generator (scripts/ckpt_fixture.py); does not run ckptfs.

Every builtin is generated, then re-read with Google's protobuf parser and checked against a
second, independently written model of the spec: slices are reassembled by asking, for every
global index, which block holds it (the generator goes the other way, from rank to block); the
expected files are checked record by record against the reassembled tensors and the source
records; the spec's own vectors (§1.3, §1.7, §3.2, §3.5, §4.5, appendix B) are checked too.

    /usr/bin/python3 test_fixture_selfcheck.py --ckptfs BIN --shared DATA_DIR --work WORKDIR
"""

import importlib
import json
import math
import os
import re
import shutil
import subprocess
import sys
import zlib

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(REPO, "scripts"))

import ckpt_fixture  # noqa: E402
import itest  # noqa: E402
from ckptfix import data as fxdata  # noqa: E402
from ckptfix.layout import Layout  # noqa: E402
from ckptfix.ranklist import (ParamLayout, StrategyMap, mindspore_needed,  # noqa: E402
                              rank_list_for_transform)
from ckptfix.sources import TensorBank  # noqa: E402

MS_CHUNK = 536_870_912
DTYPES = {"Bool": "?", "Int8": "i1", "UInt8": "u1", "Int16": "<i2", "UInt16": "<u2",
          "Int32": "<i4", "UInt32": "<u4", "Int64": "<i8", "UInt64": "<u8", "Float16": "<f2",
          "Float32": "<f4", "Float64": "<f8", "BFloat16": "<u2"}


# -- Google's protobuf classes, compiled from the repo's schemas --------------------------------

def load_protos(workdir):
    out = os.path.join(workdir, "pb")
    os.makedirs(out, exist_ok=True)
    subprocess.run(["protoc", "-I", os.path.join(REPO, "proto"), f"--python_out={out}",
                    "checkpoint.proto", "strategy.proto"], check=True)
    sys.path.insert(0, out)
    return importlib.import_module("checkpoint_pb2"), importlib.import_module("strategy_pb2")


PB_CKPT = None
PB_STRA = None


def split_trailer(blob):
    if len(blob) >= 17 and blob[-17:-10] == b"crc_num":
        return blob[:-17], int.from_bytes(blob[-10:], "big")
    return blob, None


def parse_ckpt(path, want_crc=None):
    """Google-parsed records of a file; checks the CRC trailer and the canonical encoding."""
    with open(path, "rb") as f:
        blob = f.read()
    body, crc = split_trailer(blob)
    if want_crc is not None:
        assert (crc is not None) == want_crc, f"{path}: CRC trailer present={crc is not None}"
    if crc is not None:
        assert crc == zlib.crc32(body), f"{path}: CRC mismatch"
    msg = PB_CKPT.Checkpoint.FromString(body)
    # Google's serializer emits fields in ascending order with unpacked dims: the bytes must match.
    assert msg.SerializeToString() == body, f"{path}: not canonically encoded"
    return [(v.tag, list(v.tensor.dims), v.tensor.tensor_type, v.tensor.tensor_content)
            for v in msg.value]


def group_records(records):
    """Consecutive equal tags -> one entry (tag, dims, type, content, chunk sizes)."""
    out = []
    for tag, dims, ttype, content in records:
        if out and out[-1][0] == tag:
            prev = out[-1]
            assert prev[1] == dims and prev[2] == ttype, f"{tag}: chunks disagree"
            out[-1] = (tag, dims, ttype, prev[3] + content, prev[4] + [len(content)])
        else:
            out.append((tag, dims, ttype, content, [len(content)]))
    return out


# -- an independent model of layouts: from global index to owner ------------------------------

class Owners:
    """Who holds which global indices, derived index -> block -> owning coordinates."""

    def __init__(self, dev_matrix, tensor_map, opt_size=0, opt_step=0):
        self.dev = list(dev_matrix)
        n = len(self.dev)
        self.axes = []
        for entry in tensor_map:
            values = entry if isinstance(entry, list) else [entry]
            self.axes.append([n - 1 - v for v in values if v != -1])
        self.n = math.prod(self.dev)
        self.coords = np.array(np.unravel_index(np.arange(self.n), self.dev)).T  # [rank, axis]
        used = sorted(a for ax in self.axes for a in ax)
        key = [tuple(self.coords[r, used]) for r in range(self.n)]
        replicas = self.n // math.prod(self.dev[a] for a in used)
        if opt_size == 0 or opt_step == 0:
            self.k = 1
        else:
            self.k = replicas if opt_size == -1 else opt_size
        # Position of each rank among the ranks holding the same model-parallel block.
        self.opt_index = np.zeros(self.n, dtype=int)
        for r in range(self.n):
            group = [q for q in range(self.n) if key[q] == key[r]]
            self.opt_index[r] = group.index(r) % self.k

    def radix(self, j):
        sizes = [self.dev[a] for a in self.axes[j]]
        return sizes + ([self.k] if j == 0 else [])

    def held(self, rank, shape):
        """Per dimension, the sorted global indices `rank` stores."""
        out = []
        for j, g in enumerate(shape):
            radix = self.radix(j)
            blocks = math.prod(radix)
            assert g % blocks == 0, f"dim {j}: {g} not divisible by {blocks}"
            idx = np.arange(g)
            digits = np.unravel_index(idx // (g // blocks), radix) if radix else []
            mask = np.ones(g, dtype=bool)
            for d, a in zip(digits, self.axes[j]):
                mask &= d == self.coords[rank, a]
            if j == 0 and self.k > 1:
                mask &= digits[-1] == self.opt_index[rank]
            held = np.nonzero(mask)[0]
            assert len(held) and np.array_equal(held, np.arange(held[0], held[0] + len(held))), \
                f"rank {rank} dim {j}: held indices not one contiguous run"
            out.append(held)
        return out

    def box(self, rank, shape):
        return tuple((int(h[0]), int(h[-1]) + 1) for h in self.held(rank, shape))


def owners_of(spec, ndim):
    if spec is None:
        return Owners([1], [-1] * ndim)
    return Owners(spec.dev_matrix, spec.tensor_map, spec.opt_shard_size, spec.opt_shard_step)


def as_array(content, dtype, dims):
    arr = np.frombuffer(content, dtype=DTYPES[dtype])
    return arr.reshape(dims) if dims else arr


# -- checks of one generated fixture ------------------------------------------------------------

def expected_chunks(nbytes, limit, style, itemsize):
    if nbytes <= limit:
        return [nbytes]
    pieces = -(-nbytes // limit)
    if style == "bytes":
        return [limit] * (pieces - 1) + [nbytes - limit * (pieces - 1)]
    counts = np.array_split(np.arange(nbytes // itemsize), pieces)
    return [len(c) * itemsize for c in counts]


def extra_value(extra, rank):
    """The rank-specific variant rule, restated: step counters are equal on every rank."""
    v = extra.value
    if not extra.per_rank or rank == 0 or extra.name in ("global_step", "epoch_num", "step_num"):
        return v
    if extra.dtype == "str":
        return f"{v}@rank{rank}"
    if extra.dtype == "Bool":
        return bool(v) != (rank % 2 == 1)
    if extra.dtype.startswith(("Float", "BFloat")):
        return float(v) + rank
    return int(v) + rank


def extra_bytes(dtype, value):
    if dtype == "str":
        return value.encode("utf-32-le")
    if dtype == "BFloat16":
        return (np.array([value], "<f4").view("<u4") >> 16).astype("<u2").tobytes()
    return np.array([value], DTYPES[dtype]).tobytes()


class FixtureCheck:
    def __init__(self, fx):
        self.fx = fx
        self.case = fx.case
        self.opts = self.case.options
        self.sources = {}   # rank -> grouped records
        self.full = {}      # param -> reassembled global tensor

    def run(self):
        self.check_source_choice()
        self.read_sources()
        self.check_source_contents()
        self.check_strategies()
        if self.fx.expected_dir:
            self.check_expected()

    # sources ------------------------------------------------------------------------------

    def check_source_choice(self):
        """The real file must be what ckptfs picks: the newest *.ckpt regular file, numerically
        by the last two integers of the name (MindSpore's .ckpt transform takes string order)."""
        def newest_first(n):
            ints = [int(t) for t in re.findall(r"[0-9]+", n)]
            return tuple(([-1, -1] + ints)[-2:]) + (n,)

        for g, path in self.fx.source_files.items():
            rank_dir = os.path.dirname(path)
            base = os.path.basename(rank_dir)
            assert base.startswith("rank_") and int(base[5:]) == g, rank_dir
            names = sorted((n for n in os.listdir(rank_dir)
                            if n.endswith(".ckpt") and not n.startswith(".")
                            and os.path.isfile(os.path.join(rank_dir, n))), key=newest_first)
            assert names[-1] == os.path.basename(path), f"rank {g}: {names[-1]} would be picked"

    def read_sources(self):
        for g, path in self.fx.source_files.items():
            recs = parse_ckpt(path, want_crc=self.opts.crc)
            self.sources[g] = group_records(recs)
            for tag, dims, ttype, content, chunks in self.sources[g]:
                item = 1 if ttype == "str" else np.dtype(DTYPES[ttype]).itemsize
                want = expected_chunks(len(content), self.opts.src_chunk_bytes,
                                       self.opts.src_chunk_style, item)
                assert chunks == want, f"rank {g} {tag}: chunks {chunks}, want {want}"

    def holders(self, p):
        case = self.case
        if case.src is None:
            return {0: 0}
        return {g: g % case.src.devices for g in self.sources
                if p.src is not None and g // case.src.devices in p.src.stages}

    def check_source_contents(self):
        case = self.case
        for g, recs in self.sources.items():
            names = [r[0] for r in recs]
            want = [p.name for p in case.params
                    if case.src is None or p.src is None
                    or g // case.src.devices in p.src.stages] + [e.name for e in case.extras]
            if str(g) in self.opts.record_orders:
                # Another order of the same records (the generator's record_orders option).
                assert sorted(names) == sorted(want) and names != want, \
                    f"rank {g}: records {names}, want another order of {want}"
                continue
            assert names == want, f"rank {g}: records {names}, want {want}"
        for p in case.params:
            if case.src is not None and p.src is None:
                for g, recs in self.sources.items():
                    rec = next(r for r in recs if r[0] == p.name)
                    assert rec[1] == p.shape and rec[2] == p.dtype, f"{p.name} rank {g}"
                continue
            self.full[p.name] = self.reassemble(p)
            truth = TensorBank(case).get(p).block_array(fxdata.full_box(p.shape))
            assert self.full[p.name].tobytes() == truth.tobytes(), f"{p.name}: data differs"
        for e in case.extras:
            for g, recs in self.sources.items():
                tag, dims, ttype, content, _ = next(r for r in recs if r[0] == e.name)
                want_dims = [0] if (ttype == "str" or self.opts.old_scalars) else []
                assert (dims, ttype) == (want_dims, e.dtype), f"{e.name} rank {g}: {dims} {ttype}"
                assert content == extra_bytes(e.dtype, extra_value(e, g)), f"{e.name} rank {g}"

    def reassemble(self, p):
        owners = owners_of(p.src, len(p.shape))
        full = np.zeros(p.shape, dtype=DTYPES[p.dtype])
        seen = np.zeros(p.shape, dtype=bool)
        for g, local in self.holders(p).items():
            tag, dims, ttype, content, _ = next(r for r in self.sources[g] if r[0] == p.name)
            held = owners.held(local, p.shape)
            assert dims == [len(h) for h in held], f"{p.name} rank {g}: dims {dims}"
            assert ttype == p.dtype
            part = as_array(content, p.dtype, dims)
            index = np.ix_(*held)
            overlap = seen[index]
            assert np.array_equal(full[index][overlap], part[overlap]), \
                f"{p.name} rank {g}: replicas differ"
            full[index] = part
            seen[index] = True
        assert seen.all(), f"{p.name}: source slices do not cover the tensor"
        return full

    # strategies ---------------------------------------------------------------------------

    def strategy_files(self, which):
        path = self.fx.src_strategy if which == "src" else self.fx.dst_strategy
        if path is None:
            return []
        if os.path.isdir(path):
            return [os.path.join(path, n) for n in sorted(os.listdir(path))]
        return [path]

    def check_strategies(self):
        for which in ("src", "dst"):
            side = self.case.side(which)
            files = self.strategy_files(which)
            assert (side is None) == (not files), f"{which}: strategy presence"
            if side is None:
                continue
            if which == "src" and self.opts.src_strategy_file:
                self.check_protobuf_strategy(files[0], which, None)
                continue
            if os.path.isdir(self.fx.src_strategy if which == "src" else self.fx.dst_strategy):
                self.check_strategy_dir(which, files)
            else:
                self.check_strategy_file(files[0], which, stage=None)

    def check_strategy_dir(self, which, files):
        side = self.case.side(which)
        ranks = sorted(int(os.path.basename(f).split("_")[-1].split(".")[0]) for f in files)
        per_stage = [s * side.devices for s in range(side.stages)]
        all_ranks = list(range(side.ranks))
        assert ranks in (per_stage, all_ranks), f"{which}: strategy files for ranks {ranks}"
        for f in files:
            rank = int(os.path.basename(f).split("_")[-1].split(".")[0])
            self.check_strategy_file(f, which, stage=rank // side.devices)

    def check_strategy_file(self, path, which, stage):
        if path.endswith(".json"):
            self.check_json_strategy(path, which, stage)
        else:
            self.check_protobuf_strategy(path, which, stage)

    def want_layouts(self, which, stage):
        """name as written -> (param, spec); stage None = the whole side in one file."""
        side = self.case.side(which)
        form = self.opts.src_strategy_form if which == "src" else self.opts.dst_strategy_form
        prefixed = stage is None and (side.stages > 1 or form == "merged")
        out = {}
        for p in self.case.params:
            spec = getattr(p, which)
            if spec is None:
                continue
            for s in spec.stages:
                if stage is None or s == stage:
                    out[f"{s}-{p.name}" if prefixed else p.name] = (p, spec, s)
        return out

    def check_protobuf_strategy(self, path, which, stage):
        with open(path, "rb") as f:
            blob = f.read()
        msg = PB_STRA.ParallelStrategyMap.FromString(blob)
        assert msg.SerializeToString() == blob, f"{path}: not canonically encoded"
        assert msg.current_stage == 1
        stages = {i.parallel_strategys.stage for i in msg.parallel_strategy_item}
        if stage is not None:
            assert stages == {stage}, f"{path}: strategy item stages {stages}"
        want = self.want_layouts(which, stage)
        if which == "src" and self.opts.src_strategy_file:
            want = {p.name: (p, p.src, 0) for p in self.case.params if p.src is not None}
        got = {i.param_name: i.parallel_layouts for i in msg.parallel_layout_item}
        assert sorted(got) == sorted(want), f"{path}: layout names differ"
        devices = set()
        for name, (p, spec, s) in want.items():
            lay = got[name]
            assert len(lay.dev_matrix) == 1 and len(lay.param_split_shape) == 1 \
                and len(lay.indices_offset) == 1, f"{name}: sub-message counts"
            assert not lay.param_split_shape[0].dim and not lay.indices_offset[0].dim
            assert lay.field == 0 and lay.HasField("opt_weight_shard_step") \
                and lay.HasField("opt_weight_shard_size")
            assert list(lay.dev_matrix[0].dim) == spec.dev_matrix, f"{name}: dev matrix"
            maps = [list(m.dim) for m in lay.tensor_map]
            if any(isinstance(e, list) for e in spec.tensor_map):
                want_maps = [e if isinstance(e, list) else [e] for e in spec.tensor_map]
                if len(want_maps) == 1:
                    want_maps.append([])
            else:
                want_maps = [spec.tensor_map]
            assert maps == want_maps, f"{name}: tensor maps {maps}, want {want_maps}"
            assert lay.opt_weight_shard_size == spec.opt_shard_size
            assert lay.opt_weight_shard_step == spec.opt_shard_step
            devices.add(math.prod(spec.dev_matrix))
        assert len(devices) == 1, f"{path}: several device counts"

    def check_json_strategy(self, path, which, stage):
        with open(path) as f:
            doc = json.load(f)
        assert doc["current_stage"] == 1
        want = self.want_layouts(which, stage)
        got = doc["parallel_layout_item"]
        assert sorted(got) == sorted(want), f"{path}: layout names differ"
        for name, (p, spec, s) in want.items():
            lay = got[name]
            assert lay["dev_matrix"] == spec.dev_matrix and lay["tensor_map"] == spec.tensor_map
            assert lay["tensor_shape"] == p.shape and lay["field"] == 0
            assert lay["opt_weight_shard_size"] == spec.opt_shard_size
            assert lay["opt_weight_shard_step"] == spec.opt_shard_step
        stages = {v["stage"] for v in doc["parallel_strategy_item"].values()}
        if stage is not None:
            assert stages == {stage}

    # expected files -----------------------------------------------------------------------

    def strategy_maps(self):
        def side_map(which):
            side = self.case.side(which)
            if side is None:
                return None
            params = {p.name: ParamLayout(getattr(p, which).layout(),
                                          tuple(getattr(p, which).stages))
                      for p in self.case.params if getattr(p, which) is not None}
            return StrategyMap(params, side.devices, side.stages)
        return side_map("src"), side_map("dst")

    def check_expected(self):
        case = self.case
        src_map, dst_map = self.strategy_maps()
        n_src = case.src.devices if case.src else 1
        n_dst = case.dst.devices if case.dst else 1
        targets = [0] if case.dst is None else list(range(case.dst.ranks))
        files = sorted(os.listdir(self.fx.expected_dir))
        assert files == sorted(f"rank_{t}" for t in targets), f"expected dirs {files}"
        shapes = {p.name: p.shape for p in case.params}
        for t in targets:
            path = os.path.join(self.fx.expected_dir, f"rank_{t}", f"checkpoint_{t}.ckpt")
            got = group_records(parse_ckpt(path, want_crc=False))
            rank_list = rank_list_for_transform(src_map, dst_map, t, shapes)
            assert rank_list == sorted(rank_list, reverse=True)
            self.check_target(t, t // n_dst, t % n_dst, n_src, rank_list, got)

    def roles(self, t_stage):
        """name -> "drop" | "reshard" | "pass", restating §4.2/§4.4 from the case."""
        case = self.case

        def in_side(p, which, stage_only):
            spec = getattr(p, which)
            if spec is None:
                return False
            return (not stage_only) or which == "src" or t_stage in spec.stages

        out = {}
        for p in case.params:
            src_orig = case.src is None or p.src is not None
            dst_orig = case.dst is None or p.dst is not None
            dst_eff = case.dst is None or (p.dst is not None and t_stage in p.dst.stages)
            removed_from_dst = case.dst is not None and p.dst is not None and not dst_eff
            src_eff = src_orig and not removed_from_dst
            src_gone = case.src is None or (p.src is not None and not src_eff)
            dst_gone = case.dst is None or removed_from_dst
            if src_gone and dst_gone:
                out[p.name] = "drop"
            elif src_eff and dst_eff and (case.src is None or p.src is not None) and dst_orig:
                out[p.name] = "reshard"
            else:
                out[p.name] = "pass"
        for e in case.extras:
            out[e.name] = "pass"
        return out

    def check_target(self, t, t_stage, t_local, n_src, rank_list, got):
        names = []
        for g in rank_list:
            for rec in self.sources[g]:
                if rec[0] not in names:
                    names.append(rec[0])
        roles = self.roles(t_stage)
        want_order = ([n for n in names if roles[n] == "reshard"]
                      + [n for n in names if roles[n] == "pass"])
        got_order = [r[0] for r in got]
        assert got_order == want_order, f"target {t}: order {got_order}, want {want_order}"
        for tag, dims, ttype, content, chunks in got:
            assert all(c == MS_CHUNK for c in chunks[:-1]), f"target {t} {tag}: chunking"
            if roles[tag] == "reshard":
                p = self.case.param(tag)
                held = owners_of(p.dst if self.case.dst else None, len(p.shape)).held(
                    t_local, p.shape)
                assert dims == [len(h) for h in held], f"target {t} {tag}: dims {dims}"
                assert ttype == p.dtype
                assert content == self.full[tag][np.ix_(*held)].tobytes(), \
                    f"target {t} {tag}: content differs from the target block"
            else:
                source = None
                for g in rank_list:  # load order; later loads overwrite
                    if g % n_src == t_local % n_src and any(r[0] == tag for r in self.sources[g]):
                        source = g
                assert source is not None, f"target {t} {tag}: no passthrough source"
                s_tag, s_dims, s_type, s_content, _ = next(
                    r for r in self.sources[source] if r[0] == tag)
                want_dims = [] if (s_type != "str" and s_dims == [0]) else s_dims
                assert (dims, ttype, content) == (want_dims, s_type, s_content), \
                    f"target {t} {tag}: passthrough differs from rank {source}"


# -- spec vectors -------------------------------------------------------------------------------

def check_encoding_examples():
    from ckptfix import ckptio
    w = ckptio.encode_record("w", [2], "Float32", np.array([1.0, 2.0], "<f4").tobytes())
    want_w = (b"\x0a\x1a\x0a\x01w\x12\x15\x08\x02\x12\x07Float32\x1a\x08"
              + bytes.fromhex("0000803F00000040"))
    assert w == want_w, w.hex()
    epoch = ckptio.encode_record("epoch_num", [], "Int64", (3).to_bytes(8, "little"))
    assert epoch == b"\x0a\x1e\x0a\x09epoch_num\x12\x11\x12\x05Int64\x1a\x08" \
        + (3).to_bytes(8, "little"), epoch.hex()
    old = ckptio.encode_record("epoch_num", [0], "Int64", (3).to_bytes(8, "little"))
    assert len(old) == 34 and old[13:15] == b"\x12\x13" and old[15:17] == b"\x08\x00"
    note = ckptio.encode_record("note", [0], "str", ckptio.encode_string("ab"))
    assert note == b"\x0a\x19\x0a\x04note\x12\x11\x08\x00\x12\x03str\x1a\x08a\0\0\0b\0\0\0"
    assert zlib.crc32(want_w + epoch) == 0xB191EAB2
    assert ckptio.crc_trailer(0xB191EAB2) == bytes.fromhex("6372635F6E756D000000000000B191EAB2")
    # Google's parser agrees with the hand encoding.
    msg = PB_CKPT.Checkpoint.FromString(want_w + epoch + note)
    assert [v.tag for v in msg.value] == ["w", "epoch_num", "note"]
    assert msg.SerializeToString() == want_w + epoch + note


def check_real_files_reencode(shared):
    """The hand encoder reproduces real MindSpore files byte for byte (checkpoints and the
    llama strategy), so generated files have MindSpore's byte style."""
    from ckptfix import ckptio, strategy
    real = os.path.join(shared, "fixtures", "real")
    ckpts = sorted(os.listdir(os.path.join(real, "ckpt")))
    assert len(ckpts) >= 8, ckpts
    for name in ckpts:
        path = os.path.join(real, "ckpt", name)
        records = parse_ckpt(path, want_crc=False)
        again = b"".join(ckptio.encode_record(tag, dims, ttype, content)
                         for tag, dims, ttype, content in records)
        assert again == itest.read_file(path), f"{name}: re-encoding differs"
    path = os.path.join(real, "strategy", "golden-stick_llama2-13b-2p_ckpt_strategy_rank_0.ckpt")
    read = strategy.read_protobuf(path)
    entries = [strategy.Entry(lay.name, 0, None, {
        "dev_matrix": lay.dev_matrix, "tensor_map": lay.tensor_map(),
        "opt_weight_shard_step": lay.opt_step, "opt_weight_shard_size": lay.opt_size})
        for lay in read.layouts]
    layouts_only = b"".join(strategy.encode_layout_item(e.name, e.written) for e in entries)
    assert itest.read_file(path).endswith(layouts_only), "layout items re-encode differently"
    assert len(read.layouts) == 363 and len(read.items) == 363


def check_chunking_writer(workdir):
    """Byte and element chunking through the writer, read back with Google's parser."""
    from ckptfix import ckptio
    content = np.arange(1000, dtype="<f4").tobytes()
    for style, want in (("bytes", [1024, 1024, 1024, 928]), ("elements", [1000] * 4)):
        path = os.path.join(workdir, f"chunk_{style}.ckpt")
        with ckptio.CheckpointWriter(path) as w:
            n = w.add("t", [1000], "Float32", len(content),
                      (content[i:i + 333] for i in range(0, len(content), 333)), 1024, style)
        assert n == 4
        recs = parse_ckpt(path)
        assert [len(r[3]) for r in recs] == want and all(r[1] == [1000] for r in recs)
        assert b"".join(r[3] for r in recs) == content
    assert ckptio.chunk_lengths(0, MS_CHUNK) == []
    assert ckptio.chunk_lengths(MS_CHUNK, MS_CHUNK) == [MS_CHUNK]
    assert ckptio.chunk_lengths(MS_CHUNK + 1, MS_CHUNK) == [MS_CHUNK, 1]
    # (3*2^27 - 1) elements in 3 pieces: array_split gives the first pieces the extra element.
    assert ckptio.chunk_lengths(3 * MS_CHUNK - 4, MS_CHUNK, "elements", 4) == \
        [MS_CHUNK, MS_CHUNK, MS_CHUNK - 4]


def first_rows(dev, tmap, size, step, shape, ranks):
    """(generator, oracle) first rows of every rank."""
    lay = Layout.from_map(dev, tmap, size, step)
    own = Owners(dev, tmap, size, step)
    gen = [lay.box(r, shape)[0][0] for r in range(ranks)]
    ora = [own.box(r, shape)[0][0] for r in range(ranks)]
    return gen, ora


def check_opt_vectors():
    vectors = [
        ([4, 4], [0, -1], 4, 2, lambda r: (r % 4) * 4 + ((r // 4) % 2) * 2),
        ([8, 2], [0, -1], 2, 4, lambda r: (r % 2) * 8 + ((r // 2) % 4) * 2),
        ([16], [-1, -1], 1, 16, lambda r: r),
        ([4, 4], [-1, 0], 4, 2, lambda r: ((r // 4) % 2) * 8),
    ]
    for dev, tmap, step, size, rule in vectors:
        gen, ora = first_rows(dev, tmap, size, step, [16, 8], 16)
        want = [rule(r) for r in range(16)]
        assert gen == want and ora == want, f"{dev} {tmap} size {size}: {gen} / {ora}"
    gen, ora = first_rows([2, 4], [0, -1], 2, 4, [16, 8], 8)  # appendix B, 8 devices
    want = [(r % 4) * 4 + (r // 4) * 2 for r in range(8)]
    assert gen == want and ora == want


def boxes(dev, tmap, shape, size=0, step=0):
    lay = Layout.from_map(dev, tmap, size, step)
    own = Owners(dev, tmap, size, step)
    gen = [lay.box(r, shape) for r in range(lay.devices)]
    assert gen == [own.box(r, shape) for r in range(lay.devices)], f"{dev} {tmap}: models differ"
    return gen


def check_worked_examples():
    a = boxes([2, 4], [1, -1], [8, 8])
    assert a == [((0, 4), (0, 8))] * 4 + [((4, 8), (0, 8))] * 4
    b = boxes([2, 4], [-1, 0], [8, 8])
    assert b == [((0, 8), (2 * (r % 4), 2 * (r % 4) + 2)) for r in range(8)]
    c = boxes([2, 4], [0, 1], [8, 8])
    assert c == [((2 * (r % 4), 2 * (r % 4) + 2), (4 * (r // 4), 4 * (r // 4) + 4))
                 for r in range(8)]
    d1 = boxes([4, 2], [0, -1], [8, 4], 4, 2)
    assert [x[0] for x in d1] == [(0, 1), (4, 5), (1, 2), (5, 6), (2, 3), (6, 7), (3, 4), (7, 8)]
    assert boxes([4, 2], [0, -1], [8, 4], -1, 2) == d1
    d2 = boxes([4, 2], [0, -1], [8, 4], 2, 2)
    assert [x[0] for x in d2] == [(0, 2), (4, 6), (2, 4), (6, 8)] * 2
    e = boxes([2, 2, 2], [[1, 0], -1], [8, 4])
    assert [x[0] for x in e] == [(0, 2), (2, 4), (4, 6), (6, 8)] * 2
    f0 = boxes([2, 2], [1, -1], [4, 4])
    assert [x[0] for x in f0] == [(0, 2), (0, 2), (2, 4), (2, 4)]
    f1 = boxes([2, 2], [-1, 0], [4, 4])
    assert [x[1] for x in f1] == [(0, 2), (2, 4), (0, 2), (2, 4)]
    # Appendix B: rank 0 of dev [2,2,2] map [2,1,0] holds [0,4) on every dimension.
    assert boxes([2, 2, 2], [2, 1, 0], [8, 8, 8])[0] == ((0, 4), (0, 4), (0, 4))


def check_expansion_fuzz():
    """Generator boxes (literal rule and expanded form) equal the oracle's, on random layouts
    with multi-axis dimensions and optimizer sharding."""
    rng = np.random.default_rng(3)
    tried = 0
    while tried < 200:
        n_axes = int(rng.integers(1, 4))
        dev = [int(x) for x in rng.choice([1, 2, 3, 4], n_axes)]
        ndim = int(rng.integers(1, 4))
        owner = [int(rng.integers(-1, ndim)) for _ in range(n_axes)]  # -1: replication axis
        order = [int(a) for a in rng.permutation(n_axes)]
        tmap = []
        for j in range(ndim):
            values = [n_axes - 1 - a for a in order if owner[a] == j]
            if not values:
                tmap.append(-1)
            elif len(values) == 1 and rng.integers(0, 2):
                tmap.append(values[0])
            else:
                tmap.append(values)
        lay = Layout.from_map(dev, tmap)
        r = lay.replica_count
        sizes = [k for k in (2, 3, 4, 6, 8, -1) if k == -1 or (r % k == 0 and k <= r)]
        size = int(rng.choice(sizes)) if r > 1 and sizes else 0
        try:
            lay = Layout.from_map(dev, tmap, size, 1 if size else 0)
            exp_dev, exp_dims = lay.expanded()
        except ValueError:
            continue
        tried += 1
        shape = [s * 2 for s in lay.splits()]
        plain = Layout(tuple(exp_dev), tuple(exp_dims))
        own = Owners(dev, tmap, size, 1 if size else 0)
        for rank in range(lay.devices):
            want = own.box(rank, shape)
            assert lay.box(rank, shape) == want, f"{dev} {tmap} k={size} rank {rank}"
            assert plain.box(rank, shape) == want, f"expanded {dev} {tmap} k={size} rank {rank}"


def check_needed_vectors():
    vectors = [
        (([2, 2, 2], [2, 1, 0]), ([8, 1, 1], [2, 1, 0]), 1, [0, 1, 2, 3]),
        (([32, 1, 8], [2, -1, 0]), ([2, 64, 2], [2, 1, 0]), 1, list(range(128))),
        (([4, 2], [1, 0]), ([1, 8], [-1, -1]), 0, list(range(8))),
        (([8, 1], [1, -1]), ([1, 8], [-1, 0]), 0, list(range(8))),
        (([8, 1, 8], [2, 1, -1]), ([8, 8, 1], [2, 1, 0]), 0, [0]),
        (([1, 8], [1, 0]), ([1, 4, 2], [2, 1]), 0, [0, 1]),
        (([8, 1], [1, 0]), ([2, 1, 4], [2, 1]), 0, [0, 1, 2, 3]),
        (([8], [0, -1]), ([4, 2], [1, -1]), 0, [0, 1]),
    ]
    for src, dst, t, want in vectors:
        got = sorted(mindspore_needed(Layout.from_map(*src), Layout.from_map(*dst), t))
        assert got == want, f"{src} -> {dst} target {t}: {got}"


def random_layout(rng, ndim, device_counts):
    """A random valid layout: multi-axis dimensions and optimizer sharding included."""
    while True:
        n_axes = int(rng.integers(1, 4))
        dev = [int(x) for x in rng.choice([1, 2, 4], n_axes)]
        if math.prod(dev) in device_counts:
            break
    owner = [int(rng.integers(-1, ndim)) for _ in range(n_axes)]
    order = [int(a) for a in rng.permutation(n_axes)]
    tmap = []
    for j in range(ndim):
        values = [n_axes - 1 - a for a in order if owner[a] == j]
        tmap.append(-1 if not values else values[0] if len(values) == 1 else values)
    lay = Layout.from_map(dev, tmap)
    r = lay.replica_count
    if r > 1 and rng.integers(0, 2):
        size = int(rng.choice([k for k in (2, 4, -1) if k == -1 or r % k == 0]))
        lay = Layout.from_map(dev, tmap, size, 1)
    return lay


def check_needed_properties():
    """§4.5's stated properties on random layout pairs: the set holds t_local mod N_src, covers
    every source block the target block intersects, and holds each such block exactly once."""
    rng = np.random.default_rng(7)
    checked = 0
    for _ in range(400):
        ndim = int(rng.integers(1, 4))
        src = random_layout(rng, ndim, {2, 4, 8, 16})
        dst = random_layout(rng, ndim, {1, 2, 4, 8, 16})
        shape = [math.lcm(a, b) * 2 for a, b in zip(src.splits(), dst.splits())]
        src_own = Owners(src.dev_matrix, [[len(src.dev_matrix) - 1 - a for a in ax]
                                          for ax in src.dim_axes], src.opt_size, src.opt_step)
        dst_own = Owners(dst.dev_matrix, [[len(dst.dev_matrix) - 1 - a for a in ax]
                                          for ax in dst.dim_axes], dst.opt_size, dst.opt_step)
        src_boxes = [src_own.box(r, shape) for r in range(src.devices)]
        for t in range(dst.devices):
            try:
                need = mindspore_needed(src, dst, t)
            except ValueError:  # device matrices MindSpore cannot plan with
                continue
            checked += 1
            want = dst_own.box(t, shape)
            assert t % src.devices in need
            hits = {}
            for r, box in enumerate(src_boxes):
                if all(a < d and c < b for (a, b), (c, d) in zip(box, want)):
                    hits.setdefault(box, []).append(r)
            for box, holders in hits.items():
                chosen = [r for r in holders if r in need]
                assert len(chosen) == 1, f"{src} -> {dst} t={t}: block {box} read from {chosen}"
    assert checked > 1000, checked


def smap(layouts, devices, stages=1):
    return StrategyMap({n: ParamLayout(Layout.from_map(*spec[:2], *spec[2:4]),
                                       tuple(spec[4]) if len(spec) > 4 else (0,))
                        for n, spec in layouts.items()}, devices, stages)


def check_g_vectors():
    example_a = smap({"w": ([2, 4], [1, -1])}, 8)
    g1_dst = smap({"w": ([4], [-1, 0])}, 4)
    for t in range(4):
        assert rank_list_for_transform(example_a, g1_dst, t) == [t + 4, t]
    g2_src = smap({"w": ([4], [0, -1])}, 4)
    g2_dst = smap({"w": ([2, 4], [1, 0])}, 8)
    assert rank_list_for_transform(g2_src, g2_dst, 5) == [3, 2, 1, 0]
    assert rank_list_for_transform(example_a, None, 0) == [4, 0]
    d1 = smap({"w": ([4, 2], [0, -1], 4, 2)}, 8)
    assert rank_list_for_transform(d1, smap({"w": ([2], [0, -1])}, 2), 0) == [6, 4, 2, 0]
    f = smap({"w0": ([2, 2], [1, -1], 0, 0, [0]), "w1": ([2, 2], [-1, 0], 0, 0, [1])}, 4, 2)
    g5_dst = smap({"w0": ([4], [0, -1]), "w1": ([4], [0, -1])}, 4)
    assert rank_list_for_transform(f, g5_dst, 1) == [5, 4, 1, 0]
    assert rank_list_for_transform(None, g5_dst, 3) == [0]


G_CASES = {
    "g1": ({"w": ([2, 4], [1, -1])}, 8, 1, {"w": ([4], [-1, 0])}, 4, 1),
    "g2": ({"w": ([4], [0, -1])}, 4, 1, {"w": ([2, 4], [1, 0])}, 8, 1),
    "g3": ({"w": ([2, 4], [1, -1])}, 8, 1, None, 0, 0),
    "g4": ({"w": ([4, 2], [0, -1], 4)}, 8, 1, {"w": ([2], [0, -1])}, 2, 1),
    "g5": ({"w0": ([2, 2], [1, -1], 0, [0]), "w1": ([2, 2], [-1, 0], 0, [1])}, 4, 2,
           {"w0": ([4], [0, -1]), "w1": ([4], [0, -1])}, 4, 1),
}


def g_case(name):
    src, n_src, s_src, dst, n_dst, s_dst = G_CASES[name]

    def lay(spec):
        d = {"dev_matrix": spec[0], "tensor_map": spec[1]}
        if len(spec) > 2:
            d["opt_shard_size"] = spec[2]
        if len(spec) > 3:
            d["stages"] = spec[3]
        return d

    params = []
    for pname in sorted(src):
        params.append({"name": pname, "dtype": "Float32", "shape": [8, 8] if name != "g4"
                       and name != "g5" else ([8, 4] if name == "g4" else [4, 4]),
                       "src": lay(src[pname]), "dst": lay(dst[pname]) if dst else None})
    return {"name": name, "seed": 11, "src": {"devices": n_src, "stages": s_src},
            "dst": {"devices": n_dst, "stages": s_dst} if dst else None, "params": params,
            "extras": [{"name": "global_step", "dtype": "Int64", "value": 9}]}


def check_g_outputs(workdir):
    """G1–G5 as fixtures: generic checks plus the spec's stated pieces."""
    for name in G_CASES:
        fx = ckpt_fixture.make(g_case(name), os.path.join(workdir, name))
        FixtureCheck(fx).run()
        lists = {t["rank"]: t["rank_list"] for t in fx.targets}
        if name == "g1":
            assert lists == {t: [t + 4, t] for t in range(4)}
            # Target 1 = rows 0..3 of rank 1 and rows 4..7 of rank 5, columns 2..3.
            out = ckpt_fixture.read_records(fx.expected_files()[1])[0]
            r1 = ckpt_fixture.read_records(fx.source_files[1])[0]
            r5 = ckpt_fixture.read_records(fx.source_files[5])[0]
            want = np.concatenate([np.frombuffer(r1.content, "<f4").reshape(4, 8),
                                   np.frombuffer(r5.content, "<f4").reshape(4, 8)])[:, 2:4]
            assert out.dims == [8, 2] and out.content == want.tobytes()
        elif name == "g2":
            assert lists[5] == [3, 2, 1, 0]
        elif name == "g3":
            assert lists == {0: [4, 0]}
        elif name == "g4":
            assert lists[0] == [6, 4, 2, 0]
        elif name == "g5":
            assert lists[1] == [5, 4, 1, 0]
            recs = {r.tag: r for r in ckpt_fixture.read_records(fx.expected_files()[1])}
            assert recs["w0"].dims == [1, 4] and recs["w1"].dims == [1, 4]
            # w1 row 1: columns 0..1 from global rank 4, columns 2..3 from global rank 5.
            r4 = ckpt_fixture.read_records(fx.source_files[4])[0]
            r5 = ckpt_fixture.read_records(fx.source_files[5])[0]
            assert r4.tag == "w1" and r5.tag == "w1"
            want = np.concatenate([np.frombuffer(r4.content, "<f4").reshape(4, 2)[1],
                                   np.frombuffer(r5.content, "<f4").reshape(4, 2)[1]])
            assert recs["w1"].content == want.tobytes()


def check_appendix_b_data(workdir):
    """8 ranks each holding row r (value r) of an 8x8x8 tensor, redistributed to dev [2,2,2]:
    rank 0 gets [0,4) on every dimension with values = row index."""
    c = {"name": "appendix_b", "seed": 1, "src": {"devices": 8}, "dst": {"devices": 8},
         "params": [{"name": "t", "dtype": "Float32", "shape": [8, 8, 8],
                     "src": {"dev_matrix": [8, 1, 1], "tensor_map": [2, 1, 0]},
                     "dst": {"dev_matrix": [2, 2, 2], "tensor_map": [2, 1, 0]}}]}
    fx = ckpt_fixture.make(c, os.path.join(workdir, "appendix_b"))
    FixtureCheck(fx).run()
    full = TensorBank(fx.case).get(fx.case.params[0]).block_array(((0, 8), (0, 8), (0, 8)))
    rec = ckpt_fixture.read_records(fx.expected_files()[0])[0]
    assert rec.dims == [4, 4, 4] and rec.content == full[:4, :4, :4].tobytes()


# -- negative helpers ---------------------------------------------------------------------------

def check_negatives(workdir):
    base = os.path.join(workdir, "neg_base")
    ckpt_fixture.make_builtin("multifile", base)

    def fresh(name):
        path = os.path.join(workdir, name)
        shutil.copytree(base, path, symlinks=True)
        return path

    d = fresh("neg_remove")
    ckpt_fixture.remove_rank(d, 2)
    assert not os.path.exists(os.path.join(d, "src", "rank_2"))

    d = fresh("neg_truncate")
    ckpt_fixture.truncate_source(d, 0)
    body = open(os.path.join(d, "src", "rank_0", "net-10_1.ckpt"), "rb").read()
    try:
        PB_CKPT.Checkpoint.FromString(body)
    except Exception:  # the point: Google's parser refuses it
        pass
    else:
        raise AssertionError("truncated file still parses")

    d = fresh("neg_inconsistent")
    ckpt_fixture.inconsistent_slice(d, 1, "w")
    recs = {r[0]: r for r in parse_ckpt(os.path.join(d, "src", "rank_1", "net-10_1.ckpt"))}
    peers = {r[0]: r for r in parse_ckpt(os.path.join(d, "src", "rank_0", "net-10_1.ckpt"))}
    assert recs["w"][1][0] == peers["w"][1][0] - 1

    d = fresh("neg_garbage")
    ckpt_fixture.garbage_strategy(d, "src")
    try:
        PB_STRA.ParallelStrategyMap.FromString(open(os.path.join(d, "src_strategy.ckpt"),
                                                    "rb").read())
    except Exception:
        pass
    else:
        raise AssertionError("garbage strategy parses")

    d = fresh("neg_encrypted")
    ckpt_fixture.encrypted_source(d, 3, "cbc")
    head = open(os.path.join(d, "src", "rank_3", "net-10_1.ckpt"), "rb").read(4)
    assert int.from_bytes(head, "little") == 0x7F3A5ED9

    d = os.path.join(workdir, "neg_indivisible")
    ckpt_fixture.indivisible(d)
    assert os.path.exists(os.path.join(d, "src", "rank_3")) and \
        not os.path.exists(os.path.join(d, "expected"))

    for delta, want in ((1, [0, -1, -1]), (-1, [0])):
        d = os.path.join(workdir, f"neg_map{delta}")
        ckpt_fixture.tensor_map_length(d, delta)
        msg = PB_STRA.ParallelStrategyMap.FromString(
            open(os.path.join(d, "src_strategy.ckpt"), "rb").read())
        maps = {i.param_name: list(i.parallel_layouts.tensor_map[0].dim)
                for i in msg.parallel_layout_item}
        assert maps["w"] == want and maps["ok"] == [0, -1]


def check_oracle_bites(workdir):
    """The checks above must notice wrong bytes, a wrong order and a wrong passthrough rank."""
    from ckptfix import ckptio
    base = os.path.join(workdir, "bite_base")
    ckpt_fixture.make_builtin("pipeline_src_dir", base)
    FixtureCheck(ckpt_fixture.Fixture.load(base)).run()

    def expected(d, t):
        return os.path.join(d, "expected", f"rank_{t}", f"checkpoint_{t}.ckpt")

    def rewrite(path, records):
        with ckptio.CheckpointWriter(path) as w:
            for r in records:
                w.add_bytes(r.tag, r.dims, r.tensor_type, r.content)

    def flip_content(path):
        recs = ckptio.read_records(path)
        recs[0].content = bytes([recs[0].content[0] ^ 1]) + recs[0].content[1:]
        rewrite(path, recs)

    def swap_last_two(path):
        recs = ckptio.read_records(path)
        rewrite(path, recs[:-2] + [recs[-1], recs[-2]])

    def other_rank(path):
        shutil.copyfile(expected(os.path.dirname(os.path.dirname(os.path.dirname(path))), 1),
                        path)

    mutations = [
        ("flipped expected byte", lambda d: flip_content(expected(d, 1))),
        ("swapped expected records", lambda d: swap_last_two(expected(d, 0))),
        ("passthrough from another rank", lambda d: other_rank(expected(d, 2))),
        ("flipped source byte", lambda d: flip_content(os.path.join(d, "src", "rank_3",
                                                                    "checkpoint-1_1.ckpt"))),
    ]
    for i, (what, mutate) in enumerate(mutations):
        d = os.path.join(workdir, f"bite_{i}")
        shutil.copytree(base, d)
        mutate(d)
        try:
            FixtureCheck(ckpt_fixture.Fixture.load(d)).run()
        except AssertionError:
            continue
        raise AssertionError(f"the self-check did not notice: {what}")


def check_cli(workdir):
    script = os.path.join(REPO, "scripts", "ckpt_fixture.py")
    py = sys.executable
    out = subprocess.run([py, script, "list"], capture_output=True, text=True, check=True).stdout
    assert "demo" in out and "llama13b_to4" in out
    case_path = os.path.join(workdir, "cli_case.json")
    with open(case_path, "w") as f:
        json.dump(g_case("g1"), f)
    subprocess.run([py, script, "make", case_path, os.path.join(workdir, "cli_g1")], check=True,
                   capture_output=True)
    # Re-making from the resolved case.json reproduces every file byte for byte.
    subprocess.run([py, script, "make", os.path.join(workdir, "cli_g1", "case.json"),
                    os.path.join(workdir, "cli_g1_again")], check=True, capture_output=True)
    a, b = os.path.join(workdir, "cli_g1"), os.path.join(workdir, "cli_g1_again")
    for rel in itest.tree_files(a):
        if rel != "case.json":
            same = itest.read_file(os.path.join(a, rel)) == itest.read_file(os.path.join(b, rel))
            assert same, rel
    proc = subprocess.run([py, script, "make", "--builtin", "bench", "--size-gib", "0.01",
                           "--dst-devices", "0", os.path.join(workdir, "cli_bench")],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    FixtureCheck(ckpt_fixture.Fixture.load(os.path.join(workdir, "cli_bench"))).run()
    proc = subprocess.run([py, script, "neg", "indivisible", os.path.join(workdir, "cli_neg")],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    exp, got = (os.path.join(a, "expected", "rank_1", "checkpoint_1.ckpt"),
                os.path.join(a, "expected", "rank_2", "checkpoint_2.ckpt"))
    proc = subprocess.run([py, script, "diff", exp, got], capture_output=True, text=True)
    assert proc.returncode == 1 and "content differs" in proc.stdout, proc.stdout
    # compare_tree: a copy of the expected tree is clean; a swapped file is reported.
    mnt = os.path.join(workdir, "cli_fake_mount")
    shutil.copytree(os.path.join(a, "expected"), mnt)
    fx = ckpt_fixture.Fixture.load(a)
    assert ckpt_fixture.compare_tree(fx, mnt) == []
    shutil.copyfile(exp, os.path.join(mnt, "rank_2", "checkpoint_2.ckpt"))
    problems = ckpt_fixture.compare_tree(fx, mnt)
    assert len(problems) == 1 and problems[0].startswith("rank 2"), problems
    proc = subprocess.run([py, script, "compare", a, mnt], capture_output=True, text=True)
    assert proc.returncode == 1, proc.stdout


def check_builtin(name, shared, workdir):
    fx = ckpt_fixture.make_builtin(name, os.path.join(workdir, name), shared=shared)
    FixtureCheck(fx).run()
    if name == "llama13b_to1":
        original = os.path.join(shared, "fixtures", "real", "strategy",
                                "golden-stick_llama2-13b-2p_ckpt_strategy_rank_0.ckpt")
        assert itest.read_file(fx.src_strategy) == itest.read_file(original)
        assert len(fx.case.params) == 363
    if name == "multifile":
        assert os.path.islink(fx.source_files[1])


def main():
    global PB_CKPT, PB_STRA
    args = itest.parse_args()
    PB_CKPT, PB_STRA = load_protos(args.work)
    checks = itest.Checks(args.only)
    checks.run("encoding examples (§1.3, §1.7)", check_encoding_examples)
    checks.run("chunking writer (§1.5)", check_chunking_writer, args.work)
    checks.run("real files re-encode byte for byte", check_real_files_reencode, args.shared)
    checks.run("optimizer-shard vectors (§3.2, appendix B)", check_opt_vectors)
    checks.run("worked examples A-F (§3.5)", check_worked_examples)
    checks.run("optimizer expansion vs literal rule", check_expansion_fuzz)
    checks.run("needed-rank vectors (§4.5)", check_needed_vectors)
    checks.run("needed-rank properties on random layouts (§4.5)", check_needed_properties)
    checks.run("rank lists G1-G5 (§4.5)", check_g_vectors)
    checks.run("G1-G5 fixtures", check_g_outputs, args.work)
    checks.run("appendix B redistribution", check_appendix_b_data, args.work)
    for name in ckpt_fixture.SMALL_BUILTINS:
        checks.run(f"builtin {name}", check_builtin, name, args.shared, args.work)
    checks.run("negative helpers", check_negatives, args.work)
    checks.run("the oracle notices mutations", check_oracle_bites, args.work)
    checks.run("CLI", check_cli, args.work)
    checks.finish()


if __name__ == "__main__":
    main()
