"""MindFormers 2.1.0's own Checkpoint 2.0 load (`mindformers.checkpoint.checkpoint.load_checkpoint`)
of a checkpoint directory into a model and its AdamW optimizer, as a trainer resumes.

    python mf_load.py CHECKPOINT_DIR TEMPLATE_NPZ OUT_NPZ

The model (mf_save.py's Net) is built from TEMPLATE_NPZ's names, shapes and dtypes, all zeros, and
MindFormers' AdamW over it starts from zeros too, so a value the load does not set stays zero.
OUT_NPZ gets every model and optimizer parameter after the load. Run as a process of its own, one
rank (a one-process job: MindFormers reads a directory without metadata.json, such as a mounted
rank_N/, as one full checkpoint of its *.safetensors files).
"""

import sys

import numpy as np

import mf_save  # noqa: F401  (MindSpore's DeviceCtx, which 2.1.0's load path enters)
import mindspore as ms
import mindformers.checkpoint.checkpoint as C


def main():
    checkpoint, template, out = sys.argv[1:4]
    ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")
    with np.load(template) as shapes:
        net = mf_save.Net({k: np.zeros_like(shapes[k]) for k in shapes.files})
    opt = mf_save.adamw(net)
    C.load_checkpoint(checkpoint, net, optimizer=opt)
    values = {name: p.asnumpy() for name, p in opt.parameters_dict().items()}
    values.update({name: p.asnumpy() for name, p in net.parameters_dict().items()})
    np.savez(out, **values)


if __name__ == "__main__":
    main()
