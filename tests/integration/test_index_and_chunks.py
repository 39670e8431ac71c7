"""The LMDB index across remounts, and parameters over 512 MiB in the output.

* A second mount of unchanged sources takes every scan from the index; after one source file
  changes, only that file is scanned again.
* A merged parameter of 640 MiB is written as a 512 MiB record followed by a 128 MiB one (spec
  §1.5, ≥2.3 byte chunks). The sources are sparse files, so the test costs no disk and little time;
  the record headers expected are encoded by the fixture generator's own encoder.
"""

import os
import re

import itest
from ckptfix import ckptio
from ckptfix.builtins import case, lay, param, side
import ckpt_fixture

SMALL = case("index_reuse", "dev [4] rows -> dev [2] columns", side(4), side(2),
             [param("w", "Float32", [8, 6], lay([4], [0, -1]), lay([2], [-1, 0]))], [])


def index_counts(stderr):
    m = re.search(r"(\d+) source files: (\d+) from the index, (\d+) scanned", stderr)
    assert m, f"no index summary in:\n{stderr}"
    return int(m.group(2)), int(m.group(3))


def mount_and_count(args, fx, mnt, index_dir):
    cmd = itest.mount_cmd(args.ckptfs, fx.src_dir, mnt, src_strategy=fx.src_strategy,
                          dst_strategy=fx.dst_strategy, index_dir=index_dir)
    cmd.insert(1, "--log-level=info")
    proc = itest.run(cmd)
    try:
        problems = ckpt_fixture.compare_tree(fx, mnt)
        assert not problems, problems
    finally:
        itest.unmount(args.ckptfs, mnt)
    return index_counts(proc.stderr)


def index_reuse(args):
    work = os.path.join(args.work, "index")
    fx = ckpt_fixture.make(SMALL, os.path.join(work, "fixture"))
    mnt = os.path.join(work, "mnt")
    os.makedirs(mnt)
    index_dir = os.path.join(work, "index")
    assert mount_and_count(args, fx, mnt, index_dir) == (0, 4)
    assert mount_and_count(args, fx, mnt, index_dir) == (4, 0)
    # Same bytes, new mtime: a changed fingerprint, so that file alone is scanned again.
    victim = os.path.realpath(fx.source_files[2])
    st = os.stat(victim)
    os.utime(victim, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    assert mount_and_count(args, fx, mnt, index_dir) == (3, 1)
    listing = itest.run([args.ckptfs, "index", "list", "--index-dir", index_dir]).stdout
    assert victim in listing, listing


def write_sparse_checkpoint(path, name, dims, dtype, content_length, markers):
    """One record whose content is a hole of zeros except `markers` {content offset: bytes}."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        header = ckptio.record_header(name, dims, dtype, content_length)
        f.write(header)
        f.truncate(len(header) + content_length)
        for offset, data in markers.items():
            f.seek(len(header) + offset)
            f.write(data)


def large_parameter(args):
    work = os.path.join(args.work, "large")
    src = os.path.join(work, "src")
    rows, cols = 160, 1024 * 1024  # Float32: 640 MiB in all, 320 MiB per source rank
    half = rows // 2 * cols * 4
    # Marked elements around the 512 MiB cut and at each slice's ends, so misplaced content
    # shows; merged content offset = rank * half + offset within the rank's slice.
    expected_markers = {}
    for rank in range(2):
        markers = {}
        for offset in (0, 4096, half - 4, 536870912 - half * rank - 4 if rank else half // 2):
            if 0 <= offset < half:
                markers[offset] = f"r{rank}@{offset:x}".encode()[:4].ljust(4, b".")
        for offset, data in markers.items():
            expected_markers[rank * half + offset] = data
        write_sparse_checkpoint(os.path.join(src, f"rank_{rank}", "big.ckpt"), "big",
                                [rows // 2, cols], "Float32", half, markers)
    strategy = os.path.join(work, "src_strategy.json")
    with open(strategy, "w") as f:
        f.write('{"current_stage": 1, "parallel_strategy_item": {"MatMul_big": {"stage": 0, '
                '"parallel_strategy": [[2, 1]]}}, "parallel_layout_item": {"big": {"dev_matrix": '
                '[2], "tensor_map": [0, -1], "tensor_shape": [160, 1048576], "field": 0, '
                '"opt_weight_shard_step": 0, "opt_weight_shard_size": 0}}}')
    total = rows * cols * 4
    chunk1 = 536870912
    first = ckptio.record_header("big", [rows, cols], "Float32", chunk1)
    second = ckptio.record_header("big", [rows, cols], "Float32", total - chunk1)

    def expected_content(begin, end):
        out = bytearray(end - begin)
        for offset, data in expected_markers.items():
            if begin <= offset < end:
                out[offset - begin:offset - begin + len(data)] = data
        return bytes(out)

    mnt = os.path.join(work, "mnt")
    with itest.mounted(args.ckptfs, src, mnt, src_strategy=strategy,
                       index_dir=os.path.join(work, "index")):
        path = os.path.join(mnt, "rank_0", "checkpoint_0.ckpt")
        assert os.path.getsize(path) == len(first) + len(second) + total
        step = 1 << 20
        with open(path, "rb", buffering=0) as f:
            for header, begin, end in ((first, 0, chunk1), (second, chunk1, total)):
                assert f.read(len(header)) == header, "record header"
                for at in range(begin, end, step):
                    n = min(step, end - at)
                    assert f.read(n) == expected_content(at, at + n), f"content at {at}"
            assert f.read(1) == b""
        listing = itest.run([args.ckptfs, "inspect", "--json", path]).stdout
        assert '"nbytes": 671088640' in listing, listing


def main():
    args = itest.parse_args()
    checks = itest.Checks(args.only)
    checks.run("index reused on remount, changed file rescanned", index_reuse, args)
    checks.run("parameter over 512 MiB becomes 512 MiB records", large_parameter, args)
    checks.finish()


if __name__ == "__main__":
    main()
