"""MindFormers metadata checkpoints ("Checkpoint 2.0"), really mounted.

Trees written by construction (scripts/ckptfix/mindformers.py: full tensors cut by a layout into
model/opt safetensors files, metadata.json and common.json as MindFormers 2.1.0 writes them), with
and without deduplication, mounted with no source strategy: every view equals the expected file
the generator cut from the same full tensors, merged and resharded to a destination strategy.
A deduplicated tree's .ckpt view holds the same records (each byte-identical); the order of
names that no file holds together is open there. Bad input is refused at mount time with one line
per failure naming the file and the parameter.
"""

import json
import os
import shutil

import itest
from ckptfix import ckptio, stio
from ckptfix import mindformers as mf


def strategy_json(path, dev, maps):
    layouts = {name: {"dev_matrix": dev, "tensor_map": m, "field": 0,
                      "opt_weight_shard_step": 0, "opt_weight_shard_size": 0}
               for name, m in maps.items()}
    items = {f"MatMul_{name}": {"stage": 0, "parallel_strategy": [[1]]} for name in maps}
    with open(path, "w") as f:
        json.dump({"current_stage": 1, "parallel_strategy_item": items,
                   "parallel_layout_item": layouts}, f)
    return path


def compare_views(mnt, expected_dir, files, ckpt_order=True):
    assert itest.tree_files(mnt) == sorted(files), (itest.tree_files(mnt), files)
    for rel in files:
        got, want = itest.read_file(os.path.join(mnt, rel)), itest.read_file(
            os.path.join(expected_dir, rel))
        if rel.endswith(".ckpt") and not ckpt_order:
            def recs(blob):
                return sorted((r.tag, r.tensor_type, tuple(r.dims), r.content)
                              for r in ckptio.join_chunks(ckptio.parse_records(blob)))
            assert recs(got) == recs(want), f"{rel}: records differ"
        else:
            assert got == want, f"{rel}: {len(got)} bytes, expected {len(want)}"


def mount_args(args, name):
    return {"index_dir": os.path.join(args.work, "index"),
            "log_file": os.path.join(args.work, f"{name}.log")}


DST_DEV = [4]


def dst_maps(params):
    """Another layout on 4 devices: rows where the source cut columns and so on."""
    out = {}
    for p in params:
        if len(p.shape) == 2:
            out[p.name] = [-1, 0] if p.shape[1] % 4 == 0 else [0, -1]
        elif len(p.shape) == 1 and p.shape[0] % 4 == 0:
            out[p.name] = [0]
        else:
            out[p.name] = [-1] * len(p.shape)
    return out


def case_merged(args, dedup):
    name = f"merged_{'dedup' if dedup else 'full'}"
    work = os.path.join(args.work, name)
    tree = mf.write_tree(os.path.join(work, "src"), mf.demo_params(), [2, 2], dedup=dedup)
    files = tree.expected(os.path.join(work, "expected"))
    with itest.mounted(args.ckptfs, tree.root, os.path.join(work, "mnt"),
                       **mount_args(args, name)) as mnt:
        compare_views(mnt, os.path.join(work, "expected"), files, ckpt_order=not dedup)


def case_resharded(args, dedup):
    name = f"resharded_{'dedup' if dedup else 'full'}"
    work = os.path.join(args.work, name)
    params = mf.demo_params()
    tree = mf.write_tree(os.path.join(work, "src"), params, [2, 2], dedup=dedup, prefix="llama")
    maps = dst_maps(params)
    dst = strategy_json(os.path.join(work, "dst.json"), DST_DEV, maps)
    files = tree.expected(os.path.join(work, "expected"), dst=maps, dst_dev=DST_DEV)
    with itest.mounted(args.ckptfs, tree.root, os.path.join(work, "mnt"), dst_strategy=dst,
                       **mount_args(args, name)) as mnt:
        compare_views(mnt, os.path.join(work, "expected"), files, ckpt_order=not dedup)


def case_compact_dedup(args):
    """Replicated parameters on 4 ranks, deduplicated: only some ranks write files, numbered
    compactly, and optimizer files holding only global_step are named by no storage key."""
    work = os.path.join(args.work, "compact")
    params = [mf.Param("a", [4, 4], "Float32", [-1, -1]), mf.Param("b", [6], "Float16", [-1]),
              mf.Param("m.a", [4, 4], "Float32", [-1, -1], opt=True)]
    tree = mf.write_tree(os.path.join(work, "src"), params, [4], dedup=True)
    names = sorted(os.listdir(tree.iteration_dir))
    assert "model-0000002-0000003.safetensors" in names and not any(
        "0000004" in n for n in names), names
    files = tree.expected(os.path.join(work, "expected"))
    with itest.mounted(args.ckptfs, tree.root, os.path.join(work, "mnt"),
                       **mount_args(args, "compact")) as mnt:
        # No file holds two of the names: their .ckpt order is open.
        compare_views(mnt, os.path.join(work, "expected"), files, ckpt_order=False)


def case_pipeline(args, dst):
    """Two pipeline stages (rank_list 0-1 and 2-3): merged, or to one stage of 4 devices."""
    name = f"pipeline_{'dst' if dst else 'merged'}"
    work = os.path.join(args.work, name)
    params = [mf.Param("s0.w", [4, 8], "Float32", [0, -1], stage=0),
              mf.Param("s0.b", [6], "Float16", [-1], stage=0),
              mf.Param("s1.w", [4, 8], "Float32", [-1, 0], stage=1),
              mf.Param("adam_m.s1.w", [4, 8], "Float32", [-1, 0], opt=True, stage=1)]
    tree = mf.write_tree(os.path.join(work, "src"), params, [2], stages=2)
    kw = mount_args(args, name)
    if dst:
        maps = dst_maps(params)
        kw["dst_strategy"] = strategy_json(os.path.join(work, "dst.json"), DST_DEV, maps)
        files = tree.expected(os.path.join(work, "expected"), dst=maps, dst_dev=DST_DEV)
    else:
        files = tree.expected(os.path.join(work, "expected"))
    with itest.mounted(args.ckptfs, tree.root, os.path.join(work, "mnt"), **kw) as mnt:
        compare_views(mnt, os.path.join(work, "expected"), files)


def case_weights_only(args):
    """No optimizer states: no optimizer files, so global_step is common.json's (Int64 scalar,
    .ckpt view only), and a null counter is left out."""
    work = os.path.join(args.work, "weights_only")
    params = [p for p in mf.demo_params() if not p.opt]
    tree = mf.write_tree(os.path.join(work, "src"), params, [2, 2],
                         common={"epoch_num": 1, "step_num": 7, "global_step": 7,
                                 "loss_scale": None, "global_batch_size": 32,
                                 "consumed_samples": 224, "ckpt_status": None})
    assert not any(n.startswith("opt-") for n in os.listdir(tree.iteration_dir))
    files = tree.expected(os.path.join(work, "expected"))
    with itest.mounted(args.ckptfs, tree.root, os.path.join(work, "mnt"),
                       **mount_args(args, "weights_only")) as mnt:
        compare_views(mnt, os.path.join(work, "expected"), files)
        tags = [r.tag for r in ckptio.read_records(os.path.join(mnt, "rank_0/checkpoint_0.ckpt"))]
        assert tags[-4:] == ["epoch_num", "step_num", "global_step", "global_batch_size"], tags


def case_unhealthy(args):
    """common.json's ckpt_status 1 (ABNORMAL) mounts with one warning saying so."""
    work = os.path.join(args.work, "unhealthy")
    tree = mf.write_tree(os.path.join(work, "src"), mf.demo_params(), [2, 2],
                         common={"epoch_num": 1, "step_num": 7, "global_step": 7,
                                 "loss_scale": 1.0, "global_batch_size": 32, "ckpt_status": 1})
    files = tree.expected(os.path.join(work, "expected"))
    mnt = os.path.join(work, "mnt")
    os.makedirs(mnt)
    proc = itest.run(itest.mount_cmd(args.ckptfs, tree.root, mnt,
                                     index_dir=os.path.join(args.work, "index")))
    try:
        assert "unhealthy (ckpt_status 1)" in proc.stderr, proc.stderr
        compare_views(mnt, os.path.join(work, "expected"), files)
    finally:
        itest.unmount(args.ckptfs, mnt)


def case_iterations(args):
    """ROOT serves latest_checkpointed_iteration.txt's iteration, --step ITER another one, and an
    iteration directory serves itself."""
    work = os.path.join(args.work, "iterations")
    root = os.path.join(work, "src")
    old = mf.write_tree(root, mf.demo_params(), [2, 2], iteration=500, seed=1, latest=False)
    new = mf.write_tree(root, mf.demo_params(), [2, 2], iteration=1000, seed=2)
    old_files = old.expected(os.path.join(work, "exp_old"))
    new.expected(os.path.join(work, "exp_new"))
    kw = mount_args(args, "iterations")
    with itest.mounted(args.ckptfs, root, os.path.join(work, "mnt"), **kw) as mnt:
        compare_views(mnt, os.path.join(work, "exp_new"), old_files)
    with itest.mounted(args.ckptfs, root, os.path.join(work, "mnt"), extra_args=["--step", "500"],
                       **kw) as mnt:
        compare_views(mnt, os.path.join(work, "exp_old"), old_files)
    with itest.mounted(args.ckptfs, old.iteration_dir, os.path.join(work, "mnt"), **kw) as mnt:
        compare_views(mnt, os.path.join(work, "exp_old"), old_files)


def refused(args, src, *expect, extra=()):
    proc = itest.refused_mount(args.ckptfs, src, os.path.join(args.work, "bad_mnt"),
                               index_dir=os.path.join(args.work, "index"), extra_args=list(extra))
    err = proc.stderr.strip()
    for word in expect:
        assert word in err, f"{word!r} not in: {err}"
    assert "terminate" not in err and "Traceback" not in err, err
    return err


def bad_tree(args, name):
    work = os.path.join(args.work, "bad", name)
    shutil.rmtree(work, ignore_errors=True)
    return mf.write_tree(work, mf.demo_params(), [2, 2])


def edit_metadata(tree, fn):
    path = os.path.join(tree.iteration_dir, "metadata.json")
    with open(path) as f:
        doc = json.load(f)
    fn(doc)
    with open(path, "w") as f:
        json.dump(doc, f)


def case_bad_inputs(args):
    t = bad_tree(args, "missing_file")
    os.remove(os.path.join(t.iteration_dir, "model-0000001-0000004.safetensors"))
    refused(args, t.root, "model-0000001-0000004.safetensors", "missing")

    t = bad_tree(args, "lacks_param")
    # A rank-1 model file written without layer.w: metadata.json still says it stores it.
    path = os.path.join(t.iteration_dir, "model-0000001-0000004.safetensors")
    meta, entries, start = stio.read_header(path)
    with open(path, "rb") as f:
        blob = f.read()
    kept = []
    for ename, (code, shape, lo, hi) in entries.items():
        if ename == "layer.w":
            continue
        data = blob[start + lo:start + hi]
        kept.append(stio.Entry(ename, stio.TYPE_OF[code], shape, len(data),
                               lambda d=data: iter([d])))
    stio.write(path, kept, meta)
    err = refused(args, t.root, path, "layer.w", "missing")
    assert err.count("\n") == 0, err

    t = bad_tree(args, "shape")
    edit_metadata(t, lambda d: d["state_dict_metadata"]["norm.gamma"].update(
        properties=dict(d["state_dict_metadata"]["norm.gamma"]["properties"], dtype="Float16")))
    err = refused(args, t.root, "norm.gamma", "Float16", "model-0000000-0000004.safetensors")
    assert len(err.splitlines()) == 4, err  # one line per file of the replicated parameter

    t = bad_tree(args, "no_slice")
    edit_metadata(t, lambda d: d["storage_data"].pop("('layer.w', (1,))"))
    refused(args, t.root, "metadata.json", "layer.w", "slice 1")

    t = bad_tree(args, "wrong_rank")
    edit_metadata(t, lambda d: d["storage_data"]["('layer.w', (1,))"][0].update(storage_rank=0))
    refused(args, t.root, "metadata.json", "layer.w", "rank 0")

    t = bad_tree(args, "bad_json")
    with open(os.path.join(t.iteration_dir, "metadata.json"), "r+") as f:
        f.truncate(100)
    refused(args, t.root, "metadata.json", "not valid JSON")

    t = bad_tree(args, "no_iteration")
    refused(args, t.root, "iteration_00000007", extra=["--step", "7"])
    refused(args, t.root, "--step", extra=["--step", "latest_"])
    refused(args, t.root, "omit --src-strategy", extra=["--src-strategy", t.root])

    t = bad_tree(args, "chunk")
    edit_metadata(t, lambda d: d["state_dict_metadata"]["layer.w"]["chunk"][0].update(
        local_shape=[4, 6]))
    refused(args, t.root, "layer.w", "[4,6]")

    t = bad_tree(args, "interleaved")
    edit_metadata(t, lambda d: d["state_dict_metadata"]["layer.w"]["layout"].update(
        interleaved_parallel=True))
    refused(args, t.root, "metadata.json", "layer.w", "interleaved_parallel")

    t = bad_tree(args, "bad_latest")
    with open(os.path.join(t.root, "latest_checkpointed_iteration.txt"), "w") as f:
        f.write("ten")
    refused(args, t.root, "latest_checkpointed_iteration.txt", "--step")


def main():
    args = itest.parse_args()
    checks = itest.Checks(args.only)
    checks.run("merged", case_merged, args, False)
    checks.run("merged_dedup", case_merged, args, True)
    checks.run("resharded", case_resharded, args, False)
    checks.run("resharded_dedup", case_resharded, args, True)
    checks.run("compact_dedup", case_compact_dedup, args)
    checks.run("pipeline_merged", case_pipeline, args, False)
    checks.run("pipeline_dst", case_pipeline, args, True)
    checks.run("weights_only", case_weights_only, args)
    checks.run("unhealthy", case_unhealthy, args)
    checks.run("iterations", case_iterations, args)
    checks.run("bad_inputs", case_bad_inputs, args)
    checks.finish()


if __name__ == "__main__":
    main()
