"""Target files are never more readable than their sources (issue 15 allow_other, issue 16
item 7): each file's owner, group and read bits come from the sources it reads, the kernel
enforces them (default_permissions), and -o uid=,gid=,umask= apply on top, in steps/ too.
As root: sources 0600 in a 0700 directory, mounted with -o allow_other, cannot be read by
`nobody` through the mount; 0644 sources in searchable directories give files nobody can
read."""

import os
import shutil
import subprocess

import itest
import ckpt_fixture

NOBODY = 65534


def as_nobody(cmd):
    return subprocess.run(["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups",
                           "--"] + cmd, capture_output=True, text=True, timeout=60)


def fixture(args, name):
    work = os.path.join(args.work, name)
    fx = ckpt_fixture.make_builtin("demo", os.path.join(work, "fixture"))
    os.chmod(work, 0o755)
    return work, fx


def kw(fx, work):
    return dict(src_strategy=fx.src_strategy, dst_strategy=fx.dst_strategy,
                index_dir=os.path.join(work, "index"))


def source_files(src_dir):
    return [os.path.join(d, n) for d, _, names in os.walk(src_dir) for n in names
            if n.endswith(".ckpt")]


def private_sources(args):
    work, fx = fixture(args, "private")
    for path in source_files(fx.src_dir):
        os.chmod(path, 0o600)
    os.chmod(fx.src_dir, 0o700)
    # The sources really are out of nobody's reach.
    probe = source_files(fx.src_dir)[0]
    assert as_nobody(["cat", probe]).returncode != 0
    mnt = os.path.join(work, "mnt")
    with itest.mounted(args.ckptfs, fx.src_dir, mnt, options="allow_other", **kw(fx, work)):
        f = os.path.join(mnt, "rank_0", "checkpoint_0.ckpt")
        st = os.stat(f)
        assert (st.st_mode & 0o7777, st.st_uid, st.st_gid) == (0o400, 0, 0), \
            (oct(st.st_mode), st.st_uid, st.st_gid)
        # nobody sees the tree (allow_other) but cannot read a file of it.
        proc = as_nobody(["ls", os.path.join(mnt, "rank_0")])
        assert proc.returncode == 0 and "checkpoint_0.ckpt" in proc.stdout, proc.stderr
        proc = as_nobody(["cat", f])
        assert proc.returncode != 0 and "Permission denied" in proc.stderr, proc.stderr
        # Root still reads the right bytes.
        assert itest.read_file(f) == itest.read_file(fx.expected_files()[0])


def public_sources(args):
    work, fx = fixture(args, "public")
    for path in source_files(fx.src_dir):
        os.chmod(path, 0o644)
    mnt = os.path.join(work, "mnt")
    with itest.mounted(args.ckptfs, fx.src_dir, mnt, options="allow_other", **kw(fx, work)):
        f = os.path.join(mnt, "rank_0", "checkpoint_0.ckpt")
        assert os.stat(f).st_mode & 0o7777 == 0o444
        proc = subprocess.run(["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}",
                               "--clear-groups", "--", "sha256sum", f],
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr
        want = subprocess.run(["sha256sum", fx.expected_files()[0]], capture_output=True,
                              text=True).stdout.split()[0]
        assert proc.stdout.split()[0] == want


def mixed_owners(args):
    # One merged file read from all 8 sources: the owner and group are the sources' when they
    # all agree, else the mounter's (with no group bit); any source withholding a bit takes it
    # away.
    work = os.path.join(args.work, "mixed")
    fx = ckpt_fixture.make_builtin("8to1_merge", os.path.join(work, "fixture"))
    os.chmod(work, 0o755)
    files = sorted(source_files(fx.src_dir))
    assert len(files) == 8, files
    mnt = os.path.join(work, "mnt")
    f = os.path.join(mnt, "rank_0", "checkpoint_0.ckpt")

    def mode_of():
        with itest.mounted(args.ckptfs, fx.src_dir, mnt, options="allow_other", **kw(fx, work)):
            st = os.stat(f)
            return st.st_mode & 0o7777, st.st_uid, st.st_gid

    for path in files:
        os.chown(path, 1234, 4321)
        os.chmod(path, 0o640)
    assert mode_of() == (0o440, 1234, 4321)
    os.chmod(files[3], 0o600)
    assert mode_of() == (0o400, 1234, 4321)
    for path in files:
        os.chmod(path, 0o644)
    os.chown(files[0], 0, 4321)
    assert mode_of() == (0o444, 0, 4321)
    os.chown(files[0], 0, 0)
    assert mode_of() == (0o404, 0, 0)


def stat_tree(mnt):
    """(mode bits, uid, gid) of every file under `mnt`, by relative path."""
    out = {}
    for d, _, names in os.walk(mnt):
        for n in names:
            st = os.stat(os.path.join(d, n))
            out[os.path.relpath(os.path.join(d, n), mnt)] = (oct(st.st_mode & 0o7777), st.st_uid,
                                                             st.st_gid)
    return out


def lazy_ranks_as_eager(args):
    # Ranks listed from a shipped index's summaries (planned on first open) show the owner,
    # group and read bits an eager mount derives from the same sources, before any open.
    work, fx = fixture(args, "lazy")
    files = sorted(source_files(fx.src_dir))
    modes = [(0o640, 1234, 4321)] * 4 + [(0o644, 0, 0), (0o644, 1234, 4321), (0o604, 1234, 4321),
                                         (0o644, 1234, 4321)]
    assert len(files) == len(modes), files
    for path, (mode, uid, gid) in zip(files, modes):
        os.chown(path, uid, gid)
        os.chmod(path, mode)
    idx = os.path.join(work, "idx")
    itest.run([args.ckptfs, "index", "build", fx.src_dir, "--output", idx, "--src-strategy",
               fx.src_strategy, "--dst-strategy", fx.dst_strategy, "-q"])
    log = os.path.join(work, "lazy.log")
    with itest.mounted(args.ckptfs, fx.src_dir, os.path.join(work, "eager"), **kw(fx, work)) as e:
        eager = {k: v for k, v in stat_tree(e).items() if not k.startswith("steps/")}
    with itest.mounted(args.ckptfs, fx.src_dir, os.path.join(work, "mnt"),
                       src_strategy=fx.src_strategy, dst_strategy=fx.dst_strategy,
                       log_file=log, log_level="info", extra_args=["--index", idx]) as m:
        lazy = stat_tree(m)

        def planned():
            with open(log) as f:
                return f.read().count("planned on first open")
        assert planned() == 0  # listed, not planned
        itest.read_file(os.path.join(m, "rank_0", "checkpoint_0.ckpt"))
        assert planned() == 1  # so the files were listed from the summaries
        assert stat_tree(m) == lazy  # and planning a rank changes nothing
    assert lazy == eager, (lazy, eager)
    # The sources' differences reach the files (else the comparison proves little).
    assert len(set(eager.values())) >= 2 and ("0o444", 0, 0) not in eager.values(), eager


def options_on_top_and_steps(args):
    # uid=, gid= and umask= still apply on top of the derived bits, in steps/ too.
    work = os.path.join(args.work, "steps")
    fx = ckpt_fixture.make_builtin("demo", os.path.join(work, "fixture"))
    os.chmod(work, 0o755)
    for path in source_files(fx.src_dir):
        os.chmod(path, 0o600)
    mnt = os.path.join(work, "mnt")
    with itest.mounted(args.ckptfs, fx.src_dir, mnt, options="uid=1234,gid=5678,umask=0027",
                       **kw(fx, work)):
        st = os.stat(os.path.join(mnt, "rank_0", "checkpoint_0.ckpt"))
        assert (st.st_mode & 0o7777, st.st_uid, st.st_gid) == (0o400, 1234, 5678), \
            (oct(st.st_mode), st.st_uid, st.st_gid)
        steps = os.path.join(mnt, "steps")
        assert os.listdir(steps), "no step under steps/"
        for name in os.listdir(steps):
            st = os.stat(os.path.join(steps, name, "rank_0", "checkpoint_0.ckpt"))
            assert (st.st_mode & 0o7777, st.st_uid, st.st_gid) == (0o400, 1234, 5678), \
                (name, oct(st.st_mode), st.st_uid, st.st_gid)
            st = os.stat(os.path.join(steps, name))
            assert st.st_mode & 0o7777 == 0o550 and st.st_uid == 1234, oct(st.st_mode)


def main():
    args = itest.parse_args()
    args.ckptfs = os.path.abspath(args.ckptfs)
    checks = itest.Checks(args.only)
    if os.getuid() != 0 or not shutil.which("setpriv"):
        itest.skip("needs root and setpriv (util-linux) to read as another user")
    checks.run("0600 sources in a 0700 directory: nobody cannot read, even with allow_other",
               private_sources, args)
    checks.run("0644 sources: nobody reads the right bytes", public_sources, args)
    checks.run("sources of mixed owners, groups and modes", mixed_owners, args)
    checks.run("-o uid=,gid=,umask= on top, in steps/ too", options_on_top_and_steps, args)
    checks.run("ranks listed from a shipped index: the eager mount's modes", lazy_ranks_as_eager,
               args)
    checks.finish()


if __name__ == "__main__":
    main()
