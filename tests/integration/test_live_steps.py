"""MOUNTPOINT/steps/<epoch>_<step>/: every step saved on all ranks, planned when first looked up,
kept current while training writes new steps and deletes old ones."""

import errno
import os
import time

import itest
import ckpt_fixture
from ckptfix import training

# A new step must show within a second of its last file being complete; polled this often.
APPEAR_S = 1.0
POLL_S = 0.05
# fs::Steps::kGrace: how long a dropped step's Tree is kept for readers still in it.
STEP_GRACE_S = 10


def wait_for(predicate, limit):
    """Seconds until predicate() held, or None if it did not within `limit`."""
    start = time.monotonic()
    while True:
        if predicate():
            return time.monotonic() - start
        if time.monotonic() - start > limit:
            return None
        time.sleep(POLL_S)


def three_steps(args, name):
    """A training directory of 3 steps, and where to mount it."""
    work = os.path.join(args.work, name)
    case = training.twelve_saves_case()
    steps = [(1, 2), (2, 2), (3, 2)]
    tr = training.make_training(case, os.path.join(work, "t"), steps, expected_steps=steps)
    return work, case, steps, tr, os.path.join(work, "mnt")


def live(args):
    work, case, steps, tr, mnt = three_steps(args, "live")
    with itest.mounted(args.ckptfs, tr.src_dir, mnt, src_strategy=tr.src_strategy,
                       index_dir=os.path.join(work, "index")):
        root = os.path.join(mnt, "steps")
        # Reachable by path, but not listed: copying the mount root copies the served step only.
        assert sorted(os.listdir(mnt)) == ["rank_0"], os.listdir(mnt)
        assert sorted(os.listdir(root)) == ["1_2", "2_2", "3_2"], os.listdir(root)
        for step in steps:
            problems = ckpt_fixture.compare_tree(tr.expected(step),
                                                 os.path.join(root, f"{step[0]}_{step[1]}"))
            assert not problems, f"{step}: " + "\n".join(problems)

        # A save under way: rank 0 done, rank 1 still writing its .tmp. Not complete.
        saved = training.save_step(tr, case, 3, (4, 2), ranks=[0])
        with open(os.path.join(tr.rank_dirs[1], tr.file_name(1, (4, 2)) + ".tmp"), "wb") as f:
            f.write(b"partial")
        assert wait_for(lambda: os.path.exists(os.path.join(root, "4_2")), 1.5) is None, \
            "a step on one of two ranks appeared"
        os.remove(os.path.join(tr.rank_dirs[1], tr.file_name(1, (4, 2)) + ".tmp"))
        # The last rank's file is renamed into place: the step appears within a second.
        training.save_step(tr, case, 3, (4, 2), ranks=[1])
        took = wait_for(lambda: os.path.exists(os.path.join(root, "4_2")), APPEAR_S)
        assert took is not None, f"step 4_2 did not appear within {APPEAR_S}s"
        print(f"     step 4_2 appeared {took:.2f}s after its last file")
        problems = ckpt_fixture.compare_tree(tr.expected((4, 2)), os.path.join(root, "4_2"))
        assert not problems, "\n".join(problems)
        assert saved

        # keep_checkpoint_max deletes step 1 while one of its files is open.
        victim = os.path.join(root, "1_2", "rank_0", "checkpoint_0.ckpt")
        want = itest.read_file(os.path.join(tr.expected((1, 2)).outdir, "expected", "rank_0",
                                            "checkpoint_0.ckpt"))
        with open(victim, "rb", buffering=0) as f:
            head = f.read(16)
            assert head == want[:16]
            for path in tr.files[(1, 2)].values():
                os.remove(path)
            took = wait_for(lambda: not os.path.exists(os.path.join(root, "1_2")), APPEAR_S)
            assert took is not None, "deleted step 1_2 still listed"
            assert "1_2" not in os.listdir(root)
            # The open file: its bytes, or EIO, never others.
            try:
                rest = f.read()
                assert head + rest == want, "an open file of a deleted step changed its bytes"
            except OSError as e:
                assert e.errno == errno.EIO, e
        # The main view is the step chosen at mount.
        problems = ckpt_fixture.compare_tree(tr.expected((3, 2)), mnt)
        assert not problems, "\n".join(problems)


def open_paths(pid):
    """The files the process `pid` holds open (their paths, " (deleted)" once unlinked)."""
    held = []
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            held.append(os.readlink(f"/proc/{pid}/fd/{fd}"))
        except OSError:
            pass
    return held


def deleted_closed(args):
    """A step deleted while mounted is closed once its grace period is over: the daemon holds no
    descriptor of its files, so their disk space comes back (keep_checkpoint_max on a full disk)."""
    work, _, _, tr, mnt = three_steps(args, "closed")
    with itest.mounted(args.ckptfs, tr.src_dir, mnt, src_strategy=tr.src_strategy,
                       index_dir=os.path.join(work, "index")):
        root = os.path.join(mnt, "steps")
        problems = ckpt_fixture.compare_tree(tr.expected((1, 2)), os.path.join(root, "1_2"))
        assert not problems, "\n".join(problems)
        [pid] = itest.daemon_pids(args.ckptfs, mnt)
        victims = [os.path.realpath(p) for p in tr.files[(1, 2)].values()]
        assert any(p in victims for p in open_paths(pid)), "step 1_2's files were never opened"
        for path in victims:
            os.remove(path)
        assert wait_for(lambda: not os.path.exists(os.path.join(root, "1_2")), APPEAR_S) \
            is not None, "deleted step 1_2 still listed"
        gone = [p + " (deleted)" for p in victims]
        took = wait_for(lambda: not any(p in gone for p in open_paths(pid)),
                        STEP_GRACE_S + 5)
        assert took is not None, \
            f"step 1_2's deleted files still open: {[p for p in open_paths(pid) if p in gone]}"
        print(f"     closed {took:.1f}s after the step went")


def lazy(args):
    """A mount of 60 steps plans only the chosen step: the index holds only its files until
    another step is looked up, and then that step's too."""
    work = os.path.join(args.work, "lazy")
    case = training.twelve_saves_case()
    many = [(e, 2) for e in range(1, 61)]
    tr = training.make_training(case, os.path.join(work, "t"), many, expected_steps=[])
    mnt = os.path.join(work, "mnt")
    index = os.path.join(work, "index")
    with itest.mounted(args.ckptfs, tr.src_dir, mnt, src_strategy=tr.src_strategy,
                       index_dir=index):
        listed = itest.run([args.ckptfs, "index", "list", "--index-dir", index]).stdout
        assert listed.count(".ckpt") == 2, listed  # the chosen step's two files only
        assert len(os.listdir(os.path.join(mnt, "steps"))) == 60
        os.stat(os.path.join(mnt, "steps", "7_2", "rank_0", "checkpoint_0.ckpt"))
        listed = itest.run([args.ckptfs, "index", "list", "--index-dir", index]).stdout
        assert listed.count(".ckpt") == 4, listed


def copy_root(args):
    """`cp -r MOUNTPOINT out` and `find MOUNTPOINT` (and so rsync, tar, du: all walk the listing)
    see the served checkpoint only: steps/ (like .ckptfs/) is reached by its path, never listed,
    so a copy of a training directory with 3 steps is one step's bytes, not four."""
    work, _, _, tr, mnt = three_steps(args, "copy")
    with itest.mounted(args.ckptfs, tr.src_dir, mnt, src_strategy=tr.src_strategy,
                       index_dir=os.path.join(work, "index")):
        out = os.path.join(work, "cp")
        itest.run(["cp", "-r", mnt, out])
        problems = ckpt_fixture.compare_tree(tr.expected((3, 2)), out)
        assert not problems, "\n".join(problems)
        assert sorted(os.listdir(out)) == ["rank_0"], os.listdir(out)
        found = itest.run(["find", mnt]).stdout.split()
        assert not any("/steps" in p for p in found), found
        # Still there by path, whole.
        problems = ckpt_fixture.compare_tree(tr.expected((1, 2)),
                                             os.path.join(mnt, "steps", "1_2"))
        assert not problems, "\n".join(problems)
        assert sorted(os.listdir(os.path.join(mnt, "steps"))) == ["1_2", "2_2", "3_2"]


def main():
    args = itest.parse_args()
    checks = itest.Checks(args.only)
    checks.run("steps appear and disappear while mounted", live, args)
    checks.run("a deleted step's files are closed after its grace period", deleted_closed, args)
    checks.run("copying the mount root copies no step", copy_root, args)
    checks.run("steps are planned on first lookup", lazy, args)
    checks.finish()


if __name__ == "__main__":
    main()
