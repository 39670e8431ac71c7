"""A source of millions of tiny records under an address-space limit of 1 GiB: `ckptfs inspect`
and `ckptfs mount` either work or fail with one line naming the file and what to do, never a
crash, an "unexpected error" or a bare "std::bad_alloc". Address-space limits mean nothing to a
sanitized build (its shadow memory alone passes 1 GiB): the test command leaves this test out of
its sanitizer stage (ctest label no_sanitizer, tests/CMakeLists.txt), and run under a sanitizer
anyway it ends as skipped, which ctest reports."""

import json
import os
import re
import subprocess

import itest
from ckptfix.ckptio import encode_record

RECORDS = 8_000_000  # the scan runs out of memory (inspect needs about 0.17 KiB a record)
PLANNED_RECORDS = 2_000_000  # the scan fits; the plan of its two views does not, on this build
LIMIT = 1 << 30
PROGRESS = re.compile(r"^\w+: \d+ of \d+ ")


def tiny_records(path, count):
    """`count` one-byte Int8 scalars, one record each (23 bytes a record): 184 MB for 8M."""
    template = encode_record("p0000000", [], "Int8", b"\x07")
    at = template.index(b"p0000000")
    head, tail = template[:at], template[at + 8:]
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        for start in range(0, count, 1 << 20):
            f.write(b"".join(head + b"p%07d" % k + tail
                             for k in range(start, min(count, start + (1 << 20)))))


def one_clear_line_or_success(name, proc, *named):
    """Success, or exit 1 with one line naming one of `named` (the file, or the directory whose
    view was being planned) and saying what to do."""
    # Progress lines ("scan: 1 of 1 files ...") are shown on stderr when a step is slow.
    lines = [l for l in proc.stderr.splitlines() if l.strip() and not PROGRESS.match(l)]
    assert proc.returncode in (0, 1), f"{name}: exit {proc.returncode}: {proc.stderr[-2000:]}"
    if proc.returncode == 0:
        print(f"     -> {name} worked within the limit")
        return
    assert len(lines) == 1, f"{name}: {len(lines)} lines: {proc.stderr[-2000:]}"
    line = lines[0]
    assert any(n in line for n in named), f"{name}: the line names none of {named}: {line}"
    assert "out of memory" in line and "ulimit -v" in line, f"{name}: {line}"
    assert "unexpected" not in line and "bad_alloc" not in line, f"{name}: {line}"
    print(f"     -> {line}")


def inspect_under_limit(args, path):
    proc = subprocess.run(["prlimit", f"--as={LIMIT}", "--", args.ckptfs, "inspect", path],
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                          timeout=600)
    one_clear_line_or_success("inspect", proc, path)


# One layout (any will do: the other parameters are replicated), for a 1 -> 1 view of both kinds.
STRATEGY = {"parallel_layout_item": {"p0000000": {
    "dev_matrix": [1], "tensor_map": [], "field": 0, "opt_weight_shard_step": 0,
    "opt_weight_shard_size": 0}}}


def mount_under_limit(args, path):
    src = os.path.dirname(os.path.dirname(path))
    mnt = os.path.join(args.work, "mnt")
    if not os.path.exists(path):
        tiny_records(path, PLANNED_RECORDS)
    os.makedirs(mnt, exist_ok=True)
    strategy = os.path.join(args.work, "strategy.json")
    with open(strategy, "w") as f:
        json.dump(STRATEGY, f)
    cmd = ["prlimit", f"--as={LIMIT}", "--"] + itest.mount_cmd(
        args.ckptfs, src, mnt, src_strategy=strategy, dst_strategy=strategy,
        index_dir=os.path.join(args.work, "index"))
    with itest.unmounting(args.ckptfs, mnt):
        proc = itest.run(cmd, timeout=600, check=False)
        one_clear_line_or_success("mount", proc, path, src)


def main():
    args = itest.parse_args()
    checks = itest.Checks(args.only)
    if itest.SANITIZED:
        itest.skip("under a sanitizer an address-space limit means nothing")
    path = os.path.join(args.work, "src", "rank_0", "tiny.ckpt")
    tiny_records(path, RECORDS)
    checks.run(f"inspect of {RECORDS} one-byte records under prlimit --as=1G", inspect_under_limit,
               args, path)
    checks.run(f"mount of {RECORDS} one-byte records under prlimit --as=1G", mount_under_limit,
               args, path)
    planned = os.path.join(args.work, "src_planned", "rank_0", "tiny.ckpt")
    checks.run(f"mount of {PLANNED_RECORDS} one-byte records under prlimit --as=1G",
               mount_under_limit, args, planned)
    checks.finish()


if __name__ == "__main__":
    main()
