"""Paths that are not the regular file or directory a command expects (issue 29 item 11, issue 30
item 15): a FIFO, /dev/zero, a symlink to /dev/zero, a symlink loop, a directory where a file
belongs (a regular file where a directory belongs). Every command that opens such a path refuses
it within seconds, under an address-space limit of 1 GiB, with exit 1 and one line naming the
path and what it is: a FIFO used to block open(2) or read(2) forever, and /dev/zero to be read
until memory ran out. Rank directories that hold no usable checkpoint (empty, only a FIFO or a
device, a symlink loop) are named as such, not as missing."""

import os
import shutil
import subprocess
import time

import itest
import ckpt_fixture

TIMEOUT = 10  # seconds: a hang is a failure, not a stuck test
LIMIT_AS = 1 << 30


# Each kind: how to make it at a path, and the words the refusal must hold.
def make_fifo(path):
    os.mkfifo(path)


def make_dev_zero_link(path):
    os.symlink("/dev/zero", path)


def make_loop(path):
    os.symlink(os.path.basename(path) + ".other", path)
    os.symlink(os.path.basename(path), path + ".other")


def make_dir(path):
    os.makedirs(path)


def make_file(path):
    with open(path, "w") as f:
        f.write("not a directory\n")


# (name, maker or None for /dev/zero itself, words of the message)
FILE_KINDS = [
    ("a FIFO", make_fifo, ["FIFO"]),
    ("/dev/zero", None, ["character device"]),
    ("a symlink to /dev/zero", make_dev_zero_link, ["symlink to /dev/zero", "character device"]),
    ("a symlink loop", make_loop, ["symlink loop"]),
    ("a directory", make_dir, ["a directory", "not a regular file"]),
]
DIR_KINDS = FILE_KINDS[:4] + [("a regular file", make_file, ["a regular file", "not a directory"])]


def limited(cmd):
    """Address-space limits mean nothing to a sanitized build (itest.SANITIZED)."""
    return cmd if itest.SANITIZED else ["prlimit", f"--as={LIMIT_AS}", "--"] + cmd


def run_bounded(cmd, what):
    start = time.monotonic()
    try:
        proc = subprocess.run(limited(cmd), capture_output=True, text=True, timeout=TIMEOUT,
                              stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"{what}: still running after {TIMEOUT}s (hangs): {' '.join(cmd)}")
    return proc, time.monotonic() - start


def expect_refusal(cmd, what, must_name, mnt=None, ckptfs=None, must_not=()):
    """`cmd` exits 1 within TIMEOUT under prlimit --as=1G with one stderr line holding every
    word of `must_name`; a mount it made (at `mnt`) is a failure too, and is undone."""
    try:
        proc, took = run_bounded(cmd, what)
    finally:
        if mnt is not None:
            mounted = itest.is_mounted(mnt)
            itest.unmount(ckptfs, mnt)
            assert not mounted, f"{what}: mounted instead of refusing"
    lines = itest.stderr_lines(proc)
    assert proc.returncode == 1, f"{what}: exit {proc.returncode}: {proc.stderr[-2000:]}"
    assert len(lines) == 1, f"{what}: {len(lines)} lines on stderr: {proc.stderr[-2000:]}"
    for word in must_name:
        assert word in lines[0], f"{what}: does not say {word!r}: {lines[0]}"
    for word in ("out of memory",) + tuple(must_not):
        assert word not in lines[0], f"{what}: says {word!r}: {lines[0]}"
    print(f"     {what} ({took:.1f}s) -> {lines[0]}", flush=True)


class Place:
    """A fresh folder per kind, holding the bad path at `path` (or /dev/zero itself)."""

    def __init__(self, root, label, name, maker):
        self.dir = os.path.join(root, label.replace(" ", "_").replace("/", "_"))
        os.makedirs(self.dir, exist_ok=True)
        if maker is None:
            self.path = "/dev/zero"
        else:
            self.path = os.path.join(self.dir, name)
            maker(self.path)


def make_in_tree(maker, path):
    """The kind at `path` inside a tree: /dev/zero itself cannot be put there, so a symlink to
    it stands in; returns the extra words its refusal must hold."""
    if maker is None:
        os.symlink("/dev/zero", path)
        return ["symlink to /dev/zero"]
    maker(path)
    return []


def each_kind(args, check_name, kinds, name, body):
    """Runs body(place, words, label, maker) for every kind; reports every failing kind at
    once."""
    root = os.path.join(args.work, "".join(c if c.isalnum() else "_" for c in check_name))
    failures = []
    for label, maker, words in kinds:
        place = Place(root, label, name, maker)
        place.maker = maker
        try:
            body(place, [place.path] + words, f"{check_name}, {label}")
        except AssertionError as e:
            failures.append(str(e))
    assert not failures, "\n".join(failures)


def demo(args, name):
    return ckpt_fixture.make_builtin("8to4_dtypes", os.path.join(args.work, name, "fixture"),
                                     expected=False)


def mount_cmd(args, fx, mnt, **kwargs):
    kwargs.setdefault("src_strategy", fx.src_strategy)
    kwargs.setdefault("dst_strategy", fx.dst_strategy)
    kwargs.setdefault("index_dir", os.path.join(os.path.dirname(mnt), "index"))
    src = kwargs.pop("src", fx.src_dir)
    return itest.mount_cmd(args.ckptfs, src, mnt, **kwargs)


def inspect_file(args):
    each_kind(args, "inspect FILE", FILE_KINDS, "x.ckpt",
              lambda p, words, what: expect_refusal([args.ckptfs, "inspect", p.path], what, words))


def strategy_show(args):
    each_kind(args, "strategy show PATH", FILE_KINDS[:4], "s.ckpt",
              lambda p, words, what: expect_refusal([args.ckptfs, "strategy", "show", p.path],
                                                    what, words))


def ranks_strategy(args):
    fx = demo(args, "ranks")
    each_kind(args, "ranks --dst-strategy", FILE_KINDS[:4], "dst.ckpt",
              lambda p, words, what: expect_refusal(
                  [args.ckptfs, "ranks", "0", "--src-strategy", fx.src_strategy,
                   "--dst-strategy", p.path], what, words))


def mount_strategy(args, side):
    fx = demo(args, f"mount_{side}")

    def body(p, words, what):
        mnt = os.path.join(p.dir, "mnt")
        os.makedirs(mnt)
        expect_refusal(mount_cmd(args, fx, mnt, **{f"{side}_strategy": p.path}), what, words,
                       mnt=mnt, ckptfs=args.ckptfs)

    each_kind(args, f"mount --{side}-strategy", FILE_KINDS[:4], "strategy.ckpt", body)


def mount_log_file(args):
    fx = demo(args, "mount_log")

    def body(p, words, what):
        mnt = os.path.join(p.dir, "mnt")
        os.makedirs(mnt)
        expect_refusal(mount_cmd(args, fx, mnt, log_file=p.path), what, words, mnt=mnt,
                       ckptfs=args.ckptfs)

    each_kind(args, "mount --log-file", FILE_KINDS, "ckptfs.log", body)


def mount_shipped_index(args):
    fx = demo(args, "mount_index")

    def body(p, words, what):
        mnt = os.path.join(p.dir, "mnt")
        os.makedirs(mnt)
        expect_refusal(mount_cmd(args, fx, mnt, extra_args=["--index", p.path]), what, words,
                       mnt=mnt, ckptfs=args.ckptfs)

    each_kind(args, "mount --index", DIR_KINDS, "shipped", body)


def shipped_index_files(args):
    """A shipped index whose data.mdb is not a regular file (LMDB would map /dev/zero)."""
    fx = demo(args, "index_files")
    each = []
    for label, maker, words in FILE_KINDS:
        shipped = os.path.join(args.work, "index_files", label.replace(" ", "_").replace("/", "_"))
        os.makedirs(shipped)
        data = os.path.join(shipped, "data.mdb")
        if maker is None:
            os.symlink("/dev/zero", data)
            words = ["symlink to /dev/zero"] + words
        else:
            maker(data)
        mnt = os.path.join(shipped, "mnt")
        os.makedirs(mnt)
        try:
            expect_refusal(mount_cmd(args, fx, mnt, extra_args=["--index", shipped]),
                           f"mount --index DIR whose data.mdb is {label}", [data] + words,
                           mnt=mnt, ckptfs=args.ckptfs)
            expect_refusal([args.ckptfs, "index", "list", "--index-dir", shipped],
                           f"index list --index-dir DIR whose data.mdb is {label}",
                           [data] + words)
        except AssertionError as e:
            each.append(str(e))
    assert not each, "\n".join(each)


def index_dirs(args):
    fx = demo(args, "index_dirs")
    each_kind(args, "index list --index-dir", DIR_KINDS, "index",
              lambda p, words, what: expect_refusal(
                  [args.ckptfs, "index", "list", "--index-dir", p.path], what, words))
    each_kind(args, "index build --output", DIR_KINDS, "out",
              lambda p, words, what: expect_refusal(
                  [args.ckptfs, "index", "build", fx.src_dir, "--output", p.path], what, words))


def mount_index_dir(args):
    """The index is only a cache: --index-dir of the wrong kind costs a mount one warning line
    naming it and what it is, and the mount serves."""
    fx = demo(args, "mount_index_dir")

    def body(p, words, what):
        mnt = os.path.join(p.dir, "mnt")
        os.makedirs(mnt)
        with itest.unmounting(args.ckptfs, mnt):
            proc, took = run_bounded(mount_cmd(args, fx, mnt, index_dir=p.path), what)
            assert proc.returncode == 0, f"{what}: exit {proc.returncode}: {proc.stderr[-2000:]}"
            warned = [line for line in itest.stderr_lines(proc) if "persistent index" in line]
            assert len(warned) == 1, f"{what}: {proc.stderr[-2000:]}"
            for word in words:
                assert word in warned[0], f"{what}: does not say {word!r}: {warned[0]}"
            assert os.listdir(os.path.join(mnt, "rank_0")), f"{what}: nothing served"
            print(f"     {what} ({took:.1f}s) -> {warned[0]}", flush=True)

    each_kind(args, "mount --index-dir", [k for k in DIR_KINDS if k[1] is not make_file],
              "index", body)


def src_dir_kinds(args):
    """SRC_DIR itself, for every command taking one."""
    def body(p, words, what):
        for cmd in (["verify", p.path], ["index", "build", p.path],
                    ["materialize", p.path, os.path.join(p.dir, "out")]):
            expect_refusal([args.ckptfs] + cmd, f"{what} ({cmd[0]})", words)
        mnt = os.path.join(p.dir, "mnt")
        os.makedirs(mnt)
        expect_refusal(itest.mount_cmd(args.ckptfs, p.path, mnt,
                                       index_dir=os.path.join(p.dir, "index")),
                       f"{what} (mount)", words, mnt=mnt, ckptfs=args.ckptfs)

    each_kind(args, "SRC_DIR", DIR_KINDS, "src", body)


def materialize_out(args):
    fx = demo(args, "materialize_out")
    each_kind(args, "materialize OUT", DIR_KINDS, "out",
              lambda p, words, what: expect_refusal(
                  [args.ckptfs, "materialize", fx.src_dir, p.path, "--src-strategy",
                   fx.src_strategy, "--dst-strategy", fx.dst_strategy,
                   "--index-dir", os.path.join(p.dir, "index")], what, words))


def verify_against(args):
    fx = demo(args, "verify_against")
    each_kind(args, "verify --against", DIR_KINDS, "against",
              lambda p, words, what: expect_refusal(
                  [args.ckptfs, "verify", fx.src_dir, "--against", p.path], what, words))


def materialize_file(args):
    fx = demo(args, "materialize_file")

    def rank_file(p, words, what):
        """An output file that is already there as something else is not written through."""
        out = os.path.join(p.dir, "out_files")
        os.makedirs(os.path.join(out, "rank_0"))
        target = os.path.join(out, "rank_0", "checkpoint_0.ckpt")
        extra = make_in_tree(p.maker, target)
        expect_refusal([args.ckptfs, "materialize", fx.src_dir, out, "--src-strategy",
                        fx.src_strategy, "--dst-strategy", fx.dst_strategy, "--view", "ckpt",
                        "--index-dir", os.path.join(p.dir, "index")], what,
                       [target] + extra + words[1:])

    each_kind(args, "materialize OUT/rank_0/checkpoint_0.ckpt", FILE_KINDS, "x", rank_file)


def fresh_source(args, name):
    """An 8-rank source whose rank_3 entry the caller replaces."""
    fx = demo(args, name)
    return fx, os.path.join(fx.src_dir, "rank_3")


def source_file_kinds(args):
    """rank_3's only checkpoint is not a regular file: named with what it is."""
    def body(p, words, what):
        fx, rank_dir = fresh_source(args, os.path.join("source_files", os.path.basename(p.dir)))
        (victim,) = [f for f in os.listdir(rank_dir) if f.endswith(".ckpt")]
        target = os.path.join(rank_dir, victim)
        os.remove(target)
        words = words + make_in_tree(p.maker, target)
        kind_words = [w for w in words[1:] if w != "not a regular file"]
        need = ["rank_3", victim] + kind_words
        mnt = os.path.join(p.dir, "mnt")
        os.makedirs(mnt)
        expect_refusal(mount_cmd(args, fx, mnt), f"{what} (mount)", need, mnt=mnt,
                       ckptfs=args.ckptfs)
        expect_refusal([args.ckptfs, "inspect", target], f"{what} (inspect)",
                       [target] + kind_words)

    each_kind(args, "rank_3's checkpoint", FILE_KINDS, "x", body)


def rank_dir_kinds(args):
    """rank_3 itself is not a directory: said so, with what it is, not "missing rank_3/"."""
    def body(p, words, what):
        fx, rank_dir = fresh_source(args, os.path.join("rank_dirs", os.path.basename(p.dir)))
        shutil.rmtree(rank_dir)
        words = words + make_in_tree(p.maker, rank_dir)
        mnt = os.path.join(p.dir, "mnt")
        os.makedirs(mnt)
        need = ["rank_3", "not a directory"] + words[1:]
        expect_refusal(mount_cmd(args, fx, mnt), f"{what} (mount)", need, mnt=mnt,
                       ckptfs=args.ckptfs, must_not=["missing rank_3"])

    each_kind(args, "rank_3 entry", DIR_KINDS, "x", body)


def rank_dir_empty(args):
    fx, rank_dir = fresh_source(args, "rank_empty")
    for f in os.listdir(rank_dir):
        os.remove(os.path.join(rank_dir, f))
    mnt = os.path.join(args.work, "rank_empty", "mnt")
    os.makedirs(mnt)
    expect_refusal(mount_cmd(args, fx, mnt), "empty rank_3/ (mount)", ["rank_3/ is empty"],
                   mnt=mnt, ckptfs=args.ckptfs, must_not=["missing rank_3"])
    proc, _ = run_bounded([args.ckptfs, "verify", fx.src_dir, "--src-strategy", fx.src_strategy,
                           "--dst-strategy", fx.dst_strategy], "empty rank_3/ (verify)")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "source rank 3 has no checkpoint file (rank_3/ is empty)" in proc.stdout, proc.stdout


def empty_checkpoint(args):
    fx, rank_dir = fresh_source(args, "empty_ckpt")
    (victim,) = [f for f in os.listdir(rank_dir) if f.endswith(".ckpt")]
    open(os.path.join(rank_dir, victim), "w").close()
    mnt = os.path.join(args.work, "empty_ckpt", "mnt")
    os.makedirs(mnt)
    expect_refusal(mount_cmd(args, fx, mnt), "0-byte checkpoint (mount)",
                   [os.path.join("rank_3", victim), "empty (0 bytes)"], mnt=mnt,
                   ckptfs=args.ckptfs, must_not=["parameter"])


def missing_src_dir(args):
    gone = os.path.join(args.work, "no_such_dir")
    for cmd in (["mount", gone, os.path.join(args.work, "mnt_gone")], ["verify", gone],
                ["materialize", gone, os.path.join(args.work, "out_gone")],
                ["index", "build", gone], ["ranks", "0", "--src", gone]):
        expect_refusal([args.ckptfs] + cmd, f"missing SRC_DIR ({cmd[0]})",
                       [gone, "No such file or directory"])
    assert not os.path.exists(os.path.join(args.work, "mnt_gone")), "mountpoint created"


def mistyped_mountpoint(args):
    """Only the last component of a mountpoint is created."""
    fx = demo(args, "mistyped")
    base = os.path.join(args.work, "mistyped")
    mnt = os.path.join(base, "typo", "deeper", "mnt")
    expect_refusal(mount_cmd(args, fx, mnt), "mountpoint under missing directories",
                   [mnt, os.path.join(base, "typo", "deeper"), "does not exist"],
                   mnt=mnt, ckptfs=args.ckptfs)
    assert not os.path.exists(os.path.join(base, "typo")), "created the missing parents"
    # The last component alone is still created, as before.
    last = os.path.join(base, "new_mnt")
    with itest.mounted(args.ckptfs, fx.src_dir, last, src_strategy=fx.src_strategy,
                       dst_strategy=fx.dst_strategy, index_dir=os.path.join(base, "index")):
        pass


def main():
    args = itest.parse_args()
    checks = itest.Checks(args.only)
    checks.run("inspect FILE", inspect_file, args)
    checks.run("strategy show PATH", strategy_show, args)
    checks.run("ranks --dst-strategy", ranks_strategy, args)
    checks.run("mount --src-strategy", mount_strategy, args, "src")
    checks.run("mount --dst-strategy", mount_strategy, args, "dst")
    checks.run("mount --log-file", mount_log_file, args)
    checks.run("mount --index", mount_shipped_index, args)
    checks.run("index files (data.mdb)", shipped_index_files, args)
    checks.run("index --index-dir and --output", index_dirs, args)
    checks.run("mount --index-dir: a warning, and the mount serves", mount_index_dir, args)
    checks.run("SRC_DIR", src_dir_kinds, args)
    checks.run("materialize OUT", materialize_out, args)
    checks.run("verify --against", verify_against, args)
    checks.run("materialize's output file", materialize_file, args)
    checks.run("a rank's checkpoint", source_file_kinds, args)
    checks.run("a rank directory", rank_dir_kinds, args)
    checks.run("an empty rank directory", rank_dir_empty, args)
    checks.run("a 0-byte checkpoint", empty_checkpoint, args)
    checks.run("a missing SRC_DIR", missing_src_dir, args)
    checks.run("a mistyped mountpoint", mistyped_mountpoint, args)
    checks.finish()


if __name__ == "__main__":
    main()
