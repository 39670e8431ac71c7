"""Encrypted MindSpore checkpoints as sources (issue 34): MindSpore 2.7.2's own encrypted saves
(tests/data/encrypted/, key in its README) mounted with the key serve exactly the views of
MindSpore's unencrypted oracle saves; a missing, exposed or wrong key, a flipped ciphertext byte
and -o allow_other are refused at mount; the views are 0400 and the status tree shows no
decrypted bytes."""

import concurrent.futures
import hashlib
import json
import os
import shutil
import stat

import itest

KEY = b"ckptfs-TEST-KEY-not-a-secret-32B"
# Key length per mode, as the fixtures were written (tests/data/encrypted/README.md).
SINGLE = {"aes_gcm": 32, "aes_gcm_oneblock": 16, "aes_cbc": 24, "sm4_cbc": 16}
DIST = {"aes_gcm": 32, "aes_cbc": 24, "sm4_cbc": 16}

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, "..", "data", "encrypted")


def md5_tree(root):
    out = {}
    for rel in itest.tree_files(root):
        if rel.startswith(".ckptfs"):
            continue
        out[rel] = hashlib.md5(itest.read_file(os.path.join(root, rel))).hexdigest()
    return out


def key_file(work, length, mode=0o600):
    path = os.path.join(work, f"key{length}_{mode:o}")
    with open(path, "wb") as f:
        f.write(KEY[:length])
    os.chmod(path, mode)
    return path


def single_source(work, name):
    """SRC_DIR/rank_0/<name>.ckpt: one full checkpoint, a copy of the fixture."""
    src = os.path.join(work, "src_" + name)
    os.makedirs(os.path.join(src, "rank_0"), exist_ok=True)
    shutil.copy(os.path.join(DATA, "single", name + ".ckpt"), os.path.join(src, "rank_0"))
    return src


def dist_source(work, mode):
    src = os.path.join(work, "dist_" + mode)
    shutil.copytree(os.path.join(DATA, "dist", mode), src)
    return src


def mount_md5(args, work, src, name, extra=(), **kw):
    mnt = os.path.join(work, "mnt_" + name)
    with itest.mounted(args.ckptfs, src, mnt, index_dir=os.path.join(work, "index"),
                       extra_args=extra, **kw) as m:
        return md5_tree(m)


def single_strategy(work):
    """A destination that cuts layer.weight [48,64] in two rows (the rest is passed through): a
    mount needs something to reshard, and this one reads slices of the decrypted stream."""
    path = os.path.join(work, "dst.json")
    layout = {"dev_matrix": [2], "tensor_map": [0, -1], "tensor_shape": [48, 64], "field": 0,
              "opt_weight_shard_step": 0, "opt_weight_shard_size": 0}
    doc = {"current_stage": 1,
           "parallel_strategy_item": {"MatMul_layer.weight": {"stage": 0,
                                                              "parallel_strategy": [[2, 1]]}},
           "parallel_layout_item": {"layer.weight": layout}}
    with open(path, "w") as f:
        json.dump(doc, f)
    return path


def single_oracle(args, work):
    """The views of MindSpore's unencrypted save, and the destination strategy they were cut by."""
    dst = single_strategy(work)
    oracle = mount_md5(args, work, single_source(work, "plain"), "plain", dst_strategy=dst)
    assert len(oracle) == 4, oracle  # two ranks, .ckpt and .safetensors each
    return oracle, dst


def single_views(args):
    work = os.path.join(args.work, "single")
    os.makedirs(work)
    oracle, dst = single_oracle(args, work)
    for name, length in SINGLE.items():
        got = mount_md5(args, work, single_source(work, name), name, dst_strategy=dst,
                        extra=["--dec-key-file", key_file(work, length)])
        assert got == oracle, f"{name}: {got} != {oracle}"


def dist_reshard(args):
    work = os.path.join(args.work, "dist")
    os.makedirs(work)
    strategies = dict(src_strategy=os.path.join(DATA, "dist", "src_strategy.ckpt"),
                      dst_strategy=os.path.join(DATA, "dist", "dst_strategy.ckpt"))
    oracle = mount_md5(args, work, dist_source(work, "plain"), "plain", **strategies)
    assert len([k for k in oracle if k.endswith(".ckpt")]) == 2, oracle
    for mode, length in DIST.items():
        got = mount_md5(args, work, dist_source(work, mode), mode,
                        extra=["--dec-key-file", key_file(work, length)], **strategies)
        assert got == oracle, f"{mode}: {got} != {oracle}"
    # materialize writes the same .ckpt views, as files only their owner may read.
    out = os.path.join(work, "out")
    itest.run([args.ckptfs, "materialize", os.path.join(work, "dist_sm4_cbc"), out, "--src-strategy",
               strategies["src_strategy"], "--dst-strategy", strategies["dst_strategy"],
               "--index-dir", os.path.join(work, "index"), "--dec-key-file", key_file(work, 16)])
    # verify reads every source (its tags checked with the key) and every view in full.
    proc = itest.run([args.ckptfs, "verify", os.path.join(work, "dist_aes_gcm"), "--src-strategy",
                      strategies["src_strategy"], "--dst-strategy", strategies["dst_strategy"],
                      "--index-dir", os.path.join(work, "index"), "--dec-key-file",
                      key_file(work, 32)])
    assert "all well" in proc.stderr + proc.stdout, proc.stderr
    written = md5_tree(out)
    assert written == {k: v for k, v in oracle.items() if k.endswith(".ckpt")}, written
    for rel in written:
        assert stat.S_IMODE(os.stat(os.path.join(out, rel)).st_mode) == 0o600, rel


def concurrent_reads(args):
    """Many threads reading the views of one AES-GCM mount at once, in small unaligned pieces
    (the shared DecryptedStream per source, its lock and cache, the read-ahead helpers)."""
    work = os.path.join(args.work, "concurrent")
    os.makedirs(work)
    strategies = dict(src_strategy=os.path.join(DATA, "dist", "src_strategy.ckpt"),
                      dst_strategy=os.path.join(DATA, "dist", "dst_strategy.ckpt"))
    oracle = mount_md5(args, work, dist_source(work, "plain"), "plain", **strategies)
    mnt = os.path.join(work, "mnt")
    with itest.mounted(args.ckptfs, dist_source(work, "aes_gcm"), mnt, **strategies,
                       index_dir=os.path.join(work, "index"),
                       extra_args=["--dec-key-file", key_file(work, 32)]) as m:
        def read(rel, piece):
            out = bytearray()
            with open(os.path.join(m, rel), "rb", buffering=0) as f:
                while chunk := f.read(piece):
                    out += chunk
            return rel, hashlib.md5(out).hexdigest()

        jobs = [(rel, piece) for rel in oracle for piece in (1, 7, 333, 4096, 1 << 20)] * 4
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            for rel, digest in pool.map(lambda j: read(*j), jobs):
                assert digest == oracle[rel], rel


def allow_other_when_asked(args):
    work = os.path.join(args.work, "allow_other")
    os.makedirs(work)
    oracle, dst = single_oracle(args, work)
    got = mount_md5(args, work, single_source(work, "aes_cbc"), "cbc", dst_strategy=dst,
                    options="allow_other",
                    extra=["--dec-key-file", key_file(work, 24), "--allow-other-decrypted"])
    assert got == oracle


def key_from_env(args):
    work = os.path.join(args.work, "env")
    os.makedirs(work)
    oracle, dst = single_oracle(args, work)
    os.environ["CKPTFS_TEST_DEC_KEY"] = KEY.hex()
    try:
        got = mount_md5(args, work, single_source(work, "aes_gcm"), "gcm", dst_strategy=dst,
                        extra=["--dec-key-env", "CKPTFS_TEST_DEC_KEY"])
    finally:
        del os.environ["CKPTFS_TEST_DEC_KEY"]
    assert got == oracle, f"{got} != {oracle}"


def refusal(args, work, src, extra, *words):
    proc = itest.refused_mount(args.ckptfs, src, os.path.join(work, "mnt"),
                               dst_strategy=single_strategy(work),
                               index_dir=os.path.join(work, "index"), extra_args=extra)
    lines = itest.stderr_lines(proc)
    assert len(lines) == 1, proc.stderr
    for w in words:
        assert w in lines[0], (w, lines[0])
    return lines[0]


def refusals(args):
    work = os.path.join(args.work, "refusals")
    os.makedirs(work)
    gcm = single_source(work, "aes_gcm")
    refusal(args, work, gcm, [], "aes_gcm.ckpt", "encrypted", "--dec-key-file")
    refusal(args, work, gcm, ["--dec-key-file", key_file(work, 32, 0o644)], "key", "chmod 600")
    wrong = os.path.join(work, "wrong")
    with open(wrong, "wb") as f:
        f.write(bytes(b ^ 0x5A for b in KEY))
    os.chmod(wrong, 0o600)
    for name in ("aes_gcm", "aes_cbc"):
        src = single_source(work, name)
        length = SINGLE[name]
        with open(wrong, "wb") as f:
            f.write(bytes(b ^ 0x5A for b in KEY[:length]))
        refusal(args, work, src, ["--dec-key-file", wrong], name + ".ckpt", "wrong key")
    # One ciphertext byte of the third block (after its 48-byte header at 8288).
    flipped = single_source(work, "aes_gcm")
    path = os.path.join(flipped, "rank_0", "aes_gcm.ckpt")
    data = bytearray(itest.read_file(path))
    data[8288 + 48 + 100] ^= 1
    with open(path, "wb") as f:
        f.write(data)
    refusal(args, work, flipped, ["--dec-key-file", key_file(work, 32)], "aes_gcm.ckpt",
            "wrong key or damaged file")
    proc = itest.run([args.ckptfs, "index", "build", gcm, "--index-dir",
                      os.path.join(work, "index")], check=False)
    lines = itest.stderr_lines(proc)
    assert proc.returncode != 0 and len(lines) == 1, proc.stderr
    assert "aes_gcm.ckpt" in lines[0] and "never indexes" in lines[0], lines
    refusal(args, work, single_source(work, "aes_gcm"), ["--dec-key-file", key_file(work, 32), "-o",
                                                        "allow_other"],
            "allow_other", "--allow-other-decrypted")


def exposure(args):
    work = os.path.join(args.work, "exposure")
    os.makedirs(work)
    oracle, dst = single_oracle(args, work)
    src = single_source(work, "aes_gcm")
    for f in (src, os.path.join(src, "rank_0"), os.path.join(src, "rank_0", "aes_gcm.ckpt")):
        os.chmod(f, 0o755 if os.path.isdir(f) else 0o644)
    mnt = os.path.join(work, "mnt")
    with itest.mounted(args.ckptfs, src, mnt, index_dir=os.path.join(work, "index"),
                       dst_strategy=dst, options="cache,splice",
                       extra_args=["--dec-key-file", key_file(work, 32)]) as m:
        for rel in itest.tree_files(m):
            if rel.startswith(".ckptfs"):
                continue
            st = os.stat(os.path.join(m, rel))
            assert stat.S_IMODE(st.st_mode) == 0o400, (rel, oct(st.st_mode))
            assert st.st_uid == os.getuid(), (rel, st.st_uid)
        plan = json.loads(itest.read_file(os.path.join(m, ".ckptfs", "plan", "rank_0.json")))
        for f in plan["files"]:
            for rec in f["records"]:
                for e in rec["extents"]:
                    assert "hex" not in e, e
        # Through the options that are turned off (cache, splice): still the oracle's bytes.
        assert md5_tree(m) == oracle
    # Nothing of the scan was stored: the index holds no entry for the encrypted file.
    proc = itest.run([args.ckptfs, "index", "list", "--index-dir", os.path.join(work, "index")],
                     check=False)
    assert "aes_gcm.ckpt" not in proc.stdout, proc.stdout


def inspect_plaintext(args):
    """MindSpore decrypts to exactly its unencrypted save (the fixtures' README), so inspect of
    an encrypted file with its key lists what inspect of the oracle lists, offsets included."""
    work = os.path.join(args.work, "inspect")
    os.makedirs(work)
    oracle = itest.run([args.ckptfs, "inspect", "--json",
                        os.path.join(DATA, "single", "plain.ckpt")]).stdout
    for name, length in SINGLE.items():
        got = itest.run([args.ckptfs, "inspect", "--json", "--verify-crc",
                         os.path.join(DATA, "single", name + ".ckpt"), "--dec-key-file",
                         key_file(work, length)]).stdout
        assert got == oracle, name
    proc = itest.run([args.ckptfs, "inspect", os.path.join(DATA, "single", "sm4_cbc.ckpt")],
                     check=False)
    assert proc.returncode != 0 and "--dec-key-file" in proc.stderr, proc.stderr


def main():
    args = itest.parse_args()
    args.ckptfs = os.path.abspath(args.ckptfs)
    checks = itest.Checks(args.only)
    checks.run("single files, every mode: the views of MindSpore's unencrypted oracle",
               single_views, args)
    checks.run("4 ranks resharded 4->2, every mode: the oracle ranks' reshard byte for byte; "
               "materialize 0600, verify",
               dist_reshard, args)
    checks.run("8 threads reading the views in pieces of 1 B to 1 MiB", concurrent_reads, args)
    checks.run("allow_other with --allow-other-decrypted", allow_other_when_asked, args)
    checks.run("key from a hex environment variable", key_from_env, args)
    checks.run("refused at mount: no key, a 0644 key file, a wrong key (GCM, CBC), a flipped "
               "GCM byte, allow_other; index build", refusals, args)
    checks.run("views 0400 of the mounting user, no hex of decrypted bytes, nothing indexed",
               exposure, args)
    checks.run("inspect with the key: the oracle's parameters and offsets", inspect_plaintext,
               args)
    checks.finish()


if __name__ == "__main__":
    main()
