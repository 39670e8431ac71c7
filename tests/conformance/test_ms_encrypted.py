"""Encrypted checkpoints (issue 34): real MindSpore saves a 4-rank checkpoint encrypted in each
mode (its default block size, a key of the mode's length); `transform_checkpoints` of the
unencrypted copies equals the mounted views byte for byte, `load_checkpoint` reads the views, and
a wrong key is refused at mount."""

import os
import shutil

import pytest

import itest
import msconf

ms = msconf.ms
DIST = os.path.join(msconf.REPO, "tests", "data", "encrypted", "dist")
KEY = b"ckptfs-TEST-KEY-not-a-secret-32B"
MODES = {"AES-GCM": 32, "AES-CBC": 24, "SM4-CBC": 16}
STRATEGIES = dict(src_strategy=os.path.join(DIST, "src_strategy.ckpt"),
                  dst_strategy=os.path.join(DIST, "dst_strategy.ckpt"))


def save_encrypted(plain_root, out_root, mode, key):
    """Each rank of `plain_root` loaded and saved again by MindSpore with enc_key/enc_mode."""
    for rel in msconf.tree_files(plain_root):
        params = ms.load_checkpoint(os.path.join(plain_root, rel))
        dest = os.path.join(out_root, rel)
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        ms.save_checkpoint([{"name": n, "data": v} for n, v in params.items()], dest,
                           enc_key=key, enc_mode=mode)
    return out_root


def key_file(workdir, key):
    path = os.path.join(workdir, "key")
    with open(path, "wb") as f:
        f.write(key)
    os.chmod(path, 0o600)
    return path


@pytest.mark.parametrize("mode", list(MODES))
def test_encrypted_views_equal_transform_of_plain(request, tmp_path, mode):
    """Encrypted saves in every mode: the views equal MindSpore's transform of the plain ranks."""
    ckptfs = request.config.getoption("--ckptfs")
    key = KEY[:MODES[mode]]
    plain = os.path.join(tmp_path, "plain")
    shutil.copytree(os.path.join(DIST, "plain"), plain)
    src = save_encrypted(plain, os.path.join(tmp_path, "enc"), mode, key)
    # MindSpore itself reads what it wrote back to the plain values.
    for rel in msconf.tree_files(src):
        got = ms.load_checkpoint(os.path.join(src, rel), dec_key=key, dec_mode=mode)
        want = ms.load_checkpoint(os.path.join(plain, rel))
        assert list(got) == list(want)
    reference = msconf.transform(plain, os.path.join(tmp_path, "ref"),
                                 STRATEGIES["src_strategy"], STRATEGIES["dst_strategy"])
    work = os.path.join(tmp_path, "m")
    os.makedirs(work)
    with msconf.mounted(ckptfs, src, work, **STRATEGIES,
                        args=["--dec-key-file", key_file(tmp_path, key)]) as mnt:
        files = msconf.assert_same_tree(reference, mnt, only=".ckpt")
        assert files
        for rel in files:
            loaded = ms.load_checkpoint(os.path.join(mnt, rel))
            want = ms.load_checkpoint(os.path.join(reference, rel))
            assert list(loaded) == list(want)
            for name in want:
                assert msconf.raw_bytes(loaded[name]) == msconf.raw_bytes(want[name]), name
    wrong = os.path.join(tmp_path, "wrong")
    os.makedirs(wrong)
    proc = itest.refused_mount(ckptfs, src, os.path.join(tmp_path, "mnt_wrong"),
                               index_dir=os.path.join(tmp_path, "index"), **STRATEGIES,
                               extra_args=["--dec-key-file",
                                           key_file(wrong, bytes(b ^ 0x5A for b in key))])
    assert "wrong key" in proc.stderr or "padding" in proc.stderr, proc.stderr
