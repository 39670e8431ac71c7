#!/usr/bin/python3
"""Numbers for docs/SCALE.md: a job of NODES nodes x RANKS_PER_NODE ranks mounting one
checkpoint from shared storage, one ckptfs mount per node with a shipped index and --ranks.

Per node, at mount and at the first open of its ranks: metadata operations and bytes read from
the shared file system, from what the code does (each counted in the comments below, and checked
with strace -c on a 128-rank mount: 160 openat, 450 newfstatat, 266 getdents64 for 128 rank
directories); the index size from the bytes per source tensor measured by
scripts/bench_scale.py; and the read amplification (bytes read from storage / bytes served) of
typical layout changes, by simulating which pages of each source file a target's reads touch
(a transformer layer's column-parallel, row-parallel and replicated tensors, row-major slices as
MindSpore saves them, storage read in PAGE-byte units).

Run: scripts/scale_plan.py [--nodes 1024] [--ranks-per-node 8] [--names 100000] [--pp 8] ...
"""

import argparse

KIB, MIB, GIB = 1 << 10, 1 << 20, 1 << 30


# -- read amplification ------------------------------------------------------------------------

def layer(h, ffn, dtype_bytes=2):
    """(name, shape, split dim or None) of one transformer layer: column-parallel weights split
    rows (dim 0), row-parallel ones split columns (dim 1), norms replicated."""
    return [("wq", [h, h], 0), ("wk", [h, h], 0), ("wv", [h, h], 0), ("wo", [h, h], 1),
            ("w1", [ffn, h], 0), ("w3", [ffn, h], 0), ("w2", [h, ffn], 1),
            ("attention_norm", [h], None), ("ffn_norm", [h], None)], dtype_bytes


def slice_shape(shape, dim, parts):
    out = list(shape)
    if dim is not None:
        out[dim] //= parts
    return out


def pages_touched(runs, page):
    """Distinct pages of [start, start + length) runs (sorted by start)."""
    total, last = 0, -1
    for start, length in runs:
        first, end = start // page, (start + length - 1) // page
        if end <= last:
            continue
        total += end - max(first, last + 1) + 1
        last = end
    return total


def amplification(tensors, dtype, src_tp, dst_tp, page):
    """Bytes of storage pages touched / bytes served, summed over every target of one stage
    (each target reads the blocks that hold its box; a replicated tensor from one source)."""
    served = touched = 0
    for t in range(dst_tp):
        # Per source file: the byte runs this target reads from it.
        runs = {}
        for s in range(src_tp):
            offset = 0  # the tensor's offset in source file s
            for name, shape, dim in tensors:
                sshape = slice_shape(shape, dim, src_tp)
                row_bytes = (sshape[-1] if len(sshape) > 1 else sshape[0]) * dtype
                rows = sshape[0] if len(sshape) > 1 else 1
                size = rows * row_bytes
                if dim is None:
                    if s == t % src_tp:
                        runs.setdefault(s, []).append((offset, size))
                        served += size
                    offset += size
                    continue
                # This source's range and the target's range along the split dimension.
                n = shape[dim]
                s_lo, s_hi = s * n // src_tp, (s + 1) * n // src_tp
                t_lo, t_hi = t * n // dst_tp, (t + 1) * n // dst_tp
                lo, hi = max(s_lo, t_lo), min(s_hi, t_hi)
                if lo < hi:
                    if dim == 0:  # whole rows: one run
                        runs.setdefault(s, []).append((offset + (lo - s_lo) * row_bytes,
                                                       (hi - lo) * row_bytes))
                    else:  # a column range of every row
                        width = (hi - lo) * dtype
                        for r in range(rows):
                            runs.setdefault(s, []).append(
                                (offset + r * row_bytes + (lo - s_lo) * dtype, width))
                    served += (hi - lo) * (size // (s_hi - s_lo))
                offset += size
        for s, rs in runs.items():
            rs.sort()
            touched += pages_touched(rs, page) * page
    return touched / served


# -- the plan ----------------------------------------------------------------------------------

def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=1024)
    ap.add_argument("--ranks-per-node", type=int, default=8)
    ap.add_argument("--names", type=int, default=100_000,
                    help="parameter names of the model, optimizer states included")
    ap.add_argument("--pp", type=int, default=8, help="pipeline stages of the saved job")
    ap.add_argument("--merge-factor", type=int, default=4,
                    help="source files each target reads its blocks from (TP 8->2 is 4)")
    ap.add_argument("--index-bytes-per-tensor", type=float, default=68.0,
                    help="measured by bench_scale.py (index size / source tensors)")
    ap.add_argument("--strategy-bytes-per-name", type=float, default=248.0,
                    help="a JSON strategy's bytes per parameter (bench data: 8126535 / 32768)")
    ap.add_argument("--hidden", type=int, default=8192)
    ap.add_argument("--page", type=int, default=4096, help="storage read unit in bytes")
    a = ap.parse_args()

    ranks = a.nodes * a.ranks_per_node
    per_file = a.names // a.pp
    tensors = ranks * per_file
    index = tensors * a.index_bytes_per_tensor
    print(f"job: {a.nodes} nodes x {a.ranks_per_node} ranks = {ranks} rank files, {a.names:,} "
          f"parameter names over {a.pp} stages ({per_file:,} tensors a file): "
          f"{tensors / 1e6:.0f}M source tensors")
    print(f"shipped index: {index / GIB:.1f} GiB ({a.index_bytes_per_tensor:.0f} B a tensor), "
          f"plus {ranks} target summaries (~100 B each); built once, read-only on every node")

    k = a.merge_factor
    needed = a.ranks_per_node * k + a.ranks_per_node  # block sources + passthrough sources
    # Each strategy file is read twice (its digest, then the parse).
    strategies = 2 * 2 * a.names * a.strategy_bytes_per_name
    files_record = ranks * 60  # the index's list of chosen files, one line a rank
    summary_pages = (a.ranks_per_node + needed + 2) * 4  # B-tree root-to-leaf, 4 levels
    # Pinned by the index: open+read of each strategy file twice, open+mmap of data.mdb, a stat
    # of each source the node's ranks read.
    mount_ops = 2 * 2 * 2 + 2 + needed
    # Listing instead (another --step, or a source strategy found in a MindFormers output/):
    # per rank directory an open, two getdents64, a close, a stat of the directory, a stat of
    # each entry (strace: 1.25 openat, 3.5 newfstatat, 2.1 getdents64 a rank).
    listing_ops = ranks * 7
    read = strategies + files_record + summary_pages * 4096
    print("\nper node, at mount (ranks listed from the index summaries, nothing planned):")
    print(f"  metadata operations: {mount_ops} (strategy and index opens, {needed} stats of the "
          f"node's sources); {mount_ops + listing_ops:,} when the mount has to list the source "
          f"directory instead of taking the index's files")
    print(f"  bytes read: {strategies / MIB:.0f} MiB of strategy files (read twice) + "
          f"{(files_record + summary_pages * 4096) / MIB:.1f} MiB of index pages")
    print(f"  cluster-wide: {mount_ops * a.nodes:,} metadata operations, {read * a.nodes / GIB:.0f}"
          f" GiB read")
    first_open = needed * per_file * a.index_bytes_per_tensor
    print(f"per node, at the first open of its {a.ranks_per_node} ranks: {needed} source files "
          f"opened and mapped (no lock, no write), {first_open / MIB:.0f} MiB of index entries "
          f"read ({needed} files x {per_file:,} tensors)")
    print("  then only the bytes served, times the read amplification below")

    tensors_layer, dtype = layer(a.hidden, 4 * a.hidden)
    print(f"\nread amplification (storage bytes / served bytes), {a.page} B pages, hidden "
          f"{a.hidden}, BFloat16:")
    for label, s, d in (("TP 8 -> 4", 8, 4), ("TP 8 -> 1 (merge)", 8, 1),
                        ("TP 4 -> 8 (split)", 4, 8), ("TP 8 -> 16 (split)", 8, 16)):
        print(f"  {label:20s} {amplification(tensors_layer, dtype, s, d, a.page):.3f}")
    # PP 4 -> 2: a stage-2 target reads two whole source stages, the same tensors' files.
    print(f"  {'PP 4 -> 2':20s} {amplification(tensors_layer, dtype, 8, 8, a.page):.3f} "
          f"(each target reads both stages' files of its TP rank whole)")
    print("\nwhat a node needs from the storage: read-only access (open, stat, read, mmap) to "
          "the sources, the strategies and the index; no locks (the index opens MDB_NOLOCK), no "
          "writes, no cluster service")


if __name__ == "__main__":
    main()
