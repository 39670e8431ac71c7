"""Progress of scanning, planning, index build and materialize: plain periodic lines when stderr
is not a terminal, one summary line at the end, nothing with --quiet, nothing for a quick step.
The reporting interval is lowered by CKPTFS_PROGRESS_MS so that a small synthetic source (many
files of many tensors, written here) shows lines."""

import json
import os
import struct

import itest
from ckptfix import ckptio

RANKS = 32
TARGETS = 16
EXTRA = 1500  # passthrough scalars per file


def make_source(root):
    """RANKS rank files holding their slice of w[RANKS*4] plus EXTRA float scalars each, and the
    two strategies (w split RANKS ways, then TARGETS ways)."""
    for r in range(RANKS):
        d = os.path.join(root, "src", f"rank_{r}")
        os.makedirs(d)
        with open(os.path.join(d, f"net_{r}-1_1.ckpt"), "wb") as f:
            f.write(ckptio.encode_record("w", [4], "Float32",
                                         struct.pack("<4f", *range(4 * r, 4 * r + 4))))
            for i in range(EXTRA):
                f.write(ckptio.encode_record(f"p{i}", [1], "Float32", struct.pack("<f", i)))

    def strategy(devices):
        return {"current_stage": 1,
                "parallel_strategy_item": {"MatMul_w": {"stage": 0,
                                                        "parallel_strategy": [[devices]]}},
                "parallel_layout_item": {"w": {"dev_matrix": [devices], "tensor_map": [0],
                                               "tensor_shape": [RANKS * 4], "field": 0,
                                               "opt_weight_shard_step": 0,
                                               "opt_weight_shard_size": 0}}}
    paths = []
    for name, devices in (("src.json", RANKS), ("dst.json", TARGETS)):
        paths.append(os.path.join(root, name))
        with open(paths[-1], "w") as f:
            json.dump(strategy(devices), f)
    return os.path.join(root, "src"), paths[0], paths[1]


def env(ms):
    out = dict(os.environ)
    out["CKPTFS_PROGRESS_MS"] = str(ms)
    return out


def run(cmd, ms):
    proc = itest.subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env(ms))
    assert proc.returncode == 0, f"{cmd}: {proc.returncode}\n{proc.stderr}"
    return proc


def lines_of(stderr, what):
    return [line for line in stderr.splitlines() if line.startswith(what + ": ")]


def index_build(args, src, work):
    cmd = [args.ckptfs, "index", "build", src, "--index-dir", os.path.join(work, "index")]
    proc = run(cmd, 1)
    lines = lines_of(proc.stderr, "index build")
    assert len(lines) >= 2, proc.stderr  # at least one periodic line and the summary
    assert "\r" not in proc.stderr
    final = lines[-1]
    assert final.startswith(f"index build: {RANKS} of {RANKS} files (100%), "
                            f"{RANKS * (EXTRA + 1)} tensors, "), final
    assert final.endswith("s") and "tensors/s" in final, final
    for line in lines[:-1]:
        assert f" of {RANKS} files (" in line and " tensors/s" in line, line
    # Counts only grow.
    done = [int(line.split(": ")[1].split(" ")[0]) for line in lines]
    assert done == sorted(done), lines
    # --quiet: nothing but warnings and errors, so neither the progress nor the summary.
    proc = run(cmd + ["--quiet"], 1)
    assert proc.stderr == "", proc.stderr
    assert proc.stdout == "", proc.stdout


def scan_plan_materialize(args, src, src_strategy, dst_strategy, work):
    out = os.path.join(work, "out")
    cmd = [args.ckptfs, "materialize", src, out, "--src-strategy", src_strategy,
           "--dst-strategy", dst_strategy, "--index-dir", os.path.join(work, "index2"),
           "--view", "ckpt", "-j", "2"]
    proc = run(cmd, 1)
    scan = lines_of(proc.stderr, "scan")
    plan = lines_of(proc.stderr, "plan")
    assert scan and plan, proc.stderr
    assert scan[-1].startswith(f"scan: {RANKS} of {RANKS} files (100%), "
                               f"{RANKS * (EXTRA + 1)} tensors"), scan
    assert plan[-1].startswith(f"plan: {TARGETS} of {TARGETS} target ranks (100%), "), plan
    assert lines_of(proc.stderr, "materialize")[-1].startswith("materialize: "), proc.stderr
    # Order: scanning, then planning, then writing.
    text = proc.stderr
    assert text.index("scan: ") < text.index("plan: ") < text.index("materialize: "), text
    # A step quicker than the interval says nothing (the index now holds every scan; the 60 s
    # interval is never reached), materialize still ends with its summary.
    proc = run(cmd, 60000)
    assert not lines_of(proc.stderr, "scan") and not lines_of(proc.stderr, "plan"), proc.stderr
    assert lines_of(proc.stderr, "materialize"), proc.stderr
    # --quiet: nothing at all.
    proc = run(cmd + ["--quiet"], 1)
    assert proc.stderr == "", proc.stderr
    # The files are what the strategies say: target t holds w[8t : 8t + 8].
    for t in range(TARGETS):
        records = ckptio.read_records(os.path.join(out, f"rank_{t}", f"checkpoint_{t}.ckpt"))
        w = [r for r in records if r.tag == "w"][0]
        assert struct.unpack("<8f", w.content) == tuple(float(x) for x in range(8 * t, 8 * t + 8))


def mount_quiet(args, src, src_strategy, dst_strategy, work):
    mnt = os.path.join(work, "mnt")
    os.makedirs(mnt)
    cmd = itest.mount_cmd(args.ckptfs, src, mnt, src_strategy=src_strategy,
                          dst_strategy=dst_strategy, index_dir=os.path.join(work, "index3"))
    proc = itest.subprocess.run(cmd + ["--quiet"], capture_output=True, text=True, timeout=120,
                                env=env(1))
    try:
        assert proc.returncode == 0, proc.stderr
        assert not lines_of(proc.stderr, "scan") and not lines_of(proc.stderr, "plan"), \
            proc.stderr
    finally:
        itest.unmount(args.ckptfs, mnt)
    itest.run(["rm", "-rf", os.path.join(work, "index3")])
    proc = itest.subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env(1))
    try:
        assert proc.returncode == 0, proc.stderr
        assert lines_of(proc.stderr, "scan")[-1].startswith(f"scan: {RANKS} of {RANKS} files"), \
            proc.stderr
    finally:
        itest.unmount(args.ckptfs, mnt)


def main():
    args = itest.parse_args()
    args.ckptfs = os.path.abspath(args.ckptfs)
    work = args.work
    src, src_strategy, dst_strategy = make_source(os.path.join(work, "fixture"))
    checks = itest.Checks(args.only)
    checks.run("index build: plain lines, summary, --quiet", index_build, args, src, work)
    checks.run("materialize: scan, plan and write lines; quick steps silent; --quiet",
               scan_plan_materialize, args, src, src_strategy, dst_strategy, work)
    checks.run("mount: scan lines on stderr, none with --quiet", mount_quiet, args, src,
               src_strategy, dst_strategy, work)
    checks.finish()


if __name__ == "__main__":
    main()
