"""A per-rank entry (one no strategy names, here `learning_rate`: every rank saves its own value)
missing from the file a target takes it from. MindSpore takes such an entry from the source file
of local rank t mod N_src only; without it there, its transform fails (`KeyError: 0`, in 2.7.2
from `_transform_parallel_checkpoint` for `.ckpt` sources and `_transform_parallel_safetensor`
for safetensors sources) and writes nothing. The mount refuses the same save, in one line naming
the entry and the file, and never serves another rank's value."""

import os

import pytest

import itest
import msconf
from ckptfix import negative

CASES = ["demo", "st_demo"]


@pytest.mark.parametrize("name", CASES)
def test_per_rank_entry_missing(ckptfs, tmp_path, name):
    """transform_checkpoints refuses a save whose rank 0 lacks learning_rate; so does the mount"""
    workdir = str(tmp_path)
    fx = msconf.make_fixture(name, os.path.join(workdir, "fixture"))
    # A .ckpt cut between records (the format cannot tell), a safetensors file without it.
    path = negative.lose_entry(fx.outdir, 0, "learning_rate")
    # Safetensors sources can also be transformed to safetensors; .ckpt sources only to .ckpt.
    formats = ["ckpt", "safetensors"] if path.endswith(".safetensors") else ["ckpt"]
    for output_format in formats:
        out = os.path.join(workdir, "transformed_" + output_format)
        with pytest.raises(KeyError):
            msconf.transform(fx.src_dir, out, fx.src_strategy, fx.dst_strategy,
                             output_format=output_format)
        written = msconf.tree_files(out) if os.path.isdir(out) else []
        assert not written, f"MindSpore wrote {written} before failing"
    proc = itest.refused_mount(ckptfs, fx.src_dir, os.path.join(workdir, "mnt"),
                               src_strategy=fx.src_strategy, dst_strategy=fx.dst_strategy,
                               index_dir=os.path.join(workdir, "index"))
    lines = itest.stderr_lines(proc)
    assert len(lines) == 1, proc.stderr
    for word in ["parameter learning_rate", "target rank 0",
                 os.path.join("rank_0", os.path.basename(path))]:
        assert word in lines[0], f"the refusal does not name {word!r}: {lines[0]}"
