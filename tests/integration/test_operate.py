"""Operating ckptfs: --version, --log-level anywhere, option typos, the mountpoint (created,
non-empty refused, a dead mount recovered), umount -z, the mount helper with mount -t and an
fstab line, verify of sources and verify --against, an unusable index directory, and inspect on
a strategy file."""

import os
import shutil
import signal
import struct
import subprocess
import time

import itest
import ckpt_fixture


def demo(args, name):
    work = os.path.join(args.work, name)
    fx = ckpt_fixture.make_builtin("demo", os.path.join(work, "fixture"))
    return work, fx


def kw(fx, work):
    return dict(src_strategy=fx.src_strategy, dst_strategy=fx.dst_strategy,
                index_dir=os.path.join(work, "index"))


def version_and_log_level(args):
    proc = itest.run([args.ckptfs, "--version"])
    assert proc.stdout.startswith("ckptfs ") and proc.stdout.strip()[7:][0].isdigit(), proc.stdout
    work, fx = demo(args, "loglevel")
    # After the subcommand, as before it: info lines appear.
    proc = itest.run([args.ckptfs, "index", "build", fx.src_dir, "--index-dir",
                      os.path.join(work, "index"), "--log-level", "info"])
    assert "ckptfs: info:" in proc.stderr, proc.stderr
    proc = itest.run([args.ckptfs, "index", "build", fx.src_dir, "--index-dir",
                      os.path.join(work, "index"), "--log-level", "loud"], check=False)
    assert proc.returncode == 1 and "--log-level loud" in proc.stderr, proc.stderr


def typos(args):
    work, fx = demo(args, "typos")
    mnt = os.path.join(work, "mnt")
    with itest.unmounting(args.ckptfs, mnt):
        proc = itest.run([args.ckptfs, "mount", fx.src_dir, mnt, "--dst-stratgy",
                          fx.dst_strategy], check=False)
        assert proc.returncode != 0
        # One line, about the option (not its value taken for a stray argument).
        lines = itest.stderr_lines(proc)
        assert lines == ["ckptfs: unknown option --dst-stratgy; did you mean --dst-strategy? "
                         "(see --help)"], proc.stderr
        assert not itest.is_mounted(mnt)
        proc = itest.run([args.ckptfs, "mount", fx.src_dir, mnt,
                          f"--dst-stratgy={fx.dst_strategy}"], check=False)
        assert itest.stderr_lines(proc) == ["ckptfs: unknown option --dst-stratgy; did you mean "
                                            "--dst-strategy? (see --help)"], proc.stderr
        assert not itest.is_mounted(mnt)
    proc = itest.run([args.ckptfs, "index", "lst"], check=False)
    assert proc.returncode != 0 and "did you mean list?" in proc.stderr, proc.stderr
    proc = itest.run([args.ckptfs, "materialise"], check=False)
    assert proc.returncode != 0 and "did you mean materialize?" in proc.stderr, proc.stderr


def mountpoint_rules(args):
    work, fx = demo(args, "mountpoint")
    # Created if missing.
    mnt = os.path.join(work, "new", "mnt")
    with itest.mounted(args.ckptfs, fx.src_dir, mnt, **kw(fx, work)):
        assert os.path.isfile(os.path.join(mnt, "rank_0", "checkpoint_0.ckpt"))
    # Not empty: refused, nothing mounted; with -o nonempty it mounts over it.
    full = os.path.join(work, "full")
    os.makedirs(full)
    with open(os.path.join(full, "keep.txt"), "w") as f:
        f.write("mine")
    proc = itest.refused_mount(args.ckptfs, fx.src_dir, full, **kw(fx, work))
    assert proc.returncode == 1 and "not empty" in proc.stderr and \
        "-o nonempty" in proc.stderr, proc.stderr
    with itest.mounted(args.ckptfs, fx.src_dir, full, options="nonempty", **kw(fx, work)):
        assert not os.path.exists(os.path.join(full, "keep.txt"))
    assert os.path.exists(os.path.join(full, "keep.txt"))


def status_unlisted(mnt):
    """The mount lists its rank directories only: these two checks once let any listing pass,
    written while MOUNTPOINT/.ckptfs/ was still listed; it is found by name but never listed."""
    assert os.path.isdir(os.path.join(mnt, ".ckptfs")), "no .ckptfs/ in the mount"
    assert ".ckptfs" not in os.listdir(mnt), os.listdir(mnt)


def dead_mount_recovered(args):
    work, fx = demo(args, "dead")
    mnt = os.path.join(work, "mnt")
    os.makedirs(mnt)
    with itest.unmounting(args.ckptfs, mnt):
        itest.run(itest.mount_cmd(args.ckptfs, fx.src_dir, mnt, **kw(fx, work)))
        pids = itest.daemon_pids(args.ckptfs, mnt)
        assert len(pids) == 1, f"daemons found: {pids}"
        os.kill(pids[0], signal.SIGKILL)
        for _ in range(100):
            if not os.path.exists(f"/proc/{pids[0]}"):
                break
            time.sleep(0.05)
        try:
            os.stat(mnt)
            raise AssertionError("a killed daemon's mount still answers")
        except OSError:
            pass
        # Mounting again detaches the dead mount and serves.
        proc = itest.run(itest.mount_cmd(args.ckptfs, fx.src_dir, mnt, **kw(fx, work)),
                         check=False)
        assert proc.returncode == 0, proc.stderr
        assert "daemon serving it is gone" in proc.stderr, proc.stderr
        problems = ckpt_fixture.compare_tree(fx, mnt)
        assert not problems, "\n".join(problems)
        status_unlisted(mnt)


def lazy_umount(args):
    work, fx = demo(args, "lazy")
    mnt = os.path.join(work, "mnt")
    with itest.mounted(args.ckptfs, fx.src_dir, mnt, **kw(fx, work)):
        f = open(os.path.join(mnt, "rank_0", "checkpoint_0.ckpt"), "rb")
        try:
            proc = itest.run([args.ckptfs, "umount", mnt], check=False)
            assert proc.returncode == 1 and "umount -z" in proc.stderr, proc.stderr
            itest.run([args.ckptfs, "umount", "-z", mnt])
            assert not itest.is_mounted(mnt)
            want = itest.read_file(fx.expected_files()[0])
            assert f.read() == want  # the open file still reads
        finally:
            f.close()


def helper_installed():
    """Links /sbin/mount.fuse.ckptfs to the binary for the test, if we may; returns the link to
    remove afterwards, or None (then the mount -t test cannot run)."""
    link = "/sbin/mount.fuse.ckptfs"
    if os.geteuid() != 0 or os.path.lexists(link):
        return None
    return link


def mount_t_and_fstab(args):
    work, fx = demo(args, "helper")
    mnt = os.path.join(work, "mnt")
    index = os.path.join(work, "index")
    opts = f"src_strategy={fx.src_strategy},dst_strategy={fx.dst_strategy},index_dir={index}"
    # The helper's translation, without mount(8): -f is mount's "fake" run.
    helper = os.path.join(work, "mount.ckptfs")
    os.symlink(args.ckptfs, helper)
    with itest.unmounting(args.ckptfs, mnt):
        itest.run([helper, fx.src_dir, mnt, "-f", "-o", opts])
        assert not itest.is_mounted(mnt)
        proc = itest.run([helper, fx.src_dir, mnt, "-o", opts + ",noauto,nofail,bogus_opt"],
                         check=False)
        assert proc.returncode != 0 and "bogus_opt" in proc.stderr, proc.stderr
    link = helper_installed()
    if link is None:
        raise AssertionError("cannot place /sbin/mount.fuse.ckptfs (not root, or one exists): "
                             "mount -t fuse.ckptfs not tested")
    os.symlink(os.path.abspath(args.ckptfs), link)
    try:
        os.makedirs(mnt, exist_ok=True)
        with itest.unmounting(args.ckptfs, mnt):
            itest.run(["mount", "-t", "fuse.ckptfs", fx.src_dir, mnt, "-o", opts])
            assert itest.is_mounted(mnt)
            assert not ckpt_fixture.compare_tree(fx, mnt)
        fstab = os.path.join(work, "fstab")
        with open(fstab, "w") as f:
            f.write(f"# test fstab\n{fx.src_dir} {mnt} fuse.ckptfs {opts},nofail 0 0\n")
        with itest.unmounting(args.ckptfs, mnt):
            itest.run(["mount", "-a", "-T", fstab])
            assert itest.is_mounted(mnt)
            assert not ckpt_fixture.compare_tree(fx, mnt)
    finally:
        os.unlink(link)


def verify_sources(args):
    work, fx = demo(args, "verify")
    base = [args.ckptfs, "verify", fx.src_dir, "--src-strategy", fx.src_strategy,
            "--dst-strategy", fx.dst_strategy, "--index-dir", os.path.join(work, "index")]
    proc = itest.run(base)
    assert "all well" in proc.stdout, proc.stdout
    proc = itest.run(base + ["-q"])
    assert proc.stderr == "", proc.stderr
    # A missing rank: named, with the target ranks that need it.
    gone = os.path.join(work, "rank_5_moved")
    shutil.move(os.path.join(fx.src_dir, "rank_5"), gone)
    proc = itest.run(base, check=False)
    shutil.move(gone, os.path.join(fx.src_dir, "rank_5"))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "source rank 5 has no checkpoint file (no rank_5/)" in proc.stdout, proc.stdout
    assert "target rank" in proc.stdout, proc.stdout


def verify_crc(args):
    work = os.path.join(args.work, "verify_crc")
    fx = ckpt_fixture.make_builtin("crc_oldscalars", os.path.join(work, "fixture"))
    base = [args.ckptfs, "verify", fx.src_dir, "--index-dir", os.path.join(work, "index")]
    if fx.src_strategy:
        base += ["--src-strategy", fx.src_strategy]
    if fx.dst_strategy:
        base += ["--dst-strategy", fx.dst_strategy]
    itest.run(base)
    rank0 = os.path.join(fx.src_dir, "rank_0")
    victim = os.path.join(rank0, sorted(os.listdir(rank0))[-1])
    data = bytearray(itest.read_file(victim))
    data[len(data) // 2] ^= 0xFF  # a flipped tensor byte: only the CRC can tell
    with open(victim, "wb") as f:
        f.write(data)
    proc = itest.run(base, check=False)
    assert proc.returncode == 1, proc.stdout
    assert "CRC" in proc.stdout and victim in proc.stdout, proc.stdout


def verify_against(args):
    work, fx = demo(args, "against")
    out = os.path.join(work, "out")
    itest.run([args.ckptfs, "materialize", fx.src_dir, out, "--src-strategy", fx.src_strategy,
               "--dst-strategy", fx.dst_strategy, "--index-dir", os.path.join(work, "index"),
               "--view", "ckpt", "-q"])
    expected = os.path.join(fx.root, "expected") if hasattr(fx, "root") else \
        os.path.dirname(os.path.dirname(fx.expected_files()[0]))
    proc = itest.run([args.ckptfs, "verify", out, "--against", expected])
    assert "identical" in proc.stdout, proc.stdout
    # Change one Float32 element of a tensor in the other tool's copy.
    other = os.path.join(work, "other")
    shutil.copytree(expected, other)
    victim = fx.expected_files()[1].replace(expected, other)
    import json
    params = json.loads(itest.run([args.ckptfs, "inspect", "--json", victim]).stdout)
    p = next(p for p in params if p["dtype"] == "Float32" and len(p["shape"]) == 2)
    cols = p["shape"][1]
    flat = cols + 3  # element [1,3]
    off = p["offsets"][0][0] + 4 * flat
    with open(victim, "r+b") as f:
        f.seek(off)
        old = struct.unpack("<f", f.read(4))[0]
        f.seek(off)
        f.write(struct.pack("<f", 1234.5))
    proc = itest.run([args.ckptfs, "verify", out, "--against", other], check=False)
    assert proc.returncode == 1, proc.stdout
    lines = [l for l in proc.stdout.splitlines() if l.startswith("FAIL")]
    assert len(lines) == 1, proc.stdout
    assert p["name"] in lines[0] and f"element [1,3] (flat {flat})" in lines[0], lines[0]
    assert "1234.5" in lines[0] and repr(old)[:4] in lines[0], (lines[0], old)


def index_unusable(args):
    work, fx = demo(args, "noindex")
    blocker = os.path.join(work, "not_a_dir")
    with open(blocker, "w") as f:
        f.write("x")
    mnt = os.path.join(work, "mnt")
    os.makedirs(mnt)
    cmd = itest.mount_cmd(args.ckptfs, fx.src_dir, mnt, src_strategy=fx.src_strategy,
                          dst_strategy=fx.dst_strategy,
                          index_dir=os.path.join(blocker, "index"))
    with itest.unmounting(args.ckptfs, mnt):
        proc = itest.run(cmd, check=False)
        assert proc.returncode == 0, proc.stderr
        warnings = [l for l in proc.stderr.splitlines() if "without a persistent index" in l]
        assert len(warnings) == 1, proc.stderr
        problems = ckpt_fixture.compare_tree(fx, mnt)
        assert not problems, "\n".join(problems)
        status_unlisted(mnt)
        assert itest.read_file(os.path.join(mnt, "rank_0", "checkpoint_0.ckpt")) == \
            itest.read_file(fx.expected_files()[0])
    # No HOME and no XDG_CACHE_HOME: the same.
    env = {k: v for k, v in os.environ.items() if k not in ("HOME", "XDG_CACHE_HOME")}
    cmd = [args.ckptfs, "materialize", fx.src_dir, os.path.join(work, "out"), "--src-strategy",
           fx.src_strategy, "--dst-strategy", fx.dst_strategy, "-q"]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "without a persistent index" in proc.stderr, proc.stderr


def inspect_strategy(args):
    work, fx = demo(args, "inspect_strategy")
    proc = itest.run([args.ckptfs, "inspect", fx.src_strategy], check=False)
    assert proc.returncode == 1
    assert f"ckptfs strategy show {fx.src_strategy}" in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def cmake_install(args):
    """`cmake --install` into a DESTDIR installs the binary, the mount helpers and the man page,
    also from a build of the ckptfs target alone (scripts/demo.sh's build-demo), which does not
    make the man page: the install makes it then. The build's page is moved aside for that
    check (as after `cmake --build DIR --target ckptfs`) and put back after."""
    build = os.path.dirname(args.ckptfs)
    if not os.path.exists(os.path.join(build, "cmake_install.cmake")):
        raise AssertionError(f"{build} is not a CMake build directory")
    page_path = os.path.join(build, "ckptfs.1")
    aside = os.path.join(args.work, "ckptfs.1.aside")
    had = os.path.exists(page_path)
    if had:
        shutil.move(page_path, aside)
    try:
        dest = os.path.join(args.work, "destdir")
        env = dict(os.environ, DESTDIR=dest)
        proc = subprocess.run(["cmake", "--install", build, "--prefix", "/usr"], env=env,
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stdout + proc.stderr
    finally:
        if had:
            if os.path.exists(page_path):
                os.remove(page_path)
            shutil.move(aside, page_path)
    binary = os.path.join(dest, "usr", "bin", "ckptfs")
    assert itest.run([binary, "--version"]).stdout.startswith("ckptfs ")
    for helper in ("mount.ckptfs", "mount.fuse.ckptfs"):
        assert os.readlink(os.path.join(dest, "sbin", helper)) == "/usr/bin/ckptfs"
    with open(os.path.join(dest, "usr", "share", "man", "man1", "ckptfs.1")) as f:
        page = f.read()
    assert page.startswith(".TH CKPTFS 1") and ".SH MATERIALIZE" in page and "--dst-strategy" in page


def owner_and_modes(args):
    work, fx = demo(args, "owner")
    mnt = os.path.join(work, "mnt")
    f = os.path.join(mnt, "rank_0", "checkpoint_0.ckpt")
    with itest.mounted(args.ckptfs, fx.src_dir, mnt, **kw(fx, work)):
        st = os.stat(f)
        assert (st.st_mode & 0o7777, st.st_uid) == (0o444, os.getuid()), oct(st.st_mode)
        assert os.stat(os.path.dirname(f)).st_mode & 0o7777 == 0o555
        # The newest source's mtime (rsync -a of an unchanged view transfers nothing).
        newest = max(os.stat(os.path.join(d, n)).st_mtime_ns
                     for d, _, names in os.walk(fx.src_dir) for n in names)
        assert st.st_mtime_ns <= newest
    with itest.mounted(args.ckptfs, fx.src_dir, mnt, options="umask=0227,uid=1234,gid=5678",
                       **kw(fx, work)):
        st = os.stat(f)
        assert (st.st_mode & 0o7777, st.st_uid, st.st_gid) == (0o440, 1234, 5678), \
            (oct(st.st_mode), st.st_uid, st.st_gid)
        assert os.stat(os.path.dirname(f)).st_mode & 0o7777 == 0o550
    with itest.unmounting(args.ckptfs, mnt):
        proc = itest.run(itest.mount_cmd(args.ckptfs, fx.src_dir, mnt, options="umask=9",
                                         **kw(fx, work)), check=False)
        assert proc.returncode == 1 and "umask=9" in proc.stderr, proc.stderr
        assert not itest.is_mounted(mnt)


def main():
    args = itest.parse_args()
    args.ckptfs = os.path.abspath(args.ckptfs)
    checks = itest.Checks(args.only)
    checks.run("--version; --log-level after the subcommand", version_and_log_level, args)
    checks.run("option typos get the nearest name", typos, args)
    checks.run("mountpoint created; non-empty refused unless -o nonempty", mountpoint_rules, args)
    checks.run("a killed daemon's mount is detached by the next mount", dead_mount_recovered,
               args)
    checks.run("umount -z with a file open", lazy_umount, args)
    checks.run("mount helper: mount -t fuse.ckptfs and an fstab line", mount_t_and_fstab, args)
    checks.run("verify SRC: all well, then a missing rank", verify_sources, args)
    checks.run("verify SRC: a CRC mismatch", verify_crc, args)
    checks.run("verify --against: first differing element", verify_against, args)
    checks.run("unusable index directory: one warning, mount works", index_unusable, args)
    checks.run("inspect on a strategy file", inspect_strategy, args)
    checks.run("owner and modes; -o uid=,gid=,umask=", owner_and_modes, args)
    checks.run("cmake --install: binary, mount helpers, man page", cmake_install, args)
    checks.finish()


if __name__ == "__main__":
    main()
