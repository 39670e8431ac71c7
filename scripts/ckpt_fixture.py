#!/usr/bin/python3
"""Test-fixture generator and oracle for ckptfs.

Writes MindSpore-format distributed checkpoints and strategy files by slicing seeded random full
tensors by a source layout, and writes the files `transform_checkpoints` would produce by slicing
the same full tensors by the target layout (spec: shared/spec/mindspore-formats.md). It never
runs ckptfs.

CLI:
    ckpt_fixture.py list
    ckpt_fixture.py show NAME                        print a builtin case as JSON
    ckpt_fixture.py make CASE.json OUTDIR [--no-expected] [--shared DIR]
    ckpt_fixture.py make --builtin NAME OUTDIR [--size-gib X] [--src-devices N]
                         [--dst-devices M] [--no-expected] [--shared DIR]
    ckpt_fixture.py neg KIND OUTDIR [--rank G] [--side src|dst] [--mode gcm|cbc|sm4]
                        [--bytes N] [--param NAME] [--delta 1|-1]
    ckpt_fixture.py compare OUTDIR MOUNT_DIR         compare a mount with the expected files
    ckpt_fixture.py diff EXPECTED_FILE ACTUAL_FILE   explain the first difference

Case JSON (see ckptfix/case.py; `show NAME` prints complete examples):
    {"name": "x", "seed": 1,
     "src": {"devices": 8, "stages": 1},          null = unsharded (one full rank_0 file)
     "dst": {"devices": 4, "stages": 1},          null = one merged target file (rank_0)
     "params": [{"name": "w", "dtype": "BFloat16", "shape": [16, 8],       global shape
                 "src": {"dev_matrix": [2, 4], "tensor_map": [1, -1],      ints or nested
                         "opt_shard_size": 0, "opt_shard_step": null,      null = MindSpore's
                         "stages": [0]},
                 "dst": null}],                   null = not in that side's strategy
     "extras": [{"name": "global_step", "dtype": "Int64", "value": 10, "per_rank": true}],
     "options": {"crc": false, "old_scalars": false, "ckpt_name": "net-9_1.ckpt",
                 "decoys": ["net-10_1.ckpt"], "junk_entries": false, "rank_dir_width": 0,
                 "symlink_rank": -1, "src_strategy_form": "protobuf|merged|json|dir|json_dir",
                 "dst_strategy_form": "...", "strategy_dir_all_ranks": false,
                 "shuffle_layouts": false, "src_strategy_file": "shared:fixtures/real/...",
                 "src_chunk_bytes": 536870912, "src_chunk_style": "bytes|elements",
                 "strategy_overrides": {"src": {"w": {"tensor_map": [0]}}},
                 "materialize_limit": 67108864, "record_orders": {"3": "reversed"},
                 "expected": true}}
  A parameter outside the src strategy (src null, source sharded) is saved whole in every rank
  file with rank-specific data; extras (per_rank) differ per rank too, so the passthrough
  source rank is observable (except the step counters global_step, epoch_num and step_num,
  equal on every rank as training writes them). record_orders writes a rank's records in
  another order ("reversed", "rotated:K", "moved:NAME:I" or the list of names; see
  ckptfix/case.py); the expected files follow the file MindSpore loads first.
  OUTDIR/case.json is the resolved case plus a "fixture" section (paths, and per target:
  rank_list, records with role and passthrough source rank).

As a module (sys.path.insert(0, "<repo>/scripts"); import ckpt_fixture):
    fx = ckpt_fixture.make_builtin("demo", outdir)   # or make(case_dict, outdir)
    fx.src_dir, fx.mount_args(), fx.expected_files()  # {target rank: path}
    ckpt_fixture.compare_tree(fx, mount_dir)          # [] when the mount is byte-identical
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from ckptfix import ckptio, negative  # noqa: E402
from ckptfix.build import Fixture, make, resolve_shared_path, shared_dir  # noqa: E402
from ckptfix.builtins import (BUILTINS, SAFETENSORS_BUILTINS, SMALL_BUILTINS,  # noqa: E402
                               builtin, describe)
from ckptfix.case import Case, CaseError, format_json  # noqa: E402
from ckptfix.ckptio import (MINDSPORE_CHUNK_BYTES, describe_difference, join_chunks,  # noqa: E402
                            parse_records, read_records)
from ckptfix.expected import ExpectationError  # noqa: E402
from ckptfix.layout import Layout, LayoutError  # noqa: E402
from ckptfix.negative import (encrypted_source, garbage_strategy, inconsistent_slice,  # noqa: E402
                              indivisible, remove_rank, tensor_map_length, truncate_source)
from ckptfix.ranklist import ParamLayout, StrategyMap, rank_list_for_transform  # noqa: E402

__all__ = [
    "BUILTINS", "SAFETENSORS_BUILTINS", "SMALL_BUILTINS", "MINDSPORE_CHUNK_BYTES", "Case", "CaseError",
    "ExpectationError", "Fixture", "Layout", "LayoutError", "ParamLayout", "StrategyMap",
    "builtin", "compare_tree", "describe_difference", "encrypted_source", "garbage_strategy",
    "inconsistent_slice", "indivisible", "join_chunks", "make", "make_builtin", "parse_records",
    "rank_list_for_transform", "read_records", "remove_rank", "resolve_shared_path",
    "shared_dir", "tensor_map_length", "truncate_source",
]


def make_builtin(name: str, outdir: str, shared: str = None, expected: bool = None,
                 **kwargs) -> Fixture:
    """Generates builtin `name` (kwargs: size_gib, src_devices, dst_devices for `bench`)."""
    return make(builtin(name, shared=shared, **kwargs), outdir, shared=shared, expected=expected)


def compare_tree(fixture: Fixture, mount_dir: str) -> list:
    """Problems found comparing a mounted (or materialized) tree with the expected files;
    an empty list means every target file is byte-identical and nothing else is there."""
    problems = []
    want = {f"rank_{t}": os.path.basename(p) for t, p in fixture.expected_files().items()}
    # A mount also shows steps/ (every step of a training directory); compared on its own.
    got = sorted(n for n in os.listdir(mount_dir) if n != "steps")
    if got != sorted(want):
        problems.append(f"rank directories {got}, expected {sorted(want)}")
    for t, path in sorted(fixture.expected_files().items()):
        actual = os.path.join(mount_dir, f"rank_{t}", os.path.basename(path))
        if not os.path.isfile(actual):
            problems.append(f"{actual} is missing")
            continue
        diff = describe_difference(path, actual)
        if diff:
            problems.append(f"rank {t}: {diff}")
    return problems


def _cmd_list(_args) -> int:
    for name in BUILTINS:
        print(f"{name:18} {describe(name, shared=_args.shared)}")
    return 0


def _cmd_show(args) -> int:
    print(format_json(builtin(args.name, shared=args.shared)))
    return 0


def _cmd_make(args) -> int:
    expected = False if args.no_expected else None
    if len(args.paths) > 2:
        raise SystemExit("make takes [CASE.json] OUTDIR")
    args.case = args.paths[0] if len(args.paths) == 2 else None
    args.outdir = args.paths[-1]
    if args.builtin:
        if args.case:
            raise SystemExit("give either CASE.json or --builtin NAME, not both")
        kwargs = {}
        if args.builtin in ("bench", "st_bench"):
            kwargs = {"size_gib": args.size_gib, "src_devices": args.src_devices,
                      "dst_devices": args.dst_devices}
        fx = make_builtin(args.builtin, args.outdir, shared=args.shared, expected=expected,
                          **kwargs)
    else:
        if not args.case:
            raise SystemExit("CASE.json or --builtin NAME is required")
        fx = make(Case.load(args.case), args.outdir, shared=args.shared, expected=expected)
    print(f"{fx.case.name}: {len(fx.source_files)} source ranks, {len(fx.targets)} expected "
          f"files in {fx.outdir}")
    print("mount args: " + " ".join(fx.mount_args()))
    return 0


def _cmd_neg(args) -> int:
    kind = args.kind
    if kind == "indivisible":
        msg = negative.indivisible(args.outdir)
    elif kind == "map-length":
        msg = negative.tensor_map_length(args.outdir, args.delta, args.side)
    elif kind == "remove-rank":
        msg = negative.remove_rank(args.outdir, args.rank)
    elif kind == "truncate":
        msg = negative.truncate_source(args.outdir, args.rank, args.bytes)
    elif kind == "inconsistent-slice":
        msg = negative.inconsistent_slice(args.outdir, args.rank, args.param)
    elif kind == "garbage-strategy":
        msg = negative.garbage_strategy(args.outdir, args.side)
    elif kind == "encrypted":
        msg = negative.encrypted_source(args.outdir, args.rank, args.mode)
    else:
        raise SystemExit(f"unknown negative kind {kind}")
    print(msg)
    return 0


def _cmd_compare(args) -> int:
    problems = compare_tree(Fixture.load(args.outdir), args.mount_dir)
    for p in problems:
        print(p)
    print("identical" if not problems else f"{len(problems)} problem(s)")
    return 0 if not problems else 1


def _cmd_diff(args) -> int:
    diff = describe_difference(args.expected, args.actual)
    print(diff or "identical")
    return 0 if diff is None else 1


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shared", default=None,
                        help="data dir for shared: paths (default: $CKPTFS_SHARED_DIR or <repo>/tests/data)")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("list", help="list builtin cases")
    p.set_defaults(func=_cmd_list)

    p = sub.add_parser("show", help="print a builtin case as JSON")
    p.add_argument("name")
    p.set_defaults(func=_cmd_show)

    p = sub.add_parser("make", help="generate a fixture")
    p.add_argument("paths", nargs="+", metavar="PATH", help="[CASE.json] OUTDIR")
    p.add_argument("--builtin")
    p.add_argument("--no-expected", action="store_true", help="skip the expected files")
    p.add_argument("--size-gib", type=float, default=1.0, help="bench: model size")
    p.add_argument("--src-devices", type=int, default=8, help="bench: source ranks")
    p.add_argument("--dst-devices", type=int, default=4, help="bench: target ranks (0: merged)")
    p.add_argument("--shared", dest="shared_sub", default=None)
    p.set_defaults(func=_cmd_make)

    p = sub.add_parser("neg", help="make a broken fixture for negative tests")
    p.add_argument("kind", choices=sorted(negative.NEGATIVES))
    p.add_argument("outdir")
    p.add_argument("--rank", type=int, default=0)
    p.add_argument("--side", choices=["src", "dst"], default="src")
    p.add_argument("--mode", choices=sorted(ckptio.ENCRYPTION_MAGICS), default="gcm")
    p.add_argument("--bytes", type=int, default=None, help="truncate: bytes to keep")
    p.add_argument("--param", default=None, help="inconsistent-slice: parameter name")
    p.add_argument("--delta", type=int, default=1, help="map-length: +1 longer, -1 shorter")
    p.set_defaults(func=_cmd_neg)

    p = sub.add_parser("compare", help="compare a mounted tree with a fixture's expected files")
    p.add_argument("outdir")
    p.add_argument("mount_dir")
    p.set_defaults(func=_cmd_compare)

    p = sub.add_parser("diff", help="compare an expected and an actual checkpoint")
    p.add_argument("expected")
    p.add_argument("actual")
    p.set_defaults(func=_cmd_diff)

    args = parser.parse_args(argv)
    if getattr(args, "shared_sub", None):
        args.shared = args.shared_sub
    try:
        return args.func(args)
    except (CaseError, ExpectationError, LayoutError, OSError) as err:
        print(f"ckpt_fixture: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
