"""Device counts that are not multiples of each other: MindSpore's transform refuses them, ckptfs
serves them. The mounted slices, merged by MindSpore's own `merge_sliced_parameter` with the
target strategy, are the generator's full tensors."""

import numpy as np
import pytest

import msconf
from msconf import ms
from ckptfix import ckptio
from ckptfix.data import full_box
from ckptfix.sources import TensorBank


def nonmultiple_case(n_src, n_dst):
    """Three parameters split along different dimensions, n_src -> n_dst devices (1-D meshes)."""
    size = n_src * n_dst * 2

    def lay(n, tmap):
        return {"dev_matrix": [n], "tensor_map": tmap}

    params = [
        {"name": "rows.weight", "dtype": "Float32", "shape": [size, 4],
         "src": lay(n_src, [0, -1]), "dst": lay(n_dst, [0, -1])},
        {"name": "cols.weight", "dtype": "BFloat16", "shape": [4, size],
         "src": lay(n_src, [0, -1]), "dst": lay(n_dst, [-1, 0])},
        {"name": "bias", "dtype": "Float16", "shape": [size],
         "src": lay(n_src, [-1]), "dst": lay(n_dst, [0])},
    ]
    return {"name": f"{n_src}to{n_dst}", "seed": n_src * 10 + n_dst,
            "src": {"devices": n_src}, "dst": {"devices": n_dst}, "params": params,
            "extras": [{"name": "global_step", "dtype": "Int64", "value": 7}]}


CASES = {"4to6": "4to6", "2to3": nonmultiple_case(2, 3), "4to3": nonmultiple_case(4, 3),
         "st_4to6": "st_4to6"}


def as_merged(full, tensor_type):
    """merge_sliced_parameter casts BFloat16 slices to Float32 before merging (lossless)."""
    if tensor_type == "BFloat16":
        return (full.astype(np.uint32) << 16).view(np.float32)
    return full


def assemble(case, param, slices):
    """The full tensor put together from the target slices by the generator's own layout."""
    layout = param.dst.layout()
    full = np.zeros(param.shape, dtype=ckptio.NUMPY_DTYPES[param.dtype])
    for rank in range(case.dst.devices):
        box = layout.box(rank, param.shape)
        block = np.frombuffer(msconf.raw_bytes(slices[rank]), dtype=full.dtype)
        full[tuple(slice(lo, hi) for lo, hi in box)] = block.reshape([hi - lo for lo, hi in box])
    return full


@pytest.mark.parametrize("name", list(CASES))
def test_nonmultiple(ckptfs, tmp_path, name):
    """transform_checkpoints refuses; merge_sliced_parameter(mount) == full tensors"""
    fx = msconf.make_fixture(CASES[name], str(tmp_path / "fixture"))
    case = fx.case
    n_src, n_dst = case.src.devices, case.dst.devices
    with pytest.raises(ValueError, match=f"Cannot transform device_num from {n_src} to {n_dst}"):
        msconf.transform(fx.src_dir, str(tmp_path / "transformed"), fx.src_strategy,
                         fx.dst_strategy)
    strategy = ms.build_searched_strategy(fx.dst_strategy)
    bank = TensorBank(case)
    with msconf.mounted(ckptfs, fx.src_dir, str(tmp_path), fx.src_strategy,
                        fx.dst_strategy) as mnt:
        loaded = {}
        for t, path in sorted(fx.expected_files().items()):
            mounted = f"{mnt}/rank_{t}/checkpoint_{t}.ckpt"
            msconf.assert_loads_as_expected(mounted, path)
            msconf.assert_safetensors_as_expected(mounted[:-len(".ckpt")] + ".safetensors", path)
            loaded[t] = ms.load_checkpoint(mounted)
    assert sorted(loaded) == list(range(n_dst))
    for param in case.params:
        full = bank.get(param).block_array(full_box(param.shape))
        slices = [loaded[t][param.name] for t in range(n_dst)]
        merged = ms.merge_sliced_parameter(slices, strategy).asnumpy()
        assert merged.tobytes() == as_merged(full, param.dtype).tobytes(), \
            f"{param.name}: merge_sliced_parameter of the mounted slices differs"
        assert assemble(case, param, slices).tobytes() == full.tobytes(), \
            f"{param.name}: the mounted slices do not tile the full tensor"
