#!/usr/bin/python3
"""Materializing checkpoint conversion done the way MindSpore's transform_checkpoints does it.

This is the baseline ckptfs is compared against (issue 4, figure (i)); it is deliberately not
clever. For every target rank, in order:

  1. rank_list_for_transform: the source ranks the target needs (descending, as MindSpore loads
     them);
  2. load each of those source files WHOLE: read all of its bytes, parse every record with
     Google's protobuf parser (checkpoint_pb2 compiled from proto/checkpoint.proto, like
     mindspore/train/checkpoint_pb2.py), join chunked parameters, and keep every tensor as a
     NumPy array; files are loaded again for every target rank, as MindSpore does;
  3. for each parameter of the target: allocate the global tensor, copy every loaded source
     block into it, cut the target block out (MindSpore's AllGather + Slice operators on numpy);
     other parameters are passed through from the file of local rank t mod N_src loaded last;
  4. write the new file record by record with SerializeToString (content above 512 MiB is cut
     into 512 MiB records, like MindSpore >= 2.3's saver).

Supported: single-stage protobuf strategies on both sides (or none: an unsharded side), which
is what the benchmark generates. Layout math comes from scripts/ckptfix (layout.py,
ranklist.py), the same definitions the fixture generator uses.

    naive_convert.py SRC_DIR OUT_DIR [--src-strategy F] [--dst-strategy F] [--pb2-dir DIR]

writes OUT_DIR/rank_<t>/checkpoint_<t>.ckpt and prints the time and bytes written.
"""

import argparse
import glob
import math
import os
import subprocess
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from ckptfix import ckptio  # noqa: E402
from ckptfix.layout import Layout  # noqa: E402
from ckptfix.ranklist import ParamLayout, StrategyMap, rank_list_for_transform, target_maps  # noqa: E402
from ckptfix.strategy import layout_specs, read_protobuf  # noqa: E402

CHUNK_BYTES = ckptio.MINDSPORE_CHUNK_BYTES
CRC_TRAILER = 17


def load_pb2(pb2_dir):
    """checkpoint_pb2, compiled with protoc from the repository's proto/checkpoint.proto into
    `pb2_dir` unless an up-to-date copy is already there."""
    proto_dir = os.path.join(os.path.dirname(HERE), "proto")
    proto = os.path.join(proto_dir, "checkpoint.proto")
    out = os.path.join(pb2_dir, "checkpoint_pb2.py")
    os.makedirs(pb2_dir, exist_ok=True)
    if not os.path.exists(out) or os.path.getmtime(out) < os.path.getmtime(proto):
        subprocess.run(["protoc", f"--proto_path={proto_dir}", f"--python_out={pb2_dir}", proto],
                       check=True)
    sys.path.insert(0, pb2_dir)
    import checkpoint_pb2  # noqa: E402
    return checkpoint_pb2


def read_strategy(path):
    """StrategyMap of a single-stage protobuf strategy file (None: unsharded side)."""
    if path is None:
        return None
    specs = layout_specs(read_protobuf(path))
    params = {name: ParamLayout(spec.layout(), tuple(spec.stages)) for name, spec in specs.items()}
    devices = max(math.prod(s.dev_matrix) for s in specs.values())
    return StrategyMap(params, devices, 1)


def source_files(src_dir):
    """global rank -> its checkpoint (the one .ckpt in rank_<g>/; the last name if several)."""
    files = {}
    for d in glob.glob(os.path.join(src_dir, "rank_*")):
        suffix = os.path.basename(d)[5:]
        if not suffix.isdigit() or not os.path.isdir(d):
            continue
        ckpts = sorted(f for f in os.listdir(d) if f.endswith(".ckpt"))
        if ckpts:
            files[int(suffix)] = os.path.join(d, ckpts[-1])
    return files


def load_checkpoint(path, pb2):
    """name -> (tensor_type, dims, ndarray), in file order, like mindspore.load_checkpoint:
    the whole file in memory, parsed by protobuf, chunks of one parameter concatenated."""
    with open(path, "rb") as f:
        blob = f.read()
    if len(blob) >= CRC_TRAILER and blob[-CRC_TRAILER:-10] == ckptio.CRC_MAGIC:
        blob = blob[:-CRC_TRAILER]
    ckpt = pb2.Checkpoint()
    ckpt.ParseFromString(blob)
    del blob
    params = {}
    pending = []  # consecutive records of one tag (a chunked parameter)

    def flush():
        if not pending:
            return
        tag, tensor_type, dims = pending[0][:3]
        data = b"".join(p[3] for p in pending) if len(pending) > 1 else pending[0][3]
        if tensor_type == ckptio.STRING_TYPE:
            array = np.frombuffer(data, dtype=np.uint8)
        else:
            array = np.frombuffer(data, dtype=ckptio.NUMPY_DTYPES[tensor_type])
            if dims and dims != [0]:
                array = array.reshape(dims)
        params[tag] = (tensor_type, dims, array)
        pending.clear()

    for value in ckpt.value:
        if pending and pending[0][0] != value.tag:
            flush()
        t = value.tensor
        pending.append((value.tag, t.tensor_type, list(t.dims), t.tensor_content))
    flush()
    return params


def write_checkpoint(path, records, pb2):
    """records: (name, tensor_type, dims, content bytes). One serialized Checkpoint per record."""
    size = 0
    with open(path, "wb") as f:
        for name, tensor_type, dims, content in records:
            pieces = [content[i:i + CHUNK_BYTES] for i in range(0, len(content), CHUNK_BYTES)]
            for piece in pieces:
                ckpt = pb2.Checkpoint()
                value = ckpt.value.add()
                value.tag = name
                value.tensor.dims.extend(dims)
                value.tensor.tensor_type = tensor_type
                value.tensor.tensor_content = piece
                blob = ckpt.SerializeToString()
                f.write(blob)
                size += len(blob)
    return size


def convert_target(t, files, src_map, dst_map, pb2, out_dir):
    maps = target_maps(src_map, dst_map, t)
    rank_list = rank_list_for_transform(src_map, dst_map, t) if src_map else [0]
    loaded = {}  # global rank -> params of that file, in load order
    for g in rank_list:
        loaded[g] = load_checkpoint(files[g], pb2)
    order = {}
    for g in rank_list:
        for name in loaded[g]:
            order.setdefault(name, None)
    names = [n for n in order if not maps.dropped(n)]
    resharded = [n for n in names if maps.resharded(n)]
    passthrough = [n for n in names if not maps.resharded(n)]

    records = []
    for name in resharded:
        src = maps.src[name].layout if maps.src is not None else None
        holders = [g for g in rank_list if name in loaded[g]]
        tensor_type, dims, first = loaded[holders[0]][name]
        splits = src.splits() if src is not None else [1] * len(dims)
        shape = [d * s for d, s in zip(dims, splits)]
        dst = maps.dst[name].layout if maps.dst is not None else Layout.unsharded(len(shape))
        # The global tensor, gathered from every loaded block (uncovered parts stay unset; the
        # rank list guarantees they are outside the target block).
        full = np.empty(shape, dtype=first.dtype)
        for g in holders:
            block = loaded[g][name][2]
            if src is None:
                full[...] = block
            else:
                box = src.box(g % maps.n_src, shape)
                full[tuple(slice(lo, hi) for lo, hi in box)] = block
        box = dst.box(maps.t_local, shape)
        part = np.ascontiguousarray(full[tuple(slice(lo, hi) for lo, hi in box)])
        del full
        if part.nbytes:
            records.append((name, tensor_type, [hi - lo for lo, hi in box], part.tobytes()))
    for name in passthrough:
        chosen = None
        for g in rank_list:
            if g % maps.n_src == maps.t_local % maps.n_src and name in loaded[g]:
                chosen = g
        if chosen is None:
            raise SystemExit(f"target {t}: no loaded file of local rank "
                             f"{maps.t_local % maps.n_src} holds {name}")
        tensor_type, dims, array = loaded[chosen][name]
        if tensor_type != ckptio.STRING_TYPE and dims == [0]:
            dims = []  # a >= 2.3 re-save writes 0-d tensors without the old [0]
        if array.nbytes:
            records.append((name, tensor_type, dims, array.tobytes()))

    path = os.path.join(out_dir, f"rank_{t}", f"checkpoint_{t}.ckpt")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    size = write_checkpoint(path, records, pb2)
    return path, size, rank_list


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("src_dir")
    ap.add_argument("out_dir")
    ap.add_argument("--src-strategy")
    ap.add_argument("--dst-strategy")
    ap.add_argument("--pb2-dir", default=None,
                    help="where checkpoint_pb2.py is compiled (default: OUT_DIR/.pb2)")
    args = ap.parse_args(argv)

    pb2 = load_pb2(args.pb2_dir or os.path.join(args.out_dir, ".pb2"))
    src_map = read_strategy(args.src_strategy)
    dst_map = read_strategy(args.dst_strategy)
    files = source_files(args.src_dir)
    targets = list(range(dst_map.devices)) if dst_map else [0]
    start = time.monotonic()
    total = 0
    for t in targets:
        path, size, rank_list = convert_target(t, files, src_map, dst_map, pb2, args.out_dir)
        total += size
        print(f"rank {t}: {size} bytes from source ranks {rank_list} -> {path}", flush=True)
    print(f"naive_convert: {len(targets)} files, {total} bytes in "
          f"{time.monotonic() - start:.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
