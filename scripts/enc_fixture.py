#!/usr/bin/env python3
"""Encrypted MindSpore checkpoints written by real MindSpore, with their unencrypted oracles.

Run with the conformance lane's interpreter (MindSpore 2.7.2 installed there):
    build/conformance-venv/bin/python scripts/enc_fixture.py OUTDIR

Writes (every file by MindSpore's own save_checkpoint; the keys are TEST KEYS, public on purpose):
    OUTDIR/single/plain.ckpt                the oracle: the same parameters saved unencrypted
    OUTDIR/single/aes_gcm.ckpt              AES-256-GCM (32-byte key), 4 KiB plaintext blocks
    OUTDIR/single/aes_gcm_oneblock.ckpt     AES-128-GCM (16-byte key), MindSpore's default blocks
    OUTDIR/single/aes_cbc.ckpt              AES-192-CBC (24-byte key), 4 KiB plaintext blocks
    OUTDIR/single/sm4_cbc.ckpt              SM4-CBC (16-byte key), 4 KiB plaintext blocks
    OUTDIR/dist/{plain,aes_gcm,aes_cbc,sm4_cbc}/rank_<r>/checkpoint-1_1.ckpt
                                            a 4-rank source (dev [4]) cut by the fixture
                                            generator's "rankdirs"-style case, loaded and saved
                                            again by MindSpore in each mode (same keys as single/)
    OUTDIR/dist/{src,dst}_strategy.ckpt     the strategies of that layout
and checks, with MindSpore alone, that each encrypted file decrypts (MindSpore's _decrypt) to
exactly the oracle's bytes and loads (load_checkpoint with dec_key) to the oracle's values; it
prints what MindSpore does with a wrong key in each mode.

The plaintext block size is MindSpore's module constant serialization.ENCRYPT_BLOCK_SIZE (KiB,
64 MiB by default): it is set to 4 KiB while saving the multi-block files so that a few KiB of
parameters span several blocks. The framing of each block is MindSpore's own.
"""

import contextlib
import os
import shutil
import sys

import numpy as np

os.environ.setdefault("GLOG_v", "3")
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "scripts"))

import mindspore as ms  # noqa: E402
from mindspore._c_expression import _decrypt  # noqa: E402
from mindspore.train import serialization  # noqa: E402

import ckpt_fixture  # noqa: E402

TEST_KEY = b"ckptfs-TEST-KEY-not-a-secret-32B"  # 32 bytes; shorter keys are its prefixes
assert len(TEST_KEY) == 32

# name -> (enc_mode, key length, plaintext block KiB or None for MindSpore's default)
MODES = {
    "aes_gcm": ("AES-GCM", 32, 4),
    "aes_gcm_oneblock": ("AES-GCM", 16, None),
    "aes_cbc": ("AES-CBC", 24, 4),
    "sm4_cbc": ("SM4-CBC", 16, 4),
}
DIST_MODES = ("aes_gcm", "aes_cbc", "sm4_cbc")
DIST_CASE = {
    "name": "enc_dist", "seed": 7,
    "src": {"devices": 4, "stages": 1}, "dst": {"devices": 2, "stages": 1},
    "params": [
        {"name": "w", "dtype": "Float32", "shape": [64, 32],
         "src": {"dev_matrix": [4], "tensor_map": [0, -1], "opt_shard_size": 0, "stages": [0]},
         "dst": {"dev_matrix": [2], "tensor_map": [-1, 0], "opt_shard_size": 0, "stages": [0]}},
        {"name": "emb", "dtype": "Float16", "shape": [32, 48],
         "src": {"dev_matrix": [4], "tensor_map": [-1, 0], "opt_shard_size": 0, "stages": [0]},
         "dst": {"dev_matrix": [2], "tensor_map": [0, -1], "opt_shard_size": 0, "stages": [0]}},
    ],
    "extras": [{"name": "global_step", "dtype": "Int64", "value": 1000, "per_rank": True}],
    "options": {},
}


@contextlib.contextmanager
def block_kib(kib):
    saved = serialization.ENCRYPT_BLOCK_SIZE
    if kib is not None:
        serialization.ENCRYPT_BLOCK_SIZE = kib
    try:
        yield
    finally:
        serialization.ENCRYPT_BLOCK_SIZE = saved


def single_params():
    rng = np.random.default_rng(34)
    return [
        {"name": "layer.weight", "data": ms.Tensor(rng.standard_normal((48, 64), dtype=np.float32))},
        {"name": "layer.bias", "data": ms.Tensor(rng.standard_normal(64).astype(np.float16))},
        {"name": "embed.weight",
         "data": ms.Tensor(rng.standard_normal((32, 32), dtype=np.float32), dtype=ms.bfloat16)},
        {"name": "token_ids", "data": ms.Tensor(rng.integers(-1000, 1000, (16,), dtype=np.int32))},
        {"name": "learning_rate", "data": ms.Tensor(np.float32(0.001))},
        {"name": "global_step", "data": ms.Tensor(np.int64(1000))},
    ]


def save_all(params, plain_path, enc_paths):
    """Saves the plain oracle and each (path, mode name) encrypted, then checks with MindSpore."""
    os.makedirs(os.path.dirname(plain_path), exist_ok=True)
    ms.save_checkpoint(params, plain_path)
    oracle = open(plain_path, "rb").read()
    expected = ms.load_checkpoint(plain_path)
    for path, name in enc_paths:
        mode, key_len, kib = MODES[name]
        key = TEST_KEY[:key_len]
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with block_kib(kib):
            ms.save_checkpoint(params, path, enc_key=key, enc_mode=mode)
        plain = _decrypt(path, key, len(key), mode)
        if plain != oracle:
            sys.exit(f"{path}: MindSpore's _decrypt does not give the oracle's bytes")
        loaded = ms.load_checkpoint(path, dec_key=key, dec_mode=mode)
        if sorted(loaded) != sorted(expected) or any(
                not np.array_equal(loaded[k].asnumpy(), expected[k].asnumpy()) for k in expected):
            sys.exit(f"{path}: load_checkpoint(dec_key=...) differs from the oracle")


def wrong_key_behaviour(path, name):
    mode, key_len, _ = MODES[name]
    wrong = bytes(b ^ 0x5A for b in TEST_KEY[:key_len])
    try:
        ms.load_checkpoint(path, dec_key=wrong, dec_mode=mode)
        return "loaded without an error"
    except Exception as e:  # noqa: BLE001 (we report whatever MindSpore raises)
        return f"{type(e).__name__}: {str(e).splitlines()[0]}"


def make_dist(outdir):
    work = os.path.join(outdir, "dist_generator")
    fx = ckpt_fixture.make(DIST_CASE, work)
    dist = os.path.join(outdir, "dist")
    os.makedirs(dist, exist_ok=True)
    for side in ("src", "dst"):
        shutil.copyfile(os.path.join(work, f"{side}_strategy.ckpt"),
                        os.path.join(dist, f"{side}_strategy.ckpt"))
    for rank, path in sorted(fx.source_files.items()):
        loaded = ms.load_checkpoint(path)
        params = [{"name": k, "data": v} for k, v in loaded.items()]
        rel = os.path.join(f"rank_{rank}", "checkpoint-1_1.ckpt")
        save_all(params, os.path.join(dist, "plain", rel),
                 [(os.path.join(dist, name, rel), name) for name in DIST_MODES])
    shutil.rmtree(work)


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    outdir = sys.argv[1]
    single = os.path.join(outdir, "single")
    save_all(single_params(), os.path.join(single, "plain.ckpt"),
             [(os.path.join(single, f"{name}.ckpt"), name) for name in MODES])
    make_dist(outdir)
    print(f"MindSpore {ms.__version__}: every encrypted file decrypts to its oracle's bytes")
    for name in MODES:
        print(f"wrong key, {name}: {wrong_key_behaviour(os.path.join(single, name + '.ckpt'), name)}")


if __name__ == "__main__":
    main()
