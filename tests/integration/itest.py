"""Shared helpers of the end-to-end tests: arguments, mounting through the real ckptfs binary,
and a tiny check runner that prints the closing "N passed, M failed" line.

Every test script is run by ctest as
    /usr/bin/python3 test_X.py --ckptfs BIN --shared DATA_DIR --work WORK_DIR

where DATA_DIR is the repository's tests/data (real fixtures under fixtures/real/, the same
relative paths as the project's shared/ folder, so "shared:" fixture paths resolve there).
"""

import argparse
import contextlib
import os
import shutil
import subprocess
import sys
import time
import traceback

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# Under a sanitized build (scripts/test.sh sets these variables for its sanitizer stages), memory
# figures grow: ASan reserves terabytes of address space up front and keeps up to 256 MiB of
# freed blocks in quarantine.
SANITIZED = any(os.environ.get(v) for v in ("ASAN_OPTIONS", "TSAN_OPTIONS"))
ASAN_QUARANTINE_KIB = 256 * 1024
sys.path.insert(0, os.path.join(REPO, "scripts"))


# The reference safetensors package lives in a venv of its own (Debian 12 packages none), made by
# scripts/install-deps.sh from /usr/bin/python3 with the system's packages visible (numpy, torch),
# so this interpreter can import from it.
TEST_VENV = os.path.join(REPO, "build", "test-venv")


def import_from_test_venv(module):
    """`module` imported with build/test-venv on the path; a missing venv fails the check, never
    skips it."""
    import glob
    import importlib
    import site
    for packages in glob.glob(os.path.join(TEST_VENV, "lib", "python3*", "site-packages")):
        site.addsitedir(packages)
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise AssertionError(f"{module} cannot be imported from {TEST_VENV} ({e}): "
                             "bash scripts/install-deps.sh makes it") from None


def parse_args():
    parser = argparse.ArgumentParser()
    parser.add_argument("--ckptfs", required=True)
    parser.add_argument("--shared", required=True)
    parser.add_argument("--work", required=True)
    parser.add_argument("-k", dest="only", default=None, help="run checks whose name contains this")
    args = parser.parse_args()
    shutil.rmtree(args.work, ignore_errors=True)
    os.makedirs(args.work)
    global _work
    _work = args.work
    return args


_work = None  # the work folder parse_args made; Checks.finish removes it when every check passed


def remove_work(work):
    """Removes a passed test's work folder: the suite writes gigabytes of fixtures (twice, for the
    sanitizer stage), more than a CI machine's disk may hold at once. A failed test keeps its
    folder to look at, and so does any test under CKPTFS_KEEP_WORK=1."""
    if os.environ.get("CKPTFS_KEEP_WORK") == "1":
        return
    root = os.path.realpath(work)
    left = [m for m in mount_points() if m == root or m.startswith(root + "/")]
    if left:  # never walk into a mount; a check that leaves one behind has failed already
        print(f"kept {work}: still mounted at {', '.join(left)}", flush=True)
        return

    def writable_and_retry(fn, path, _):
        # Checks of permission errors leave folders without write or search permission.
        os.chmod(os.path.dirname(path), 0o700)
        if os.path.isdir(path) and not os.path.islink(path):
            os.chmod(path, 0o700)
        fn(path)

    shutil.rmtree(work, onerror=writable_and_retry)


# The exit status of a test that did not run what it is for (ctest's SKIP_RETURN_CODE, set in
# tests/CMakeLists.txt): ctest reports it as skipped, and the test command fails on any skip.
SKIP_EXIT = 77


class Skip(Exception):
    """Raised by a check that cannot run on this machine; never a silent early return."""


def skip(reason):
    """Ends the whole test as skipped, before any check ran."""
    print(f"SKIPPED: {reason}", flush=True)
    sys.exit(SKIP_EXIT)


def require_tool(name, package):
    """Skips the calling check (Checks.run) when the program `name` is not installed."""
    if not shutil.which(name):
        raise Skip(f"{name} is not installed (Debian package {package})")


class Checks:
    """Runs named checks, reports each, and exits with the summary line ctest logs: 0 when every
    check passed, 1 when one failed, SKIP_EXIT when none failed but one was skipped."""

    def __init__(self, only=None):
        self.passed = 0
        self.failed = []
        self.skipped = []
        self.only = only

    def run(self, name, fn, *args):
        if self.only and self.only not in name:
            return
        start = time.monotonic()
        try:
            fn(*args)
        except Skip as e:
            self.skipped.append(name)
            print(f"SKIP {name}: {e}", flush=True)
        except Exception:  # report every failure, then go on with the next check
            self.failed.append(name)
            print(f"FAIL {name}\n{traceback.format_exc()}", flush=True)
        else:
            self.passed += 1
            print(f"ok   {name} ({time.monotonic() - start:.1f}s)", flush=True)

    def finish(self):
        for name in self.failed:
            print(f"failed: {name}")
        for name in self.skipped:
            print(f"skipped: {name}")
        print(f"{self.passed} passed, {len(self.failed)} failed, {len(self.skipped)} skipped")
        if not self.failed and _work:
            remove_work(_work)
        sys.exit(1 if self.failed else SKIP_EXIT if self.skipped else 0)


def mount_points():
    with open("/proc/self/mounts") as mounts:
        return [line.split()[1] for line in mounts]


def is_mounted(path):
    return os.path.realpath(path) in mount_points()


def thread_stacks(pid):
    """What a process that overran its time is doing: every thread's stack from gdb (when
    installed), else each thread's kernel stack and wait channel."""
    if shutil.which("gdb"):
        try:
            out = subprocess.run(["gdb", "-p", str(pid), "-batch", "-nx", "-ex",
                                  "thread apply all bt"], capture_output=True, text=True,
                                 timeout=60).stdout
            return "\n".join(line for line in out.splitlines()
                             if line.startswith(("#", "Thread")))
        except subprocess.TimeoutExpired:
            pass
    lines = []
    for task in sorted(os.listdir(f"/proc/{pid}/task")):
        for name in ("comm", "wchan", "stack"):
            with contextlib.suppress(OSError), open(f"/proc/{pid}/task/{task}/{name}") as f:
                lines.append(f"{task} {name}: {f.read().strip()}")
    return "\n".join(lines)


def run(cmd, timeout=120, check=True, preexec_fn=None):
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True, preexec_fn=preexec_fn) as child:
        try:
            stdout, stderr = child.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            stacks = thread_stacks(child.pid)
            child.kill()
            stdout, stderr = child.communicate()
            raise AssertionError(f"{' '.join(cmd)} still ran after {timeout} s; its threads:\n"
                                 f"{stacks}\nstderr: {stderr}") from None
    proc = subprocess.CompletedProcess(cmd, child.returncode, stdout, stderr)
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} exited {proc.returncode}\nstdout: {proc.stdout}\n"
                             f"stderr: {proc.stderr}")
    return proc


def mount_cmd(ckptfs, src, mnt, src_strategy=None, dst_strategy=None, index_dir=None,
              log_file=None, options=None, log_level=None, extra_args=()):
    cmd = [ckptfs] + (["--log-level", log_level] if log_level else []) + ["mount", src, mnt]
    if src_strategy:
        cmd += ["--src-strategy", src_strategy]
    if dst_strategy:
        cmd += ["--dst-strategy", dst_strategy]
    if index_dir:
        cmd += ["--index-dir", index_dir]
    if log_file:
        cmd += ["--log-file", log_file]
    if options:
        cmd += ["-o", options]
    return cmd + list(extra_args)


def unmount(ckptfs, mnt):
    if not is_mounted(mnt):
        return
    proc = subprocess.run([ckptfs, "umount", mnt], capture_output=True, text=True, timeout=60)
    if is_mounted(mnt):  # never leave a mount behind, even if umount failed
        subprocess.run(["fusermount3", "-u", "-z", mnt], capture_output=True, timeout=60)
    if proc.returncode != 0:
        raise AssertionError(f"ckptfs umount {mnt} failed: {proc.stderr}")
    assert not is_mounted(mnt), f"{mnt} still mounted"


@contextlib.contextmanager
def unmounting(ckptfs, mnt):
    """Whatever the body mounts at `mnt` (a mount expected to be refused that was not, a mount by
    mount(8), a daemon killed and mounted again) is unmounted afterwards, also on a failure."""
    try:
        yield mnt
    finally:
        unmount(ckptfs, mnt)


@contextlib.contextmanager
def mounted(ckptfs, src, mnt, **kwargs):
    """Mounts in the background (the command returns once the mount serves) and always unmounts."""
    os.makedirs(mnt, exist_ok=True)
    with unmounting(ckptfs, mnt):
        proc = run(mount_cmd(ckptfs, src, mnt, **kwargs), timeout=120, check=False)
        if proc.returncode != 0:
            raise AssertionError(f"mount failed ({proc.returncode}): {proc.stderr}")
        assert is_mounted(mnt), "mount returned 0 but nothing is mounted"
        yield mnt


def refused_mount(ckptfs, src, mnt, timeout=60, preexec_fn=None, **kwargs):
    """Runs a mount that must be refused (mount_cmd's arguments): asserts that it failed and left
    nothing mounted (unmounting whatever it did mount), and returns the finished process."""
    os.makedirs(mnt, exist_ok=True)
    try:
        proc = run(mount_cmd(ckptfs, src, mnt, **kwargs), timeout=timeout, check=False,
                   preexec_fn=preexec_fn)
    finally:
        mounted = is_mounted(mnt)
        unmount(ckptfs, mnt)
    assert not mounted, f"a refused mount of {src} left a mount behind"
    assert proc.returncode != 0, f"the mount of {src} was not refused: {proc.stdout}"
    return proc


def stderr_lines(proc):
    """The non-empty lines a command wrote to stderr."""
    return [line for line in proc.stderr.splitlines() if line.strip()]


def status_kib(pid, field):
    """A KiB figure of /proc/PID/status, such as VmRSS or VmHWM."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise AssertionError(f"no {field} in /proc/{pid}/status")


def daemon_pids(ckptfs, mnt):
    """Processes of the binary `ckptfs` serving `mnt`: a mount command whose arguments name it."""
    binary = os.path.realpath(ckptfs).encode()
    pids = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
            exe = os.path.realpath(f"/proc/{pid}/exe").encode()
        except OSError:
            continue
        if exe == binary and b"mount" in argv and mnt.encode() in argv:
            pids.append(int(pid))
    return pids


def hf_split(order, sizes, max_size):
    """save_pretrained's shards (lists of names): huggingface_hub's documented rule, written here
    from its docs. Names in `order` fill the current shard; a new one starts when the next would
    take it over max_size; a name whose size (sizes[name]) is over max_size is appended alone in a
    shard of its own when met, the current shard staying open."""
    shards, current, current_size = [], [], 0
    for name in order:
        if sizes[name] > max_size:
            shards.append([name])
            continue
        if current_size + sizes[name] > max_size:
            shards.append(current)
            current, current_size = [], 0
        current.append(name)
        current_size += sizes[name]
    if current:
        shards.append(current)
    return shards


def read_file(path):
    with open(path, "rb") as f:
        return f.read()


def tree_files(root):
    """Relative paths of the regular files below root, sorted."""
    out = []
    for dirpath, _, files in os.walk(root):
        for name in files:
            out.append(os.path.relpath(os.path.join(dirpath, name), root))
    return sorted(out)


@contextlib.contextmanager
def attempts(n):
    """Requests per GET for the commands started meanwhile, as the AWS tools take
    AWS_MAX_ATTEMPTS: a check of answers that never come right needs one retry to see that it
    retries, not five with backoff (checks of answers right at the second try need the
    default)."""
    before = os.environ.get("AWS_MAX_ATTEMPTS")
    os.environ["AWS_MAX_ATTEMPTS"] = str(n)
    try:
        yield
    finally:
        if before is None:
            del os.environ["AWS_MAX_ATTEMPTS"]
        else:
            os.environ["AWS_MAX_ATTEMPTS"] = before
