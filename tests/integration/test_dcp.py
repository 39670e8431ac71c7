"""PyTorch Distributed Checkpoint (DCP) directories mounted as their merged model.safetensors.

The fixtures in tests/data/dcp/ were written by real torch 2.6 (tests/data/dcp/README.md), and
each `<case>.reference.safetensors` holds the full tensors the case started from, written by the
safetensors package before any sharding: the expected bytes. Both files are parsed by the tests'
own small parser (test_hfai's), and the mounted file is also opened by the reference `safetensors`
package (safe_open with numpy, 0.7.0 from build/test-venv). The damaged copies of tests/data/dcp/
bad/ must each be refused at mount with one line naming the file.
"""

import hashlib
import json
import os
import shutil
import subprocess

import itest
import test_hfai  # its safetensors parser

CASES = ["plain", "fsdp", "tp", "objects", "threads"]
SHARED_DCP = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data", "dcp")


def read_safetensors(path):
    """{name: (dtype, shape, bytes)} and the metadata of a safetensors file."""
    meta, tensors = test_hfai.read_safetensors(path)
    return meta, {k: (v["dtype"], v["shape"], data) for k, (v, data) in tensors.items()}


def copy_case(args, case, tag=""):
    """A fresh copy of the fixture `case` (its hidden .metadata too) in the work folder."""
    dst = os.path.join(args.work, f"src_{case}{tag}")
    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(os.path.join(args.shared, "dcp", case), dst)
    return dst


def md5(path):
    return hashlib.md5(itest.read_file(path)).hexdigest()


def check_case(args, case):
    """The mount serves one file, model.safetensors, holding every reference tensor under its
    name, with its dtype, shape and bytes; ls -l gives its size; two reads agree."""
    src = copy_case(args, case)
    mnt = os.path.join(args.work, "mnt_" + case)
    _, expected = read_safetensors(os.path.join(args.shared, "dcp", case + ".reference.safetensors"))
    with itest.mounted(args.ckptfs, src, mnt, index_dir=os.path.join(args.work, "index")):
        assert sorted(os.listdir(mnt)) == ["model.safetensors"], os.listdir(mnt)
        path = os.path.join(mnt, "model.safetensors")
        meta, got = read_safetensors(path)
        assert meta == {"format": "pt"}, meta
        assert sorted(got) == sorted(expected), (sorted(got), sorted(expected))
        for name, (dtype, shape, data) in expected.items():
            assert got[name][0] == dtype and got[name][1] == shape, (name, got[name][:2], dtype, shape)
            assert got[name][2] == data, f"{case}: tensor {name}: bytes differ from the reference"
        size = len(itest.read_file(path))
        ls = subprocess.run(["ls", "-l", path], capture_output=True, text=True, check=True).stdout
        assert int(ls.split()[4]) == size == os.stat(path).st_size, (ls, size)
        assert md5(path) == md5(path)
        check_safe_open(path, expected)


def check_safe_open(path, expected):
    """The reference safetensors package opens the mounted file lazily: every key, and the bytes
    of every tensor numpy can hold (numpy has no bfloat16)."""
    try:
        import numpy  # noqa: F401
    except ImportError:  # this check only: the bytes were compared above
        print("safe_open not tried: /usr/bin/python3 has no numpy", flush=True)
        return
    safe_open = itest.import_from_test_venv("safetensors").safe_open
    with safe_open(path, framework="np") as f:
        assert sorted(f.keys()) == sorted(expected), sorted(f.keys())
        for name, (dtype, shape, data) in expected.items():
            if dtype == "BF16":
                continue
            t = f.get_tensor(name)
            assert list(t.shape) == shape, (name, t.shape, shape)
            assert t.tobytes() == data, f"safe_open: tensor {name} differs from the reference"


def refused(args, src, *needles, **kwargs):
    mnt = os.path.join(args.work, "mnt_refused")
    proc = itest.refused_mount(args.ckptfs, src, mnt, index_dir=os.path.join(args.work, "index"),
                               **kwargs)
    lines = itest.stderr_lines(proc)
    assert len(lines) == 1, proc.stderr
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


# Each damaged copy of tests/data/dcp/bad/ (fsdp's data files with the damaged files over them)
# and what its one line must say.
BAD = {
    "bad_size": ["__0_0.distcp", '"w"', "data/0 record of 128 bytes", "take 64"],
    "bounds": [".metadata", '"layers.0.w"', "outside it"],
    "compressed": [".metadata", '"w"', "stream.zstd/1", "compressed"],
    "foreign": [".metadata", '"argparse.Namespace"'],
    "gap": [".metadata", '"layers.0.w"', "120 of its 128 elements"],
    "items_overlap": ["__0_0.distcp", '"layers.0.w"', '"layers.0.b"', "overlap"],
    "no_storage": [".metadata", '"odd"', "no storage entry"],
    "overlap": [".metadata", '"layers.0.w"', "overlap"],
    "past_end": ["__0_0.distcp", '"layers.0.w"', "past the end"],
}


def check_bad(args):
    assert sorted(BAD) == sorted(os.listdir(os.path.join(args.shared, "dcp", "bad")))
    for kind, needles in BAD.items():
        src = copy_case(args, "fsdp", "_" + kind)
        shutil.copytree(os.path.join(args.shared, "dcp", "bad", kind), src, dirs_exist_ok=True)
        refused(args, src, *needles)


def check_refused_options(args):
    """What the merged view cannot do is refused in one line naming the checkpoint."""
    src = copy_case(args, "fsdp", "_options")
    refused(args, src, src, "model.safetensors only", "--view ckpt", extra_args=["--view", "ckpt"])
    refused(args, src, src, "omit --src-strategy", src_strategy=os.path.join(src, ".metadata"))
    refused(args, src, src, "one merged model", "--ranks", extra_args=["--ranks", "0"])


def check_rank_local(args):
    """A save without collectives (__<rank>.metadata only) is refused in one line."""
    src = copy_case(args, "fsdp", "_local")
    os.rename(os.path.join(src, ".metadata"), os.path.join(src, "__0.metadata"))
    refused(args, src, src, "rank-local DCP checkpoint", "__<rank>.metadata")


def check_objects_named(args):
    """The BYTE_IO items are named in one warning line at mount, and not served."""
    src = copy_case(args, "objects", "_warn")
    mnt = os.path.join(args.work, "mnt_objects_warn")
    names = json.loads(itest.read_file(os.path.join(args.shared, "dcp", "objects.objects.json")))
    os.makedirs(mnt, exist_ok=True)
    with itest.unmounting(args.ckptfs, mnt):
        proc = itest.run(itest.mount_cmd(args.ckptfs, src, mnt,
                                         index_dir=os.path.join(args.work, "index")))
        lines = [line for line in itest.stderr_lines(proc) if "non-tensor" in line]
        assert len(lines) == 1, proc.stderr
        assert f"{len(names)} non-tensor items are not served" in lines[0], lines[0]
        for name in names:
            assert name in lines[0], (name, lines[0])
        assert os.listdir(mnt) == ["model.safetensors"], os.listdir(mnt)


def check_metadata_saved_again(args):
    """A .metadata saved again after the data files were indexed, naming the tensor `norm`
    `NORM` (the index keys a data file's scan by that file alone, and the scans name chunks by
    their tensor): the scans taken against the old .metadata are taken again, and the mount
    serves the reference bytes under the new name."""
    src = copy_case(args, "tp", "_again")
    index = os.path.join(args.work, "index_again")
    mnt = os.path.join(args.work, "mnt_again")
    _, expected = read_safetensors(os.path.join(args.shared, "dcp", "tp.reference.safetensors"))
    with itest.mounted(args.ckptfs, src, mnt, index_dir=index):
        pass
    path = os.path.join(src, ".metadata")
    raw = itest.read_file(path)
    assert raw.count(b"norm") == 4 and raw.count(b"\x8c\x04norm") == 4  # pickled strings only
    with open(path, "wb") as f:
        f.write(raw.replace(b"\x8c\x04norm", b"\x8c\x04NORM"))
    with itest.mounted(args.ckptfs, src, mnt, index_dir=index):
        _, got = read_safetensors(os.path.join(mnt, "model.safetensors"))
    expected["NORM"] = expected.pop("norm")
    assert got == expected, sorted(got)


# Per case: the rules of a 2-device strategy (`strategy new`), each tensor split along a
# dimension other than the one torch sharded it along where it can be.
RESHARD = {
    "fsdp": ["--split", r"layers\.0\.w=1", "--split", "big=0", "--split", "few=1",
             "--split", r"layers\.0\.b=0"],
    "tp": ["--split", "col=0", "--split", "row=1", "--split", "norm=0"],
    "plain": ["--split", "w=1", "--split", "h=1", "--split", "b=0"],
    "threads": ["--split", "a=1", "--split", "d=0", "--split", "c=0"],
}
ELEMENT = {"F64": 8, "I64": 8, "F32": 4, "I32": 4, "F16": 2, "BF16": 2, "BOOL": 1}


def expected_block(dtype, shape, data, dim, rank, devices):
    """The bytes of `rank`'s block of a tensor split `devices` ways along `dim` (None: whole),
    cut with NumPy from the reference's bytes."""
    import numpy as np
    if dim is None:
        return data
    a = np.frombuffer(data, dtype=np.dtype(f"V{ELEMENT[dtype]}")).reshape(shape)
    return np.ascontiguousarray(np.split(a, devices, axis=dim)[rank]).tobytes()


def check_reshard(args, case):
    """--dst-strategy from `strategy new` (2 devices, the rules above): every rank's
    checkpoint_<r>.safetensors holds each tensor's block, cut here from the reference."""
    src = copy_case(args, case, "_reshard")
    _, expected = read_safetensors(os.path.join(args.shared, "dcp", case + ".reference.safetensors"))
    shapes = os.path.join(args.work, f"shapes_{case}.json")
    with open(shapes, "w") as f:
        json.dump({name: shape for name, (_, shape, _) in expected.items()}, f)
    strategy = os.path.join(args.work, f"dst_{case}.json")
    itest.run([args.ckptfs, "strategy", "new", shapes, "--devices", "2", *RESHARD[case],
               "--replicate", ".*", "-o", strategy])
    rules = dict(RESHARD[case][i + 1].replace("\\", "").split("=") for i in
                 range(0, len(RESHARD[case]), 2))
    mnt = os.path.join(args.work, "mnt_reshard_" + case)
    with itest.mounted(args.ckptfs, src, mnt, dst_strategy=strategy,
                       index_dir=os.path.join(args.work, "index")):
        assert sorted(os.listdir(mnt)) == ["rank_0", "rank_1"], os.listdir(mnt)
        for rank in range(2):
            _, got = read_safetensors(os.path.join(mnt, f"rank_{rank}",
                                                   f"checkpoint_{rank}.safetensors"))
            assert sorted(got) == sorted(expected), (sorted(got), sorted(expected))
            for name, (dtype, shape, data) in expected.items():
                dim = int(rules[name]) if name in rules else None
                want = expected_block(dtype, shape, data, dim, rank, 2)
                assert got[name][0] == dtype, (name, got[name][0], dtype)
                assert got[name][2] == want, f"{case} rank {rank}: tensor {name} differs"


def metadata_order(case):
    """The tensors' keys in the order the saved state dict held them, read from the case's
    .metadata with Python's own unpickler, every class it names stood in for by a stub (so no
    torch is needed and nothing of ckptfs is used)."""
    import pickle

    class Meta(type):
        def __getattr__(cls, name):  # enum members pickled as getattr(Class, 'NAME')
            return cls

    class Stub(metaclass=Meta):
        def __init__(self, *args, **kwargs):
            self.args = args

        def __setstate__(self, state):
            self.state = state

    class Unpickler(pickle.Unpickler):
        def find_class(self, module, name):
            if (module, name) == ("builtins", "getattr"):
                return getattr
            return type(name, (Stub,), {})

    with open(os.path.join(SHARED_DCP, case, ".metadata"), "rb") as f:
        md = Unpickler(f).load()
    return [k for k, v in md.state["state_dict_metadata"].items()
            if type(v).__name__ == "TensorStorageMetadata"]


def expected_shards(case, max_size, rename=lambda k: k):
    """{file: [served names]} and the index.json bytes save_pretrained would write for the
    case's reference tensors (None: one model.safetensors)."""
    _, reference = read_safetensors(os.path.join(SHARED_DCP, case + ".reference.safetensors"))
    sizes = {rename(k): len(data) for k, (_, _, data) in reference.items()}
    shards = itest.hf_split([rename(k) for k in metadata_order(case)], sizes, max_size)
    if len(shards) == 1:
        return {"model.safetensors": shards[0]}, None
    files = {f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors": keys
             for i, keys in enumerate(shards)}
    index = {"metadata": {"total_size": sum(sizes.values())},
             "weight_map": {k: f for f, keys in files.items() for k in keys}}
    return files, json.dumps(index, indent=2, sort_keys=True) + "\n"


def check_served_files(mnt, case, files, index, rename=lambda k: k):
    """The mount lists exactly `files` (and the index); the index has save_pretrained's bytes;
    each file holds its tensors with the reference's dtype, shape and bytes, read by the tests'
    parser and by the safetensors package."""
    _, reference = read_safetensors(os.path.join(SHARED_DCP, case + ".reference.safetensors"))
    expected = {rename(k): v for k, v in reference.items()}
    names = sorted(files) + ([] if index is None else ["model.safetensors.index.json"])
    assert sorted(os.listdir(mnt)) == names, (os.listdir(mnt), names)
    if index is not None:
        got = itest.read_file(os.path.join(mnt, "model.safetensors.index.json")).decode()
        assert got == index, (got, index)
    for name, keys in files.items():
        path = os.path.join(mnt, name)
        meta, got = read_safetensors(path)
        assert meta == {"format": "pt"}, (name, meta)
        assert sorted(got) == sorted(keys), (name, sorted(got), sorted(keys))
        for key in keys:
            assert got[key] == expected[key], f"{case} {name}: tensor {key} differs"
        check_safe_open(path, {k: expected[k] for k in keys})


# Per case, a --shard-size that cuts its few hundred bytes into several shards, one tensor over
# the size at least.
SHARD_SIZES = {"plain": 64, "fsdp": 100, "tp": 300, "threads": 64}


def check_sharded(args, case):
    """--shard-size: model-0000k-of-0000n.safetensors and model.safetensors.index.json exactly
    as save_pretrained would write them from the reference tensors."""
    files, index = expected_shards(case, SHARD_SIZES[case])
    assert index is not None and len(files) > 2, files
    src = copy_case(args, case, "_sharded")
    mnt = os.path.join(args.work, "mnt_sharded_" + case)
    with itest.mounted(args.ckptfs, src, mnt, index_dir=os.path.join(args.work, "index"),
                       extra_args=["--shard-size", str(SHARD_SIZES[case])]):
        check_served_files(mnt, case, files, index)


def check_shard_size_forms(args):
    """A model within the size, and --shard-size 0 or none, give one model.safetensors; sizes
    with units are read as save_pretrained reads them."""
    src = copy_case(args, "fsdp", "_forms")
    mnt = os.path.join(args.work, "mnt_forms")
    for size in ["0", "none", "692", "1KB", "5GB"]:  # fsdp's tensors hold 692 bytes
        with itest.mounted(args.ckptfs, src, mnt, index_dir=os.path.join(args.work, "index"),
                           extra_args=["--shard-size", size]):
            assert os.listdir(mnt) == ["model.safetensors"], (size, os.listdir(mnt))
    with itest.mounted(args.ckptfs, src, mnt, index_dir=os.path.join(args.work, "index"),
                       extra_args=["--shard-size", "0.1KB"]):
        check_served_files(mnt, "fsdp", *expected_shards("fsdp", 100))


FSDP_RULES = ("# fsdp's keys as a loader names them\n"
              "layers\\.([0-9]+)\\.w\tmodel.layers.\\1.weight\n"
              "layers\\.([0-9]+)\\.(.)   model.layers.\\1.\\2\n"
              "(odd|few)  extra.\\1\n")
FSDP_RENAMED = {"layers.0.w": "model.layers.0.weight", "layers.0.b": "model.layers.0.b",
                "odd": "extra.odd", "few": "extra.few", "big": "big"}


def write_rules(args, name, text):
    path = os.path.join(args.work, name)
    with open(path, "w") as f:
        f.write(text)
    return path


def check_rename(args):
    """--rename: every tensor served under the first matching rule's name, in the merged file,
    in the shards and their index, and in every rank's file of --dst-strategy."""
    rules = write_rules(args, "rename_fsdp.txt", FSDP_RULES)
    rename = FSDP_RENAMED.__getitem__
    src = copy_case(args, "fsdp", "_rename")
    mnt = os.path.join(args.work, "mnt_rename")
    index = os.path.join(args.work, "index")
    with itest.mounted(args.ckptfs, src, mnt, index_dir=index, extra_args=["--rename", rules]):
        check_served_files(mnt, "fsdp", *expected_shards("fsdp", 5 * 10**9, rename), rename)
    with itest.mounted(args.ckptfs, src, mnt, index_dir=index,
                       extra_args=["--rename", rules, "--shard-size", "100"]):
        check_served_files(mnt, "fsdp", *expected_shards("fsdp", 100, rename), rename)
    # A strategy names the served names; `strategy new` with --rename lists them.
    strategy = os.path.join(args.work, "dst_rename.json")
    itest.run([args.ckptfs, "strategy", "new", src, "--rename", rules, "--devices", "2",
               "--split", r"model\.layers\.0\.weight=1", "--replicate", ".*", "-o", strategy])
    _, reference = read_safetensors(os.path.join(SHARED_DCP, "fsdp.reference.safetensors"))
    with itest.mounted(args.ckptfs, src, mnt, index_dir=index, dst_strategy=strategy,
                       extra_args=["--rename", rules]):
        for rank in range(2):
            _, got = read_safetensors(os.path.join(mnt, f"rank_{rank}",
                                                   f"checkpoint_{rank}.safetensors"))
            assert sorted(got) == sorted(FSDP_RENAMED.values()), sorted(got)
            for key, (dtype, shape, data) in reference.items():
                dim = 1 if key == "layers.0.w" else None
                want = expected_block(dtype, shape, data, dim, rank, 2)
                assert got[rename(key)][2] == want, f"rank {rank}: tensor {key} differs"


def check_rename_refusals(args):
    """A bad rename map, and the options where they cannot apply, are refused in one line."""
    src = copy_case(args, "fsdp", "_rename_bad")
    bad = write_rules(args, "rename_bad.txt", "# ok\nodd extra.odd\nlayers\\.(0 x\n")
    refused(args, src, "rename_bad.txt:3", "not a regular expression", extra_args=["--rename", bad])
    fields = write_rules(args, "rename_fields.txt", "odd\n")
    refused(args, src, "rename_fields.txt:1", "REGEX REPLACEMENT",
            extra_args=["--rename", fields])
    same = write_rules(args, "rename_same.txt", "(odd|few) extra\n")
    refused(args, src, "rename_same.txt", '"odd"', '"few"', "both be served as",
            extra_args=["--rename", same])
    empty = write_rules(args, "rename_empty.txt", "big\\.?(.*) \\1\n")
    refused(args, src, "rename_empty.txt:1", '"big"', "empty name", extra_args=["--rename", empty])
    refused(args, src, "missing.txt", "--rename",
            extra_args=["--rename", os.path.join(args.work, "missing.txt")])
    refused(args, src, "--shard-size 5XB", extra_args=["--shard-size", "5XB"])
    strategy = os.path.join(args.work, "dst_forms.json")
    itest.run([args.ckptfs, "strategy", "new", src, "--devices", "2", "--replicate", ".*", "-o",
               strategy])
    refused(args, src, src, "--shard-size", "--dst-strategy", dst_strategy=strategy,
            extra_args=["--shard-size", "100"])
    # A view with no merged model.safetensors: MindSpore rank directories.
    plain = os.path.join(args.work, "not_dcp")
    os.makedirs(plain, exist_ok=True)
    refused(args, plain, plain, "--rename", "mindspore-rank-dirs", extra_args=["--rename", same])
    refused(args, plain, plain, "--shard-size", extra_args=["--shard-size", "1GB"])


def check_inspect(args):
    """inspect of a .distcp file lists its chunks (name, dtype, chunk shape, bytes) and its
    non-tensor items, without the .metadata being unpickled at read time."""
    data = os.path.join(args.shared, "dcp", "objects", "__1_0.distcp")  # rank 1 saved the objects
    out = itest.run([args.ckptfs, "inspect", data]).stdout
    assert "(dcp)" in out, out
    j = json.loads(itest.run([args.ckptfs, "inspect", "--json", data]).stdout)
    assert j["format"] == "dcp", j
    _, expected = read_safetensors(os.path.join(args.shared, "dcp", "objects.reference.safetensors"))
    for t, chunk in zip(j["tensors"], j["object"]["chunks"]):
        assert t["name"] == chunk["fqn"] and t["name"] in expected, (t, chunk)
        assert chunk["shape"] == expected[t["name"]][1], (chunk, expected[t["name"]])
        assert t["dtype"] == expected[t["name"]][0], t
        assert [t["nbytes"]] == [length for _, length in t["storage"]], t
    names = json.loads(itest.read_file(os.path.join(args.shared, "dcp", "objects.objects.json")))
    listed = [o["fqn"] for o in j["object"]["objects"]]
    assert sorted(listed) == sorted(names), listed
    for name in listed:
        assert name in out, (name, out)


def check_index_build(args):
    """index build scans a DCP directory's data files once; a second build takes them all from
    the index (its entries keep the dcp format)."""
    src = copy_case(args, "fsdp", "_index")
    index = os.path.join(args.work, "index_build")
    first = itest.run([args.ckptfs, "index", "build", src, "--index-dir", index]).stdout
    assert "4 files, 20 parameters: 0 from the index, 4 scanned" in first, first
    again = itest.run([args.ckptfs, "index", "build", src, "--index-dir", index]).stdout
    assert "4 files, 20 parameters: 4 from the index, 0 scanned" in again, again


def main():
    global SHARED_DCP
    args = itest.parse_args()
    SHARED_DCP = os.path.join(args.shared, "dcp")
    checks = itest.Checks(args.only)
    for case in CASES:
        checks.run(f"merged model.safetensors of {case} equals the reference", check_case, args,
                   case)
    for case in RESHARD:
        checks.run(f"--dst-strategy of {case} cuts every tensor from the reference", check_reshard,
                   args, case)
    for case in SHARD_SIZES:
        checks.run(f"--shard-size cuts {case} as save_pretrained would", check_sharded, args, case)
    checks.run("--shard-size forms, and a model within the size", check_shard_size_forms, args)
    checks.run("--rename names every view's tensors", check_rename, args)
    checks.run("a bad rename map or --shard-size is refused in one line", check_rename_refusals,
               args)
    checks.run("each damaged DCP directory is refused in one line", check_bad, args)
    checks.run("options the merged view cannot honour are refused in one line",
               check_refused_options, args)
    checks.run("a rank-local DCP save is refused in one line", check_rank_local, args)
    checks.run("BYTE_IO items are named in one line and not served", check_objects_named, args)
    checks.run("a .metadata saved again after indexing", check_metadata_saved_again, args)
    checks.run("inspect of a DCP data file", check_inspect, args)
    checks.run("index build of a DCP directory, then from the index", check_index_build, args)
    checks.finish()


if __name__ == "__main__":
    main()
