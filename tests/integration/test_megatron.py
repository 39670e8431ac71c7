"""Megatron-Core `torch_dist` checkpoints (a save root with latest_checkpointed_iteration.txt and
iter_*/ directories of DCP files plus metadata.json and common.pt) mounted as their merged
model.safetensors, model weights only.

tests/data/megatron/save/ was written by real Megatron-Core 0.16.1 (TP 2 x PP 2 on 4 gloo
processes, tests/data/megatron/README.md); reference.safetensors holds every model tensor whole,
assembled by the generator from each rank's local ShardedTensor data at its global offset (never
from the saved files): the expected bytes. reference.json names the stacked tensors.
"""

import hashlib
import json
import os
import shutil

import itest
import test_hfai  # its safetensors parser


def read_safetensors(path):
    meta, tensors = test_hfai.read_safetensors(path)
    return meta, {k: (v["dtype"], v["shape"], data) for k, (v, data) in tensors.items()}


def data(args, *parts):
    return os.path.join(args.shared, "megatron", *parts)


def copy_save(args, tag):
    dst = os.path.join(args.work, "save_" + tag)
    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(data(args, "save"), dst)
    return dst


def reference(args):
    return read_safetensors(data(args, "reference.safetensors"))[1]


def mount_and_read(args, src, tag, extra=()):
    """(stderr lines of the mount, {name: (dtype, shape, bytes)} of its model.safetensors)."""
    mnt = os.path.join(args.work, "mnt_" + tag)
    os.makedirs(mnt, exist_ok=True)
    with itest.unmounting(args.ckptfs, mnt):
        proc = itest.run(itest.mount_cmd(args.ckptfs, src, mnt,
                                         index_dir=os.path.join(args.work, "index"),
                                         extra_args=extra))
        assert sorted(os.listdir(mnt)) == ["model.safetensors"], os.listdir(mnt)
        meta, got = read_safetensors(os.path.join(mnt, "model.safetensors"))
        assert meta == {"format": "pt"}, meta
    return itest.stderr_lines(proc), got


def refused(args, src, *needles, extra=()):
    mnt = os.path.join(args.work, "mnt_refused")
    proc = itest.refused_mount(args.ckptfs, src, mnt, index_dir=os.path.join(args.work, "index"),
                               extra_args=extra)
    lines = itest.stderr_lines(proc)
    assert len(lines) == 1, proc.stderr
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])


def check_merged(args):
    """The save root's latest iteration: every model tensor of the reference, bytes equal; the
    optimizer tensor and the objects are not served but named, one line each."""
    expected = reference(args)
    lines, got = mount_and_read(args, copy_save(args, "merged"), "merged")
    assert sorted(got) == sorted(expected), (sorted(got), sorted(expected))
    for name, want in expected.items():
        assert got[name] == want, f"tensor {name} differs from the reference"
    optimizer = [line for line in lines if "optimizer items are not served" in line]
    assert len(optimizer) == 1 and "optimizer.distributed.dp_group_idx_0" in optimizer[0], lines
    objects = [line for line in lines if "ShardedObjects are not served" in line]
    assert len(objects) == 1 and "21 items" in objects[0] and "common.pt" in objects[0], \
        lines
    assert any("Megatron-Core torch_dist checkpoint" in line and "iter_0000007" in line
               for line in lines), lines


def check_step(args):
    """--step: an iteration number picks iter_<7 digits>; one iteration directory is mounted
    as given; refusals say what to give."""
    src = copy_save(args, "step")
    expected = reference(args)
    _, got = mount_and_read(args, src, "step", extra=["--step", "7"])
    assert got == expected
    _, got = mount_and_read(args, os.path.join(src, "iter_0000007"), "iterdir")
    assert got == expected
    refused(args, os.path.join(src, "iter_0000007"), "an iteration directory is one checkpoint",
            "--step 7", extra=["--step", "7"])
    refused(args, src, "iter_0000008", "metadata.json", extra=["--step", "8"])
    refused(args, src, "--step 10_100", "latest or an iteration number", extra=["--step", "10_100"])
    with open(os.path.join(src, "latest_checkpointed_iteration.txt"), "w") as f:
        f.write("seven")
    refused(args, src, "latest_checkpointed_iteration.txt", "--step ITERATION")


def check_backend(args):
    """A sharded_backend other than torch_dist is refused in one line naming metadata.json."""
    src = copy_save(args, "backend")
    path = os.path.join(src, "iter_0000007", "metadata.json")
    with open(path) as f:
        doc = json.load(f)
    doc["sharded_backend"] = "zarr"
    with open(path, "w") as f:
        json.dump(doc, f)
    refused(args, src, "metadata.json", '"zarr"', "torch_dist")


def unstacked_reference(args):
    """The reference with each stacked [L, ...] tensor cut into L tensors decoder.layers.<i>.NAME
    by NumPy: what --unstack-layers serves."""
    import numpy as np
    info = json.loads(itest.read_file(data(args, "reference.json")))
    assert info["stacked"], info
    want = {}
    size = {"F32": 4, "BF16": 2, "F16": 2}
    for name, (dtype, shape, raw) in reference(args).items():
        if name not in info["stacked"]:
            want[name] = (dtype, shape, raw)
            continue
        a = np.frombuffer(raw, dtype=np.dtype(f"V{size[dtype]}")).reshape(shape)
        for i in range(shape[0]):
            layer = name.replace("layers.", f"layers.{i}.", 1)
            want[layer] = (dtype, shape[1:], np.ascontiguousarray(a[i]).tobytes())
    return want


def check_unstack(args):
    """--unstack-layers: each stacked [L, ...] tensor becomes L tensors decoder.layers.<i>.NAME,
    layer i's bytes cut from the reference; the other tensors are unchanged."""
    want = unstacked_reference(args)
    _, got = mount_and_read(args, copy_save(args, "unstack"), "unstack",
                            extra=["--unstack-layers"])
    assert sorted(got) == sorted(want), (sorted(got), sorted(want))
    for name in want:
        assert got[name] == want[name], f"tensor {name} differs"


# A 2-device layout of the unstacked tensors: column and row splits of layer 1 and 3 only, the
# rest replicated (a rule naming one layer is what per-layer names allow).
UNSTACK_RULES = [r"decoder\.layers\.[13]\.self_attention\.linear_qkv\.weight=0",
                 r"decoder\.layers\.[13]\.mlp\.linear_fc2\.weight=1",
                 r"embedding\.word_embeddings\.weight=0"]


def check_unstack_reshard(args):
    """--unstack-layers with --dst-strategy from `strategy new --unstack-layers`: each rank's
    file holds every per-layer tensor's block, cut by NumPy from the reference; a strategy written
    without --unstack-layers (stacked names) does not fit the unstacked view and is refused."""
    import numpy as np
    import re
    src = copy_save(args, "unstack_reshard")
    strategy = os.path.join(args.work, "unstack_tp2.json")
    rules = [arg for rule in UNSTACK_RULES for arg in ("--split", rule)]
    itest.run([args.ckptfs, "strategy", "new", src, "--unstack-layers", "--devices", "2", *rules,
               "--replicate", ".*", "-o", strategy])
    want = unstacked_reference(args)
    size = {"F32": 4, "BF16": 2, "F16": 2}
    mnt = os.path.join(args.work, "mnt_unstack_reshard")
    with itest.mounted(args.ckptfs, src, mnt, dst_strategy=strategy,
                       index_dir=os.path.join(args.work, "index"),
                       extra_args=["--unstack-layers"]):
        assert sorted(os.listdir(mnt)) == ["rank_0", "rank_1"], os.listdir(mnt)
        for rank in range(2):
            _, got = read_safetensors(os.path.join(mnt, f"rank_{rank}",
                                                   f"checkpoint_{rank}.safetensors"))
            assert sorted(got) == sorted(want), (sorted(got), sorted(want))
            split = 0
            for name, (dtype, shape, raw) in want.items():
                dims = [int(r.rsplit("=", 1)[1]) for r in UNSTACK_RULES
                        if re.fullmatch(r.rsplit("=", 1)[0], name)]
                if dims:
                    split += 1
                    a = np.frombuffer(raw, dtype=np.dtype(f"V{size[dtype]}")).reshape(shape)
                    raw = np.ascontiguousarray(np.split(a, 2, axis=dims[0])[rank]).tobytes()
                    shape = list(a.shape)
                    shape[dims[0]] //= 2
                assert got[name] == (dtype, shape, raw), f"rank {rank}: tensor {name} differs"
            assert split == 5, split
    # With --rename too: the strategy and the view name the renamed per-layer tensors.
    rules_file = os.path.join(args.work, "rename_layers.txt")
    with open(rules_file, "w") as f:
        f.write("decoder\\.layers\\.([0-9]+)\\.(.*)\tmodel.layers.\\1.\\2\n")
    renamed = os.path.join(args.work, "unstack_renamed_tp2.json")
    itest.run([args.ckptfs, "strategy", "new", src, "--unstack-layers", "--rename", rules_file,
               "--devices", "2", "--split", r"model\.layers\.1\.mlp\.linear_fc2\.weight=1",
               "--replicate", ".*", "-o", renamed])
    with itest.mounted(args.ckptfs, src, mnt, dst_strategy=renamed,
                       index_dir=os.path.join(args.work, "index"),
                       extra_args=["--unstack-layers", "--rename", rules_file]):
        _, got = read_safetensors(os.path.join(mnt, "rank_1", "checkpoint_1.safetensors"))
        new_name = {re.sub(r"^decoder\.layers\.([0-9]+)\.", r"model.layers.\1.", n): n
                    for n in want}
        assert sorted(got) == sorted(new_name), sorted(got)
        dtype, shape, raw = want["decoder.layers.1.mlp.linear_fc2.weight"]
        a = np.frombuffer(raw, dtype=np.dtype(f"V{size[dtype]}")).reshape(shape)
        assert got["model.layers.1.mlp.linear_fc2.weight"][2] == \
            np.ascontiguousarray(np.split(a, 2, axis=1)[1]).tobytes()
        for name, old in new_name.items():
            if name != "model.layers.1.mlp.linear_fc2.weight":
                assert got[name] == want[old], f"tensor {name} differs"
    stacked = os.path.join(args.work, "stacked_tp2.json")
    itest.run([args.ckptfs, "strategy", "new", src, "--devices", "2", "--replicate", ".*", "-o",
               stacked])
    proc = itest.refused_mount(args.ckptfs, src, mnt, index_dir=os.path.join(args.work, "index"),
                               extra_args=["--unstack-layers", "--dst-strategy", stacked])
    assert "decoder.layers.mlp." in proc.stderr and "is not in the checkpoint" in proc.stderr, \
        proc.stderr


def check_unstack_refused(args):
    """--unstack-layers on a checkpoint without stacked layers (a plain DCP one) is refused, by
    mount and by strategy new."""
    src = os.path.join(args.work, "plain_dcp")
    shutil.rmtree(src, ignore_errors=True)
    shutil.copytree(os.path.join(args.shared, "dcp", "plain"), src)
    refused(args, src, "--unstack-layers", "pytorch-dcp", extra=["--unstack-layers"])
    proc = itest.run([args.ckptfs, "strategy", "new", src, "--unstack-layers", "--devices", "2",
                      "-o", os.path.join(args.work, "never.json")], check=False)
    assert proc.returncode != 0 and "--unstack-layers" in proc.stderr and \
        "no stacked layers" in proc.stderr, proc.stderr


def write_integrity(iter_dir):
    """integrity.json as Megatron-Core writes it ({"algorithm": "sha256", "files": {name:
    hex}}), digests made here with hashlib."""
    files = {}
    for name in sorted(os.listdir(iter_dir)):
        with open(os.path.join(iter_dir, name), "rb") as f:
            files[name] = hashlib.sha256(f.read()).hexdigest()
    with open(os.path.join(iter_dir, "integrity.json"), "w") as f:
        json.dump({"algorithm": "sha256", "files": files}, f)


def check_integrity(args):
    """verify checks integrity.json: all well when every digest matches; a changed byte in a
    data file is named."""
    src = copy_save(args, "integrity")
    iter_dir = os.path.join(src, "iter_0000007")
    write_integrity(iter_dir)
    out = itest.run([args.ckptfs, "verify", src, "--index-dir", os.path.join(args.work, "index")])
    assert "verify: all well" in out.stdout and "integrity.json" in out.stdout, out.stdout
    victim = os.path.join(iter_dir, "common.pt")
    raw = bytearray(itest.read_file(victim))
    raw[-1] ^= 1
    with open(victim, "wb") as f:
        f.write(raw)
    proc = itest.run([args.ckptfs, "verify", src, "--index-dir",
                      os.path.join(args.work, "index")], check=False)
    assert proc.returncode != 0, proc.stdout
    said = proc.stdout + proc.stderr
    assert "common.pt: SHA-256" in said and "integrity.json records" in said, \
        said


def main():
    args = itest.parse_args()
    checks = itest.Checks(args.only)
    checks.run("merged model.safetensors of a Megatron save root equals the reference",
               check_merged, args)
    checks.run("--step and an iteration directory", check_step, args)
    checks.run("a sharded_backend other than torch_dist is refused", check_backend, args)
    checks.run("--unstack-layers serves each layer of a stacked tensor", check_unstack, args)
    checks.run("--unstack-layers with --dst-strategy from strategy new --unstack-layers",
               check_unstack_reshard, args)
    checks.run("--unstack-layers on a checkpoint without stacked layers is refused",
               check_unstack_refused, args)
    checks.run("verify checks integrity.json", check_integrity, args)
    checks.finish()


if __name__ == "__main__":
    main()
