"""Every resharding case of the fixture generator, really mounted: sizes before any read, whole
files, random windows and concurrent readers, all compared byte for byte with the expected files
the generator wrote by construction."""

import errno
import os
import random
import shutil
import subprocess
import tempfile
import threading

import itest
import ckpt_fixture

CASES = [
    "demo", "8to4_dtypes", "8to1_merge", "1to8_split", "opt_src", "opt_dst", "pipeline_src_dir",
    "pipeline_src_merged", "pipeline_dst", "json", "json_pipeline", "crc_oldscalars", "multiaxis",
    "multifile", "rankdirs", "4to6", "src_chunks", "src_chunks_old", "llama13b_to1",
    "llama13b_to4",
]


def check_case(args, name):
    work = os.path.join(args.work, name)
    fx = ckpt_fixture.make_builtin(name, os.path.join(work, "fixture"), shared=args.shared)
    mnt = os.path.join(work, "mnt")
    kwargs = dict(src_strategy=fx.src_strategy, dst_strategy=fx.dst_strategy,
                  index_dir=os.path.join(work, "index"), log_file=os.path.join(work, "log"))
    with itest.mounted(args.ckptfs, fx.src_dir, mnt, **kwargs):
        expected = {t: itest.read_file(p) for t, p in fx.expected_files().items()}
        # ls -l shows exact sizes before any byte is read.
        for t, want in expected.items():
            st = os.stat(os.path.join(mnt, f"rank_{t}", f"checkpoint_{t}.ckpt"))
            assert st.st_size == len(want), f"rank {t}: size {st.st_size}, expected {len(want)}"
        problems = ckpt_fixture.compare_tree(fx, mnt)
        assert not problems, "\n".join(problems)
        rng = random.Random(name)
        for t, want in expected.items():
            fd = os.open(os.path.join(mnt, f"rank_{t}", f"checkpoint_{t}.ckpt"), os.O_RDONLY)
            try:
                for _ in range(40):
                    off = rng.randrange(len(want) + 1)
                    size = rng.choice([1, 7, 4096, 65536, rng.randrange(1, len(want) + 2)])
                    got = os.pread(fd, size, off)
                    assert got == want[off:off + size], f"rank {t}: window {off}+{size} differs"
            finally:
                os.close(fd)


def check_concurrent_readers(args):
    work = os.path.join(args.work, "concurrent")
    fx = ckpt_fixture.make_builtin("8to4_dtypes", os.path.join(work, "fixture"))
    mnt = os.path.join(work, "mnt")
    with itest.mounted(args.ckptfs, fx.src_dir, mnt, src_strategy=fx.src_strategy,
                       dst_strategy=fx.dst_strategy, index_dir=os.path.join(work, "index")):
        files = sorted(fx.expected_files().items())
        errors = []
        finished = []

        def reader(seed):
            rng = random.Random(seed)
            try:
                for _ in range(30):
                    t, path = rng.choice(files)
                    want = itest.read_file(path)
                    with open(os.path.join(mnt, f"rank_{t}", os.path.basename(path)), "rb") as f:
                        off = rng.randrange(len(want))
                        size = rng.randrange(1, 300000)
                        f.seek(off)
                        if f.read(size) != want[off:off + size]:
                            errors.append(f"reader {seed}: rank {t} window {off}+{size} differs")
                        f.seek(0)
                        if f.read() != want:
                            errors.append(f"reader {seed}: rank {t} differs")
            except Exception as e:  # a failed open or read must fail the check, not end a thread
                errors.append(f"reader {seed}: {e!r}")
            else:
                finished.append(seed)

        threads = [threading.Thread(target=reader, args=(s,)) for s in range(6)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        assert not errors, errors
        assert sorted(finished) == list(range(6)), f"readers finished: {finished}"


def check_real_clients(args):
    """protoc --decode_raw, Google's Python parser, cp -r + cmp, md5sum stable across remounts,
    a read-only tree."""
    work = os.path.join(args.work, "clients")
    fx = ckpt_fixture.make_builtin("demo", os.path.join(work, "fixture"))
    mnt = os.path.join(work, "mnt")
    kwargs = dict(src_strategy=fx.src_strategy, dst_strategy=fx.dst_strategy,
                  index_dir=os.path.join(work, "index"), log_file=os.path.join(work, "log"))
    pb_dir = tempfile.mkdtemp(dir=work)
    itest.run(["protoc", f"--proto_path={itest.REPO}/proto", f"--python_out={pb_dir}",
               "checkpoint.proto"])
    import sys
    sys.path.insert(0, pb_dir)
    import checkpoint_pb2

    sums = []
    for attempt in range(2):
        with itest.mounted(args.ckptfs, fx.src_dir, mnt, **kwargs):
            rank0 = os.path.join(mnt, "rank_0", "checkpoint_0.ckpt")
            decoded = {}
            for which, path in (("mounted", rank0), ("expected", fx.expected_files()[0])):
                with open(path, "rb") as f:
                    proc = subprocess.run(["protoc", "--decode_raw"], stdin=f,
                                          capture_output=True, timeout=60)
                assert proc.returncode == 0 and proc.stdout, proc.stderr
                decoded[which] = proc.stdout
            assert decoded["mounted"] == decoded["expected"], "protoc --decode_raw output differs"
            for t, path in fx.expected_files().items():
                mounted_file = os.path.join(mnt, f"rank_{t}", os.path.basename(path))
                msg, want = checkpoint_pb2.Checkpoint(), checkpoint_pb2.Checkpoint()
                msg.ParseFromString(itest.read_file(mounted_file))
                want.ParseFromString(itest.read_file(path))
                assert len(msg.value) > 0 and msg == want, f"rank {t}: parsed records differ"
                assert [v.tag for v in msg.value] == [v.tag for v in want.value]
            out = os.path.join(work, f"copy{attempt}")
            itest.run(["cp", "-r", mnt + "/.", out])
            for t, path in fx.expected_files().items():
                itest.run(["cmp", path, os.path.join(out, f"rank_{t}", os.path.basename(path))])
            md5 = itest.run(["md5sum"] + [os.path.join(mnt, f"rank_{t}", os.path.basename(p))
                                          for t, p in sorted(fx.expected_files().items())])
            sums.append(md5.stdout.replace(mnt, "MNT"))
            # Read-only: writes and creates fail with EROFS.
            for attempt_write in (lambda: open(rank0, "r+b"),
                                  lambda: open(os.path.join(mnt, "rank_0", "new"), "wb"),
                                  lambda: os.mkdir(os.path.join(mnt, "x"))):
                try:
                    attempt_write()
                except OSError as e:
                    assert e.errno == errno.EROFS, e
                else:
                    raise AssertionError("a write into the mount succeeded")
    assert sums[0] == sums[1], f"md5sum changed across remounts:\n{sums[0]}\n{sums[1]}"
    shutil.rmtree(pb_dir)


def main():
    args = itest.parse_args()
    checks = itest.Checks(args.only)
    for name in CASES:
        checks.run(f"case {name}", check_case, args, name)
    checks.run("concurrent readers", check_concurrent_readers, args)
    checks.run("real clients", check_real_clients, args)
    checks.finish()


if __name__ == "__main__":
    main()
