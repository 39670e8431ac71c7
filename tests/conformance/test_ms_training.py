"""A real training run as the source: a tiny network trained by `Model.train` with
`ModelCheckpoint` (PyNative, CPU) leaves twelve checkpoints in one rank directory; the mount of
that directory equals MindSpore's transform of the one file ckptfs is documented to choose."""

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
    def step(name):
        epoch, step_in_epoch = re.search(r"(\d+)_(\d+)\.ckpt$", name).groups()
        return int(epoch), int(step_in_epoch)

    return max((n for n in names if n.endswith(".ckpt")), key=step)


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


def write_dst_strategy(checkpoint, outdir):
    loaded = ms.load_checkpoint(checkpoint)
    params = [{"name": name, "dtype": str(loaded[name].dtype), "shape": list(loaded[name].shape),
               "src": None, "dst": {"dev_matrix": [2], "tensor_map": tmap}}
              for name, tmap in DST_MAPS.items()]
    case = Case.from_dict({"name": "training", "src": None, "dst": {"devices": 2},
                           "params": params}).resolve()
    return strategy.write_side(case, "dst", outdir)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """One training run per session: its source tree and a target strategy for it."""
    root = tmp_path_factory.mktemp("training")
    rank0 = root / "src" / "rank_0"
    train(str(rank0))
    names = sorted(os.listdir(rank0))
    dst = write_dst_strategy(str(rank0 / "net-12_2.ckpt"), str(root))
    return {"root": root, "src": str(root / "src"), "names": names, "dst": dst}


def transform_of_one(run, name, workdir):
    """MindSpore's transform of a source tree holding only `name` in rank_0."""
    only = os.path.join(workdir, f"only_{name}", "rank_0")
    os.makedirs(only)
    shutil.copy2(os.path.join(run["src"], "rank_0", name), only)
    return msconf.transform(os.path.dirname(only), os.path.join(workdir, f"out_{name}"), None,
                            run["dst"])


def epoch_of(name):
    return int(re.fullmatch(r"net-(\d+)_2\.ckpt", name).group(1))


def test_training_leaves_twelve_checkpoints(run):
    """Model.train + ModelCheckpoint leaves net-1_2.ckpt ... net-12_2.ckpt"""
    assert sorted(run["names"], key=epoch_of) == [f"net-{e}_2.ckpt" for e in range(1, 13)]
    first = ms.load_checkpoint(os.path.join(run["src"], "rank_0", "net-1_2.ckpt"))
    last = ms.load_checkpoint(os.path.join(run["src"], "rank_0", "net-12_2.ckpt"))
    assert msconf.raw_bytes(first["fc1.weight"]) != msconf.raw_bytes(last["fc1.weight"]), \
        "training did not change the weights, so steps cannot be told apart"


def test_training_mount_equals_transform_of_chosen(ckptfs, run, tmp_path):
    """mount of a ModelCheckpoint directory == transform_checkpoints of the file ckptfs chooses"""
    chosen = ckptfs_chosen_checkpoint(run["names"])
    out = transform_of_one(run, chosen, str(tmp_path))
    with msconf.mounted(ckptfs, run["src"], str(tmp_path), None, run["dst"]) as mnt:
        files = msconf.assert_same_tree(out, mnt)
        assert files == ["rank_0/checkpoint_0.ckpt", "rank_1/checkpoint_1.ckpt"]
        halves = [ms.load_checkpoint(os.path.join(mnt, f)) for f in files]
    full = ms.load_checkpoint(os.path.join(run["src"], "rank_0", chosen))
    rows = np.concatenate([h["fc1.weight"].asnumpy() for h in halves])
    assert rows.tobytes() == full["fc1.weight"].asnumpy().tobytes()


def test_mindspore_transform_takes_string_order(run, tmp_path):
    """MindSpore's .ckpt transform of the whole directory takes net-9_2.ckpt (string order)"""
    whole = msconf.transform(run["src"], str(tmp_path / "whole"), None, run["dst"])
    net9 = transform_of_one(run, "net-9_2.ckpt", str(tmp_path))
    net12 = transform_of_one(run, "net-12_2.ckpt", str(tmp_path))
    files = msconf.assert_same_tree(net9, whole)
    assert any(open(os.path.join(net12, f), "rb").read() != open(os.path.join(whole, f),
                                                                 "rb").read() for f in files)


@pytest.mark.parametrize("step, name", [("9_2", "net-9_2.ckpt"), ("net-5_*.ckpt", "net-5_2.ckpt")])
def test_training_step_option(ckptfs, run, tmp_path, step, name):
    """mount --step == transform_checkpoints of that step's file alone"""
    out = transform_of_one(run, name, str(tmp_path))
    with msconf.mounted(ckptfs, run["src"], str(tmp_path), None, run["dst"],
                        args=["--step", step]) as mnt:
        msconf.assert_same_tree(out, mnt)
