#!/usr/bin/env python3
"""PyTorch DCP checkpoints (issue 32, item 6): ckptfs's merged view against torch's own converter,
paired in one run, medians over the rounds.

    build/torch-venv/bin/python scripts/bench_dcp.py --workdir DIR [--ckptfs build/ckptfs]
        [--size-gib 1] [--runs 3] [--many-ranks 64] [--many-tensors 2000]

(a) A >= 1 GiB checkpoint written by torch itself (`dcp.save`, 8 processes joined by gloo, FSDP2's
    Shard(0) for most tensors, Shard(1) for every fourth, a few replicated ones). Each round, in
    alternating order:
      ckptfs: `ckptfs mount` (a fresh index: the data files are scanned in the round) and then
              `safetensors.torch.load_file(MNT/model.safetensors)` in a fresh process;
      torch:  `dcp_to_torch_save(SRC, full.pt)` in one process, then `torch.load(full.pt)` in
              another.
    "Time to a loadable full model" is the wall time from the start of the mount (of the
    conversion) until a Python process holds the state dict of full tensors with every byte read
    (load_file's tensors map the file lazily, so both sides touch every byte once); the
    processes' interpreter and `import torch` start-up is left out on both sides (each child
    times itself after its imports). Memory: the producer's peak, the mount daemon's VmHWM against
    the converter's peak RSS (its whole process, torch's import included, as a user pays it); the
    loader's peak RSS (which holds the model either way) is printed beside it. The source files
    are in the page cache for both (written just before); the output of round 1 is compared
    tensor for tensor. The loader's floor is printed beside them: the same load_file again on
    the same mount (every page of the view cached, nothing left for the daemon) and from a
    local copy of the view in the page cache.
(b) A many-rank, many-chunk checkpoint: --many-ranks data files of --many-tensors small tensors
    (Shard(0) and Shard(1) over all ranks) plus 4 column-split (Shard(1)) [8192, 16 x ranks]
    tensors, written with DCP's own metadata classes and `torch.save` item by item as
    FileSystemWriter does, in one process (64 torch processes do not fit this machine). Mount time
    without and with an index, and the daemon's VmHWM after the mount and after reading the view.

The load average is printed at the start and the end: the machine may be shared.
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import bench  # noqa: E402  (daemon_pid, proc_status, is_mounted)
import dcp_fixture  # noqa: E402  (free_port)

MIB = 1 << 20
GIB = 1 << 30
GOAL_SPEED = 10.0
GOAL_MEMORY = 20.0


def log(msg):
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def loadavg():
    return "{:.2f} {:.2f} {:.2f}".format(*os.getloadavg())


# -- writing the checkpoints (children) --------------------------------------------------------

ROWS, COLS = 4096, 2048  # one fp32 tensor: 32 MiB


def big_layout(size_gib):
    """(name, shape, placement) of the (a) checkpoint: 32 MiB matrices, every fourth Shard(1)."""
    n = max(1, round(size_gib * GIB / (ROWS * COLS * 4)))
    out = [(f"layers.{i}.w", (ROWS, COLS), "shard1" if i % 4 == 3 else "shard0") for i in range(n)]
    out += [(f"layers.{i}.norm", (COLS,), "replicate") for i in range(4)]
    return out


def big_writer(rank, world, out, size_gib, port):
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Replicate, Shard

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        mesh = init_device_mesh("cpu", (world,))
        sd = {}
        for i, (name, shape, kind) in enumerate(big_layout(size_gib)):
            local = list(shape)
            place = Replicate()
            if kind != "replicate":
                dim = 0 if kind == "shard0" else 1
                local[dim] //= world
                place = Shard(dim)
            g = torch.Generator().manual_seed(i * 1000 + (0 if kind == "replicate" else rank))
            sd[name] = DTensor.from_local(torch.randn(local, generator=g), mesh, [place],
                                          run_check=False, shape=torch.Size(shape),
                                          stride=torch.empty(shape, device="meta").stride())
        dcp.save(sd, storage_writer=dcp.FileSystemWriter(out))
        dist.barrier()
    finally:
        dist.destroy_process_group()


def write_big(src, size_gib):
    import torch.multiprocessing as mp

    os.makedirs(src, exist_ok=True)
    mp.spawn(big_writer, args=(8, src, size_gib, dcp_fixture.free_port()), nprocs=8, join=True)


def write_many(src, ranks, tensors):
    """DCP files as FileSystemWriter writes them (one torch.save per item, back to back), one
    process: chunks of Shard(0) and Shard(1) tensors over `ranks` ranks."""
    import torch
    from torch.distributed.checkpoint.filesystem import _StorageInfo
    from torch.distributed.checkpoint.metadata import (ChunkStorageMetadata, Metadata,
                                                       MetadataIndex, TensorProperties,
                                                       TensorStorageMetadata)

    os.makedirs(src, exist_ok=True)
    layout = [(f"t.{i}", (ranks, 64) if i % 2 == 0 else (32, 2 * ranks), i % 2) for i in
              range(tensors)]
    layout += [(f"col.{i}", (8192, 16 * ranks), 1) for i in range(4)]
    state, storage = {}, {}
    files = [open(os.path.join(src, f"__{r}_0.distcp"), "wb") for r in range(ranks)]
    try:
        for name, shape, dim in layout:
            step = shape[dim] // ranks
            full = torch.arange(shape[0] * shape[1], dtype=torch.float16).reshape(shape)
            chunks = []
            for r in range(ranks):
                offsets = [0, 0]
                offsets[dim] = r * step
                part = full.narrow(dim, r * step, step).clone()
                f = files[r]
                at = f.tell()
                torch.save(part, f)
                storage[MetadataIndex(name, torch.Size(offsets), r)] = _StorageInfo(
                    f"__{r}_0.distcp", at, f.tell() - at)
                chunks.append(ChunkStorageMetadata(torch.Size(offsets), part.shape))
            state[name] = TensorStorageMetadata(TensorProperties(dtype=torch.float16),
                                                torch.Size(shape), chunks)
    finally:
        for f in files:
            f.close()
    with open(os.path.join(src, ".metadata"), "wb") as f:
        import pickle
        pickle.dump(Metadata(state_dict_metadata=state, storage_data=storage), f)
    return len(layout), len(storage)


# -- the measured children ---------------------------------------------------------------------

CHILD = r"""
import json, resource, sys, time
import torch
from safetensors.torch import load_file
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
def touch(state):
    for t in state.values():
        t.reshape(-1).view(torch.uint8).max() if t.numel() else None
    return len(state)
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
what, a, b = sys.argv[1], sys.argv[2], sys.argv[3]
t0 = time.monotonic()
if what == "convert":
    dcp_to_torch_save(a, b)
    n = 0
elif what == "torch_load":
    n = touch(torch.load(a, weights_only=True))
elif what == "load_file":
    n = touch(load_file(a))  # its tensors map the file lazily: touching reads every byte
elif what == "compare":
    full, mounted = torch.load(a, weights_only=True), load_file(b)
    assert sorted(full) == sorted(mounted), (sorted(full), sorted(mounted))
    for k, t in full.items():
        assert t.dtype == mounted[k].dtype and torch.equal(t, mounted[k]), k
    n = len(full)
print(json.dumps({"s": time.monotonic() - t0, "n": n, "base": base,
                  "peak": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}))
"""


def child(what, a, b="-"):
    out = subprocess.run([sys.executable, "-c", CHILD, what, a, b], text=True,
                         capture_output=True)
    if out.returncode != 0:
        raise RuntimeError(f"{what} failed:\n{out.stderr}")
    return json.loads(out.stdout.strip().splitlines()[-1])


class Mount:
    def __init__(self, ckptfs, src, mnt, index_dir, log_file):
        os.makedirs(mnt, exist_ok=True)
        cmd = [ckptfs, "--log-level", "info", "mount", src, mnt, "--index-dir", index_dir,
               "--log-file", log_file]
        t0 = time.monotonic()
        out = subprocess.run(cmd, text=True, capture_output=True)
        self.seconds = time.monotonic() - t0
        if out.returncode != 0:
            raise RuntimeError(f"mount failed: {out.stderr.strip()}")
        self.ckptfs, self.mnt = ckptfs, mnt
        try:
            self.pid = bench.daemon_pid(mnt)  # finds the binary by its name, `ckptfs`
        except RuntimeError:
            subprocess.run([ckptfs, "umount", mnt], capture_output=True)
            raise

    def hwm(self):
        return bench.proc_status(self.pid, "VmHWM")

    def close(self):
        subprocess.run([self.ckptfs, "umount", self.mnt], capture_output=True)
        for _ in range(500):
            if not bench.is_mounted(self.mnt) and not os.path.exists(f"/proc/{self.pid}"):
                return
            time.sleep(0.01)


def med(xs):
    return statistics.median(xs)


def rng(xs):
    return f"[{min(xs):.2f}..{max(xs):.2f}]"


# -- (a) --------------------------------------------------------------------------------------

def bench_big(args, work):
    src = os.path.join(work, "big")
    if not os.path.exists(os.path.join(src, ".metadata")):
        log(f"(a) writing a {args.size_gib:g} GiB DCP checkpoint with torch (8 ranks, gloo)")
        write_big(src, args.size_gib)
    size = sum(os.path.getsize(os.path.join(src, f)) for f in os.listdir(src))
    log(f"(a) {src}: {size / GIB:.2f} GiB in {len(os.listdir(src)) - 1} data files")
    pt = os.path.join(work, "full.pt")
    mnt = os.path.join(work, "mnt-a")
    fig = {k: [] for k in ("mount", "load_mnt", "mnt_total", "hwm", "reader_peak", "convert",
                           "torch_load", "conv_total", "conv_peak", "tload_peak", "speed",
                           "memory", "cached", "local")}
    local = os.path.join(work, "local-model.safetensors")
    for r in range(args.runs):
        order = ("torch", "ckptfs") if r % 2 == 0 else ("ckptfs", "torch")
        for side in order:
            subprocess.run(["sync"])
            if side == "ckptfs":
                index = tempfile.mkdtemp(dir=work, prefix="index-")
                m = Mount(args.ckptfs, src, mnt, index, os.path.join(work, f"mount-{r}.log"))
                try:
                    got = child("load_file", os.path.join(mnt, "model.safetensors"))
                    hwm = m.hwm()
                    # The floor: the same load with nothing left for the daemon to do (every
                    # page of the view cached), and from a local copy in the page cache.
                    fig["cached"].append(
                        child("load_file", os.path.join(mnt, "model.safetensors"))["s"])
                    if not os.path.exists(local):
                        shutil.copyfile(os.path.join(mnt, "model.safetensors"), local)
                        child("load_file", local)
                    fig["local"].append(child("load_file", local)["s"])
                    if r == 0 and os.path.exists(pt):
                        check = child("compare", pt, os.path.join(mnt, "model.safetensors"))
                        log(f"  round 1: the mounted view equals dcp_to_torch_save's output, "
                            f"{check['n']} tensors")
                finally:
                    m.close()
                    shutil.rmtree(index, ignore_errors=True)
                fig["mount"].append(m.seconds)
                fig["load_mnt"].append(got["s"])
                fig["mnt_total"].append(m.seconds + got["s"])
                fig["hwm"].append(hwm)
                fig["reader_peak"].append(got["peak"])
            else:
                conv = child("convert", src, pt)
                loaded = child("torch_load", pt)
                fig["convert"].append(conv["s"])
                fig["torch_load"].append(loaded["s"])
                fig["conv_total"].append(conv["s"] + loaded["s"])
                fig["conv_peak"].append(conv["peak"])
                fig["tload_peak"].append(loaded["peak"])
        fig["speed"].append(fig["conv_total"][-1] / fig["mnt_total"][-1])
        fig["memory"].append(fig["conv_peak"][-1] / fig["hwm"][-1])
        log(f"  round {r + 1}: ckptfs {fig['mnt_total'][-1]:.2f} s (mount "
            f"{fig['mount'][-1]:.2f} + load_file {fig['load_mnt'][-1]:.2f}), daemon VmHWM "
            f"{fig['hwm'][-1] / MIB:.1f} MiB; torch {fig['conv_total'][-1]:.2f} s (convert "
            f"{fig['convert'][-1]:.2f} + torch.load {fig['torch_load'][-1]:.2f}), converter peak "
            f"{fig['conv_peak'][-1] / MIB:.0f} MiB")
        if os.path.exists(pt):
            os.unlink(pt)
    os.unlink(local)
    return fig, size


# -- (b) --------------------------------------------------------------------------------------

def read_all(path):
    n = 0
    with open(path, "rb", buffering=0) as f:
        while chunk := f.read(1 << 20):
            n += len(chunk)
    return n


def bench_many(args, work):
    src = os.path.join(work, f"many{args.many_ranks}")
    if not os.path.exists(os.path.join(src, ".metadata")):
        log(f"(b) writing a {args.many_ranks}-rank DCP checkpoint of {args.many_tensors} + 4 "
            f"tensors (one process)")
        write_many(src, args.many_ranks, args.many_tensors)
    chunks = (args.many_tensors + 4) * args.many_ranks
    mnt = os.path.join(work, "mnt-b")
    fig = {"cold": [], "warm": [], "hwm_mount": [], "hwm_read": []}
    for r in range(args.runs):
        index = tempfile.mkdtemp(dir=work, prefix="index-")
        try:
            m = Mount(args.ckptfs, src, mnt, index, os.path.join(work, f"many-{r}-cold.log"))
            m.close()
            fig["cold"].append(m.seconds)
            m = Mount(args.ckptfs, src, mnt, index, os.path.join(work, f"many-{r}-warm.log"))
            try:
                fig["warm"].append(m.seconds)
                fig["hwm_mount"].append(m.hwm())
                read_all(os.path.join(mnt, "model.safetensors"))
                fig["hwm_read"].append(m.hwm())
            finally:
                m.close()
        finally:
            shutil.rmtree(index, ignore_errors=True)
        log(f"  round {r + 1}: mount {fig['cold'][-1]:.2f} s cold, {fig['warm'][-1]:.2f} s with "
            f"index; VmHWM {fig['hwm_mount'][-1] / MIB:.1f} MiB mounted, "
            f"{fig['hwm_read'][-1] / MIB:.1f} MiB after reading the view")
    return fig, chunks


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--ckptfs", default=os.path.join(os.path.dirname(HERE), "build", "ckptfs"))
    ap.add_argument("--size-gib", type=float, default=1.0)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--many-ranks", type=int, default=64)
    ap.add_argument("--many-tensors", type=int, default=2000)
    ap.add_argument("--only", choices=["a", "b"], help="run one part")
    ap.add_argument("--json", help="also write the figures here")
    args = ap.parse_args()
    args.ckptfs = os.path.abspath(args.ckptfs)
    work = os.path.abspath(args.workdir)
    os.makedirs(work, exist_ok=True)
    start = loadavg()
    log(f"load average {start}; {os.cpu_count()} cores")
    out = {}
    rows = []
    if args.only in (None, "a"):
        a, size = bench_big(args, work)
        out["a"] = a
        speed, memory = med(a["speed"]), med(a["memory"])
        rows += [
            (f"(a) time to a loadable full model, {size / GIB:.2f} GiB, 8 ranks: ckptfs mount + "
             f"load_file", f"{med(a['mnt_total']):.2f} s {rng(a['mnt_total'])} (mount "
             f"{med(a['mount']):.2f} s)", "", ""),
            ("(a) same: dcp_to_torch_save + torch.load",
             f"{med(a['conv_total']):.2f} s {rng(a['conv_total'])} (convert "
             f"{med(a['convert']):.2f} s)", "", ""),
            ("(a) speed-up (paired, median of ratios)", f"{speed:.1f}x {rng(a['speed'])}",
             f">= {GOAL_SPEED:.0f}x", "met" if speed >= GOAL_SPEED else "NOT met"),
            ("(a) the loader's floor: load_file again, view cached / from a local copy "
             f"(10x needs mount + load <= {med(a['conv_total']) / GOAL_SPEED:.2f} s)",
             f"{med(a['cached']):.2f} s {rng(a['cached'])} / {med(a['local']):.2f} s "
             f"{rng(a['local'])}", "", ""),
            ("(a) producer peak memory: daemon VmHWM vs converter max RSS",
             f"{med(a['hwm']) / MIB:.1f} MiB vs {med(a['conv_peak']) / MIB:.0f} MiB", "", ""),
            ("(a) memory ratio (paired, median)", f"{memory:.1f}x {rng(a['memory'])}",
             f">= {GOAL_MEMORY:.0f}x", "met" if memory >= GOAL_MEMORY else "NOT met"),
            ("(a) loader max RSS (holds the model): load_file(mount) vs torch.load(.pt)",
             f"{med(a['reader_peak']) / MIB:.0f} vs {med(a['tload_peak']) / MIB:.0f} MiB", "", ""),
        ]
    if args.only in (None, "b"):
        b, chunks = bench_many(args, work)
        out["b"] = b
        rows += [
            (f"(b) mount, {args.many_ranks} ranks, {chunks:,} chunks (4 column-split "
             f"[8192, {16 * args.many_ranks}]): no index / index",
             f"{med(b['cold']):.2f} s {rng(b['cold'])} / {med(b['warm']):.2f} s", "", ""),
            ("(b) daemon VmHWM mounted / after reading the view",
             f"{med(b['hwm_mount']) / MIB:.1f} / {med(b['hwm_read']) / MIB:.1f} MiB", "", ""),
        ]
    log(f"load average {loadavg()} (start {start}); medians of {args.runs} paired rounds")
    for what, value, goal, verdict in rows:
        print(f"{what:<90} {value:<34} {goal:<8} {verdict}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
