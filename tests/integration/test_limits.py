"""Limits a mount, an index or an inspect meets on real machines: more source files than the soft
limit on open files; crafted inputs that claim huge sizes or nest a million levels deep, refused
quickly and with bounded memory (under an address-space limit of 1 GiB) by one line naming the
file; the index under an address-space limit, damaged, and on a full disk."""

import io
import os
import struct
import subprocess
import time
import zipfile

import itest
import ckpt_fixture
from ckptfix import wire
from ckptfix.builtins import case, lay, param, side
from ckptfix.ckptio import encode_record, record_header

SOURCES = 300
MANY_SOURCES_CASE = case(
    "many_sources", f"{SOURCES} source ranks -> 2", side(SOURCES), side(2),
    [param("w", "Float32", [SOURCES * 2, 4], lay([SOURCES], [0, -1]), lay([2], [0, -1]))], [])


def many_sources(args):
    """300 sources mount and serve under a soft limit of 100 open files (hard 4096): ckptfs
    raises its soft limit to the hard one."""
    work = os.path.join(args.work, "many")
    fx = ckpt_fixture.make(MANY_SOURCES_CASE, os.path.join(work, "fixture"))
    mnt = os.path.join(work, "mnt")
    os.makedirs(mnt, exist_ok=True)
    cmd = ["prlimit", "--nofile=100:4096", "--"] + itest.mount_cmd(
        args.ckptfs, fx.src_dir, mnt, src_strategy=fx.src_strategy,
        dst_strategy=fx.dst_strategy, index_dir=os.path.join(work, "index"))
    proc = itest.run(cmd, timeout=300, check=False)
    try:
        assert proc.returncode == 0, f"mount failed ({proc.returncode}): {proc.stderr}"
        problems = ckpt_fixture.compare_tree(fx, mnt)
        assert not problems, "\n".join(problems)
    finally:
        itest.unmount(args.ckptfs, mnt)


def limit_as(cmd, nbytes):
    """Address-space limits mean nothing to a sanitized build (itest.SANITIZED)."""
    return cmd if itest.SANITIZED else ["prlimit", f"--as={nbytes}", "--"] + cmd


def small_fixture(args, name):
    return ckpt_fixture.make_builtin("8to4_dtypes", os.path.join(args.work, name, "fixture"),
                                     expected=False)


def index_in_small_address_space(args):
    """The index needs no 8 GiB of address space: build, list and mount under 2 GiB."""
    fx = small_fixture(args, "small_as")
    index = os.path.join(args.work, "small_as", "index")
    itest.run(limit_as([args.ckptfs, "index", "build", fx.src_dir, "--index-dir", index], 2 << 30))
    listing = itest.run(limit_as([args.ckptfs, "index", "list", "--index-dir", index], 2 << 30))
    assert f"{len(fx.source_files)} files in" in listing.stdout, listing.stdout


def damaged_index(args):
    """A data.mdb that is not an LMDB file: commands say so and name `ckptfs index clear`, which
    removes it; the next build starts afresh."""
    fx = small_fixture(args, "damaged")
    index = os.path.join(args.work, "damaged", "index")
    itest.run([args.ckptfs, "index", "build", fx.src_dir, "--index-dir", index])
    with open(os.path.join(index, "data.mdb"), "r+b") as f:
        f.write(os.urandom(8192))
    listing = itest.run([args.ckptfs, "index", "list", "--index-dir", index], check=False)
    lines = listing.stderr.strip().splitlines()
    assert listing.returncode == 1 and len(lines) == 1, listing.stderr
    assert index in lines[0] and "ckptfs index clear" in lines[0], lines[0]
    cleared = itest.run([args.ckptfs, "index", "clear", "--index-dir", index])
    assert "removed the damaged index" in cleared.stdout, cleared.stdout
    built = itest.run([args.ckptfs, "index", "build", fx.src_dir, "--index-dir", index])
    assert "0 from the index" in built.stdout, built.stdout


def full_disk(args):
    """An index on a full filesystem: the scans are not recorded, and the warning says the
    filesystem is full rather than "Input/output error"."""
    fx = ckpt_fixture.make(MANY_SOURCES_CASE, os.path.join(args.work, "full", "fixture"),
                           expected=False)
    disk = os.path.join(args.work, "full", "disk")
    os.makedirs(disk, exist_ok=True)
    itest.run(["mount", "-t", "tmpfs", "-o", "size=40k", "tmpfs", disk])
    try:
        built = itest.run([args.ckptfs, "index", "build", fx.src_dir, "--index-dir",
                           os.path.join(disk, "index")], check=False)
    finally:
        itest.run(["umount", disk])
    assert built.returncode == 0, built.stderr
    assert "No space left on device" in built.stderr, built.stderr
    assert "Input/output error" not in built.stderr, built.stderr


def record_claiming(tag, dims, tensor_type, content_length, content=b""):
    return record_header(tag, dims, tensor_type, content_length) + content


CRAFTED = {
    # tensor_content's length prefix says 2^60 bytes; the file holds 16.
    "content_2e60": record_claiming("w", [1 << 58], "Float32", 1 << 60, b"\0" * 16),
    # A record whose own length prefix says 2^62 bytes.
    "record_2e62": wire.len_field_header(1, 1 << 62) + b"\0" * 64,
    # Shape [2^20, 2^20, 2^20] of Float32 (2^62 bytes) with 4 content bytes.
    "dims_2e60": encode_record("w", [1 << 20] * 3, "Float32", b"\0" * 4),
    # A shape whose byte count overflows 64 bits.
    "dims_overflow": encode_record("w", [1 << 40, 1 << 40], "Float64", b"\0" * 8),
    # A million dims of 1 next to a shape that does not match its 4 content bytes.
    "million_dims": encode_record("w", [1] * 1_000_000 + [2], "Float32", b"\0" * 4),
    # A tag whose length says 2^40 bytes.
    "tag_2e40": wire.len_field_header(1, 40) + wire.len_field_header(1, 1 << 40) + b"w" * 33,
}


def refused_quickly(name, cmd, path):
    """cmd, under an address-space limit of 1 GiB, refuses path in one line within 10 s."""
    start = time.monotonic()
    proc = subprocess.run(limit_as(cmd, 1 << 30), capture_output=True, text=True, timeout=60)
    took = time.monotonic() - start
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 1, f"{name}: exit {proc.returncode}: {proc.stderr[-2000:]}"
    assert len(lines) == 1 and path in lines[0], f"{name}: {proc.stderr[-2000:]}"
    assert "unexpected" not in lines[0], f"{name}: {lines[0]}"
    assert took < 10, f"{name}: refused after {took:.1f}s"


def write(path, data):
    with open(path, "wb") as f:
        f.write(data)
    return path


def crafted_huge_sizes(args):
    work = os.path.join(args.work, "crafted")
    os.makedirs(work, exist_ok=True)
    for name, data in CRAFTED.items():
        path = write(os.path.join(work, name + ".ckpt"), data)
        refused_quickly(name, [args.ckptfs, "inspect", path], path)


def torch_zip(pickle_bytes):
    """A torch.save archive of one pickle, no storages (zip, stored, as torch writes it)."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as z:
        z.writestr("archive/data.pkl", pickle_bytes)
        z.writestr("archive/version", "3\n")
    return buf.getvalue()


def safetensors_file(header):
    return struct.pack("<Q", len(header)) + header.encode()


DEPTH = 1_000_000
NESTED = {
    # A JSON strategy whose parameter's dev_matrix is an array a million levels deep.
    "strategy.json": (["strategy", "show"], (
        '{"parallel_layout_item": {"w": {"dev_matrix": ' + "[" * DEPTH + "]" * DEPTH +
        ', "tensor_map": [0], "field": 0}}}').encode()),
    # A strategy protobuf of 100,000 nested groups (field 9, unknown to the schema).
    "strategy.ckpt": (["strategy", "show"],
                      bytes([9 << 3 | 3]) * 100_000 + bytes([9 << 3 | 4]) * 100_000),
    # A safetensors header whose tensor entry is an array a million levels deep.
    "nested.safetensors": (["inspect"],
                           safetensors_file('{"w": ' + "[" * DEPTH + "]" * DEPTH + "}")),
    # A pickle of lists nested a million deep: a million EMPTY_LISTs, then as many APPENDs.
    "nested.pt": (["inspect"], torch_zip(b"\x80\x02" + b"]" * DEPTH + b"a" * (DEPTH - 1) + b".")),
}


def deeply_nested(args):
    work = os.path.join(args.work, "nested")
    os.makedirs(work, exist_ok=True)
    for name, (verb, data) in NESTED.items():
        path = write(os.path.join(work, name), data)
        refused_quickly(name, [args.ckptfs] + verb + [path], path)


def main():
    args = itest.parse_args()
    checks = itest.Checks(args.only)
    checks.run(f"{SOURCES} sources under a soft limit of 100 open files", many_sources, args)
    checks.run("crafted huge sizes refused quickly under prlimit --as=1G", crafted_huge_sizes,
               args)
    checks.run("deeply nested inputs refused quickly under prlimit --as=1G", deeply_nested, args)
    checks.run("the index under a 2 GiB address-space limit", index_in_small_address_space, args)
    checks.run("a damaged index is named, and cleared", damaged_index, args)
    checks.run("a full disk is reported as such", full_disk, args)
    checks.finish()


if __name__ == "__main__":
    main()
