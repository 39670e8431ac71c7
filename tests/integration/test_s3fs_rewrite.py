"""A source on object storage rewritten in place under an index, read through s3fs (a real
SeaweedFS server and Debian's s3fs, started by s3harness): every stat field the index could
compare is put back, and the rewrite changes the file's structure (two same-shaped tensors'
names swapped, which keeps the size).

* rewritten_through_s3fs: the object is rewritten through a writable s3fs mount and its mtime
  put back with `touch -d`. s3fs 1.90 keeps a file's ctime in x-amz-meta-ctime and sets it to the
  mtime it is given, so size, mtime AND ctime read back as before the rewrite (asserted: it is
  why a ctime cannot stand in for the structure check over s3fs).
* reuploaded_keeping_mtime: the object is uploaded again through the S3 API with the
  x-amz-meta-mtime header it had (as rclone-style copy tools keep it); s3fs shows the old mtime
  and, for ctime, the new Last-Modified (one-second steps).

For each, through a freshly mounted s3fs (another node, or the next day): a mount with a shipped
index planned at mount is refused in one line naming the file; one whose ranks are planned on
first open fails that open with EIO and one log line; a mount with the default index, which
read the sources before the rewrite, serves the rewritten layout (what a mount with an empty
index serves, not the fixture's original bytes) or refuses. Never the old layout's bytes.

Skipped (exit 77) only when the server or s3fs cannot be installed on this machine.
"""

import errno
import json
import os
import subprocess
import time

import itest
import ckpt_fixture
import s3harness
from ckptfix.builtins import case, extra, side
from ckptfix.ckptio import read_records
from test_index_trust import TWINS, swap_names

BUCKET = "ckpt"
# TWINS with the step counters a training run saves in every rank's file (after the tensors).
COUNTED = case("counted", "two same-shaped tensors and the step counters, 2 -> 1", side(2),
               side(1), TWINS["params"],
               [extra("global_step", "Int64", 1002, False), extra("epoch_num", "Int64", 1, False),
                extra("step_num", "Int64", 2, False)])


def stat_of(path):
    st = os.stat(path)
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "ctime_ns": st.st_ctime_ns}


class Case:
    """The TWINS fixture uploaded under `prefix`, s3fs (read-only) at work/<name>/s3, and the
    indexes built through it before the rewrite."""

    def __init__(self, args, server, name, upload):
        self.args, self.server, self.name = args, server, name
        self.work = os.path.join(args.work, name)
        self.fx = ckpt_fixture.make(TWINS, os.path.join(self.work, "fixture"))
        self.prefix = name
        for path in self.fx.source_files.values():
            upload(path, self.key(path))
        self.s3 = os.path.join(self.work, "s3")
        server.mount_s3fs(BUCKET, self.s3)
        self.src = os.path.join(self.s3, self.prefix)
        self.victim = self.fx.source_files[1]
        self.victim_s3 = os.path.join(self.src, os.path.relpath(self.victim, self.fx.src_dir))
        self.eager = os.path.join(self.work, "eager")  # no strategies: planned at mount
        itest.run([args.ckptfs, "index", "build", self.src, "--output", self.eager, "-q"])
        self.lazy = os.path.join(self.work, "lazy")  # rank summaries: planned on first open
        itest.run([args.ckptfs, "index", "build", self.src, "--output", self.lazy,
                   "--src-strategy", self.fx.src_strategy, "--dst-strategy",
                   self.fx.dst_strategy, "-q"])
        self.cache = os.path.join(self.work, "cache")
        with self.mount("before", self.cache) as mnt:
            problems = ckpt_fixture.compare_tree(self.fx, mnt)
        assert not problems, f"{name}: before the rewrite: {problems}"
        self.before = stat_of(self.victim_s3)

    def key(self, path):
        return f"{self.prefix}/{os.path.relpath(path, self.fx.src_dir)}"

    def mount(self, mnt, index_dir, extra=()):
        return itest.mounted(self.args.ckptfs, self.src, os.path.join(self.work, mnt),
                             src_strategy=self.fx.src_strategy,
                             dst_strategy=self.fx.dst_strategy, index_dir=index_dir,
                             extra_args=list(extra))

    def remount_s3fs(self):
        """A fresh s3fs: no stat or page cached from before the rewrite."""
        s3harness.unmount_s3fs(os.path.realpath(self.s3))
        self.server.mount_s3fs(BUCKET, self.s3)

    def rank_file(self, mnt):
        return os.path.join(mnt, "rank_0", os.path.basename(self.fx.expected_files()[0]))

    def check_after_rewrite(self):
        self.remount_s3fs()
        after = stat_of(self.victim_s3)
        print(f"  {self.name}: before {self.before}, after {after}", flush=True)
        assert after["size"] == self.before["size"] and \
            after["mtime_ns"] == self.before["mtime_ns"], (self.before, after)
        victim = os.path.realpath(self.victim_s3)

        # The rewrite changes the served bytes: a stale layout would be wrong bytes.
        with self.mount("fresh", os.path.join(self.work, "empty")) as mnt:
            fresh = itest.read_file(self.rank_file(mnt))
        assert fresh != itest.read_file(self.fx.expected_files()[0]), "the swap changes nothing"

        proc = itest.refused_mount(self.args.ckptfs, self.src, os.path.join(self.work, "mnt"),
                                   src_strategy=self.fx.src_strategy,
                                   dst_strategy=self.fx.dst_strategy,
                                   extra_args=["--index", self.eager])
        lines = itest.stderr_lines(proc)
        assert len(lines) == 1 and victim in lines[0] and "rebuild" in lines[0], proc.stderr

        log = os.path.join(self.work, "lazy.log")
        with self.mount("lazy-mnt", os.path.join(self.work, "unused"),
                        ["--index", self.lazy, "--log-file", log]) as mnt:
            try:
                itest.read_file(self.rank_file(mnt))
                raise AssertionError("a rank planned from the shipped index's stale scan was "
                                     "served")
            except OSError as e:
                assert e.errno == errno.EIO, e
        with open(log) as f:
            named = [line for line in f if victim in line]
        assert len(named) == 1 and "rebuild" in named[0], named

        self.check_cache_index(fresh)

    def check_cache_index(self, fresh):
        """The default index, which read the sources before the rewrite. Its remount takes the
        scans by path, size and mtime without reading the sources (a .ckpt's headers span the
        file: s3fs would fetch it whole); the first read of the rewritten source compares its
        headers, fails with EIO and one log line naming it, and drops its entry. The mount
        after that scans it again and serves the rewrite's layout. Never the old one."""
        # Its size, mtime and ctime are those indexed: `index list` must not vouch for it.
        status = itest.run([self.args.ckptfs, "index", "list", "--index-dir",
                            self.cache]).stdout
        victim = "/" + os.path.relpath(self.victim, self.fx.src_dir)
        lines = [line for line in status.splitlines() if victim in line]
        assert len(lines) == 1 and (lines[0].split()[2] == "stale" or
                                    "on a FUSE filesystem" in lines[0]), status
        log = os.path.join(self.work, "cache.log")
        with self.mount("again", self.cache, ["--log-file", log]) as mnt:
            with open(os.path.join(mnt, ".ckptfs", "sources.json")) as f:
                from_index = [s["from_index"] for s in json.load(f)["sources"]]
            assert all(from_index), f"the remount rescanned: {from_index}"
            try:
                itest.read_file(self.rank_file(mnt))
                raise AssertionError("the default index served the layout from before the "
                                     "rewrite")
            except OSError as e:
                assert e.errno == errno.EIO, e
        with open(log) as f:
            named = [line for line in f if os.path.realpath(self.victim_s3) in line]
        assert len(named) == 1 and "headers" in named[0] and "mount again" in named[0], named
        with self.mount("rescanned", self.cache) as mnt:
            with open(os.path.join(mnt, ".ckptfs", "sources.json")) as f:
                sources = json.load(f)["sources"]
            served = itest.read_file(self.rank_file(mnt))
        assert served == fresh, "the mount after the failed check did not serve the rewrite"
        rescanned = [s["path"] for s in sources if not s["from_index"]]
        assert rescanned == [os.path.realpath(self.victim_s3)], sources


def rewritten_through_s3fs(args, server):
    case = Case(args, server, "touched", lambda path, key: server.put_file(path, BUCKET, key))
    rw = os.path.realpath(os.path.join(case.work, "s3-rw"))
    os.makedirs(rw, exist_ok=True)
    cmd = server.s3fs_cmd(BUCKET, rw)
    cmd[-1] = ",".join(o for o in cmd[-1].split(",") if o != "ro")
    subprocess.run(cmd, check=True, capture_output=True, timeout=60)
    server.mounts.append(rw)
    try:
        path = os.path.join(rw, case.key(case.victim))
        mtime = os.stat(path).st_mtime
        time.sleep(1.1)  # a new second: any timestamp s3fs sets now differs from the old ones
        swap_names(path)
        itest.run(["touch", "-d", f"@{mtime:.0f}", path])
    finally:
        s3harness.unmount_s3fs(rw)
        server.mounts.remove(rw)
    case.check_after_rewrite()
    after = stat_of(case.victim_s3)
    assert after["ctime_ns"] == case.before["ctime_ns"], \
        f"s3fs no longer puts the ctime back with the mtime: {case.before} -> {after}"


def reuploaded_keeping_mtime(args, server):
    def upload(path, key):
        mtime = int(os.stat(path).st_mtime)
        server._curl(["-o", "/dev/null", "-H", f"x-amz-meta-mtime: {mtime}", "-T", path,
                      f"{server.endpoint}/{BUCKET}/{key}"])

    case = Case(args, server, "reuploaded", upload)
    time.sleep(1.1)
    swap_names(case.victim)  # the local copy: keeps its mtime
    upload(case.victim, case.key(case.victim))
    case.check_after_rewrite()


def counters_moved(args, server):
    """A mount compares the step counters of every rank before planning: with the default index
    over s3fs they are read at the places the index's unchecked scans give. Rank 1 is uploaded
    again with its counters' records moved before the tensors (same size, x-amz-meta-mtime
    kept): read at the old places they are tensor bytes, and a mount refused the checkpoint as
    a mix of steps, every time (no read ever made the check that drops the entry). It must
    serve what a mount with an empty index serves."""
    work = os.path.join(args.work, "counters")
    fx = ckpt_fixture.make(COUNTED, os.path.join(work, "fixture"))

    def upload(path):
        key = f"counters/{os.path.relpath(path, fx.src_dir)}"
        server._curl(["-o", "/dev/null", "-H", f"x-amz-meta-mtime: {int(os.stat(path).st_mtime)}",
                      "-T", path, f"{server.endpoint}/{BUCKET}/{key}"])

    for path in fx.source_files.values():
        upload(path)
    s3 = os.path.join(work, "s3")
    server.mount_s3fs(BUCKET, s3)
    src = os.path.join(s3, "counters")
    cache = os.path.join(work, "cache")

    def mount(name, index_dir, extra_args=()):
        return itest.mounted(args.ckptfs, src, os.path.join(work, name),
                             src_strategy=fx.src_strategy, dst_strategy=fx.dst_strategy,
                             index_dir=index_dir, extra_args=list(extra_args))

    with mount("before", cache) as mnt:
        problems = ckpt_fixture.compare_tree(fx, mnt)
    assert not problems, problems
    victim = fx.source_files[1]
    st = os.stat(victim)
    with open(victim, "rb") as f:
        data = f.read()
    records = read_records(victim)
    counters = [r for r in records if r.tag in ("global_step", "epoch_num", "step_num")]
    assert len(counters) == 3 and records[-3:] == counters, [r.tag for r in records]
    moved = b"".join(data[r.offset:r.offset + r.length] for r in counters + records[:-3])
    assert len(moved) == len(data) and moved != data
    with open(victim, "wb") as f:
        f.write(moved)
    os.utime(victim, ns=(st.st_atime_ns, st.st_mtime_ns))
    time.sleep(1.1)
    upload(victim)
    s3harness.unmount_s3fs(os.path.realpath(s3))
    server.mount_s3fs(BUCKET, s3)

    names = [f"rank_{t}/{os.path.basename(p)}" for t, p in fx.expected_files().items()]
    with mount("fresh", os.path.join(work, "empty")) as mnt:
        fresh = {p: itest.read_file(os.path.join(mnt, p)) for p in names}
    log = os.path.join(work, "cache.log")
    with mount("again", cache, ["--log-file", log]) as mnt:
        with open(os.path.join(mnt, ".ckptfs", "sources.json")) as f:
            sources = json.load(f)["sources"]
        served = {p: itest.read_file(os.path.join(mnt, p)) for p in fresh}
    assert served == fresh, "the mount over the moved counters did not serve the rewrite"
    rescanned = [s["path"] for s in sources if not s["from_index"]]
    assert rescanned == [os.path.realpath(os.path.join(src, os.path.relpath(victim, fx.src_dir)))], \
        sources


def main():
    args = itest.parse_args()
    args.work = os.path.abspath(args.work)  # the daemon serves from "/"
    s3harness.ensure_tools_or(itest.skip)
    checks = itest.Checks(args.only)
    with s3harness.S3Server(args.work) as server:
        server.make_bucket(BUCKET)
        checks.run("rewritten through s3fs, mtime put back with touch -d", rewritten_through_s3fs,
                   args, server)
        checks.run("uploaded again keeping x-amz-meta-mtime", reuploaded_keeping_mtime, args,
                   server)
        checks.run("step counters moved, uploaded again keeping x-amz-meta-mtime",
                   counters_moved, args, server)
    checks.finish()


if __name__ == "__main__":
    main()
