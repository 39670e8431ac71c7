"""Helpers of the conformance tests: MindSpore's own transform and loader on one side, the mount
on the other, the fixture generator's by-construction files as the values both must hold.

Imported by conftest.py and the test modules; MindSpore is imported once per pytest session.
"""

import contextlib
import gc
import multiprocessing
import os
import shutil
import sys

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "scripts"))
sys.path.append(os.path.join(REPO, "tests", "integration"))

# MindSpore logs every C++ warning (e.g. no GPU plugin) unless told otherwise.
os.environ.setdefault("GLOG_v", "3")

import ckpt_fixture  # noqa: E402
import itest  # noqa: E402
import mindspore as ms  # noqa: E402
from ckptfix import ckptio  # noqa: E402

# One import per session; the training test runs in PyNative mode on the CPU.
ms.set_context(mode=ms.PYNATIVE_MODE, device_target="CPU")

# The generator's llama2-13b cases read the real strategy from "<shared>/fixtures/real/...";
# this copy (tests/data/conformance/README.md) keeps the lane independent of ../shared.
DATA_SHARED = os.path.join(REPO, "tests", "data", "conformance")


def make_fixture(case, outdir):
    """A builtin name or a case dict, generated with its expected files."""
    if isinstance(case, str):
        return ckpt_fixture.make_builtin(case, outdir, shared=DATA_SHARED)
    return ckpt_fixture.make(case, outdir, shared=DATA_SHARED)


def strategy_for_mindspore(path, workdir, which):
    """MindSpore's transform takes one strategy file: a per-stage or per-rank directory is merged
    by MindSpore's own merge_pipeline_strategys (the mount reads the directory itself)."""
    if path is None or not os.path.isdir(path):
        return path
    ext = ".json" if any(n.endswith(".json") for n in os.listdir(path)) else ".ckpt"
    merged = os.path.join(workdir, f"{which}_merged_by_mindspore{ext}")
    ms.merge_pipeline_strategys(path, merged)
    return merged


def chosen_files_only(fx, workdir):
    """A copy of the source tree with only the file ckptfs serves in each rank directory.

    Where a rank directory holds several checkpoints, MindSpore's `.ckpt` transform takes the last
    name in string order and ckptfs the newest step, so the two are compared on the chosen file.
    """
    if all(len([n for n in os.listdir(os.path.dirname(p)) if n.endswith(".ckpt")]) == 1
           for p in fx.source_files.values()):
        return fx.src_dir
    root = os.path.join(workdir, "chosen_only")
    for path in fx.source_files.values():
        rank_dir = os.path.join(root, os.path.basename(os.path.dirname(path)))
        os.makedirs(rank_dir)
        shutil.copyfile(path, os.path.join(rank_dir, os.path.basename(path)))
    return root


class _JoinedAtStart(multiprocessing.Process):
    def start(self):
        super().start()
        self.join()


class _StagesInOrder:
    """`multiprocessing` for MindSpore's safetensors transform, with each process run to its
    end before the next starts."""
    Process = _JoinedAtStart

    def __getattr__(self, name):
        return getattr(multiprocessing, name)


@contextlib.contextmanager
def pipeline_stages_in_order():
    """MindSpore 2.7.2 transforms each pipeline stage of safetensors sources in a process of its
    own, all at once, and merges their results in the order they finish: the record order of its
    `.ckpt` output, and which stage's value an entry of several stages keeps, change from run to
    run (docs/CONFORMANCE.md). Here its own code runs the stages one after the other, in stage
    order, which is also what it does most of the time."""
    from mindspore.parallel import transform_safetensors
    saved = transform_safetensors.mp
    transform_safetensors.mp = _StagesInOrder()
    try:
        yield
    finally:
        transform_safetensors.mp = saved


def transform(src_dir, out_dir, src_strategy, dst_strategy, output_format="ckpt"):
    shutil.rmtree(out_dir, ignore_errors=True)
    with pipeline_stages_in_order():
        ms.transform_checkpoints(src_dir, out_dir, "checkpoint_", src_strategy, dst_strategy,
                                 output_format=output_format)
    return out_dir


def ckpt_to_safetensors(ckpt_root, out_root):
    """MindSpore's own conversion of each `.ckpt` below `ckpt_root` (its transform writes no
    safetensors from `.ckpt` sources): `save_checkpoint(load_checkpoint(f), format="safetensors")`.
    """
    for rel in tree_files(ckpt_root):
        out_dir = os.path.join(out_root, os.path.dirname(rel))
        os.makedirs(out_dir, exist_ok=True)
        ms.ckpt_to_safetensors(os.path.join(ckpt_root, rel), out_dir)
    return out_root


def tree_files(root):
    """Files below root, sorted; a mount's `steps/` subtree (every saved step) is not the view of
    the chosen step, and the tests that want it look into it themselves."""
    return [f for f in itest.tree_files(root) if not f.startswith("steps/")]


def assert_same_file(reference, mounted):
    """Whole-file byte comparison; on a difference, the generator explains the first one."""
    with open(reference, "rb") as f:
        want = f.read()
    with open(mounted, "rb") as f:
        got = f.read()
    if got != want:
        why = ckpt_fixture.describe_difference(reference, mounted)
        raise AssertionError(f"{mounted} differs from {reference}: {why}")


def assert_same_tree(reference_root, mount_root, only=""):
    """Every file of the reference tree (those ending in `only`) is in the mount, byte for byte,
    and the mount has no other such file."""
    files = [f for f in tree_files(reference_root) if f.endswith(only)]
    assert [f for f in tree_files(mount_root) if f.endswith(only)] == files, \
        f"the mount and {reference_root} list other{' ' + only if only else ''} files"
    for rel in files:
        assert_same_file(os.path.join(reference_root, rel), os.path.join(mount_root, rel))
    return files


@contextlib.contextmanager
def mounted(ckptfs, src_dir, workdir, src_strategy=None, dst_strategy=None, args=()):
    """The real binary on a mountpoint unique to this test (`workdir`/mnt); always unmounted."""
    mnt = os.path.join(workdir, "mnt")
    with itest.mounted(ckptfs, src_dir, mnt, src_strategy=src_strategy,
                       dst_strategy=dst_strategy, index_dir=os.path.join(workdir, "index"),
                       log_file=os.path.join(workdir, "ckptfs.log"), extra_args=args):
        yield mnt


def raw_bytes(value):
    """C-order bytes of a loaded MindSpore Parameter/Tensor (bfloat16 keeps its bit pattern)."""
    return np.ascontiguousarray(value.asnumpy()).tobytes()


def assert_loads_as_expected(mounted_file, expected_file):
    """mindspore.load_checkpoint of a mounted file gives, entry for entry and in order, the names,
    dtypes, shapes and values of the generator's expected file (slices of its full tensors)."""
    loaded = ms.load_checkpoint(mounted_file)
    records = ckptio.join_chunks(ckptio.read_records(expected_file))
    assert list(loaded) == [r.tag for r in records], f"{mounted_file}: other entries or order"
    for rec in records:
        value = loaded[rec.tag]
        if rec.tensor_type == ckptio.STRING_TYPE:
            assert value == rec.content.decode("utf-32-le"), f"{rec.tag}: string differs"
            continue
        assert str(value.dtype) == rec.tensor_type, f"{rec.tag}: dtype {value.dtype}"
        assert list(value.shape) == rec.dims, f"{rec.tag}: shape {value.shape}, dims {rec.dims}"
        assert raw_bytes(value) == rec.content, f"{rec.tag}: values differ"
    return len(records)


def assert_safetensors_as_expected(view, expected_file):
    """A mounted .safetensors view read by `load_checkpoint(format="safetensors")` and by the
    reference `safetensors` package (which maps the file) holds every entry of the generator's
    expected file that safetensors can hold (not strings), with its dtype, shape and values."""
    from safetensors.numpy import load_file

    records = [r for r in ckptio.join_chunks(ckptio.read_records(expected_file))
               if r.tensor_type != ckptio.STRING_TYPE]
    loaded = ms.load_checkpoint(view, format="safetensors")
    mapped = load_file(view)
    names = sorted(r.tag for r in records)
    assert sorted(loaded) == names and sorted(mapped) == names, f"{view}: other entries"
    for rec in records:
        value = loaded[rec.tag]
        assert str(value.dtype) == rec.tensor_type, f"{rec.tag}: dtype {value.dtype}"
        assert list(value.shape) == rec.dims, f"{rec.tag}: shape {value.shape}"
        assert raw_bytes(value) == rec.content, f"{rec.tag}: load_checkpoint values differ"
        array = mapped[rec.tag]
        assert list(array.shape) == rec.dims, f"{rec.tag}: mapped shape {array.shape}"
        assert np.ascontiguousarray(array).tobytes() == rec.content, \
            f"{rec.tag}: values read through mmap differ"
    # MindSpore's reader keeps the file mapped while its tensors live; the mount must go.
    del loaded, mapped, value, array
    gc.collect()
