"""A real training run as the source: a tiny network trained by `Model.train` with
`ModelCheckpoint` (PyNative, CPU) leaves twelve checkpoints in one rank directory; the mount of
that directory equals MindSpore's transform of the one file ckptfs is documented to choose.
Run once saving `.ckpt` and once saving `.safetensors` (CheckpointConfig(format=...))."""

import os
import re
import shutil

import numpy as np
import pytest

import msconf
from msconf import ms
from ckptfix import strategy
from ckptfix.case import Case

EPOCHS, STEPS_PER_EPOCH = 12, 2


def ckptfs_chosen_checkpoint(names):
    """The checkpoint ckptfs serves from a rank directory that holds several.

    The one place the lane states the rule (README, "Pointing ckptfs at a training output
    directory"): the newest step, by the two integers at the end of the name, so `net-12_2.ckpt`
    beats `net-9_2.ckpt` (MindSpore's own `.ckpt` transform takes the last name in string order,
    `net-9_2.ckpt`). When the rule changes, only this function changes.
    """
    return max(names, key=step_of)


def step_of(name):
    epoch, step_in_epoch = re.search(r"(\d+)_(\d+)\.(ckpt|safetensors)$", name).groups()[:2]
    return int(epoch), int(step_in_epoch)


class TinyNet(ms.nn.Cell):
    def __init__(self):
        super().__init__()
        self.fc1 = ms.nn.Dense(4, 8)
        self.relu = ms.nn.ReLU()
        self.fc2 = ms.nn.Dense(8, 2)

    def construct(self, x):
        return self.fc2(self.relu(self.fc1(x)))


def train(directory, file_format="ckpt"):
    """12 epochs of 2 steps, a checkpoint every 2 steps: net-1_2 ... net-12_2."""
    from mindspore import dataset
    from mindspore.train import CheckpointConfig, Model, ModelCheckpoint

    ms.set_seed(1)
    rng = np.random.default_rng(1)
    x = rng.standard_normal((4 * STEPS_PER_EPOCH, 4)).astype(np.float32)
    y = rng.standard_normal((4 * STEPS_PER_EPOCH, 2)).astype(np.float32)
    data = dataset.NumpySlicesDataset((x, y), column_names=["data", "label"],
                                      shuffle=False).batch(4)
    net = TinyNet()
    model = Model(net, ms.nn.MSELoss(), ms.nn.Adam(net.trainable_params(), learning_rate=0.01))
    config = CheckpointConfig(save_checkpoint_steps=STEPS_PER_EPOCH, keep_checkpoint_max=20,
                              format=file_format)
    saver = ModelCheckpoint(prefix="net", directory=directory, config=config)
    model.train(EPOCHS, data, callbacks=[saver], dataset_sink_mode=False)


# Target layout on 2 devices: weights split by rows or columns, one optimizer state resharded;
# everything else (moment2.*, global_step, learning_rate, beta powers) is passed through.
DST_MAPS = {"fc1.weight": [0, -1], "fc1.bias": [0], "fc2.weight": [-1, 0], "fc2.bias": [-1],
            "moment1.fc1.weight": [-1, 0]}


def write_dst_strategy(checkpoint, file_format, outdir):
    loaded = ms.load_checkpoint(checkpoint, format=file_format)
    params = [{"name": name, "dtype": str(loaded[name].dtype), "shape": list(loaded[name].shape),
               "src": None, "dst": {"dev_matrix": [2], "tensor_map": tmap}}
              for name, tmap in DST_MAPS.items()]
    case = Case.from_dict({"name": "training", "src": None, "dst": {"devices": 2},
                           "params": params}).resolve()
    return strategy.write_side(case, "dst", outdir)


@pytest.fixture(scope="module", params=["ckpt", "safetensors"])
def run(request, tmp_path_factory):
    """One training run per format: its source tree and a target strategy for it."""
    fmt = request.param
    root = tmp_path_factory.mktemp(f"training_{fmt}")
    rank0 = root / "src" / "rank_0"
    train(str(rank0), fmt)
    names = sorted(os.listdir(rank0))
    dst = write_dst_strategy(str(rank0 / f"net-12_2.{fmt}"), fmt, str(root))
    return {"format": fmt, "src": str(root / "src"), "names": names, "dst": dst}


def views_of_one(run, name, workdir):
    """MindSpore's files for a source tree holding only `name` in rank_0: its transform to .ckpt,
    and to safetensors (from .ckpt sources, its conversion of that .ckpt output)."""
    only = os.path.join(workdir, f"only_{name}")
    os.makedirs(os.path.join(only, "rank_0"))
    shutil.copy2(os.path.join(run["src"], "rank_0", name), os.path.join(only, "rank_0"))
    as_ckpt = msconf.transform(only, os.path.join(workdir, f"ckpt_{name}"), None, run["dst"])
    if run["format"] == "ckpt":
        as_st = msconf.ckpt_to_safetensors(as_ckpt, os.path.join(workdir, f"st_{name}"))
    else:
        as_st = msconf.transform(only, os.path.join(workdir, f"st_{name}"), None, run["dst"],
                                 output_format="safetensors")
    return as_ckpt, as_st


def assert_mount_is(views, mnt):
    as_ckpt, as_st = views
    assert msconf.tree_files(mnt) == sorted(msconf.tree_files(as_ckpt) +
                                            msconf.tree_files(as_st))
    msconf.assert_same_tree(as_ckpt, mnt, only=".ckpt")
    msconf.assert_same_tree(as_st, mnt, only=".safetensors")


def test_training_leaves_twelve_checkpoints(run):
    """Model.train + ModelCheckpoint leaves net-1_2 ... net-12_2"""
    fmt = run["format"]
    assert sorted(run["names"], key=step_of) == [f"net-{e}_2.{fmt}" for e in range(1, 13)]
    first = ms.load_checkpoint(os.path.join(run["src"], "rank_0", f"net-1_2.{fmt}"), format=fmt)
    last = ms.load_checkpoint(os.path.join(run["src"], "rank_0", f"net-12_2.{fmt}"), format=fmt)
    assert msconf.raw_bytes(first["fc1.weight"]) != msconf.raw_bytes(last["fc1.weight"]), \
        "training did not change the weights, so steps cannot be told apart"


def test_training_mount_equals_transform_of_chosen(ckptfs, run, tmp_path):
    """mount of a ModelCheckpoint directory == MindSpore's files for the file ckptfs chooses"""
    chosen = ckptfs_chosen_checkpoint(run["names"])
    views = views_of_one(run, chosen, str(tmp_path))
    with msconf.mounted(ckptfs, run["src"], str(tmp_path), None, run["dst"]) as mnt:
        assert_mount_is(views, mnt)
        halves = [ms.load_checkpoint(os.path.join(mnt, f"rank_{t}", f"checkpoint_{t}.ckpt"))
                  for t in (0, 1)]
    full = ms.load_checkpoint(os.path.join(run["src"], "rank_0", chosen), format=run["format"])
    rows = np.concatenate([h["fc1.weight"].asnumpy() for h in halves])
    assert rows.tobytes() == full["fc1.weight"].asnumpy().tobytes()


def test_mindspore_transform_file_choice(run, tmp_path):
    """MindSpore's transform of the whole directory takes net-9_2 for .ckpt (string order), net-12_2 for safetensors"""
    fmt = run["format"]
    takes, not_this = ("net-9_2", "net-12_2") if fmt == "ckpt" else ("net-12_2", "net-9_2")
    whole = msconf.transform(run["src"], str(tmp_path / "whole"), None, run["dst"])
    files = msconf.assert_same_tree(views_of_one(run, f"{takes}.{fmt}", str(tmp_path))[0], whole)
    other = views_of_one(run, f"{not_this}.{fmt}", str(tmp_path))[0]
    assert any(open(os.path.join(other, f), "rb").read() != open(os.path.join(whole, f),
                                                                 "rb").read() for f in files)


@pytest.mark.parametrize("step, epoch", [("9_2", 9), ("net-5_*", 5)])
def test_training_step_option(ckptfs, run, tmp_path, step, epoch):
    """mount --step == MindSpore's files for that step's file alone"""
    fmt = run["format"]
    if "*" in step:
        step += "." + fmt
    views = views_of_one(run, f"net-{epoch}_2.{fmt}", str(tmp_path))
    with msconf.mounted(ckptfs, run["src"], str(tmp_path), None, run["dst"],
                        args=["--step", step]) as mnt:
        assert_mount_is(views, mnt)


def test_training_steps_tree(ckptfs, run, tmp_path):
    """mount's steps/<epoch>_<step>/ == MindSpore's files for that step's file alone"""
    fmt = run["format"]
    with msconf.mounted(ckptfs, run["src"], str(tmp_path), None, run["dst"]) as mnt:
        assert sorted(os.listdir(os.path.join(mnt, "steps")), key=lambda s: step_of(s + ".ckpt")) \
            == [f"{e}_2" for e in range(1, 13)]
        for epoch in (1, 9, 10, 12):
            views = views_of_one(run, f"net-{epoch}_2.{fmt}", str(tmp_path))
            assert_mount_is(views, os.path.join(mnt, "steps", f"{epoch}_2"))
