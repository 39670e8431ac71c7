"""What other users can see (issue 29, items 5 and 6).

MOUNTPOINT/.ckptfs/ follows the rule of the files it describes: plan/<dir>.json is no more
readable than the files of <dir>, sources.json, stats.json and the log no more readable than the
least readable source, the directories no more searchable; --log-file is created for its owner
only. A source that is a symlink takes the access of the file it reaches (its directories
included). And no message quotes the bytes of a file it cannot parse: a secret reached through
a symlink, or crafted headers whose fields carry a known pattern, never shows up (as text, as a
little- or big-endian number, in decimal or hex) in any output or log.

As root, reading as `nobody` through setpriv, like test_modes.py."""

import os
import shutil
import struct
import subprocess
import zipfile

import itest
import ckpt_fixture
from ckptfix import training

NOBODY = 65534
# What must never be echoed: a file's first 8 bytes, as text and as numbers.
SECRET = b"S3cr3t!Kzq#vX@w8%Lp^" * 3 + b"\n"


def as_nobody(cmd):
    proc = subprocess.run(["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups",
                           "--"] + cmd, capture_output=True, timeout=60)
    # What it read may be any bytes (a checkpoint): only stderr is text.
    proc.stderr = proc.stderr.decode(errors="replace")
    return proc


def source_files(src_dir):
    return sorted(os.path.join(d, n) for d, _, names in os.walk(src_dir) for n in names
                  if n.endswith(".ckpt"))


def fixture(args, name, case="demo"):
    work = os.path.join(args.work, name)
    fx = ckpt_fixture.make_builtin(case, os.path.join(work, "fixture"))
    os.chmod(work, 0o755)
    return work, fx


def kw(fx, work, **more):
    out = dict(src_strategy=fx.src_strategy, dst_strategy=fx.dst_strategy,
               index_dir=os.path.join(work, "index"), options="allow_other")
    out.update(more)
    return out


def status_entries(mnt):
    """Every path under MOUNTPOINT/.ckptfs (itself included), directories first."""
    top = os.path.join(mnt, ".ckptfs")
    out = [top, os.path.join(top, "plan")]
    out += [os.path.join(top, n) for n in ("sources.json", "stats.json", "log")]
    out += [os.path.join(top, "plan", n) for n in sorted(os.listdir(os.path.join(top, "plan")))]
    return out


def read_bits(path):
    return os.stat(path).st_mode & 0o444


def view_files(mnt):
    return [os.path.join(d, n) for d, dirs, names in os.walk(mnt) for n in names
            if not os.path.relpath(d, mnt).startswith(("steps", ".ckptfs"))]


def nobody_denied(path):
    """True if nobody gets EACCES reading (or listing) `path`."""
    proc = as_nobody(["ls", path] if os.path.isdir(path) else ["cat", path])
    return proc.returncode != 0 and "Permission denied" in proc.stderr


def private_sources(args):
    # 0600 sources in a 0700 directory: nobody reads no status file and lists no status
    # directory, while the owner (root) still reads them; the log file is the owner's only.
    work, fx = fixture(args, "private")
    for path in source_files(fx.src_dir):
        os.chmod(path, 0o600)
    os.chmod(fx.src_dir, 0o700)
    mnt = os.path.join(work, "mnt")
    log = os.path.join(work, "daemon.log")
    with itest.mounted(args.ckptfs, fx.src_dir, mnt, log_file=log, **kw(fx, work)):
        data = os.path.join(mnt, "rank_0", "checkpoint_0.ckpt")
        assert nobody_denied(data), "the data file itself is readable: the fixture proves nothing"
        entries = status_entries(mnt)
        assert len(entries) >= 6, entries
        problems = []
        for path in entries:
            mode = os.stat(path).st_mode & 0o7777
            if mode & 0o077:
                problems.append(f"{os.path.relpath(path, mnt)} is {oct(mode)}")
            if not nobody_denied(path):
                problems.append(f"nobody reads {os.path.relpath(path, mnt)}")
        assert not problems, "\n".join(problems)
        # The owner still reads them all.
        for path in entries[2:]:
            assert itest.read_file(path) is not None
        assert b'"sources"' in itest.read_file(os.path.join(mnt, ".ckptfs", "sources.json"))
    mode = os.stat(log).st_mode & 0o7777
    assert mode & 0o077 == 0, f"--log-file created {oct(mode)}"


def public_sources(args):
    # 0644 sources: nothing changes, nobody reads every status file.
    work, fx = fixture(args, "public")
    for path in source_files(fx.src_dir):
        os.chmod(path, 0o644)
    mnt = os.path.join(work, "mnt")
    with itest.mounted(args.ckptfs, fx.src_dir, mnt, **kw(fx, work)):
        for path in status_entries(mnt):
            if os.path.isdir(path):
                assert os.stat(path).st_mode & 0o777 == 0o555, path
                proc = as_nobody(["ls", path])
            else:
                assert os.stat(path).st_mode & 0o777 == 0o444, path
                proc = as_nobody(["cat", path])
            assert proc.returncode == 0, (path, proc.stderr)


def mixed_sources(args):
    # One source 0600, the others 0644: each plan file is no more readable than the files it
    # describes, and sources.json, stats.json and the log no more than any file of the view.
    work, fx = fixture(args, "mixed", "8to1_merge")
    files = source_files(fx.src_dir)
    for path in files:
        os.chmod(path, 0o644)
    os.chmod(files[0], 0o600)
    mnt = os.path.join(work, "mnt")
    with itest.mounted(args.ckptfs, fx.src_dir, mnt, **kw(fx, work)):
        views = view_files(mnt)
        assert any(read_bits(f) & 0o004 == 0 for f in views), "no view file is private"
        top = os.path.join(mnt, ".ckptfs")
        problems = []
        for name in sorted(os.listdir(os.path.join(top, "plan"))):
            plan = os.path.join(top, "plan", name)
            described = os.path.join(mnt, name[:-len(".json")])
            described = [os.path.join(described, n) for n in os.listdir(described)] \
                if os.path.isdir(described) else [f for f in views if os.path.dirname(f) == mnt]
            for f in described:
                if read_bits(plan) & ~read_bits(f):
                    problems.append(f"plan/{name} {oct(read_bits(plan))} is more readable than "
                                    f"{os.path.relpath(f, mnt)} {oct(read_bits(f))}")
        for name in ("sources.json", "stats.json", "log"):
            for f in views:
                if read_bits(os.path.join(top, name)) & ~read_bits(f):
                    problems.append(f"{name} is more readable than {os.path.relpath(f, mnt)}")
        assert not problems, "\n".join(problems)
        assert nobody_denied(os.path.join(top, "log"))


def log_narrows_with_a_private_step(args):
    # The log and stats.json tell about every step planned: once a step of 0600 sources under
    # steps/ is planned, others read neither (the data files of the view stay public).
    work = os.path.join(args.work, "steps")
    tr = training.make_training(training.twelve_saves_case(), os.path.join(work, "t"),
                                [(1, 2), (2, 2)])
    os.chmod(work, 0o755)
    for step, files in tr.files.items():
        for path in files.values():
            os.chmod(path, 0o600 if step == (1, 2) else 0o644)
    mnt = os.path.join(work, "mnt")
    top = os.path.join(mnt, ".ckptfs")
    with itest.mounted(args.ckptfs, tr.src_dir, mnt, src_strategy=tr.src_strategy,
                       index_dir=os.path.join(work, "index"), options="allow_other"):
        for name in ("log", "stats.json", "sources.json"):
            proc = as_nobody(["cat", os.path.join(top, name)])
            assert proc.returncode == 0, (name, proc.stderr)
        assert os.listdir(os.path.join(mnt, "steps", "1_2", "rank_0"))  # plans the step
        assert nobody_denied(os.path.join(top, "log")), oct(os.stat(os.path.join(top, "log")).st_mode)
        assert nobody_denied(os.path.join(top, "stats.json"))
        # What describes the main view only is still public.
        assert as_nobody(["cat", os.path.join(top, "sources.json")]).returncode == 0


def symlinked_source(args):
    # A source reached through a symlink into a 0700 directory (the file itself 0644): the
    # files that read it, and the status files, are not readable by others, as the target is
    # not.
    work, fx = fixture(args, "symlink")
    files = source_files(fx.src_dir)
    for path in files:
        os.chmod(path, 0o644)
    private = os.path.join(work, "private")
    os.makedirs(private, exist_ok=True)
    os.chmod(private, 0o700)
    moved = os.path.join(private, "checkpoint.ckpt")
    shutil.move(files[0], moved)
    os.symlink(moved, files[0])
    assert as_nobody(["cat", files[0]]).returncode != 0
    mnt = os.path.join(work, "mnt")
    with itest.mounted(args.ckptfs, fx.src_dir, mnt, **kw(fx, work)):
        reading = [f for f in view_files(mnt)
                   if files[0] in os.getxattr(f, "user.ckptfs.sources").decode()]
        assert reading, "no view file reads the linked source"
        problems = [f"{os.path.relpath(f, mnt)} is {oct(read_bits(f))}" for f in reading
                    if read_bits(f) & 0o044]
        problems += [f"nobody reads {os.path.relpath(f, mnt)}" for f in reading
                     if not nobody_denied(f)]
        problems += [f"nobody reads {os.path.relpath(p, mnt)}"
                     for p in status_entries(mnt) if not nobody_denied(p)]
        assert not problems, "\n".join(problems)


def needles():
    """The secret's first bytes as numbers (4 and 8 bytes, both byte orders, decimal and hex)
    and every 6-byte run of it as text."""
    out = set()
    for head in (SECRET[:8], SECRET[:4]):
        for order in ("little", "big"):
            n = int.from_bytes(head, order)
            out |= {str(n), f"{n:x}", f"{n:X}"}
            s = int.from_bytes(head, order, signed=True)
            out.add(str(s))
    text = SECRET.decode()
    out |= {text[i:i + 6] for i in range(len(text) - 5)}
    return out


def echoed(text):
    return sorted(n for n in needles() if n in text)


def secret_file(work):
    d = os.path.join(work, "secret")
    os.makedirs(d, exist_ok=True)
    path = os.path.join(d, "id_key")
    with open(path, "wb") as f:
        f.write(SECRET)
    os.chmod(path, 0o600)
    os.chmod(d, 0o700)
    return path


def outputs(proc):
    return proc.stdout + proc.stderr


def varint(n):
    out = b""
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out += bytes([b | 0x80])
        else:
            return out + bytes([b])


def crafted_files(work):
    """name -> bytes of files whose fields carry SECRET's first bytes."""
    le8 = int.from_bytes(SECRET[:8], "little")
    out = {}
    # The header length field is the pattern.
    out["length.safetensors"] = SECRET[:8] + b"{}"
    # A header that is not JSON: a name holding the pattern, cut by a control character.
    header = b'{"' + SECRET[:-1] + b'\x01":1}'
    out["text.safetensors"] = struct.pack("<Q", len(header)) + header
    # A shape dimension and an offset that are the pattern.
    header = ('{"t":{"dtype":"U8","shape":[%d],"data_offsets":[0,%d]}}' % (le8, le8)).encode()
    out["shape.safetensors"] = struct.pack("<Q", len(header)) + header + b"\0"
    # A record of a .ckpt whose length prefix is the pattern.
    out["length.ckpt"] = b"\x0a" + varint(le8) + b"\0" * 16
    # A dimension that is the pattern in a well-formed record (its content is too short).
    tensor = b"\x08" + varint(le8) + b"\x12\x04Int8" + b"\x1a\x01\0"
    value = b"\x0a\x01w" + b"\x12" + varint(len(tensor)) + tensor
    out["dims.ckpt"] = b"\x0a" + varint(len(value)) + value
    # A torch zip whose central directory's compressed size is the pattern's first 4 bytes.
    path = os.path.join(work, "plain.pt")
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:
        z.writestr("archive/data.pkl", b"\x80\x02}q\x00.")
        z.writestr("archive/version", b"3\n")
    data = bytearray(itest.read_file(path))
    at = data.index(b"PK\x01\x02")
    data[at + 20:at + 24] = SECRET[:4]
    out["sizes.pt"] = bytes(data)
    return out


def secret_never_echoed(args):
    work = os.path.join(args.work, "secret")
    os.makedirs(work, exist_ok=True)
    secret = secret_file(work)
    problems = []

    def check(what, text):
        found = echoed(text)
        if found:
            problems.append(f"{what} echoes {found[:3]}: {text.strip()[:300]}")

    # inspect of a symlink to the secret, under each name a parser goes by.
    links = os.path.join(work, "links")
    os.makedirs(links, exist_ok=True)
    for name in ("secret.ckpt", "secret.safetensors", "secret.pt", "secret.json"):
        link = os.path.join(links, name)
        if not os.path.lexists(link):
            os.symlink(secret, link)
        if name.endswith(".json"):
            continue
        proc = itest.run([args.ckptfs, "inspect", link], check=False)
        assert proc.returncode != 0, f"inspect {name} accepted the secret"
        check(f"inspect {name}", outputs(proc))

    # A mount whose rank directory holds a symlink to the secret: refused, and neither its
    # messages nor its log file quote it.
    wk, fx = fixture(args, "secret_mount")
    victim = source_files(fx.src_dir)[0]
    os.remove(victim)
    os.symlink(secret, victim)
    log = os.path.join(wk, "daemon.log")
    proc = itest.refused_mount(args.ckptfs, fx.src_dir, os.path.join(wk, "mnt"), log_file=log,
                               src_strategy=fx.src_strategy, dst_strategy=fx.dst_strategy,
                               index_dir=os.path.join(wk, "index"))
    check("mount of a rank directory with a symlink to the secret", outputs(proc))
    if os.path.exists(log):
        check("its log file", itest.read_file(log).decode(errors="replace"))
    proc = itest.run([args.ckptfs, "index", "build", fx.src_dir, "--output",
                      os.path.join(wk, "idx"), "--src-strategy", fx.src_strategy,
                      "--dst-strategy", fx.dst_strategy], check=False)
    check("index build of it", outputs(proc))
    # A strategy file that is a symlink to the secret, as protobuf and as JSON.
    fx2 = ckpt_fixture.make_builtin("demo", os.path.join(wk, "fixture2"))
    for name in ("secret.ckpt", "secret.json"):
        proc = itest.refused_mount(args.ckptfs, fx2.src_dir, os.path.join(wk, "mnt2"),
                                   src_strategy=os.path.join(links, name),
                                   dst_strategy=fx2.dst_strategy,
                                   index_dir=os.path.join(wk, "index2"))
        check(f"--src-strategy {name}", outputs(proc))

    # Crafted headers whose fields are the pattern.
    crafted = os.path.join(work, "crafted")
    os.makedirs(crafted, exist_ok=True)
    for name, data in crafted_files(crafted).items():
        path = os.path.join(crafted, name)
        with open(path, "wb") as f:
            f.write(data)
        proc = itest.run([args.ckptfs, "inspect", path], check=False)
        assert proc.returncode != 0, f"inspect {name} accepted it: {proc.stdout}"
        check(f"inspect of crafted {name}", outputs(proc))
    assert not problems, "\n".join(problems)


def names_escaped_and_limited(args):
    # A dtype of 300 bytes with an escape sequence, and a tensor name with a newline: the
    # message shows at most 64 bytes of each, with no control character.
    work = os.path.join(args.work, "names")
    os.makedirs(work, exist_ok=True)
    dtype = "\x1b[31m" + "A" * 300
    header = ('{"x\\ny":{"dtype":"%s","shape":[1],"data_offsets":[0,1]}}'
              % dtype.replace("\x1b", "\\u001b")).encode()
    path = os.path.join(work, "bad.safetensors")
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(header)) + header + b"\0")
    proc = itest.run([args.ckptfs, "inspect", path], check=False)
    assert proc.returncode != 0
    text = outputs(proc)
    assert "\x1b" not in text, repr(text)
    assert "A" * 65 not in text, text
    assert "x\ny" not in text, repr(text)
    assert "dtype" in text and "bad.safetensors" in text, text


def main():
    args = itest.parse_args()
    args.ckptfs = os.path.abspath(args.ckptfs)
    checks = itest.Checks(args.only)
    if os.getuid() != 0 or not shutil.which("setpriv"):
        print("skipped: needs root and setpriv to read as another user")
        checks.finish()
    checks.run("0600 sources: no status file or directory readable by others; --log-file 0600",
               private_sources, args)
    checks.run("0644 sources: every status file readable by others", public_sources, args)
    checks.run("mixed modes: no status file more readable than the files it describes",
               mixed_sources, args)
    checks.run("a private step planned under steps/: the log and stats.json no longer public",
               log_narrows_with_a_private_step, args)
    checks.run("a source symlinked into a 0700 directory: its views and the status tree private",
               symlinked_source, args)
    checks.run("a secret behind a symlink, or as crafted header fields, is never echoed",
               secret_never_echoed, args)
    checks.run("names and dtypes in messages: escaped, at most 64 bytes", names_escaped_and_limited,
               args)
    checks.finish()


if __name__ == "__main__":
    main()
