"""The decrypted pages of encrypted sources are bounded for the whole daemon (-o decrypt_max,
256 MiB by default), not per source: a view merged from SOURCES AES-GCM sources, each one block
of 12 MiB, read front to back (every source's block decrypted in turn) raises the daemon's peak
RSS by no more than the cap and a margin, and its bytes equal the unencrypted oracle's; a bad
value is refused in one line.

The encrypted files are written here from the fixture generator's plain saves, with the
`cryptography` package and the block layout of docs/FORMATS.md (an independent writer: no ckptfs
code encrypts)."""

import os
import struct

from cryptography.hazmat.primitives.ciphers.aead import AESGCM

import itest
import ckpt_fixture
from ckptfix.builtins import case, lay, param, side

MIB = 1 << 20
SOURCES = 10
KEY = b"ckptfs-TEST-KEY-not-a-secret-32B"
GCM_MAGIC = 0x7F3A5ED8
# 10 -> 1 rows: each source holds 12 MiB of the 120 MiB tensor, in one block.
CASE = case(
    "decrypt_memory", "10 -> 1 rows, 12 MiB per source", side(SOURCES), None,
    [param("w", "Float32", [SOURCES * 768, 4096], lay([SOURCES], [0, -1]), None)], [])
CAP = 16 * MIB
# Beyond the decrypted pages: read-ahead blocks, reply buffers, worker threads (as in
# test_read_ahead_memory). Under ASan, the quarantine and the shadow of what is touched.
MARGIN = 48 * MIB + (itest.ASAN_QUARANTINE_KIB * 1024 + CAP // 8 if itest.SANITIZED else 0)


def encrypt_gcm(path):
    """Rewrites `path` as MindSpore's AES-GCM framing with one block (FORMATS.md's table)."""
    with open(path, "rb") as f:
        plain = f.read()
    nonce = os.urandom(12)
    sealed = AESGCM(KEY).encrypt(nonce, plain, None)
    cipher, tag = sealed[:-16], sealed[-16:]
    iv = nonce + b"\0" * 4
    header = struct.pack("<I", GCM_MAGIC) + tag + struct.pack("<iI", 4 + 16 + 4 + len(cipher), 16)
    with open(path, "wb") as f:
        f.write(header + iv + struct.pack("<i", len(cipher)) + cipher)


def setup(args, name):
    work = os.path.join(args.work, name)
    fx = ckpt_fixture.make(CASE, os.path.join(work, "fixture"))
    for root, _, files in os.walk(fx.src_dir):
        for f in files:
            if f.endswith(".ckpt"):
                encrypt_gcm(os.path.join(root, f))
    key = os.path.join(work, "key")
    with open(key, "wb") as f:
        f.write(KEY)
    os.chmod(key, 0o600)
    kwargs = dict(src_strategy=fx.src_strategy, index_dir=os.path.join(work, "index"),
                  log_file=os.path.join(work, "log"), extra_args=["--dec-key-file", key])
    rank, path = sorted(fx.expected_files().items())[0]
    return fx, os.path.join(work, "mnt"), kwargs, (rank, path)


def bounded(args):
    fx, mnt, kwargs, (rank, path) = setup(args, "bounded")
    want = itest.read_file(path)
    with itest.mounted(args.ckptfs, fx.src_dir, mnt, options=f"decrypt_max={CAP // MIB}M",
                       **kwargs):
        target = os.path.join(mnt, f"rank_{rank}", os.path.basename(path))
        pids = itest.daemon_pids(args.ckptfs, mnt)
        assert len(pids) == 1, f"daemon of {mnt}: {pids}"
        pid = pids[0]
        base = itest.status_kib(pid, "VmRSS") * 1024
        with open(f"/proc/{pid}/clear_refs", "w") as f:
            f.write("5")  # resets VmHWM to the current RSS
        with open(target, "rb", buffering=0) as f:
            got = b"".join(iter(lambda: f.read(MIB), b""))
        assert got == want, "the view of the encrypted sources differs from the oracle"
        peak = itest.status_kib(pid, "VmHWM") * 1024
        grown = peak - base
        print(f"     -> {SOURCES} sources of 12 MiB blocks read: daemon RSS {base / MIB:.0f} MiB "
              f"before, peak {peak / MIB:.0f} MiB (+{grown / MIB:.0f} MiB; cap "
              f"{CAP / MIB:.0f} MiB)", flush=True)
        assert grown <= CAP + MARGIN, (
            f"reading {SOURCES} encrypted sources raised the daemon's RSS by "
            f"{grown / MIB:.0f} MiB, over the cap of {CAP / MIB:.0f} MiB + {MARGIN / MIB:.0f} MiB")


def bad_value(args):
    fx, mnt, kwargs, _ = setup(args, "bad")
    for bad in ["decrypt_max=lots", "decrypt_max=-1", "decrypt_max=12Q"]:
        proc = itest.refused_mount(args.ckptfs, fx.src_dir, mnt, options=bad, **kwargs)
        # The sources are scanned (and decrypted) before the options are read: on a slow
        # machine a progress line comes first.
        lines = [line for line in itest.stderr_lines(proc) if not line.startswith("scan: ")]
        assert len(lines) == 1 and bad in lines[0], proc.stderr


def main():
    args = itest.parse_args()
    checks = itest.Checks(args.only)
    checks.run(f"-o decrypt_max=16M: {SOURCES} encrypted sources read stay within it", bounded,
               args)
    checks.run("-o decrypt_max: a bad value is refused in one line", bad_value, args)
    checks.finish()


if __name__ == "__main__":
    main()
