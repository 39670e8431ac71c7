"""`ckptfs strategy new`: strategies written from a device count and rules, really mounted.

Sources come from the fixture generator (scripts/ckpt_fixture.py: seeded random full tensors, cut
by its own layout code) and the hfai fixtures (tests/data/hfai, the merged model written by the
fixture tools). Expected tensors are the generator's full tensors cut here with NumPy
(np.split along the rule's dimension, or whole), never with ckptfs' layout code; the mounted
`.ckpt` views are parsed by the generator's record reader and the `.safetensors` views by a small
parser of their own.

* A tensor-parallel strategy (protobuf) from one full checkpoint: every rank's both views hold
  exactly the expected blocks, the step counter is copied whole; the JSON form of the same rules
  gives byte-identical files (materialize).
* A sharded source (rank_<N>/ with its own --src-strategy): the written strategy carries the
  GLOBAL shapes (JSON tensor_shape), lays out only the names the source strategy does, and mounts.
* The written strategy as --src-strategy: the tensor-parallel files, materialized, mount merged
  back into the full tensors.
* An hfai checkpoint (PyTorch, no strategy of its own): rules over its merged model, mounted.
* A MindFormers metadata checkpoint and a unified_safetensors directory: the global shapes their
  metadata or parts give; the metadata checkpoint mounted with the written strategy equals the
  files its generator cuts from the same full tensors.
* Refusals through the real binary: one line, nothing written.
"""

import json
import os

import numpy as np

import itest
import ckpt_fixture
import test_hfai
import test_mindformers
import test_safetensors
from ckptfix import ckptio
from ckptfix import mindformers as mf
from ckptfix.data import full_box
from ckptfix.sources import TensorBank

DEVICES = 4
# (name, dtype, shape, dimension the rules below split, or None: replicated)
MODEL = [
    ("tok_embeddings.weight", "BFloat16", [32, 16], 0),
    ("layers.0.attention.wq.weight", "Float32", [16, 16], 0),
    ("layers.0.attention.wo.weight", "Float32", [16, 16], 1),
    ("layers.0.attention_norm.weight", "Float32", [16], None),
    ("layers.0.feed_forward.w1.weight", "Float16", [24, 16], 0),
    ("layers.0.feed_forward.w2.weight", "Float16", [16, 24], 1),
    ("layers.0.feed_forward.w2.bias", "Float32", [6], None),  # 6 rows: not 4-way divisible
    ("output.weight", "BFloat16", [32, 16], 0),
]
RULES = ["--replicate", r".*\.bias",
         "--split", r".*\.(wq|w1)\.weight=0",
         "--split", r".*\.(wo|w2)\..*=-1",  # would refuse w2.bias, replicated first
         "--split", r"(tok_embeddings|output)\.weight=0"]


def case(src_devices=None):
    """The model above, saved whole (src_devices None) or 2-way row-split with an extra tensor
    outside the source strategy; a step counter in every file."""
    params = []
    for name, dtype, shape, _ in MODEL:
        src = None
        if src_devices:
            src = {"dev_matrix": [src_devices], "tensor_map": [0] + [-1] * (len(shape) - 1)}
        params.append({"name": name, "dtype": dtype, "shape": shape, "src": src, "dst": None})
    if src_devices:
        params.append({"name": "rank_local.buffer", "dtype": "Float32", "shape": [3], "src": None,
                       "dst": None})
    # The generator wants a destination; these tests bring their own (expected files: none).
    params[0]["dst"] = {"dev_matrix": [2], "tensor_map": [-1, -1]}
    return {"name": "strategy_new", "seed": 11,
            "src": {"devices": src_devices} if src_devices else None, "dst": {"devices": 2},
            "params": params, "extras": [{"name": "global_step", "dtype": "Int64", "value": 5}]}


def make_fixture(args, label, src_devices=None):
    return ckpt_fixture.make(case(src_devices), os.path.join(args.work, label), expected=False)


def strategy_new(args, src, out, *extra, check=True):
    return itest.run([args.ckptfs, "strategy", "new", src, "--devices", str(DEVICES), *RULES,
                      *extra, "-o", out], check=check)


def full_tensors(fx):
    bank = TensorBank(fx.case)
    return {p.name: (p.dtype, bank.get(p).block_array(full_box(p.shape)))
            for p in fx.case.params}


def block(full, dim, rank, devices=DEVICES):
    return full if dim is None else np.split(full, devices, axis=dim)[rank]


def ckpt_tensors(path):
    """name -> (tensor_type, array) of a .ckpt file, in file order, by the generator's reader."""
    out = {}
    for r in ckptio.join_chunks(ckptio.read_records(path)):
        dtype = ckptio.NUMPY_DTYPES[r.tensor_type]
        out[r.tag] = (r.tensor_type, np.frombuffer(r.content, dtype=dtype).reshape(r.dims))
    return out


def safetensors_tensors(path):
    _, tensors = test_hfai.read_safetensors(path)
    out = {}
    for name, (entry, raw) in tensors.items():
        dtype = ckptio.NUMPY_DTYPES[test_hfai.stio.TYPE_OF[entry["dtype"]]]
        out[name] = np.frombuffer(raw, dtype=dtype).reshape(entry["shape"])
    return out


def check_rank(view_dir, rank, want):
    """Both views of one rank hold exactly `want` (name -> (tensor_type, array)), .ckpt in order."""
    base = os.path.join(view_dir, f"rank_{rank}", f"checkpoint_{rank}")
    got = ckpt_tensors(base + ".ckpt")
    assert list(got) == list(want), f"rank {rank}: records {list(got)}, expected {list(want)}"
    for name, (dtype, array) in want.items():
        assert got[name][0] == dtype, f"rank {rank} {name}: type {got[name][0]}, expected {dtype}"
        assert got[name][1].shape == array.shape, \
            f"rank {rank} {name}: shape {got[name][1].shape}, expected {array.shape}"
        assert got[name][1].tobytes() == array.tobytes(), f"rank {rank} {name}: values differ"
    st = safetensors_tensors(base + ".safetensors")
    assert sorted(st) == sorted(want), f"rank {rank}: safetensors entries {sorted(st)}"
    for name, (_, array) in want.items():
        assert st[name].shape == array.shape and st[name].tobytes() == array.tobytes(), \
            f"rank {rank} {name}: the .safetensors view differs"


def expected_tp(full, rank):
    """The tensor-parallel rank's entries: every model tensor cut, then the step counter."""
    want = {name: (full[name][0], block(full[name][1], dim, rank)) for name, _, _, dim in MODEL}
    want["global_step"] = full["global_step"]
    return want


def step_counter(fx):
    """global_step as the source file holds it (a scalar: copied, never cut)."""
    records = ckpt_tensors(fx.source_files[0])
    return records["global_step"]


def check_tp_from_full(args):
    fx = make_fixture(args, "full")
    full = full_tensors(fx)
    full["global_step"] = step_counter(fx)
    strategy = os.path.join(args.work, "tp4.ckpt_strategy")
    proc = strategy_new(args, fx.src_dir, strategy)
    assert proc.stdout.startswith(f"{strategy}: 8 tensors on 4 devices (6 split, 2 replicated)"), \
        proc.stdout
    assert "  --replicate '.*\\.bias': 1 tensor\n" in proc.stdout, proc.stdout
    assert "no rule (--default replicate): 1 tensor\n" in proc.stdout, proc.stdout
    show = itest.run([args.ckptfs, "strategy", "show", "--json", strategy]).stdout
    doc = json.loads(show)
    assert doc["devices_per_stage"] == DEVICES and doc["num_stages"] == 1, show
    maps = {p["name"]: p["tensor_map"] for p in doc["params"]}
    for name, _, shape, dim in MODEL:
        # MindSpore's map: the split dimension names device axis 0, the others -1.
        want = [0 if d == (dim if dim is None or dim >= 0 else dim + len(shape)) else -1
                for d in range(len(shape))]
        assert maps.pop(name) == want, (name, want)
    assert not maps, f"layouts of other names: {maps}"

    mnt = os.path.join(args.work, "mnt_tp")
    with itest.mounted(args.ckptfs, fx.src_dir, mnt, dst_strategy=strategy,
                       index_dir=os.path.join(args.work, "index")):
        assert sorted(os.listdir(mnt)) == [f"rank_{r}" for r in range(DEVICES)]
        for rank in range(DEVICES):
            check_rank(mnt, rank, expected_tp(full, rank))
        mounted = {r: {e: itest.read_file(os.path.join(mnt, f"rank_{r}", f"checkpoint_{r}.{e}"))
                       for e in ("ckpt", "safetensors")} for r in range(DEVICES)}
    # The JSON form of the same rules serves the same bytes.
    json_strategy = os.path.join(args.work, "tp4.json")
    strategy_new(args, fx.src_dir, json_strategy)
    shapes = {k: v["tensor_shape"] for k, v in
              json.load(open(json_strategy))["parallel_layout_item"].items()}
    assert shapes == {name: shape for name, _, shape, _ in MODEL}, shapes
    out = os.path.join(args.work, "materialized_json")
    itest.run([args.ckptfs, "materialize", fx.src_dir, out, "--dst-strategy", json_strategy,
               "--view", "ckpt,safetensors", "--index-dir", os.path.join(args.work, "index"), "-q"])
    for r in range(DEVICES):
        for e in ("ckpt", "safetensors"):
            got = itest.read_file(os.path.join(out, f"rank_{r}", f"checkpoint_{r}.{e}"))
            assert got == mounted[r][e], f"rank {r} .{e}: the JSON strategy serves other bytes"


def check_as_src_strategy(args):
    """Files saved in the written layout (the tensor-parallel view, materialized) mount with it as
    --src-strategy, merged back into the full tensors."""
    fx = make_fixture(args, "full_for_src")
    full = full_tensors(fx)
    strategy = os.path.join(args.work, "tp4_src.ckpt_strategy")
    strategy_new(args, fx.src_dir, strategy)
    saved = os.path.join(args.work, "saved_tp4")
    itest.run([args.ckptfs, "materialize", fx.src_dir, saved, "--dst-strategy", strategy,
               "--index-dir", os.path.join(args.work, "index"), "-q"])
    assert itest.tree_files(saved) == [f"rank_{r}/checkpoint_{r}.ckpt" for r in range(DEVICES)]
    mnt = os.path.join(args.work, "mnt_merged")
    with itest.mounted(args.ckptfs, saved, mnt, src_strategy=strategy,
                       index_dir=os.path.join(args.work, "index")):
        got = ckpt_tensors(os.path.join(mnt, "rank_0", "checkpoint_0.ckpt"))
    want = [name for name, _, _, _ in MODEL] + ["global_step"]
    assert list(got) == want, list(got)
    for name, _, _, _ in MODEL:
        assert got[name][1].tobytes() == full[name][1].tobytes(), f"{name}: merged values differ"
        assert list(got[name][1].shape) == list(full[name][1].shape), name


def check_sharded_source(args):
    """rank_<N>/ of a 2-way row-split save: global shapes from slice shape x splits, only the
    names the source strategy lays out, and the mount of both strategies cuts as meant."""
    fx = make_fixture(args, "sharded", src_devices=2)
    full = full_tensors(fx)
    strategy = os.path.join(args.work, "from_sharded.json")
    proc = strategy_new(args, fx.src_dir, strategy, "--src-strategy", fx.src_strategy)
    assert "8 tensors on 4 devices" in proc.stdout, proc.stdout
    items = json.load(open(strategy))["parallel_layout_item"]
    assert {k: v["tensor_shape"] for k, v in items.items()} == \
        {name: shape for name, _, shape, _ in MODEL}, items
    # Without --src-strategy, rank_1 has no place: refused as a mount refuses it.
    proc = strategy_new(args, fx.src_dir, os.path.join(args.work, "x.json"), check=False)
    assert proc.returncode != 0 and "without --src-strategy" in proc.stderr, proc.stderr
    assert len(itest.stderr_lines(proc)) == 1, proc.stderr
    mnt = os.path.join(args.work, "mnt_sharded")
    with itest.mounted(args.ckptfs, fx.src_dir, mnt, src_strategy=fx.src_strategy,
                       dst_strategy=strategy, index_dir=os.path.join(args.work, "index")):
        for rank in range(DEVICES):
            got = ckpt_tensors(os.path.join(mnt, f"rank_{rank}", f"checkpoint_{rank}.ckpt"))
            for name, dtype, _, dim in MODEL:
                want = block(full[name][1], dim, rank)
                assert got[name][0] == dtype and got[name][1].tobytes() == want.tobytes() and \
                    got[name][1].shape == want.shape, f"rank {rank} {name} differs"
            # Outside both strategies: copied whole from source rank (rank mod 2), after them.
            assert list(got)[len(MODEL):] == ["rank_local.buffer", "global_step"], list(got)


def check_hfai(args):
    """hfai PART files (PyTorch): rules over the merged model, mounted as --dst-strategy."""
    data = os.path.join(args.shared, "hfai")
    name = "hfai_t113_n4"
    model = test_hfai.merged_arrays(data, name)
    strategy = os.path.join(args.work, "hfai_tp2.ckpt_strategy")
    splits = {"fc2.weight": 0, "embed.weight": 1, "head.weight": -1, "fc1.weight": 1}
    proc = itest.run([args.ckptfs, "strategy", "new", os.path.join(data, name), "--devices", "2",
                      "--split", r"fc2\.weight=0", "--split", r"(embed|head)\.weight=-1",
                      "--split", r"fc1\.weight=1", "--default", "replicate", "-o", strategy])
    # bn.num_batches_tracked is a scalar: no layout, whole on every rank.
    assert "14 tensors on 2 devices (4 split, 10 replicated)" in proc.stdout, proc.stdout
    assert "no layout (scalars, strings: whole on every rank): 1 entry" in proc.stdout, proc.stdout
    mnt = os.path.join(args.work, "mnt_hfai")
    with itest.mounted(args.ckptfs, os.path.join(data, name), mnt, dst_strategy=strategy,
                       index_dir=os.path.join(args.work, "index")):
        for rank in range(2):
            got = safetensors_tensors(os.path.join(mnt, f"rank_{rank}",
                                                   f"checkpoint_{rank}.safetensors"))
            assert sorted(got) == sorted(k for k, _, _ in model), sorted(got)
            for key, _, array in model:
                want = block(array, splits.get(key), rank, devices=2)
                assert got[key].shape == want.shape and got[key].tobytes() == want.tobytes(), \
                    f"rank {rank} {key} differs"
    # proj.weight is 37 x 29: a split of it is refused, naming it, and nothing is written.
    out = os.path.join(args.work, "refused.ckpt_strategy")
    proc = itest.run([args.ckptfs, "strategy", "new", os.path.join(data, name), "--devices", "2",
                      "--split", r"proj\.weight=0", "-o", out], check=False)
    assert proc.returncode != 0 and not os.path.exists(out), proc
    assert itest.stderr_lines(proc) == [
        "ckptfs: tensor \"proj.weight\" (shape [37,29]): --split 'proj\\.weight=0' splits "
        "dimension 0 of size 37, which does not divide by 2 devices; put a rule for it first "
        "(--replicate or another --split)"], proc.stderr


def written_shapes(path):
    """name -> tensor_shape of a written JSON strategy."""
    with open(path) as f:
        return {k: v["tensor_shape"] for k, v in json.load(f)["parallel_layout_item"].items()}


def check_mindformers_metadata(args):
    """metadata.json's global shapes; the mount with the written strategy is the generator's cut."""
    work = os.path.join(args.work, "mindformers")
    params = mf.demo_params()
    tree = mf.write_tree(os.path.join(work, "src"), params, [2, 2])
    strategy = os.path.join(work, "tp4.json")
    itest.run([args.ckptfs, "strategy", "new", tree.root, "--devices", "4",
               "--split", r"(adam_[mv]\.)?embed\.weight=0", "--split", r"(adam_[mv]\.)?layer\.w=1",
               "-o", strategy])
    # "scale" is a scalar: no layout.
    assert written_shapes(strategy) == {p.name: p.shape for p in params if p.shape}
    splits = {"embed.weight": [0, -1], "layer.w": [-1, 0]}
    maps = {p.name: splits.get(p.name.split(".", 1)[1] if p.opt else p.name, [-1] * len(p.shape))
            for p in params}
    expected = os.path.join(work, "expected")
    files = tree.expected(expected, dst=maps, dst_dev=[4])
    with itest.mounted(args.ckptfs, tree.root, os.path.join(work, "mnt"), dst_strategy=strategy,
                       index_dir=os.path.join(args.work, "index")) as mnt:
        # The scalar, in no strategy, may come at another place of the .ckpt record order.
        test_mindformers.compare_views(mnt, expected, files, ckpt_order=False)


def check_unified(args):
    """The parts' tensors and shapes; hyper_param.safetensors' entries get no layout."""
    work = os.path.join(args.work, "unified")
    fx = ckpt_fixture.make_builtin("st_1to8_split", os.path.join(work, "fixture"), expected=False)
    udir = os.path.join(work, "unified")
    test_safetensors.write_unified(fx, udir, True)
    strategy = os.path.join(work, "s.json")
    proc = itest.run([args.ckptfs, "strategy", "new", udir, "--devices", "2", "-o", strategy])
    assert "8 tensors on 2 devices (0 split, 8 replicated)" in proc.stdout, proc.stdout
    assert written_shapes(strategy) == {p.name: p.shape for p in fx.case.params}


def main():
    args = itest.parse_args()
    checks = itest.Checks(args.only)
    checks.run("a tensor-parallel strategy from a full checkpoint cuts every tensor as meant, "
               "protobuf and JSON alike", check_tp_from_full, args)
    checks.run("the written strategy as --src-strategy merges files saved in its layout",
               check_as_src_strategy, args)
    checks.run("a sharded source gives global shapes through its --src-strategy",
               check_sharded_source, args)
    checks.run("an hfai checkpoint gets a strategy from rules over its merged model", check_hfai,
               args)
    checks.run("a MindFormers metadata checkpoint gets its global shapes from metadata.json",
               check_mindformers_metadata, args)
    checks.run("a unified_safetensors directory gets its parts' shapes", check_unified, args)
    checks.finish()


if __name__ == "__main__":
    main()
