"""hfai sharded PyTorch checkpoints (PART_*.pt) mounted as the merged model.

Expected bytes come from the fixture tools, not from ckptfs: expected/merged_model_<tag>.safetensors
(byte-identical to the reference safetensors writer), expected/manifest_<tag>.json (sha256 of every
merged tensor's C-order bytes) and expected/hfai_<tag>_n<N>.tree.json (what hfai.checkpoint.load
returns). With Debian's python3-torch, the PART files are also loaded by torch.load and merged with
hfai's rule, and every tensor compared with the mounted one, read both by this file's own small
parser and by the reference `safetensors` package's torch loader (load_file and safe_open, 0.7.0
from build/test-venv), so a real framework opens each mounted view.
"""

import gc
import hashlib
import json
import os
import shutil
import struct
from collections import OrderedDict

import itest
import numpy as np
from ckptfix import ckptio, stio
from ckptfix.layout import Layout

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
    """torch.load of every PART file, merged with hfai's rule, against the mounted model and
    optimizer state."""
    from ckptfix import hfai  # torch: Debian's python3-torch (scripts/install-deps.sh)
    data = os.path.join(args.shared, "hfai", name)
    merged = hfai.load(data)
    mnt = os.path.join(args.work, "mnt_torch_" + name)
    with itest.mounted(args.ckptfs, data, mnt, index_dir=os.path.join(args.work, "index")):
        _, model = read_safetensors(os.path.join(mnt, "model.safetensors"))
        _, opt = read_safetensors(os.path.join(mnt, "optimizer.safetensors"))
    compare_tensors(model, merged["model"])
    compare_tensors(opt, hfai.flat_state(merged["optimizer"]))


def reference_safetensors_torch():
    """safetensors.torch.load_file and safetensors.safe_open of the reference package
    (itest.TEST_VENV; torch is Debian's python3-torch)."""
    return (itest.import_from_test_venv("safetensors.torch").load_file,
            itest.import_from_test_venv("safetensors").safe_open)


def other_tensors(merged):
    """The merged checkpoint's tensors outside model and optimizer, named as others.safetensors
    names them: the path of keys and list positions joined by dots."""
    import torch
    out = {}

    def walk(value, path):
        if torch.is_tensor(value):
            out[".".join(path)] = value
        elif isinstance(value, dict):
            for k, v in value.items():
                walk(v, path + [str(k)])
        elif isinstance(value, (list, tuple)):
            for i, v in enumerate(value):
                walk(v, path + [str(i)])

    for key, value in merged.items():
        if key not in ("model", "optimizer"):
            walk(value, [str(key)])
    return out


def check_views_with_safetensors_torch(args, name):
    """Every mounted view opened by the reference safetensors package's torch loader, whole
    (load_file) and lazily (safe_open: get_tensor, get_slice of a row range), equals torch.load of
    the PART files merged by hfai's rule: names, dtypes, shapes and bytes."""
    from ckptfix import hfai
    load_file, safe_open = reference_safetensors_torch()
    data = os.path.join(args.shared, "hfai", name)
    merged = hfai.load(data)
    expected = {"model.safetensors": merged["model"],
                "optimizer.safetensors": hfai.flat_state(merged["optimizer"]),
                "others.safetensors": other_tensors(merged)}
    assert expected["others.safetensors"], "the fixture has no tensor outside model and optimizer"
    mnt = os.path.join(args.work, "mnt_st_torch_" + name)
    with itest.mounted(args.ckptfs, data, mnt, index_dir=os.path.join(args.work, "index")):
        failures = [read_with_safetensors_torch(load_file, safe_open, os.path.join(mnt, fname),
                                                expected[fname]) for fname in expected]
        # The loaded tensors map the file until they are freed: gone before the unmount.
        gc.collect()
    assert failures == [None] * len(failures), failures


def read_with_safetensors_torch(load_file, safe_open, path, want):
    """None, or what differs: as a message, so that no traceback keeps a mapped tensor (and the
    mount busy) after the check."""
    try:
        compare_views(load_file, safe_open, path, want)
    except AssertionError as e:
        return f"{path}: {e}"
    return None


def compare_views(load_file, safe_open, path, want):
    fname = os.path.basename(path)
    compare_torch(fname, load_file(path), want)
    with safe_open(path, framework="pt") as f:
        assert f.metadata() == {"format": "pt"}, (fname, f.metadata())
        assert sorted(f.keys()) == sorted(want), (fname, sorted(f.keys()))
        compare_torch(fname, {k: f.get_tensor(k) for k in f.keys()}, want)
        for key, value in want.items():
            if value.dim() and value.shape[0] > 2:
                part = f.get_slice(key)[1:value.shape[0] - 1]
                compare_torch(fname, {key: part}, {key: value[1:value.shape[0] - 1]})


def compare_torch(fname, got, want):
    assert sorted(got) == sorted(want), (fname, sorted(got), sorted(want))
    from ckptfix import hfai
    for key, value in want.items():
        assert got[key].dtype == value.dtype, (fname, key, got[key].dtype, value.dtype)
        assert tuple(got[key].shape) == tuple(value.shape), (fname, key, got[key].shape)
        assert hfai.tensor_bytes(got[key]) == hfai.tensor_bytes(value), (fname, key)


TORCH_CODES = {"float32": "F32", "float16": "F16", "bfloat16": "BF16", "int64": "I64",
               "float64": "F64", "int32": "I32", "uint8": "U8", "int8": "I8", "bool": "BOOL"}


def compare_tensors(mounted, tensors):
    """Every mounted safetensors entry equals the torch tensor of that name, bytes and type."""
    from ckptfix import hfai
    assert sorted(mounted) == sorted(tensors), (sorted(mounted), sorted(tensors))
    for key, value in tensors.items():
        entry, raw = mounted[key]
        assert entry["shape"] == list(value.shape), (key, entry, value.shape)
        assert entry["dtype"] == TORCH_CODES[str(value.dtype).split(".")[1]], (key, entry)
        assert raw == hfai.tensor_bytes(value), key


def torch_state():
    """A model state larger than the fixtures, in the shapes hfai must handle: chunked tensors
    whose pieces end mid-row (3 ranks), a transposed weight, buffers that are views into shared or
    padded storages, a 0-d buffer, four dtypes; and Adam-like state with chunked moments."""
    import torch
    g = torch.Generator().manual_seed(14)
    sd = OrderedDict()
    sd["embed.weight"] = torch.randn(3000, 700, generator=g).to(torch.bfloat16)
    sd["proj.weight"] = torch.randn(1111, 999, generator=g)
    sd["fc.weight"] = torch.randn(256, 320, generator=g).t()
    sd["fc.bias"] = torch.randn(320, generator=g).half()
    sd["ids"] = torch.arange(10000, dtype=torch.int64).view(5000, 2)
    shared = torch.arange(10000, dtype=torch.float32)
    sd["bn.running_mean"] = shared[100:400]
    sd["bn.running_var"] = shared[1000:1300]
    sd["pos"] = torch.arange(64 * 64, dtype=torch.int64).view(64, 64)[::2, 1:33]
    sd["bn.num_batches_tracked"] = torch.tensor(7)
    buffers = ["bn.running_mean", "bn.running_var", "pos", "bn.num_batches_tracked"]
    state = OrderedDict()
    for i, key in enumerate(["embed.weight", "proj.weight", "fc.weight", "fc.bias"]):
        state[i] = {"step": torch.tensor(float(i + 3)),
                    "exp_avg": torch.randn(sd[key].shape, generator=g).to(sd[key].dtype),
                    "exp_avg_sq": torch.rand(sd[key].shape, generator=g).to(sd[key].dtype)}
    optimizer = {"state": state, "param_groups": [{"lr": 1e-3, "betas": (0.9, 0.999),
                                                    "eps": 1e-8, "params": [0, 1, 2, 3, 4]}]}
    return sd, buffers, optimizer


def to_numpy(t):
    import torch
    t = t.contiguous()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(np.uint16)
    return t.numpy()


MS_TYPES = {"F32": "Float32", "F16": "Float16", "BF16": "BFloat16", "I64": "Int64"}


def check_torch_written(args):
    """hfai PART files written by torch.save in hfai's layout: the mount against the state that
    was saved, the merged view and a --dst-strategy cut."""
    from ckptfix import hfai
    sd, buffers, optimizer = torch_state()
    src = os.path.join(args.work, "torch_written")
    shutil.rmtree(src, ignore_errors=True)
    hfai.save(src, sd, buffers, 3, optimizer, others={"epoch": 4}, large_size=1 << 20)
    mnt = os.path.join(args.work, "mnt_torch_written")
    with itest.mounted(args.ckptfs, src, mnt, index_dir=os.path.join(args.work, "index")):
        _, model = read_safetensors(os.path.join(mnt, "model.safetensors"))
        _, opt = read_safetensors(os.path.join(mnt, "optimizer.safetensors"))
        assert json.load(open(os.path.join(mnt, "extra.json")))["$dict"][-1] == ["epoch", 4]
        # The reference torch loader too: bfloat16, a transposed weight, views of shared storage.
        load_file, _ = reference_safetensors_torch()
        compare_torch("model.safetensors", load_file(os.path.join(mnt, "model.safetensors")), sd)
        compare_torch("optimizer.safetensors",
                      load_file(os.path.join(mnt, "optimizer.safetensors")),
                      hfai.flat_state(optimizer))
        gc.collect()
    compare_tensors(model, sd)
    compare_tensors(opt, hfai.flat_state(optimizer))
    # The same state cut for 4 MindSpore ranks, against NumPy slices of the saved tensors in
    # hfai's merged order (hfai.load's).
    layouts = {"embed.weight": ([2, 2], [1, 0], 0, 0), "fc.weight": ([2, 2], [-1, 1], 2, 1),
               "ids": ([2, 2], [0, -1], 0, 0), "pos": ([2, 2], [-1, 1], 0, 0)}
    strategy = write_strategy(os.path.join(args.work, "torch_written_dst.json"), layouts)
    order = list(hfai.load(src)["model"])
    arrays = [(k, MS_TYPES[TORCH_CODES[str(sd[k].dtype).split(".")[1]]], to_numpy(sd[k]))
              for k in order]
    with itest.mounted(args.ckptfs, src, mnt, dst_strategy=strategy,
                       index_dir=os.path.join(args.work, "index")):
        for rank in range(4):
            ckpt, st = expected_rank(arrays, layouts, rank)
            d = os.path.join(mnt, f"rank_{rank}")
            assert itest.read_file(os.path.join(d, f"checkpoint_{rank}.ckpt")) == ckpt, rank
            assert itest.read_file(os.path.join(d, f"checkpoint_{rank}.safetensors")) == st, rank


# A destination strategy for the fixtures' model, 4 devices: cuts along either dimension of a
# transposed weight (fc2.weight), of chunked tensors whose chunks end mid-row (embed.weight,
# head.weight with optimizer sharding), of a strided buffer (pos_ids), an empty tensor, a scalar,
# and a tensor it names but leaves whole (proj.weight). fc2.bias, norm.*, fc1.bias,
# bn.running_mean are not named: copied whole to every rank.
DST_LAYOUTS = {
    "fc2.weight": ([2, 2], [1, 0], 0, 0),
    "embed.weight": ([2, 2], [-1, 0], 0, 0),
    "head.weight": ([2, 2], [1, -1], 2, 1),
    "proj.weight": ([2, 2], [-1, -1], 0, 0),
    "pos_ids": ([2, 2], [-1, 0], 0, 0),
    "lookup": ([2, 2], [1], 0, 0),
    "bn.running_var": ([2, 2], [0], 0, 0),
    "fc1.weight": ([2, 2], [0, 1], 0, 0),
    "empty_mask": ([2, 2], [-1, 0], 0, 0),
    "bn.num_batches_tracked": ([2, 2], [], 0, 0),
}


def write_strategy(path, layouts, shapes=None):
    items = {}
    for name, (dev, tmap, opt_size, opt_step) in layouts.items():
        items[name] = {"dev_matrix": dev, "tensor_map": tmap, "field": 0,
                       "opt_weight_shard_step": opt_step, "opt_weight_shard_size": opt_size}
        if shapes and name in shapes:
            items[name]["tensor_shape"] = shapes[name]
    with open(path, "w") as f:
        json.dump({"parallel_layout_item": items}, f)
    return path


def merged_arrays(data, name):
    """The merged model as NumPy arrays in hfai's merged order, from the expected safetensors."""
    tag = name.split("_")[1]
    _, tensors = read_safetensors(os.path.join(data, "expected", f"merged_model_{tag}.safetensors"))
    tree = json.load(open(os.path.join(data, "expected", f"{name}.tree.json")))["merged"]
    model = dict(tree["$dict"])["model"]
    order = [k for k, _ in model["$dict"]] if isinstance(model, dict) and "$dict" in model else list(model)
    out = []
    for key in order:
        entry, raw = tensors[key]
        ms_type = stio.TYPE_OF[entry["dtype"]]
        array = np.frombuffer(raw, dtype=ckptio.NUMPY_DTYPES[ms_type]).reshape(entry["shape"])
        out.append((key, ms_type, array))
    return out


def check_sharded_renamed(args, name):
    """--shard-size and --rename on an hfai checkpoint's merged model, as on a DCP one: the
    shards and index save_pretrained would write of the expected merged tensors (hfai's merged
    order), each tensor under its renamed name; optimizer.safetensors and the rest unchanged."""
    data = os.path.join(args.shared, "hfai")
    tag = name.split("_")[1]
    _, tensors = read_safetensors(os.path.join(data, "expected", f"merged_model_{tag}.safetensors"))
    order = ["hf." + key for key, _, _ in merged_arrays(data, name)]
    sizes = {"hf." + k: len(raw) for k, (_, raw) in tensors.items()}
    max_size = sum(sizes.values()) // 3
    shards = itest.hf_split(order, sizes, max_size)
    assert len(shards) > 2, shards
    files = [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))]
    index = json.dumps({"metadata": {"total_size": sum(sizes.values())},
                        "weight_map": {k: files[i] for i, keys in enumerate(shards) for k in keys}},
                       indent=2, sort_keys=True) + "\n"
    rules = os.path.join(args.work, "rename_hfai.txt")
    with open(rules, "w") as f:
        f.write("(.*) hf.\\1\n")
    mnt = os.path.join(args.work, "mnt_sharded_" + name)
    with itest.mounted(args.ckptfs, os.path.join(data, name), mnt,
                       index_dir=os.path.join(args.work, "index"),
                       extra_args=["--shard-size", str(max_size), "--rename", rules]):
        assert sorted(os.listdir(mnt)) == sorted(files + [
            "model.safetensors.index.json", "extra.json", "optimizer.safetensors",
            "others.safetensors"]), os.listdir(mnt)
        assert itest.read_file(os.path.join(mnt, "model.safetensors.index.json")).decode() == index
        for fname, keys in zip(files, shards):
            meta, got = read_safetensors(os.path.join(mnt, fname))
            assert meta == {"format": "pt"} and sorted(got) == sorted(keys), (fname, sorted(got))
            for key in keys:
                want_entry, want = tensors[key[len("hf."):]]
                entry, raw = got[key]
                assert (entry["dtype"], entry["shape"], raw) == (
                    want_entry["dtype"], want_entry["shape"], want), f"{fname}: {key} differs"


def expected_rank(model, layouts, rank):
    """(.ckpt bytes, .safetensors bytes) of one target rank, cut with the fixture generator's
    layout math: named tensors first, in merged order, then the others whole."""
    cut, whole = [], []
    for key, ms_type, array in model:
        if key in layouts:
            dev, tmap, opt_size, opt_step = layouts[key]
            box = Layout.from_map(dev, tmap, opt_size, opt_step).box(rank, array.shape)
            cut.append((key, ms_type, array[tuple(slice(b, e) for b, e in box)]))
        else:
            whole.append((key, ms_type, array))
    ckpt = b"".join(ckptio.encode_record(k, list(a.shape), t, np.ascontiguousarray(a).tobytes())
                    for k, t, a in cut + whole if a.size)
    entries = [stio.Entry(k, t, list(a.shape), a.nbytes, None) for k, t, a in cut + whole]
    data = {k: np.ascontiguousarray(a).tobytes() for k, _, a in cut + whole}
    ordered = stio.writer_order(entries)
    st = stio.header_bytes(ordered, {"format": "ms"}) + b"".join(data[e.name] for e in ordered)
    return ckpt, st


def check_dst_strategy(args, name):
    data = os.path.join(args.shared, "hfai")
    strategy = write_strategy(os.path.join(args.work, "dst_strategy.json"), DST_LAYOUTS)
    model = merged_arrays(data, name)
    mnt = os.path.join(args.work, "mnt_dst_" + name)
    with itest.mounted(args.ckptfs, os.path.join(data, name), mnt, dst_strategy=strategy,
                       index_dir=os.path.join(args.work, "index")):
        listing = sorted(os.listdir(mnt))
        assert listing == ["extra.json", "optimizer.safetensors", "others.safetensors", "rank_0",
                           "rank_1", "rank_2", "rank_3"], listing
        for rank in range(4):
            ckpt, st = expected_rank(model, DST_LAYOUTS, rank)
            got = itest.read_file(os.path.join(mnt, f"rank_{rank}", f"checkpoint_{rank}.ckpt"))
            assert got == ckpt, (rank, len(got), len(ckpt))
            got = itest.read_file(os.path.join(mnt, f"rank_{rank}",
                                               f"checkpoint_{rank}.safetensors"))
            assert got == st, (rank, len(got), len(st))
        # The optimizer state is still the merged one.
        _, opt = read_safetensors(os.path.join(mnt, "optimizer.safetensors"))
        manifest = json.load(open(os.path.join(data, "expected",
                                               f"manifest_{name.split('_')[1]}.json")))
        for t in manifest["tensors"]:
            if t["path"][0] == "optimizer":
                raw = opt[".".join(str(p) for p in t["path"][1:])][1]
                assert hashlib.sha256(raw).hexdigest() == t["sha256"], t["path"]
    # materialize writes the same files, the merged ones at the top of the output.
    out = os.path.join(args.work, "materialized_" + name)
    shutil.rmtree(out, ignore_errors=True)
    itest.run([args.ckptfs, "materialize", os.path.join(data, name), out, "--dst-strategy",
               strategy, "--index-dir", os.path.join(args.work, "index"),
               "--view", "ckpt,safetensors"])
    assert itest.tree_files(out) == ["extra.json", "optimizer.safetensors", "others.safetensors"] + [
        f"rank_{r}/checkpoint_{r}.{ext}" for r in range(4) for ext in ("ckpt", "safetensors")]
    for rank in range(4):
        ckpt, st = expected_rank(model, DST_LAYOUTS, rank)
        assert itest.read_file(os.path.join(out, f"rank_{rank}", f"checkpoint_{rank}.ckpt")) == ckpt
        assert itest.read_file(os.path.join(out, f"rank_{rank}",
                                            f"checkpoint_{rank}.safetensors")) == st
    # --ranks and --view narrow it like any source.
    with itest.mounted(args.ckptfs, os.path.join(data, name), mnt, dst_strategy=strategy,
                       index_dir=os.path.join(args.work, "index"),
                       extra_args=["--ranks", "2", "--view", "safetensors"]):
        assert sorted(os.listdir(mnt)) == ["extra.json", "optimizer.safetensors",
                                           "others.safetensors", "rank_2"]
        assert os.listdir(os.path.join(mnt, "rank_2")) == ["checkpoint_2.safetensors"]
        assert itest.read_file(os.path.join(mnt, "rank_2", "checkpoint_2.safetensors")) == \
            expected_rank(model, DST_LAYOUTS, 2)[1]


def check_dst_pipeline(args):
    """A two-stage destination strategy: each stage's ranks cut that stage's tensors, leave out
    the other stage's, and copy the tensors no stage names."""
    data = os.path.join(args.shared, "hfai")
    stages = [{"fc2.weight": ([2], [0, -1], 0, 0)}, {"embed.weight": ([2], [-1, 0], 0, 0)}]
    items = {}
    for stage, layouts in enumerate(stages):
        for name, (dev, tmap, opt_size, opt_step) in layouts.items():
            items[f"{stage}-{name}"] = {"dev_matrix": dev, "tensor_map": tmap, "field": 0,
                                        "opt_weight_shard_step": opt_step,
                                        "opt_weight_shard_size": opt_size}
    strategy = os.path.join(args.work, "dst_pipeline.json")
    with open(strategy, "w") as f:
        json.dump({"parallel_layout_item": items}, f)
    model = merged_arrays(data, "hfai_t113_n4")
    mnt = os.path.join(args.work, "mnt_dst_pipeline")
    with itest.mounted(args.ckptfs, os.path.join(data, "hfai_t113_n4"), mnt,
                       dst_strategy=strategy, index_dir=os.path.join(args.work, "index")):
        for rank in range(4):
            stage, other = stages[rank // 2], stages[1 - rank // 2]
            kept = [m for m in model if m[0] not in other]
            ckpt, st = expected_rank(kept, stage, rank % 2)
            d = os.path.join(mnt, f"rank_{rank}")
            assert itest.read_file(os.path.join(d, f"checkpoint_{rank}.ckpt")) == ckpt, rank
            assert itest.read_file(os.path.join(d, f"checkpoint_{rank}.safetensors")) == st, rank


def check_dst_refusals(args):
    src = os.path.join(args.shared, "hfai", "hfai_t113_n4")
    work = args.work

    def bad(label, layouts, shapes=None):
        return write_strategy(os.path.join(work, f"bad_{label}.json"), layouts, shapes)

    strategy = bad("extra", dict(DST_LAYOUTS, **{"decoder.weight": ([2, 2], [0, -1], 0, 0)}))
    refused(args, src, "bad_extra.json", "decoder.weight is not in the checkpoint",
            dst_strategy=strategy)
    strategy = bad("rank", {"fc2.weight": ([2, 2], [0], 0, 0)})
    refused(args, src, "fc2.weight", dst_strategy=strategy)
    strategy = bad("divide", {"proj.weight": ([2, 2], [0, -1], 0, 0)})
    refused(args, src, "proj.weight", "divide", dst_strategy=strategy)
    strategy = bad("shape", {"fc2.weight": ([2, 2], [1, 0], 0, 0)}, {"fc2.weight": [16, 24]})
    refused(args, src, "fc2.weight", "[16,24]", "[24,16]", dst_strategy=strategy)
    refused(args, src, "omit --src-strategy", src_strategy=strategy)
    refused(args, src, "--ranks needs a --dst-strategy", extra_args=["--ranks", "1"])
    refused(args, src, "the view has no rank 4", dst_strategy=bad("ok", DST_LAYOUTS),
            extra_args=["--ranks", "4"])


def refused(args, src, *needles, **mount_args):
    proc = itest.refused_mount(args.ckptfs, src, os.path.join(args.work, "mnt_bad"),
                               index_dir=os.path.join(args.work, "index"), **mount_args)
    lines = itest.stderr_lines(proc)
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
    refused(args, d, "PART_001.pt", 'unsupported object "subprocess.OrderedDictx"')
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
    for name in SETS:
        checks.run(f"torch.load + hfai merge of {name} equals the mount", check_with_torch, args, name)
    for name in SETS:
        checks.run(f"safetensors.torch load_file and safe_open of every view of {name} equal "
                   "torch.load + hfai merge", check_views_with_safetensors_torch, args, name)
    checks.run("hfai PART files written by torch.save, merged and cut", check_torch_written, args)
    for name in ["hfai_t113_n4", "hfai_t113_n1", "hfai_t26_n2"]:
        checks.run(f"--dst-strategy cuts the merged model of {name}", check_dst_strategy, args, name)
    checks.run("--dst-strategy of two pipeline stages", check_dst_pipeline, args)
    checks.run("--shard-size and --rename of hfai_t26_n2's merged model", check_sharded_renamed,
               args, "hfai_t26_n2")
    checks.run("bad hfai directories are refused in one line", check_refusals, args)
    checks.run("strategies that do not fit the model are refused in one line", check_dst_refusals,
               args)
    checks.run("inspect of PART files", check_inspect, args)
    checks.finish()


if __name__ == "__main__":
    main()
