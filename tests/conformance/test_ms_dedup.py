"""Deduplicated saves (`CheckpointConfig(remove_redundancy=True)`): MindSpore's transform does not
support them, so the reference is its transform of the same checkpoint saved without
deduplication. Which rank keeps which parameter is decided by MindSpore's own
`get_parameter_redundancy` + `remove_param_redundancy`, the functions its savers call."""

import os

import pytest

import msconf
from ckptfix import ckptio

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
        files = msconf.tree_files(reference)
        assert [f for f in msconf.tree_files(mnt) if f.endswith(".ckpt")] == files
        for rel in files:
            want = os.path.join(reference, rel)
            if order_is_determined([r[0] for r in records(want)], orders):
                msconf.assert_same_file(want, os.path.join(mnt, rel))
            else:
                got = records(os.path.join(mnt, rel))
                assert sorted(got) == sorted(records(want)), rel
                assert agrees_with_every_file([r[0] for r in got], orders), rel
