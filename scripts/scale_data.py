#!/usr/bin/python3
"""Synthetic checkpoints at scale, fast: every rank file of a data set is written as one NumPy
array of fixed-width .ckpt records (the names are zero-padded to one width, so every record of a
file has the same header length), with the record framing from scripts/ckptfix/ckptio.py.

A data set: `params` parameters of global shape [src_ranks * rows, cols] Float32, each split
along dimension 0 over `src_ranks` source ranks (one JSON strategy, a flat data-parallel-free
tensor-parallel job), mounted on `dst_ranks` target ranks split the same way, so target t reads
source ranks t*k .. t*k+k-1 (k = src_ranks / dst_ranks): a k -> 1 merge of row blocks.

Element (r, c) of parameter i holds the float32 value i * 65536 + r * 16 + c (exact up to 2^24
only, but the bytes are what is compared, and they are a function of (i, r, c) alone), so the
expected bytes of any target are computed here from (i, r, c), not by ckptfs.
"""

import json
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from ckptfix import ckptio  # noqa: E402

DTYPE = "Float32"


def param_name(i: int) -> str:
    return f"model.layers.{i // 64:05d}.mlp.w{i % 64:02d}.weight"


class Spec:
    def __init__(self, src_ranks: int, dst_ranks: int, params: int, rows: int = 1, cols: int = 16):
        assert src_ranks % dst_ranks == 0
        self.src_ranks, self.dst_ranks, self.params = src_ranks, dst_ranks, params
        self.rows, self.cols = rows, cols

    def key(self) -> dict:
        return {"src": self.src_ranks, "dst": self.dst_ranks, "params": self.params,
                "rows": self.rows, "cols": self.cols, "version": 1}

    @property
    def tensors(self) -> int:
        return self.src_ranks * self.params

    def values(self, first_row: int, nrows: int) -> np.ndarray:
        """[params, nrows, cols] float32 values of global rows first_row .. + nrows."""
        i = np.arange(self.params, dtype=np.float64)[:, None, None]
        r = np.arange(first_row, first_row + nrows, dtype=np.float64)[None, :, None]
        c = np.arange(self.cols, dtype=np.float64)[None, None, :]
        return (i * 65536 + r * 16 + c).astype("<f4")

    def headers(self, rows: int) -> np.ndarray:
        """[params, header bytes] uint8: each record's header for a [rows, cols] slice."""
        nbytes = rows * self.cols * 4
        first = ckptio.record_header(param_name(0), [rows, self.cols], DTYPE, nbytes)
        out = np.empty((self.params, len(first)), dtype=np.uint8)
        for i in range(self.params):
            h = ckptio.record_header(param_name(i), [rows, self.cols], DTYPE, nbytes)
            assert len(h) == len(first)
            out[i] = np.frombuffer(h, dtype=np.uint8)
        return out

    def file_bytes(self, headers: np.ndarray, first_row: int, nrows: int) -> np.ndarray:
        content = self.values(first_row, nrows).reshape(self.params, -1).view(np.uint8)
        return np.concatenate([headers, content], axis=1)

    def strategy(self, devices: int) -> dict:
        shape = [self.src_ranks * self.rows, self.cols]
        layouts = {param_name(i): {"dev_matrix": [devices], "tensor_map": [0, -1],
                                   "tensor_shape": shape, "field": 0,
                                   "opt_weight_shard_step": 0, "opt_weight_shard_size": 0}
                   for i in range(self.params)}
        items = {f"MatMul_{param_name(i)}": {"stage": 0, "parallel_strategy": [[devices, 1]]}
                 for i in range(self.params)}
        return {"current_stage": 1, "parallel_strategy_item": items,
                "parallel_layout_item": layouts}

    def expected_target(self, t: int) -> bytes:
        """The .ckpt view of target rank t: every parameter's rows t*k*rows .. in name order."""
        k = self.src_ranks // self.dst_ranks
        nrows = k * self.rows
        return self.file_bytes(self.headers(nrows), t * nrows, nrows).tobytes()


def generate(spec: Spec, root: str, log=print) -> dict:
    """Writes root/src/rank_<g>/checkpoint-1_1.ckpt and root/{src,dst}_strategy.json unless
    root/stamp.json already says this spec was written completely. Returns the paths."""
    paths = {"src": os.path.join(root, "src"),
             "src_strategy": os.path.join(root, "src_strategy.json"),
             "dst_strategy": os.path.join(root, "dst_strategy.json")}
    stamp = os.path.join(root, "stamp.json")
    if os.path.exists(stamp):
        with open(stamp) as f:
            if json.load(f) == spec.key():
                return paths
        os.remove(stamp)
    os.makedirs(paths["src"], exist_ok=True)
    headers = spec.headers(spec.rows)
    for g in range(spec.src_ranks):
        d = os.path.join(paths["src"], f"rank_{g}")
        os.makedirs(d, exist_ok=True)
        data = spec.file_bytes(headers, g * spec.rows, spec.rows)
        with open(os.path.join(d, "checkpoint-1_1.ckpt"), "wb") as f:
            f.write(data.tobytes())
        if g % 64 == 63:
            log(f"  generated {g + 1} of {spec.src_ranks} rank files")
    for which, devices in (("src_strategy", spec.src_ranks), ("dst_strategy", spec.dst_ranks)):
        with open(paths[which], "w") as f:
            json.dump(spec.strategy(devices), f, separators=(",", ":"))
    with open(stamp, "w") as f:
        json.dump(spec.key(), f)
    return paths


if __name__ == "__main__":
    import argparse
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("root")
    ap.add_argument("--src", type=int, default=512)
    ap.add_argument("--dst", type=int, default=128)
    ap.add_argument("--params", type=int, default=32768)
    a = ap.parse_args()
    generate(Spec(a.src, a.dst, a.params), a.root)
