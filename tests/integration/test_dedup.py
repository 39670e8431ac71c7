"""Deduplicated saves (CheckpointConfig(remove_redundancy=True)): each block of a strategy
parameter is in one file of the ranks holding it. The mount must serve what the transform of the
same checkpoint saved without deduplication writes (the fixture's expected files)."""

import os

import itest
import ckpt_fixture
from ckptfix import builtins, ckptio, negative, stio
from ckptfix.sources import dedup_savers, redundancy_groups

# The files of these determine the record order completely: byte-identical views.
ORDER_DETERMINED = ["opt_dst", "multiaxis", "4to6", "8to1_merge", "pipeline_src_dir"]
# Here two names are in no file together and in no chain of files: the same records, each
# byte-identical, may come in another order (the README says so).
ORDER_OPEN = ["demo", "8to4_dtypes", "opt_src", "pipeline_dst"]


def dedup_fixture(args, name, work_name=None):
    case = builtins.builtin(name, shared=args.shared)
    case["options"]["remove_redundancy"] = True
    work = os.path.join(args.work, work_name or name)
    return work, ckpt_fixture.make(case, os.path.join(work, "fixture"), shared=args.shared)


def names_in(path):
    if path.endswith(".safetensors"):
        meta, entries, _ = stio.read_header(path)
        assert meta == {"format": "ms", "remove_redundancy": "True"}, meta
        return set(entries)
    return {r.tag for r in ckptio.read_records(path)}


def check_really_deduplicated(fx):
    """Some strategy parameter is missing from some file, and every block is in some file."""
    savers = dedup_savers(fx.case)
    names = {g: names_in(path) for g, path in fx.source_files.items()}
    lacking = sum(1 for g in names for p in savers if g not in savers[p] and p in
                  {q.name for q in fx.case.params if q.src and g // fx.case.src.devices
                   in q.src.stages})
    assert lacking > 0, "the fixture is not deduplicated"
    for p, groups in redundancy_groups(fx.case).items():
        for group in groups:
            assert any(p in names[g] for g in group), f"{p}: no file of {group} holds it"


def records(path):
    return [(r.tag, r.tensor_type, tuple(r.dims), r.content)
            for r in ckptio.join_chunks(ckptio.read_records(path))]


def same_view(args, name, exact):
    work, fx = dedup_fixture(args, name)
    check_really_deduplicated(fx)
    mnt = os.path.join(work, "mnt")
    with itest.mounted(args.ckptfs, fx.src_dir, mnt, src_strategy=fx.src_strategy,
                       dst_strategy=fx.dst_strategy, index_dir=os.path.join(work, "index")):
        # The safetensors view orders entries by type and name: byte-identical either way.
        for t, want in sorted(fx.expected_safetensors_files().items()):
            got = os.path.join(mnt, f"rank_{t}", os.path.basename(want))
            diff = ckpt_fixture.describe_difference(want, got)
            assert itest.read_file(got) == itest.read_file(want), f"rank {t}: {diff}"
        if exact:
            problems = ckpt_fixture.compare_tree(fx, mnt)
            assert not problems, "\n".join(problems)
            return
        for t, want in sorted(fx.expected_files().items()):
            got = os.path.join(mnt, f"rank_{t}", os.path.basename(want))
            assert sorted(records(got)) == sorted(records(want)), f"rank {t} differs"


def block_in_no_file(args):
    """The one file holding a replicated block loses it: refused naming the parameter and the
    ranks that could have held it."""
    work, fx = dedup_fixture(args, "8to4_dtypes", "block_in_no_file")
    savers = dedup_savers(fx.case)
    groups = redundancy_groups(fx.case)
    # Several blocks (so other files still hold the parameter), this one replicated.
    name, group = next((p, g) for p, gs in sorted(groups.items()) if len(gs) > 1
                       for g in gs if len(g) > 1)
    holder = next(r for r in group if r in savers[name])
    negative.drop_record(fx.outdir, holder, name)
    mnt = os.path.join(work, "mnt")
    os.makedirs(mnt)
    proc = itest.run(itest.mount_cmd(args.ckptfs, fx.src_dir, mnt, src_strategy=fx.src_strategy,
                                     dst_strategy=fx.dst_strategy,
                                     index_dir=os.path.join(work, "index")), check=False)
    itest.unmount(args.ckptfs, mnt)
    assert proc.returncode == 1, proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    ranks = ", ".join(str(r) for r in group)
    prefix = f"ckptfs: parameter {name}: no source file holds the block target rank "
    suffix = (f" needs; source ranks {ranks} hold identical blocks and none of their files "
              f"contains it (a deduplicated save keeps each block in one of them): the "
              f"checkpoint is incomplete, or the source strategy is not the one it was saved "
              f"with")
    assert lines[0].startswith(prefix) and lines[0].endswith(suffix), lines[0]
    print(f"     -> {lines[0]}")


def main():
    args = itest.parse_args()
    checks = itest.Checks(args.only)
    for name in ORDER_DETERMINED:
        checks.run(f"dedup {name}: byte-identical", same_view, args, name, True)
    for name in ORDER_OPEN:
        checks.run(f"dedup {name}: same records", same_view, args, name, False)
    # Safetensors sources (MindSpore >= 2.7 marks them "remove_redundancy": "True").
    # Their files list entries by type and name, which fixes less of the order.
    st_open = ORDER_OPEN + ["pipeline_src_dir"]
    for name in ORDER_DETERMINED:
        if name not in st_open:
            checks.run(f"dedup st_{name}: byte-identical", same_view, args, f"st_{name}", True)
    for name in st_open:
        checks.run(f"dedup st_{name}: same records", same_view, args, f"st_{name}", False)
    checks.run("dedup: a block in no file is refused", block_in_no_file, args)
    checks.finish()


if __name__ == "__main__":
    main()
