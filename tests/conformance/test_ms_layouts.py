"""Every layout class of the fixture generator, and seeded random layouts: MindSpore's
`transform_checkpoints` writes exactly the mounted bytes, and `load_checkpoint` reads every
mounted file with the values the generator sliced from its full tensors."""

import os
import random

import pytest

import msconf
from msconf import ckpt_fixture, ms

# Generator cases that are not plain transform cases, and where each is tested instead.
NOT_TRANSFORMABLE = {
    "crc_oldscalars": "string entries crash MindSpore's transform: test_string_entries",
    "4to6": "MindSpore refuses non-multiple device counts: test_ms_nonmultiple.py",
}
BUILTIN_CASES = [n for n in ckpt_fixture.SMALL_BUILTINS if n not in NOT_TRANSFORMABLE]


def without_strings(name):
    case = ckpt_fixture.builtin(name)
    case["extras"] = [e for e in case["extras"] if e["dtype"] != "str"]
    case["name"] += "_nostrings"
    return case


def check_transform_equals_mount(ckptfs, fx, workdir):
    """The .ckpt view is MindSpore's transform; the .safetensors view is MindSpore's conversion of
    that transform to safetensors; both load with the generator's values."""
    src = msconf.strategy_for_mindspore(fx.src_strategy, workdir, "src")
    dst = msconf.strategy_for_mindspore(fx.dst_strategy, workdir, "dst")
    out = msconf.transform(msconf.chosen_files_only(fx, workdir),
                           os.path.join(workdir, "transformed"), src, dst)
    expected = fx.expected_files()
    assert msconf.tree_files(out) == sorted(
        f"rank_{t}/checkpoint_{t}.ckpt" for t in expected), "MindSpore wrote other files"
    converted = msconf.ckpt_to_safetensors(out, os.path.join(workdir, "converted"))
    with msconf.mounted(ckptfs, fx.src_dir, workdir, fx.src_strategy, fx.dst_strategy) as mnt:
        assert msconf.tree_files(mnt) == sorted(msconf.tree_files(out) +
                                                msconf.tree_files(converted))
        msconf.assert_same_tree(out, mnt, only=".ckpt")
        msconf.assert_same_tree(converted, mnt, only=".safetensors")
        for t, path in expected.items():
            view = os.path.join(mnt, f"rank_{t}", f"checkpoint_{t}")
            msconf.assert_loads_as_expected(view + ".ckpt", path)
            msconf.assert_safetensors_as_expected(view + ".safetensors", path)
    if (src, dst) != (fx.src_strategy, fx.dst_strategy):
        # The files MindSpore's merge_pipeline_strategys wrote mount to the same bytes.
        with msconf.mounted(ckptfs, fx.src_dir, os.path.join(workdir, "merged"), src, dst) as mnt:
            msconf.assert_same_tree(out, mnt, only=".ckpt")


@pytest.mark.parametrize("name", BUILTIN_CASES)
def test_builtin(ckptfs, tmp_path, name):
    """transform_checkpoints == mount, load_checkpoint == generator"""
    fx = msconf.make_fixture(name, str(tmp_path / "fixture"))
    check_transform_equals_mount(ckptfs, fx, str(tmp_path))


def test_crc_oldscalars_without_strings(ckptfs, tmp_path):
    """transform_checkpoints == mount, load_checkpoint == generator: CRC sources, dims [0] scalars"""
    fx = msconf.make_fixture(without_strings("crc_oldscalars"), str(tmp_path / "fixture"))
    check_transform_equals_mount(ckptfs, fx, str(tmp_path))


def test_string_entries(ckptfs, tmp_path):
    """String entries: MindSpore's transform crashes; load_checkpoint reads the mount's strings"""
    fx = msconf.make_fixture("crc_oldscalars", str(tmp_path / "fixture"))
    with pytest.raises(AttributeError, match="'str' object has no attribute 'data'"):
        msconf.transform(fx.src_dir, str(tmp_path / "transformed"), fx.src_strategy,
                         fx.dst_strategy)
    with msconf.mounted(ckptfs, fx.src_dir, str(tmp_path), fx.src_strategy,
                        fx.dst_strategy) as mnt:
        for t, path in fx.expected_files().items():
            mounted = os.path.join(mnt, f"rank_{t}", f"checkpoint_{t}.ckpt")
            msconf.assert_loads_as_expected(mounted, path)
            assert isinstance(ms.load_checkpoint(mounted)["note"], str)
            # The safetensors view leaves the strings out and holds everything else.
            msconf.assert_safetensors_as_expected(mounted[:-len(".ckpt")] + ".safetensors", path)


# -- seeded random layouts -----------------------------------------------------------------------

DTYPES = ["Float32", "Float16", "BFloat16", "Int32", "Int64", "Float64", "Int8", "UInt8"]
DEVICE_PAIRS = [(8, 4), (4, 8), (8, 2), (2, 8), (4, 4), (8, 8), (4, 2), (2, 4), (8, None),
                (None, 4)]


def _dev_matrix(rng, devices):
    factors = []
    while devices > 1:
        f = rng.choice([d for d in (2, 4, 8) if devices % d == 0])
        factors.append(f)
        devices //= f
    rng.shuffle(factors)
    return factors or [1]


def _random_layout(rng, dev, ndim, allow_opt):
    axes = list(range(len(dev)))
    rng.shuffle(axes)
    tmap = []
    for _ in range(ndim):
        if axes and rng.random() < 0.6:
            if len(axes) >= 2 and rng.random() < 0.25:
                tmap.append([axes.pop(), axes.pop()])  # a multi-axis (Layout-API) dimension
            else:
                tmap.append(axes.pop())
        else:
            tmap.append(-1)
    layout = ckpt_fixture.Layout.from_map(dev, tmap)
    opt = 0
    if allow_opt and layout.replica_count >= 2 and rng.random() < 0.4:
        opt = rng.choice([-1, 2] if layout.replica_count % 2 == 0 else [-1])
    return {"dev_matrix": dev, "tensor_map": tmap, "opt_shard_size": opt, "stages": [0]}


def _split_of(spec):
    probe = ckpt_fixture.Layout.from_map(spec["dev_matrix"], spec["tensor_map"],
                                         spec["opt_shard_size"], 1 if spec["opt_shard_size"] else 0)
    return probe.splits()


def random_case(seed):
    """A small model of 3-5 parameters with random maps on both sides (deterministic in seed)."""
    rng = random.Random(seed)
    n_src, n_dst = DEVICE_PAIRS[seed % len(DEVICE_PAIRS)]
    src_dev = _dev_matrix(rng, n_src) if n_src else None
    dst_dev = _dev_matrix(rng, n_dst) if n_dst else None
    params = []
    for i in range(rng.randint(3, 5)):
        ndim = rng.randint(1, 3)
        src = _random_layout(rng, src_dev, ndim, True) if src_dev else None
        dst = _random_layout(rng, dst_dev, ndim, True) if dst_dev else None
        shape = [rng.choice([1, 2, 3]) for _ in range(ndim)]
        for spec in (src, dst):
            if spec:
                for j, s in enumerate(_split_of(spec)):
                    shape[j] *= s  # a multiple of both sides' splits
        params.append({"name": f"p{i}.weight", "dtype": rng.choice(DTYPES), "shape": shape,
                       "src": src, "dst": dst})
    return {"name": f"random_{seed}", "seed": seed,
            "description": f"random layouts, {n_src or 'unsharded'} -> {n_dst or 'merged'}",
            "src": {"devices": n_src, "stages": 1} if n_src else None,
            "dst": {"devices": n_dst, "stages": 1} if n_dst else None,
            "params": params,
            "extras": [{"name": "learning_rate", "dtype": "Float32", "value": 0.001},
                       {"name": "global_step", "dtype": "Int64", "value": 1000}],
            "options": {"shuffle_layouts": True}}


@pytest.mark.parametrize("seed", range(10))
def test_random_layout(ckptfs, tmp_path, seed):
    """transform_checkpoints == mount, load_checkpoint == generator: seeded random layout"""
    fx = msconf.make_fixture(random_case(seed), str(tmp_path / "fixture"))
    check_transform_equals_mount(ckptfs, fx, str(tmp_path))


def test_by_stage(ckptfs, tmp_path):
    """mount -o by_stage == MindSpore's by-stage transform, one call per stage's strategy file"""
    from mindspore.parallel.checkpoint_transform import _transform_checkpoint_by_stage

    fx = msconf.make_fixture("pipeline_src_dir", str(tmp_path / "fixture"))
    out = str(tmp_path / "by_stage")
    # transform_checkpoints takes this path only for some strategy pairs; here it is called
    # directly, as the README describes the files: once per source stage, with its strategy.
    for name in sorted(os.listdir(fx.src_strategy)):
        _transform_checkpoint_by_stage(fx.src_dir, out, "checkpoint_",
                                       os.path.join(fx.src_strategy, name), fx.dst_strategy)
    files = msconf.tree_files(out)
    assert len(files) == 8 and all("_part" in f for f in files)
    with msconf.mounted(ckptfs, fx.src_dir, str(tmp_path), fx.src_strategy, fx.dst_strategy,
                        args=["-o", "by_stage"]) as mnt:
        msconf.assert_same_tree(out, mnt)
        for t in range(4):
            # The parts loaded together hold the resharded parameters of the one-file view (an
            # entry in several parts, like learning_rate, takes the last part's value).
            merged = ms.load_segmented_checkpoints(os.path.join(mnt, f"rank_{t}"))
            want = ms.load_checkpoint(fx.expected_files()[t])
            assert sorted(merged) == sorted(want)
            for param in fx.case.params:
                if param.dst:
                    assert msconf.raw_bytes(merged[param.name]) == \
                        msconf.raw_bytes(want[param.name]), param.name
