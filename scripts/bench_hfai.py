#!/usr/bin/python3
"""The hfai row of the benchmark: the merged model of an hfai checkpoint read through the mount
against hfai's own way, every PART file loaded whole with torch.load and merged in memory.

Data: an hfai checkpoint of about 1 GiB written by torch.save in hfai's layout
(scripts/ckptfix/hfai.py, hfai's LARGE_SIZE of 256 MiB, 4 PART files: two BFloat16 matrices of
312 MiB cut into 4 torch.chunk pieces each, 24 Float32 matrices of 16 MiB and small tensors
spread over the files). Generated once into the work directory and reused.

Figures, in one run, as paired runs (mount, torch, mount, torch, ...) with the PART files read
into the page cache before each run (both sides read hot sources); medians over the pairs:
  mount: `ckptfs mount` (warm index) + reading all of model.safetensors with 1 MiB reads;
         the daemon's peak RSS (VmHWM) at the end of the read
  torch: /usr/bin/python3 (Debian's python3-torch) importing torch, torch.load of every PART
         file and hfai's merge; wall time and peak RSS from /usr/bin/time -v, and the time of
         load + merge alone
Before timing, one pass checks that the mount's model.safetensors holds, tensor for tensor, the
bytes the torch merge gives (sha256), so the two sides deliver the same data.

    scripts/bench_hfai.py [--runs N] [--workdir DIR] [--json FILE]
Needs build/ckptfs (or --ckptfs), /usr/bin/time, python3-torch, ~3 GiB of free disk.
"""

import argparse
import hashlib
import json
import os
import statistics
import struct
import subprocess
import sys
import time
from collections import OrderedDict

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)

from bench import daemon_pid, proc_status, time_and_peak_rss  # noqa: E402

PYTHON = "/usr/bin/python3"
MIB = 1 << 20
NSHARDS = 4
LAYOUT_VERSION = "1"  # bump when the data below changes

# Loads and merges as hfai.checkpoint.load does; with --hashes also prints each tensor's sha256.
TORCH_SIDE = r"""
import sys, time, hashlib, json
t0 = time.monotonic()
sys.path.insert(0, sys.argv[1])
from ckptfix import hfai
t1 = time.monotonic()
merged = hfai.load(sys.argv[2])
t2 = time.monotonic()
out = {"import_s": t1 - t0, "load_merge_s": t2 - t1, "tensors": len(merged["model"])}
if len(sys.argv) > 3:
    out["sha256"] = {k: hashlib.sha256(hfai.tensor_bytes(v)).hexdigest()
                     for k, v in merged["model"].items()}
print(json.dumps(out))
"""


def make_data(path):
    """The ~1 GiB checkpoint; skipped when a complete one of this layout is there."""
    stamp = os.path.join(path, ".complete")
    if os.path.exists(stamp) and open(stamp).read() == LAYOUT_VERSION:
        return
    import torch
    from ckptfix import hfai
    g = torch.Generator().manual_seed(1413)

    def bf16(*shape):
        return torch.randint(-32768, 32767, shape, dtype=torch.int16, generator=g).view(
            torch.bfloat16)

    sd = OrderedDict()
    sd["embed.weight"] = bf16(160000, 1024)
    for i in range(24):
        sd[f"layers.{i}.mlp.weight"] = torch.randn(1024, 4096, generator=g)
        sd[f"layers.{i}.mlp.bias"] = torch.randn(4096, generator=g)
        sd[f"layers.{i}.norm.weight"] = bf16(1024)
    sd["lm_head.weight"] = bf16(160000, 1024)
    sd["rope.inv_freq"] = torch.rand(512, generator=g)
    for f in os.listdir(path) if os.path.isdir(path) else []:
        os.unlink(os.path.join(path, f))
    hfai.save(path, sd, ["rope.inv_freq"], NSHARDS)
    with open(stamp, "w") as f:
        f.write(LAYOUT_VERSION)


def warm(files):
    for name in files:
        with open(name, "rb") as f:
            while f.read(16 * MIB):
                pass


def read_all(path):
    """Reads a file front to back with 1 MiB reads -> bytes read."""
    buf = bytearray(MIB)
    total = 0
    with open(path, "rb", buffering=0) as f:
        while True:
            n = f.readinto(buf)
            if not n:
                return total
            total += n


def safetensors_hashes(path):
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
        header.pop("__metadata__", None)
        out = {}
        for name, entry in sorted(header.items(), key=lambda kv: kv[1]["data_offsets"]):
            begin, end = entry["data_offsets"]
            f.seek(8 + n + begin)
            out[name] = hashlib.sha256(f.read(end - begin)).hexdigest()
    return out


class Mount:
    def __init__(self, ckptfs, src, mnt, index_dir):
        self.ckptfs, self.mnt = ckptfs, mnt
        os.makedirs(mnt, exist_ok=True)
        t0 = time.monotonic()
        subprocess.run([ckptfs, "mount", src, mnt, "--index-dir", index_dir], check=True,
                       capture_output=True)
        self.seconds = time.monotonic() - t0
        self.pid = daemon_pid(mnt)

    def close(self):
        subprocess.run([self.ckptfs, "umount", self.mnt], capture_output=True)
        for _ in range(500):
            if not os.path.exists(f"/proc/{self.pid}"):
                break
            time.sleep(0.01)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--workdir", default=os.path.join(REPO, "build", "bench-hfai"))
    ap.add_argument("--ckptfs", default=os.path.join(REPO, "build", "ckptfs"))
    ap.add_argument("--json")
    args = ap.parse_args()
    src = os.path.join(args.workdir, "hfai_1g")
    os.makedirs(args.workdir, exist_ok=True)
    make_data(src)
    parts = sorted(os.path.join(src, f) for f in os.listdir(src) if f.endswith(".pt"))
    size = sum(os.path.getsize(p) for p in parts)
    index_dir = os.path.join(args.workdir, "index")
    mnt = os.path.join(args.workdir, "mnt")
    torch_cmd = [PYTHON, "-c", TORCH_SIDE, HERE, src]

    # Same data on both sides, and a warm index.
    warm(parts)
    m = Mount(args.ckptfs, src, mnt, index_dir)
    try:
        model = os.path.join(mnt, "model.safetensors")
        model_bytes = os.path.getsize(model)
        mounted = safetensors_hashes(model)
    finally:
        m.close()
    _, _, out = time_and_peak_rss(torch_cmd + ["--hashes"])
    want = json.loads(out)["sha256"]
    if mounted != want:
        bad = sorted(k for k in set(mounted) | set(want) if mounted.get(k) != want.get(k))
        sys.exit(f"bench_hfai: the mount and the torch merge differ on {bad[:5]}")

    rows = {"mount_s": [], "read_s": [], "mount_total_s": [], "daemon_rss": [], "torch_s": [],
            "torch_load_merge_s": [], "torch_rss": []}
    load = os.getloadavg()
    for _ in range(args.runs):
        warm(parts)
        m = Mount(args.ckptfs, src, mnt, index_dir)
        try:
            t0 = time.monotonic()
            got = read_all(os.path.join(mnt, "model.safetensors"))
            read_s = time.monotonic() - t0
            rows["daemon_rss"].append(proc_status(m.pid, "VmHWM"))
        finally:
            m.close()
        assert got == model_bytes, (got, model_bytes)
        rows["mount_s"].append(m.seconds)
        rows["read_s"].append(read_s)
        rows["mount_total_s"].append(m.seconds + read_s)
        warm(parts)
        wall, rss, out = time_and_peak_rss(torch_cmd)
        rows["torch_s"].append(wall)
        rows["torch_load_merge_s"].append(json.loads(out)["load_merge_s"])
        rows["torch_rss"].append(rss)
    load_after = os.getloadavg()
    med = {k: statistics.median(v) for k, v in rows.items()}
    result = {"part_bytes": size, "model_bytes": model_bytes, "runs": args.runs,
              "loadavg_before": load, "loadavg_after": load_after, "median": med, "all": rows}
    print(f"hfai checkpoint: {NSHARDS} PART files, {size / MIB:.0f} MiB; model.safetensors "
          f"{model_bytes / MIB:.0f} MiB; {args.runs} paired runs, medians; load average "
          f"{load[0]:.2f} before, {load_after[0]:.2f} after")
    print(f"  mount (warm index)            {med['mount_s']:.2f} s")
    print(f"  read model.safetensors        {med['read_s']:.2f} s "
          f"({model_bytes / med['read_s'] / 1e6:.0f} MB/s)")
    print(f"  mount + read                  {med['mount_total_s']:.2f} s, daemon peak RSS "
          f"{med['daemon_rss'] / MIB:.0f} MiB")
    print(f"  torch.load all + hfai merge   {med['torch_s']:.2f} s (load + merge alone "
          f"{med['torch_load_merge_s']:.2f} s), peak RSS {med['torch_rss'] / MIB:.0f} MiB")
    print(f"  time ratio torch / mount      {med['torch_s'] / med['mount_total_s']:.1f}x; "
          f"memory ratio {med['torch_rss'] / med['daemon_rss']:.0f}x")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
