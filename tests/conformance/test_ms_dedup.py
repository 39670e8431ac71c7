"""Deduplicated saves (`CheckpointConfig(remove_redundancy=True)`): MindSpore's transform does not
support them, so the reference is its transform of the same checkpoint saved without
deduplication. Which rank keeps which parameter is decided by MindSpore's own
`get_parameter_redundancy` + `remove_param_redundancy`, the functions its savers call. Both
source formats: `.ckpt` saves cut by record, safetensors saves (the `st_` twins) rewritten by
MindSpore's own load_checkpoint + save_checkpoint(remove_redundancy=True)."""

import gc
import os

import pytest

import msconf
from ckptfix import ckptio, stio

# Single-stage cases with classic tensor maps: MindSpore's strategy parser for redundancy reads
# only the first TensorMap of a Layout-API (multi-axis) parameter, and its groups for pipeline
# stages need each stage's first rank; both are left out.
CASES = ["demo", "8to4_dtypes", "8to1_merge", "opt_src", "opt_dst", "src_chunks",
         "llama13b_to4"]


def mindspore_assignment(strategy_file):
    """{strategy parameter: its groups of ranks holding identical blocks}, {rank: kept names}."""
    from mindspore.train._utils import get_parameter_redundancy, remove_param_redundancy
    groups = get_parameter_redundancy(strategy_file, initial_rank=0)
    return groups, remove_param_redundancy(groups)


def deduplicate(fx, root):
    """The generator's save with each rank keeping only what MindSpore assigns it (entries
    outside the strategy stay in every file); returns the tree and each file's name order."""
    groups, kept = mindspore_assignment(fx.src_strategy)
    orders = []
    for rank, path in sorted(fx.source_files.items()):
        with open(path, "rb") as f:
            data = f.read()
        records = [r for r in ckptio.parse_records(data)
                   if r.tag not in groups or r.tag in kept.get(rank, ())]
        rank_dir = os.path.join(root, os.path.basename(os.path.dirname(path)))
        os.makedirs(rank_dir)
        with open(os.path.join(rank_dir, os.path.basename(path)), "wb") as f:
            f.write(b"".join(data[r.offset:r.offset + r.length] for r in records))
        orders.append([r.tag for r in ckptio.join_chunks(records)])
    dropped = sum(len(groups) - len(set(o) & set(groups)) for o in orders)
    assert dropped > 0, "MindSpore's assignment removed nothing: not a deduplicated save"
    return root, orders


def order_is_determined(names, orders):
    """Whether the files fix the order of `names`: each next name follows the previous one in
    some file or chain of files (then the view must be byte-identical; otherwise only the
    records are, README "Deduplicated saves")."""
    after = {}
    for order in orders:
        for a, b in zip(order, order[1:]):
            after.setdefault(a, set()).add(b)

    def reaches(a, b):
        seen, todo = set(), [a]
        while todo:
            for n in after.get(todo.pop(), ()):
                if n == b:
                    return True
                if n not in seen:
                    seen.add(n)
                    todo.append(n)
        return False

    return all(reaches(a, b) for a, b in zip(names, names[1:]))


def agrees_with_every_file(names, orders):
    """The names come in an order no file contradicts."""
    position = {n: i for i, n in enumerate(names)}
    for order in orders:
        shown = [position[n] for n in order if n in position]
        if shown != sorted(shown):
            return False
    return True


def records(path):
    return [(r.tag, r.tensor_type, tuple(r.dims), r.content)
            for r in ckptio.join_chunks(ckptio.read_records(path))]


@pytest.mark.parametrize("name", CASES)
def test_dedup(ckptfs, tmp_path, name):
    """transform_checkpoints refuses a deduplicated save; its mount == transform of the full save"""
    fx = msconf.make_fixture(name, str(tmp_path / "fixture"))
    reference = msconf.transform(fx.src_dir, str(tmp_path / "transformed"), fx.src_strategy,
                                 fx.dst_strategy)
    src, orders = deduplicate(fx, str(tmp_path / "dedup"))
    # MindSpore's own transform has no check for deduplicated sources: a misleading error here.
    with pytest.raises(ValueError, match=r"The checkpoint of rank \d+ is missing\."):
        msconf.transform(src, str(tmp_path / "transformed_dedup"), fx.src_strategy,
                         fx.dst_strategy)
    # Safetensors entries are sorted by dtype and name, so that view has no order left open.
    converted = msconf.ckpt_to_safetensors(reference, str(tmp_path / "converted"))
    with msconf.mounted(ckptfs, src, str(tmp_path), fx.src_strategy, fx.dst_strategy) as mnt:
        msconf.assert_same_tree(converted, mnt, only=".safetensors")
        assert_ckpt_views(mnt, reference, orders, lambda name: True)


def assert_ckpt_views(mnt, reference, orders, ordered_by_files):
    """The mount's .ckpt files == the reference's: byte for byte where the files fix the order of
    the names `ordered_by_files` accepts (`orders`: each file's such names), otherwise record for
    record with those names in an order no file contradicts and the others where the reference
    has them."""
    files = msconf.tree_files(reference)
    assert [f for f in msconf.tree_files(mnt) if f.endswith(".ckpt")] == files
    for rel in files:
        want = os.path.join(reference, rel)
        names = [r[0] for r in records(want)]
        if order_is_determined([n for n in names if ordered_by_files(n)], orders):
            msconf.assert_same_file(want, os.path.join(mnt, rel))
            continue
        got = records(os.path.join(mnt, rel))
        assert sorted(got) == sorted(records(want)), rel
        got_names = [r[0] for r in got]
        assert [ordered_by_files(n) for n in got_names] == [ordered_by_files(n) for n in names] \
            and [n for n in got_names if not ordered_by_files(n)] == \
            [n for n in names if not ordered_by_files(n)], rel
        assert agrees_with_every_file([n for n in got_names if ordered_by_files(n)], orders), rel


def deduplicate_safetensors(fx, root):
    """The generator's safetensors save with each rank keeping only what MindSpore assigns it,
    each file read by MindSpore's load_checkpoint and written by its save_checkpoint (with
    remove_redundancy=True, which sets the metadata flag); returns the tree and each file's names
    in the order of their data in the file (the writer's: dtype, then name)."""
    from mindspore import load_checkpoint, save_checkpoint
    groups, kept = mindspore_assignment(fx.src_strategy)
    orders = []
    for rank, path in sorted(fx.source_files.items()):
        loaded = load_checkpoint(path, format="safetensors")
        keep = {name: value for name, value in loaded.items()
                if name not in groups or name in kept.get(rank, ())}
        rank_dir = os.path.join(root, os.path.basename(os.path.dirname(path)))
        os.makedirs(rank_dir)
        out = os.path.join(rank_dir, os.path.basename(path))
        save_checkpoint(keep, out, format="safetensors", remove_redundancy=True)
        _, entries, _ = stio.read_header(out)
        orders.append(sorted(entries, key=lambda name: entries[name][2]))
        del loaded, keep
    gc.collect()  # MindSpore's safetensors reader maps the source while its tensors live
    dropped = sum(len(groups) - len(set(o) & set(groups)) for o in orders)
    assert dropped > 0, "MindSpore's assignment removed nothing: not a deduplicated save"
    return root, groups, orders


@pytest.mark.parametrize("name", ["st_" + n for n in CASES if n != "src_chunks"])
def test_dedup_safetensors(ckptfs, tmp_path, name):
    """mount of a deduplicated safetensors save == transform of the full save (both views)"""
    fx = msconf.make_fixture(name, str(tmp_path / "fixture"))
    as_ckpt = msconf.transform(fx.src_dir, str(tmp_path / "to_ckpt"), fx.src_strategy,
                               fx.dst_strategy)
    as_st = msconf.transform(fx.src_dir, str(tmp_path / "to_st"), fx.src_strategy,
                             fx.dst_strategy, output_format="safetensors")
    src, groups, orders = deduplicate_safetensors(fx, str(tmp_path / "dedup"))
    # A .ckpt view from safetensors sources lists the strategy's parameters first, then the
    # entries outside it (taken whole from one rank's file, so in a fixed order): only the
    # parameters' order can be left open by the files.
    orders = [[n for n in order if n in groups] for order in orders]
    with msconf.mounted(ckptfs, src, str(tmp_path), fx.src_strategy, fx.dst_strategy) as mnt:
        # Safetensors entries are sorted by dtype and name: that view has no order left open.
        msconf.assert_same_tree(as_st, mnt, only=".safetensors")
        assert_ckpt_views(mnt, as_ckpt, orders, lambda name: name in groups)
