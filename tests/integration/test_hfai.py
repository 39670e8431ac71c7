"""hfai sharded PyTorch checkpoints (PART_*.pt) mounted as the merged model.

Expected bytes come from the fixture tools, not from ckptfs: expected/merged_model_<tag>.safetensors
(byte-identical to the reference safetensors writer), expected/manifest_<tag>.json (sha256 of every
merged tensor's C-order bytes) and expected/hfai_<tag>_n<N>.tree.json (what hfai.checkpoint.load
returns). With Debian's python3-torch, the PART files are also loaded by torch.load and merged with
hfai's rule, and every tensor compared with the mounted one.
"""

import hashlib
import json
import os
import shutil
import struct

import itest

SETS = ["hfai_t113_n1", "hfai_t113_n2", "hfai_t113_n4", "hfai_t26_n2", "hfai_t26_n4"]


def read_safetensors(path):
    raw = itest.read_file(path)
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    meta = header.pop("__metadata__", None)
    data = raw[8 + n:]
    return meta, {k: (v, data[v["data_offsets"][0]:v["data_offsets"][1]]) for k, v in header.items()}


def manifest_name(path):
    """The mounted file and tensor name of a manifest path (["optimizer", "state", 4, "exp_avg"])."""
    if path[0] == "model":
        return "model.safetensors", path[1]
    if path[0] == "optimizer":
        return "optimizer.safetensors", ".".join(str(p) for p in path[1:])
    return "others.safetensors", ".".join(str(p) for p in path)


def check_set(args, name):
    tag = name.split("_")[1]
    data = os.path.join(args.shared, "hfai")
    mnt = os.path.join(args.work, "mnt_" + name)
    with itest.mounted(args.ckptfs, os.path.join(data, name), mnt,
                       index_dir=os.path.join(args.work, "index")):
        listing = sorted(os.listdir(mnt))
        assert listing == ["extra.json", "model.safetensors", "optimizer.safetensors",
                           "others.safetensors"], listing
        expected = itest.read_file(os.path.join(data, "expected", f"merged_model_{tag}.safetensors"))
        assert itest.read_file(os.path.join(mnt, "model.safetensors")) == expected
        # Random windows read on their own give the same bytes.
        with open(os.path.join(mnt, "model.safetensors"), "rb") as f:
            for off, length in [(0, 1), (1100, 5000), (5000, 777), (20000, 4000)]:
                f.seek(off)
                assert f.read(length) == expected[off:off + length]
        files = {}
        for fname in ["model.safetensors", "optimizer.safetensors", "others.safetensors"]:
            meta, tensors = read_safetensors(os.path.join(mnt, fname))
            assert meta == {"format": "pt"}, meta
            files[fname] = tensors
        manifest = json.load(open(os.path.join(data, "expected", f"manifest_{tag}.json")))
        seen = 0
        for t in manifest["tensors"]:
            fname, tname = manifest_name(t["path"])
            entry, raw = files[fname][tname]
            assert entry["dtype"] == t["dtype"] and entry["shape"] == t["shape"], (tname, entry, t)
            assert hashlib.sha256(raw).hexdigest() == t["sha256"], tname
            seen += 1
        assert seen == sum(len(v) for v in files.values()), "tensors the manifest does not list"
        extra = json.load(open(os.path.join(mnt, "extra.json")))
        tree = json.load(open(os.path.join(data, "expected", f"{name}.tree.json")))["merged"]
        want = [[k, v] for k, v in tree["$dict"] if k != "model"]
        compare_tree(want, extra["$dict"], files)


def compare_tree(want, got, files):
    """The expected tree with each tensor as the reference to the mounted tensor."""
    if isinstance(want, dict) and "$tensor" in want:
        fname, tname = got["$tensor"].split(":", 1)
        entry, _ = files[fname][tname]
        assert entry["shape"] == want["$tensor"]["shape"], tname
        return
    assert type(want) is type(got), (want, got)
    if isinstance(want, list):
        assert len(want) == len(got), (want, got)
        for a, b in zip(want, got):
            compare_tree(a, b, files)
    elif isinstance(want, dict):
        assert sorted(want) == sorted(got), (want, got)
        for k in want:
            compare_tree(want[k], got[k], files)
    else:
        assert want == got, (want, got)


def check_with_torch(args, name):
    """torch.load of every PART file, merged with hfai's rule, against the mounted model."""
    import torch  # Debian's python3-torch (scripts/install-deps.sh)
    data = os.path.join(args.shared, "hfai", name)
    n = len([f for f in os.listdir(data) if f.startswith("PART_")])
    parts = [torch.load(os.path.join(data, f"PART_{i:03d}.pt"), map_location="cpu") for i in range(n)]
    merged, chunks = {}, {}
    for p in parts:
        small, large = p["model"][0]
        merged.update(small)
        for key, (shape, chunk) in large.items():
            chunks.setdefault(key, (shape, []))[1].append(chunk)
    for key, (shape, pieces) in chunks.items():
        merged[key] = torch.cat(pieces).view(shape)
    mnt = os.path.join(args.work, "mnt_torch_" + name)
    with itest.mounted(args.ckptfs, data, mnt, index_dir=os.path.join(args.work, "index")):
        _, tensors = read_safetensors(os.path.join(mnt, "model.safetensors"))
    assert sorted(tensors) == sorted(merged), (sorted(tensors), sorted(merged))
    for key, value in merged.items():
        raw = value.contiguous().view(-1).view(torch.uint8).numpy().tobytes() if value.numel() else b""
        assert tensors[key][1] == raw, key
        assert tensors[key][0]["shape"] == list(value.shape), key


def refused(args, src, *needles):
    mnt = os.path.join(args.work, "mnt_bad")
    os.makedirs(mnt, exist_ok=True)
    proc = itest.run(itest.mount_cmd(args.ckptfs, src, mnt,
                                     index_dir=os.path.join(args.work, "index")), check=False)
    assert not itest.is_mounted(mnt), "a refused mount left a mount behind"
    assert proc.returncode != 0, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])


def damaged_copy(args, label, edit):
    src = os.path.join(args.shared, "hfai", "hfai_t113_n4")
    dst = os.path.join(args.work, "bad_" + label)
    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(src, dst)
    for f in os.listdir(dst):
        os.chmod(os.path.join(dst, f), 0o644)
    edit(dst)
    return dst


def patch(path, old, new):
    raw = itest.read_file(path)
    assert len(old) == len(new) and old in raw
    with open(path, "wb") as f:
        f.write(raw.replace(old, new, 1))


def check_refusals(args):
    d = damaged_copy(args, "missing", lambda d: os.remove(os.path.join(d, "PART_001.pt")))
    refused(args, d, "PART_001.pt is missing")
    d = damaged_copy(args, "count", lambda d: os.remove(os.path.join(d, "PART_003.pt")))
    refused(args, d, "PART_000.pt", "__nshards__ is 4 but the directory holds 3")
    d = damaged_copy(args, "name", lambda d: shutil.copy(os.path.join(d, "PART_003.pt"),
                                                         os.path.join(d, "PART_0004.pt")))
    refused(args, d, "PART_0004.pt is not a PART file name")
    d = damaged_copy(args, "version", lambda d: patch(os.path.join(d, "PART_002.pt"),
                                                      b"2.0.0", b"1.0.0"))
    refused(args, d, "PART_002.pt", "__version__")
    d = damaged_copy(args, "global", lambda d: patch(os.path.join(d, "PART_001.pt"),
                                                     b"collections\nOrderedDict",
                                                     b"subprocess\nOrderedDictx"))
    refused(args, d, "PART_001.pt", "unsupported object subprocess.OrderedDictx")
    # A chunk cut short: rank 3's proj.weight chunk of 266 elements claims 265.
    d = damaged_copy(args, "chunk", lambda d: patch(
        os.path.join(d, "PART_003.pt"), b"K\x00M\n\x01\x85", b"K\x00M\t\x01\x85"))
    refused(args, d, "PART_003.pt", "proj.weight", "265 elements")


def check_inspect(args):
    part = os.path.join(args.shared, "hfai", "hfai_t113_n4", "PART_003.pt")
    out = itest.run([args.ckptfs, "inspect", part]).stdout
    rows = [line.split() for line in out.splitlines()]
    assert ["model/0/1/proj.weight/1", "F32", "[266]", "[1]", "0", "1064", "6720+1064"] in rows, out
    assert "__nshards__ = 4" in out, out
    j = json.loads(itest.run([args.ckptfs, "inspect", "--json", part]).stdout)
    assert j["format"] == "torch.save" and len(j["tensors"]) == 13
    legacy = os.path.join(args.shared, "hfai", "plain", "legacy_format_t113.pt")
    proc = itest.run([args.ckptfs, "inspect", legacy], check=False)
    assert proc.returncode == 1 and "legacy torch.save format" in proc.stderr, proc.stderr


def main():
    args = itest.parse_args()
    checks = itest.Checks(args.only)
    for name in SETS:
        checks.run(f"merged views of {name}", check_set, args, name)
    for name in ["hfai_t113_n4", "hfai_t26_n2"]:
        checks.run(f"torch.load + hfai merge of {name} equals the mount", check_with_torch, args, name)
    checks.run("bad hfai directories are refused in one line", check_refusals, args)
    checks.run("inspect of PART files", check_inspect, args)
    checks.finish()


if __name__ == "__main__":
    main()
