"""ckptfs index list marks stale entries (file missing, size, mtime, inode or ctime changed) and
ckptfs index prune drops exactly those, naming each with its reason; the entries kept still
serve the next build."""

import os
import shutil

import itest
import ckpt_fixture


def parse_list(stdout):
    """{path: (state, reason)} from `index list`, and its last line."""
    rows = {}
    lines = stdout.strip().splitlines()
    for line in lines[1:-1]:
        fields = line.split(None, 3)
        state, rest = fields[2], fields[3]
        path, _, reason = rest.partition(" (")
        rows[path] = (state, reason[:-1] if reason else "")
    return rows, lines[-1]


def list_and_prune(args):
    work = os.path.join(args.work, "prune")
    fx = ckpt_fixture.make_builtin("demo", os.path.join(work, "fixture"))
    index = ["--index-dir", os.path.join(work, "index")]
    itest.run([args.ckptfs, "index", "build", fx.src_dir, "-q"] + index)
    files = {}
    for r in range(8):
        d = os.path.join(fx.src_dir, f"rank_{r}")
        files[r] = os.path.realpath(os.path.join(d, [n for n in os.listdir(d)
                                                     if n.endswith(".ckpt")][0]))
    rows, last = parse_list(itest.run([args.ckptfs, "index", "list"] + index).stdout)
    assert sorted(rows) == sorted(files.values()), rows
    assert all(state == "ok" for state, _ in rows.values()), rows
    assert last.startswith("8 files in ") and "stale" not in last, last

    shutil.rmtree(os.path.dirname(files[1]))                      # gone
    st = os.stat(files[2])
    os.utime(files[2], ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # mtime
    with open(files[3], "ab") as f:                                 # size
        f.write(b"\0")
    shutil.copy2(files[4], files[4] + ".new")                       # another inode
    os.replace(files[4] + ".new", files[4])
    os.chmod(files[5], 0o600)                                       # ctime only
    want = {files[1]: "file missing", files[2]: "mtime changed",
            files[3]: f"size changed: {st.st_size} -> {st.st_size + 1} bytes",
            files[4]: "replaced by another file (inode changed)",
            files[5]: "rewritten or its attributes changed (ctime changed)"}

    rows, last = parse_list(itest.run([args.ckptfs, "index", "list"] + index).stdout)
    for path, (state, reason) in rows.items():
        if path in want:
            assert (state, reason) == ("stale", want[path]), (path, state, reason)
        else:
            assert (state, reason) == ("ok", ""), (path, state, reason)
    assert "5 stale" in last and "ckptfs index prune" in last, last

    proc = itest.run([args.ckptfs, "index", "prune"] + index)
    lines = proc.stdout.strip().splitlines()
    assert sorted(lines[:-1]) == sorted(f"removed {p}: {w}" for p, w in want.items()), lines
    assert lines[-1].startswith("removed 5 entries from ") and "1 file missing, 4 changed" in \
        lines[-1] and lines[-1].endswith("; 3 kept"), lines[-1]

    rows, last = parse_list(itest.run([args.ckptfs, "index", "list"] + index).stdout)
    assert sorted(rows) == sorted(files[r] for r in (0, 6, 7)), rows
    assert last.startswith("3 files in "), last
    # A second prune finds nothing; the kept entries still serve (rank 3 made whole again).
    os.truncate(files[3], st.st_size)
    proc = itest.run([args.ckptfs, "index", "prune"] + index)
    assert proc.stdout.startswith("removed 0 entries"), proc.stdout
    proc = itest.run([args.ckptfs, "index", "build", fx.src_dir] + index)
    assert "7 files, " in proc.stdout and "3 from the index, 4 scanned" in proc.stdout, proc.stdout
    rows, _ = parse_list(itest.run([args.ckptfs, "index", "list"] + index).stdout)
    assert len(rows) == 7 and all(s == "ok" for s, _ in rows.values()), rows


def main():
    args = itest.parse_args()
    args.ckptfs = os.path.abspath(args.ckptfs)
    checks = itest.Checks(args.only)
    checks.run("index list marks stale entries; index prune drops them", list_and_prune, args)
    checks.finish()


if __name__ == "__main__":
    main()
