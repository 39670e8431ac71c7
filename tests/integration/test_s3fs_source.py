"""Sources on object storage, read through an S3 filesystem (issue 33, step 1): a real S3 server
(SeaweedFS, started on 127.0.0.1 by s3harness) holds the fixture's sources, Debian's s3fs mounts
the bucket, and ckptfs mounts the s3fs directory with a reshard.

* identical_over_s3fs: every file the mount over s3fs serves has the md5 of the same mount over
  the local copy, and both equal the fixture generator's expected files.
* index_over_s3fs: the index over s3fs, with the figures printed (mount time, ranged GETs and
  bytes the server sent, how many sources' scans came from the index): a first mount, a remount
  with nothing forgotten, a remount after the kernel dropped its dentries and inodes (s3fs then
  hands out new inode numbers), a remount after s3fs itself was remounted, and a mount with a
  shipped index. The bytes stay identical, a mount with a shipped index fetches no source data,
  and every remount with the default index takes its scans from the index (found by path, size
  and mtime) without fetching source data: over s3fs an equal ctime proves nothing, so each
  source's structure bytes are compared with the entry's digest when it is first read
  (test_s3fs_rewrite), not at mount, since the headers of a .ckpt span the file.
* shipped_view_reads_once_over_s3fs: a mount with a shipped index (each rank planned when first
  opened) reading every file makes s3fs serve each source byte once (counted from s3fs's own
  debug log: the offsets and sizes of the READs the kernel sent it, at most 1.1x the distinct
  bytes). Each rank's plan used to open its sources again, and every open of an s3fs file drops
  its cached pages: s3fs served the checkpoint again for every rank read after it.
* summary_line_over_s3fs: a mount over s3fs prints one line on stderr with what reading the
  whole view costs (bytes needed from how many sources, and fetched in 4 KiB, 1 MiB and 8 MiB
  blocks with the ratios), and its figures are `ckptfs plan --json`'s for the same view; a mount
  of the local copy prints no such line.

Skipped (exit 77) only when the server or s3fs cannot be installed on this machine.
"""

import contextlib
import hashlib
import json
import os
import re
import time

import itest
import ckpt_fixture
import s3harness

BUCKET = "ckpt"
PREFIX = "train"


def md5s(root):
    out = {}
    for rel in itest.tree_files(root):
        h = hashlib.md5()
        with open(os.path.join(root, rel), "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
        out[rel] = h.hexdigest()
    return out


def from_index(mnt):
    """(sources whose scan came from the index, sources) of a mount, from .ckptfs/sources.json."""
    with open(os.path.join(mnt, ".ckptfs", "sources.json")) as f:
        sources = json.load(f)["sources"]
    return sum(1 for s in sources if s["from_index"]), len(sources)


class Setup:
    """The fixture, uploaded once, and the server; s3fs mounted at self.s3."""

    def __init__(self, args, server):
        self.args, self.server = args, server
        self.fx = ckpt_fixture.make_builtin("demo", os.path.join(args.work, "fixture"),
                                            shared=args.shared)
        server.make_bucket(BUCKET)
        self.uploaded = server.upload_dir(self.fx.src_dir, BUCKET, PREFIX)
        self.s3 = os.path.join(args.work, "s3")
        server.mount_s3fs(BUCKET, self.s3)
        self.src = os.path.join(self.s3, PREFIX)
        self._local = None

    def mount(self, src, mnt, index_dir, extra=()):
        return itest.mounted(self.args.ckptfs, src, os.path.join(self.args.work, mnt),
                             src_strategy=self.fx.src_strategy, dst_strategy=self.fx.dst_strategy,
                             index_dir=index_dir, extra_args=list(extra))

    def local_md5s(self):
        if self._local is None:
            with self.mount(self.fx.src_dir, "local", os.path.join(self.args.work, "idx-local")) \
                    as mnt:
                self._local = md5s(mnt)
        return self._local


def identical_over_s3fs(setup):
    local = setup.local_md5s()
    assert local, "the local mount serves no file"
    with setup.mount(setup.src, "view", os.path.join(setup.args.work, "idx-identical")) as mnt:
        remote = md5s(mnt)
        problems = ckpt_fixture.compare_tree(setup.fx, mnt)
    assert remote == local, f"over s3fs {remote}\nlocal {local}"
    assert not problems, problems


def measured_mount(setup, label, index_dir, extra=(), figures=None):
    """Mounts over s3fs, reads every file, and prints (and returns) what the mount cost."""
    before = setup.server.counters()
    start = time.monotonic()
    with setup.mount(setup.src, "view", index_dir, extra) as mnt:
        took = time.monotonic() - start
        at_mount = setup.server.counters() - before
        try:
            served = md5s(mnt)
        except OSError as e:
            with open(os.path.join(mnt, ".ckptfs", "log")) as f:
                raise AssertionError(f"{label}: {e}; the mount's log:\n{f.read()}") from None
        reading = setup.server.counters() - before - at_mount
        # After the reads: a mount with a shipped index plans (and lists its sources) on first open.
        hits, sources = from_index(mnt)
    assert served == setup.local_md5s(), f"{label}: served bytes differ from the local mount's"
    row = {"label": label, "mount_s": took, "from_index": hits, "sources": sources,
           "gets": at_mount["range_gets"], "kib": at_mount["sent_bytes"] / 1024}
    print(f"  {label:38} mount {took:5.2f} s, {hits}/{sources} scans from the index, "
          f"at mount: {at_mount.line()}; reading the view: {reading['range_gets']} range GETs, "
          f"{reading['sent_bytes'] / 1024:.0f} KiB", flush=True)
    if figures is not None:
        figures.append(row)
    return row


def index_over_s3fs(setup):
    args, server = setup.args, setup.server
    idx = os.path.join(args.work, "idx-remount")
    mib = setup.uploaded / (1 << 20)
    print(f"  sources: {mib:.2f} MiB in {len(setup.fx.source_files)} files over s3fs", flush=True)
    rows = []
    first = measured_mount(setup, "first mount (empty index)", idx, figures=rows)
    measured_mount(setup, "remount, nothing forgotten", idx, figures=rows)
    s3harness.drop_caches(2)
    measured_mount(setup, "remount after drop_caches (inodes)", idx, figures=rows)
    s3harness.unmount_s3fs(os.path.realpath(setup.s3))
    server.mount_s3fs(BUCKET, setup.s3)
    measured_mount(setup, "remount after s3fs remount", idx, figures=rows)

    # Absolute: a relative --index is opened from the daemon's cwd (/) when a rank is planned.
    shipped = os.path.abspath(os.path.join(args.work, "shipped"))
    itest.run([args.ckptfs, "index", "build", setup.src, "--output", shipped,
               "--src-strategy", setup.fx.src_strategy, "--dst-strategy", setup.fx.dst_strategy])
    s3harness.unmount_s3fs(os.path.realpath(setup.s3))
    server.mount_s3fs(BUCKET, setup.s3)
    with_index = measured_mount(setup, "mount --index (shipped), fresh s3fs",
                                os.path.join(args.work, "idx-unused"),
                                extra=["--index", shipped], figures=rows)

    assert first["from_index"] == 0, first
    assert first["gets"] > 0, f"the first mount fetched nothing from the server: {first}"
    # A shipped index lists the view without reading a source; the ranks planned on first open
    # (by the reads) list their sources in sources.json, every scan from the index.
    assert with_index["kib"] * 1024 < setup.uploaded / 10, with_index
    assert with_index["from_index"] == with_index["sources"] == len(setup.fx.source_files), \
        with_index
    remounts = rows[1:4]
    rescans = [r["label"] for r in remounts if r["from_index"] < r["sources"]]
    print(f"  default index: {len(rescans)} of {len(remounts)} remounts rescanned "
          f"({'; '.join(rescans) or 'none'})", flush=True)
    assert not rescans, f"remounts that rescanned: {rescans}"
    # The scans are taken by path, size and mtime without a source byte read: each source's
    # structure is compared when it is first read (test_s3fs_rewrite), and a .ckpt's record
    # headers span the file, which s3fs would fetch whole.
    for r in remounts:
        assert r["kib"] * 1024 < setup.uploaded / 10, \
            f"{r['label']} fetched {r['kib']:.0f} KiB of {mib:.2f} MiB of sources at mount"


S3FS_READ = re.compile(r"s3fs_read\(\d+\): \[path=([^\]]*)\]\[size=(\d+)\]\[offset=(\d+)\]")


def served_by_s3fs(log_lines):
    """(bytes of the READs s3fs served, distinct bytes among them) from s3fs's debug log."""
    total, ranges = 0, {}
    for line in log_lines:
        m = S3FS_READ.search(line)
        if m:
            size, offset = int(m.group(2)), int(m.group(3))
            total += size
            ranges.setdefault(m.group(1), []).append((offset, offset + size))
    distinct = 0
    for spans in ranges.values():
        end = 0
        for b, e in sorted(spans):
            distinct += max(0, e - max(b, end))
            end = max(end, e)
    return total, distinct


def shipped_view_reads_once_over_s3fs(setup):
    args, server = setup.args, setup.server
    shipped = os.path.abspath(os.path.join(args.work, "shipped-once"))
    # A second s3fs of its own, logging every READ the kernel sends it. The shipped index names
    # the files it was built from: built through this s3fs, the mount reads through it too.
    log = os.path.join(args.work, "s3fs-reads.log")
    with contextlib.suppress(FileNotFoundError):
        os.remove(log)
    with server.s3fs(BUCKET, os.path.join(args.work, "s3-logged"),
                     options=("dbglevel=dbg", f"logfile={log}")) as s3:
        src = os.path.join(s3, PREFIX)
        itest.run([args.ckptfs, "index", "build", src, "--output", shipped, "--src-strategy",
                   setup.fx.src_strategy, "--dst-strategy", setup.fx.dst_strategy])
        with open(log, errors="replace") as f:
            built = len(f.readlines())
        with setup.mount(src, "view-once", os.path.join(args.work, "idx-once"),
                         ["--index", shipped]) as mnt:
            served = md5s(mnt)
    with open(log, errors="replace") as f:
        total, distinct = served_by_s3fs(f.readlines()[built:])
    assert served == setup.local_md5s(), "served bytes differ from the local mount's"
    print(f"  s3fs served {total / 1024:.0f} KiB for {distinct / 1024:.0f} KiB of distinct "
          f"source bytes ({total / max(distinct, 1):.2f}x; sources {setup.uploaded / 1024:.0f} "
          f"KiB)", flush=True)
    assert distinct > 0, "s3fs logged no READ"
    assert total <= 1.1 * distinct, \
        f"s3fs served {total} bytes for {distinct} distinct ones: sources read again"


def cost_lines(setup, src, mnt):
    """The mount's stderr lines about the sources' read cost (the mount is unmounted after)."""
    mnt = os.path.join(setup.args.work, mnt)
    os.makedirs(mnt, exist_ok=True)
    with itest.unmounting(setup.args.ckptfs, mnt):
        proc = itest.run(itest.mount_cmd(setup.args.ckptfs, src, mnt,
                                         src_strategy=setup.fx.src_strategy,
                                         dst_strategy=setup.fx.dst_strategy,
                                         index_dir=os.path.join(setup.args.work, "idx-line")),
                         check=False)
        assert proc.returncode == 0, proc.stderr
    return [line for line in itest.stderr_lines(proc) if "remote filesystem" in line]


def summary_line_over_s3fs(setup):
    lines = cost_lines(setup, setup.src, "view-line")
    print(f"  {lines}", flush=True)
    assert len(lines) == 1, lines
    m = re.fullmatch(r"ckptfs: sources on a remote filesystem; the (\d+) files together: needs "
                     r"\S+ \S+ from (\d+) sources; fetched in blocks of 4 KiB: \S+ \S+ "
                     r"\(([\d.]+)x\), 1 MiB: \S+ \S+ \(([\d.]+)x\), 8 MiB: \S+ \S+ "
                     r"\(([\d.]+)x\)", lines[0])
    assert m, lines[0]
    files, sources = int(m.group(1)), int(m.group(2))
    ratios = [float(g) for g in m.group(3, 4, 5)]
    report = json.loads(itest.run([setup.args.ckptfs, "plan", setup.src, "--src-strategy",
                                   setup.fx.src_strategy, "--dst-strategy",
                                   setup.fx.dst_strategy, "--json", "-q"]).stdout)
    need = sum(s["need"] for s in report["all"]["sources"])
    want = [sum(s["fetched"][str(b)] for s in report["all"]["sources"]) / need
            for b in report["blocks"]]
    assert files == len(report["files"]) and sources == len(report["all"]["sources"]) \
        == len(setup.fx.source_files), (files, sources, report["files"])
    assert ratios == [round(r, 2) for r in want], (ratios, want)
    # Larger blocks never fetch less (the whole view can need less than 1x: targets that read
    # the same source bytes need them each, a block is fetched once).
    assert 0 < ratios[0] <= ratios[1] <= ratios[2], ratios
    assert not cost_lines(setup, setup.fx.src_dir, "view-local-line"), "a local mount's line"


def main():
    args = itest.parse_args()
    s3harness.ensure_tools_or(itest.skip)
    checks = itest.Checks(args.only)
    with s3harness.S3Server(args.work) as server:
        setup = Setup(args, server)
        checks.run("identical_over_s3fs", identical_over_s3fs, setup)
        checks.run("index_over_s3fs", index_over_s3fs, setup)
        checks.run("shipped_view_reads_once_over_s3fs", shipped_view_reads_once_over_s3fs, setup)
        checks.run("summary_line_over_s3fs", summary_line_over_s3fs, setup)
    checks.finish()


if __name__ == "__main__":
    main()
