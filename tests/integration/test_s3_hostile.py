"""Sources straight from S3 against a store that misbehaves (issue 33's rule: never a wrong byte,
a hang or a crash; bad input gets one line naming s3://BUCKET/KEY). The store is s3fake, a
fake S3 server answering from a dict, which can misbehave where a real one cannot be made to.
Expected bytes are the fixture generator's files.

* fake_serves: the fixture mounted from the fake store is byte-identical (the fake is sound).
* no_etag_refused: a store whose GET answers carry no ETag (and that ignores If-Match): the
  mount is refused with one line naming the object, instead of trusting bytes nothing checks.
* weak_etag_refused: a store (or a proxy before it) whose GET answers carry weak ETags
  (W/"..."): the mount is refused with one line naming the object and saying why.
* unquoted_listing_served: a listing that gives ETags without their quotes while GETs quote
  them: the mount serves exact bytes (was: every READ failed as "changed"), and objects rewritten
  after the mount still give EIO.
* ignored_if_match_eio: a store that ignores If-Match but sends the ETag: objects rewritten
  (same size) after the mount give EIO, never the new bytes.
* replaced_after_listing: every object replaced between the LIST and the first GET: the mount
  is refused with one line saying it changed.
* listing_loops: a listing that repeats its continuation token for ever is refused with one line
  within seconds (not listed for good).
* hostile_xml: a listing with an entity bomb and an external entity: refused with one line
  within seconds, nothing read from the local disk.
* odd_listing: a duplicate entry, a key outside the prefix and a `..` key: a sound mount that
  never GETs the last two; two keys naming one file (PREFIX//x and PREFIX/x): refused with
  one line naming both, instead of serving whichever was listed last.
* unstageable_keys_refused: a key beside another that needs it as a folder (P/x and P/x/y), or
  with a part over 255 bytes: the mount is refused with one line naming the keys' URLs (was: a
  message naming a temporary folder).
* bad_answers_refused: every GET answered with another range, fewer or more bytes, or a cut
  body: `inspect s3://...` fails with one line naming the object, in bounded time.
* whole_answer_eio: every GET answered 200 with the whole object: READs fail with EIO (the log
  says the range was ignored), with or without fetch-ahead.
* flaky_answers_served: every other GET answered so (or 503): the mount serves exact bytes.
* get_error_named: a 403 with an S3 error body: the line names the object and the S3 code.
* drip_gives_up: a store that sends a byte every 50 ms: a READ ends with EIO within a minute
  (each GET given up after --s3-timeout under 16 KiB/s, then retried once: AWS_MAX_ATTEMPTS=2,
  as in bad_answers_refused), with or without
  fetch-ahead; `umount -z` while READs wait on it: the daemon exits within a minute.
* odd_keys: keys with %, +, spaces, ?, # and unicode are fetched by their own key; `inspect`
  of a prefix says so by its URL (was: the staged temp folder's path).
* bucket_not_a_host: `s3://HOST:PORT#/x` (and `a@HOST:PORT?`) with no endpoint: refused with one
  line before any request, instead of a signed request sent to HOST:PORT.
* no_secret_printed: no line of any check above showed the secret key.
"""

import errno
import os
import socket
import subprocess
import threading
import time

import itest
import ckpt_fixture
import s3fake
from test_s3_native import read_all  # every served file's bytes or its OSError

BUCKET = "ckpt"
PREFIX = "train"
SECRET = "fake-secret-never-printed"


class Setup:
    def __init__(self, args, s3):
        self.args, self.s3 = args, s3
        self.fx = ckpt_fixture.make_builtin("demo", os.path.join(args.work, "fixture"),
                                            shared=args.shared)
        self.files = {}
        for rel in itest.tree_files(self.fx.src_dir):
            with open(os.path.join(self.fx.src_dir, rel), "rb") as f:
                self.files[rel] = f.read()
        self.put_all()
        self.url = f"s3://{BUCKET}/{PREFIX}"
        self.outputs = []  # every stderr and log text, for no_secret_printed
        self.n = 0
        os.environ["AWS_ACCESS_KEY_ID"] = "fakekey"
        os.environ["AWS_SECRET_ACCESS_KEY"] = SECRET
        os.environ["AWS_REGION"] = "us-east-1"

    def put_all(self, transform=None, prefix=PREFIX):
        for rel, data in self.files.items():
            self.s3.put(f"{prefix}/{rel}", transform(data) if transform else data)

    def data_keys(self):
        return sorted(r for r in self.files if r.endswith(".ckpt"))

    def fresh(self, name):
        self.n += 1
        return os.path.join(self.args.work, f"{name}-{self.n}")

    def args_s3(self, timeout=None):
        return ["--s3-endpoint", self.s3.endpoint] + (
            ["--s3-timeout", str(timeout)] if timeout else [])

    def mount(self, extra=(), timeout=None, url=None):
        log = self.fresh("log")
        self.last_log = log
        return itest.mounted(self.args.ckptfs, url or self.url, self.fresh("mnt"),
                             src_strategy=self.fx.src_strategy,
                             dst_strategy=self.fx.dst_strategy, index_dir=self.fresh("idx"),
                             log_file=log, extra_args=self.args_s3(timeout) + list(extra))

    def log_text(self):
        with open(self.last_log) as f:
            text = f.read()
        self.outputs.append(text)
        return text

    def refused(self, url=None, timeout=60):
        proc = itest.refused_mount(self.args.ckptfs, url or self.url, self.fresh("refused"),
                                   timeout=timeout, src_strategy=self.fx.src_strategy,
                                   dst_strategy=self.fx.dst_strategy,
                                   index_dir=self.fresh("idx"), extra_args=self.args_s3())
        lines = itest.stderr_lines(proc)
        self.outputs.append(proc.stderr)
        print(f"  {lines}", flush=True)
        assert len(lines) == 1, lines
        return lines[0]

    def refused_line(self, message):
        """The one line of a refused mount's stderr in `message` (mounted()'s assertion)."""
        self.outputs.append(message)
        lines = [line for line in message.split(": ", 1)[1].splitlines() if line.strip()]
        print(f"  {lines}", flush=True)
        assert len(lines) == 1, lines
        return lines[0]

    def inspect(self, rel, timeout=None):
        proc = itest.run([self.args.ckptfs, "inspect", f"{self.url}/{rel}"]
                         + self.args_s3(timeout), check=False, timeout=120)
        self.outputs.append(proc.stderr)
        return proc


def expected(setup):
    return {f"rank_{t}/{os.path.basename(p)}": open(p, "rb").read()
            for t, p in setup.fx.expected_files().items()}


def assert_never_wrong(setup, served):
    """Every expected file is served exactly or fails with EIO; returns the failed ones (of all
    the served files: the mount's other views too)."""
    want = expected(setup)
    assert set(want) <= set(served), (sorted(want), sorted(served))
    failed = {rel: e for rel, e in served.items() if isinstance(e, OSError)}
    assert all(e.errno == errno.EIO for e in failed.values()), failed
    wrong = [rel for rel, data in want.items()
             if not isinstance(served[rel], OSError) and served[rel] != data]
    assert not wrong, f"wrong bytes served for {wrong}"
    return failed


def refusal_or_sound(setup, extra=(), then=None):
    """The one line of a refused mount; or, when it mounts, None once every expected file read
    (after `then()`) was exact or EIO."""
    try:
        with setup.mount(extra) as mnt:
            if then:
                then()
            assert_never_wrong(setup, read_all(mnt))
    except AssertionError as e:
        if "mount failed" not in str(e):
            raise
        return setup.refused_line(str(e))
    return None


def rewritten(data):
    """Same size, other bytes."""
    return bytes((b ^ 0x5A) for b in data)


def fake_serves(setup):
    with setup.mount() as mnt:
        problems = ckpt_fixture.compare_tree(setup.fx, mnt)
    assert not problems, problems
    assert all(r["if_match"] for r in setup.s3.requests), "a GET without If-Match"


def no_etag_refused(setup):
    setup.s3.ignore_if_match = True
    setup.s3.get_fault = lambda n, key, rng: "no-etag"
    try:
        # Were it mounted, nothing would catch the objects rewritten underneath it.
        line = refusal_or_sound(setup, ["-o", "readahead_max=0"],
                                lambda: setup.put_all(rewritten))
    finally:
        setup.s3.ignore_if_match, setup.s3.get_fault = False, None
        setup.put_all()
    assert line is not None, "mounted from a store that sends no ETag"
    assert f"s3://{BUCKET}/{PREFIX}/" in line and "no ETag" in line, line


def weak_etag_refused(setup):
    setup.s3.get_fault = lambda n, key, rng: "weak-etag"
    try:
        line = refusal_or_sound(setup, ["-o", "readahead_max=0"])
    finally:
        setup.s3.get_fault = None
    assert line is not None, "mounted from a store that sends weak ETags"
    assert f"s3://{BUCKET}/{PREFIX}/" in line and "weak" in line, line


def rewritten_under_mount(setup, quirk, before=None):
    """With the store's `quirk` attribute set, mounts, runs `before(mnt)`, rewrites every object
    and reads all: every expected file is exact or EIO, and some failed."""
    setattr(setup.s3, quirk, True)
    try:
        with setup.mount(["-o", "readahead_max=0"]) as mnt:
            if before:
                before(mnt)
            setup.put_all(rewritten)
            served = read_all(mnt)
    finally:
        setattr(setup.s3, quirk, False)
        setup.put_all()
    failed = assert_never_wrong(setup, served)
    assert failed, "nothing failed though every object changed"


def unquoted_listing_served(setup):
    def exact(mnt):
        problems = ckpt_fixture.compare_tree(setup.fx, mnt)
        assert not problems, problems
    rewritten_under_mount(setup, "unquoted_listing", exact)


def ignored_if_match_eio(setup):
    rewritten_under_mount(setup, "ignore_if_match")
    assert "changed since it was scanned" in setup.log_text()


def replaced_after_listing(setup):
    swapped = threading.Event()

    def swap(n, key, rng):
        if not swapped.is_set():  # the first GET: the listing is done, nothing is read yet
            swapped.set()
            for rel, data in setup.files.items():
                k = f"{PREFIX}/{rel}"
                setup.s3.objects[k] = rewritten(data)
                setup.s3.etags[k] = '"new-' + str(len(data)) + '"'
        return None
    setup.s3.get_fault = swap
    try:
        line = setup.refused()
    finally:
        setup.s3.get_fault = None
        setup.put_all()
    assert f"s3://{BUCKET}/{PREFIX}/" in line and "changed" in line, line


def refused_listing(setup, page):
    """The one line of a mount refused, within 20 s, over a store whose every listing is `page`."""
    setup.s3.list_answer = lambda prefix, token: (200, page)
    start = time.monotonic()
    try:
        line = setup.refused(timeout=30)
    finally:
        setup.s3.list_answer = None
    assert time.monotonic() - start < 20
    assert setup.url in line, line
    return line


def listing_loops(setup):
    page = ("<ListBucketResult><IsTruncated>true</IsTruncated>"
            "<NextContinuationToken>again</NextContinuationToken></ListBucketResult>")
    line = refused_listing(setup, page)
    assert "continuation token" in line, line


def listing_xml(entries):
    return ("<?xml version=\"1.0\"?><ListBucketResult>" + "".join(
        f"<Contents><Key>{k}</Key><Size>{size}</Size><ETag>{etag.replace(chr(34), '&quot;')}"
        "</ETag></Contents>" for k, size, etag in entries)
        + "<IsTruncated>false</IsTruncated></ListBucketResult>")


def fixture_entries(setup):
    return [(f"{PREFIX}/{rel}", len(data), setup.s3.etags[f"{PREFIX}/{rel}"])
            for rel, data in sorted(setup.files.items())]


def hostile_xml(setup):
    bomb = ("<!DOCTYPE r [<!ENTITY a \"aaaaaaaaaa\"><!ENTITY b \"&a;&a;&a;&a;&a;&a;&a;&a;&a;"
            "&a;\"><!ENTITY c \"&b;&b;&b;&b;&b;&b;&b;&b;&b;&b;\"><!ENTITY d \"&c;&c;&c;&c;&c;&c;"
            "&c;&c;&c;&c;\"><!ENTITY e \"&d;&d;&d;&d;&d;&d;&d;&d;&d;&d;\"><!ENTITY f \"&e;&e;&e;"
            "&e;&e;&e;&e;&e;&e;&e;\"><!ENTITY g \"&f;&f;&f;&f;&f;&f;&f;&f;&f;&f;\">"
            "<!ENTITY x SYSTEM \"file:///etc/hostname\">]>")
    page = listing_xml(fixture_entries(setup)).replace(
        "<ListBucketResult>", bomb + "<ListBucketResult>" +
        f"<Contents><Key>{PREFIX}/&x;.bin</Key><Size>3</Size><ETag>&g;</ETag></Contents>")
    line = refused_listing(setup, page)
    with open("/etc/hostname") as f:
        assert f.read().strip() not in line, line


def odd_listing(setup):
    entries = fixture_entries(setup)
    # The same entry twice, a key outside the prefix, a key that climbs out of it.
    odd = entries + [entries[0], ("other/rank_0.ckpt", 1, '"e"'), (f"{PREFIX}/../up.ckpt", 1,
                                                                  '"e"')]
    setup.s3.list_answer = lambda prefix, token: (200, listing_xml(odd))
    try:
        with setup.mount() as mnt:
            problems = ckpt_fixture.compare_tree(setup.fx, mnt)
    finally:
        setup.s3.list_answer = None
    assert not problems, problems
    keys = {r["key"] for r in setup.s3.requests}
    assert "other/rank_0.ckpt" not in keys and f"{PREFIX}/../up.ckpt" not in keys, keys
    # Another key naming the same file, other bytes, listed after the fixture's own.
    rel = setup.data_keys()[0]
    twin = f"{PREFIX}//{rel}"
    setup.s3.put(twin, rewritten(setup.files[rel]))
    odd = entries + [(twin, len(setup.files[rel]), setup.s3.etags[twin])]
    setup.s3.list_answer = lambda prefix, token: (200, listing_xml(odd))
    try:
        line = refusal_or_sound(setup)
    finally:
        setup.s3.list_answer = None
        del setup.s3.objects[twin]
    assert line is not None, f"{twin} and {PREFIX}/{rel} were mounted as one file"
    assert twin in line and f"{PREFIX}/{rel}" in line, line


def unstageable_keys_refused(setup):
    entries = fixture_entries(setup)
    rel = setup.data_keys()[0]
    long_part = "x" * 256
    for extra, named in (((f"{PREFIX}/{rel}/y", 1, '"e"'), [f"{PREFIX}/{rel}", "folder"]),
                         ((f"{PREFIX}/rank_0/{long_part}", 1, '"e"'), [long_part, "256 bytes"])):
        odd = entries + [extra]
        setup.s3.list_answer = lambda prefix, token, odd=odd: (200, listing_xml(odd))
        try:
            line = refusal_or_sound(setup)
        finally:
            setup.s3.list_answer = None
        assert line is not None, f"mounted with {extra[0]}"
        assert all(n in line for n in named) and f"s3://{BUCKET}/" in line, line
        assert "ckptfs-s3." not in line, line


def bad_answers_refused(setup):
    """Answers no sound store gives: each is one line naming the object (and what was wrong),
    within seconds and a few GETs; the redirect, which points back at itself, is not followed."""
    rel = setup.data_keys()[0]
    key = f"s3://{BUCKET}/{PREFIX}/{rel}"
    for fault, says in (("other-range", key), ("short", key), ("long", key), ("cut", key),
                        ("redirect", "HTTP 307"), ("huge-length", key),
                        ("resized", "changed since it was scanned"),
                        ("multipart", "no Content-Range")):
        setup.s3.get_fault = lambda n, key, rng, fault=fault: fault
        gets = len(setup.s3.requests)
        start = time.monotonic()
        try:
            with itest.attempts(2):
                proc = setup.inspect(rel, timeout=2)
        finally:
            setup.s3.get_fault = None
        took = time.monotonic() - start
        sent = len(setup.s3.requests) - gets
        lines = itest.stderr_lines(proc)
        print(f"  {fault} ({took:.1f}s, {sent} GETs): {lines}", flush=True)
        assert proc.returncode != 0 and len(lines) == 1, (fault, proc.stdout, lines)
        assert key in lines[0] and says in lines[0], (fault, lines)
        assert took < 30 and sent < 20, (fault, took, sent)


def whole_answer_eio(setup):
    # A READ asks for part of an object; a 200 with all of it is not that part.
    for extra in ([], ["-o", "readahead_max=0"]):
        with setup.mount(extra) as mnt:
            setup.s3.get_fault = lambda n, key, rng: "whole"
            try:
                failed = assert_never_wrong(setup, read_all(mnt))
            finally:
                setup.s3.get_fault = None
        assert failed, extra
        assert "ignored the byte range" in setup.log_text(), extra


def flaky_answers_served(setup):
    for fault in ("short", "cut", "503"):  # a store's passing trouble, retried
        setup.s3.get_fault = lambda n, key, rng, fault=fault: fault if n % 2 else None
        try:
            with setup.mount() as mnt:
                served = read_all(mnt)
        finally:
            setup.s3.get_fault = None
        assert not assert_never_wrong(setup, served), fault


def get_error_named(setup):
    rel = setup.data_keys()[0]
    setup.s3.get_fault = lambda n, key, rng: "403"
    try:
        proc = setup.inspect(rel)
    finally:
        setup.s3.get_fault = None
    lines = itest.stderr_lines(proc)
    print(f"  {lines}", flush=True)
    assert proc.returncode != 0 and len(lines) == 1, lines
    assert f"s3://{BUCKET}/{PREFIX}/{rel}" in lines[0] and "ExpiredToken" in lines[0], lines


def drip_gives_up(setup):
    setup.s3.drip_seconds = 0.05
    rel = sorted(expected(setup))[0]
    for extra in ([], ["-o", "readahead_max=0"]):
        dripping = threading.Event()
        setup.s3.get_fault = lambda n, key, rng: "drip" if dripping.is_set() else None
        try:
            with itest.attempts(2), setup.mount(extra, timeout=2) as mnt:
                dripping.set()
                start = time.monotonic()
                try:
                    with open(os.path.join(mnt, rel), "rb") as f:
                        f.read()
                except OSError as e:
                    assert e.errno == errno.EIO, e
                else:
                    raise AssertionError(f"{rel} was read from a store that drips")
                took = time.monotonic() - start
                print(f"  {extra}: the read failed after {took:.1f}s", flush=True)
                assert took < 60, took
                if extra:
                    continue
                # Stopping while READs wait on dripping GETs: they end, then the daemon.
                pids = itest.daemon_pids(setup.args.ckptfs, mnt)
                reader = threading.Thread(target=read_all, args=(mnt,), daemon=True)
                reader.start()
                time.sleep(1)
                start = time.monotonic()
                itest.run([setup.args.ckptfs, "umount", "-z", mnt])
                reader.join(90)
                while any(os.path.exists(f"/proc/{p}") for p in pids) and \
                        time.monotonic() - start < 90:
                    time.sleep(0.1)
                took = time.monotonic() - start
                print(f"  the daemon exited {took:.1f}s after umount -z", flush=True)
                assert took < 60, took
        finally:
            setup.s3.get_fault = None
        assert "GET failed" in setup.log_text()


ODD = ("odd/50% off+more.ckpt", "odd/a b?c#d.ckpt", "odd/ünïcødé-検査.ckpt",
       "odd/semi;colon&amp.ckpt")


def odd_keys(setup):
    rel = setup.data_keys()[0]
    for key in ODD:
        setup.s3.put(key, setup.files[rel])
    for key in ODD:
        mark = len(setup.s3.requests)
        proc = itest.run([setup.args.ckptfs, "inspect", f"s3://{BUCKET}/{key}"] + setup.args_s3(),
                         check=False)
        setup.outputs.append(proc.stderr)
        assert proc.returncode == 0, (key, proc.stderr)
        got = {r["key"] for r in setup.s3.requests[mark:]}
        assert got == {key}, (key, got)
    # A prefix is not one object: said so by its URL, not by a staged temp folder.
    proc = itest.run([setup.args.ckptfs, "inspect", f"s3://{BUCKET}/odd"] + setup.args_s3(),
                     check=False)
    lines = itest.stderr_lines(proc)
    assert proc.returncode != 0 and len(lines) == 1, lines
    assert f"s3://{BUCKET}/odd: a prefix" in lines[0] and "ckptfs-s3." not in lines[0], lines


def bucket_not_a_host(setup):
    # Without an endpoint the bucket is part of AWS's host name: a "bucket" that ends the host
    # early would send the signed request elsewhere.
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    listener.settimeout(0.2)
    port = listener.getsockname()[1]
    saved = {k: os.environ.pop(k) for k in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3")
             if k in os.environ}
    connections = 0
    try:
        for url in (f"s3://127.0.0.1:{port}#/x", f"s3://a@127.0.0.1:{port}?/x"):
            proc = subprocess.Popen([setup.args.ckptfs, "inspect", url], text=True,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            deadline = time.monotonic() + 60
            while proc.poll() is None and time.monotonic() < deadline:
                try:
                    conn, _ = listener.accept()
                    connections += 1
                    conn.close()
                except socket.timeout:
                    pass
            if proc.poll() is None:
                proc.kill()
            err = proc.communicate()[1]
            setup.outputs.append(err)
            lines = [line for line in err.splitlines() if line.strip()]
            print(f"  {url}: {connections} connections, {lines}", flush=True)
            assert connections == 0, f"{url}: a request went to 127.0.0.1:{port}"
            assert proc.returncode != 0 and len(lines) == 1 and url in lines[0], lines
    finally:
        listener.close()
        os.environ.update(saved)


def no_secret_printed(setup):
    assert setup.outputs
    leaked = [o for o in setup.outputs if SECRET in o]
    assert not leaked, leaked[:1]


def main():
    args = itest.parse_args()
    checks = itest.Checks(args.only)
    with s3fake.FakeS3(BUCKET) as s3:
        setup = Setup(args, s3)
        checks.run("fake_serves", fake_serves, setup)
        checks.run("no_etag_refused", no_etag_refused, setup)
        checks.run("weak_etag_refused", weak_etag_refused, setup)
        checks.run("unquoted_listing_served", unquoted_listing_served, setup)
        checks.run("ignored_if_match_eio", ignored_if_match_eio, setup)
        checks.run("replaced_after_listing", replaced_after_listing, setup)
        checks.run("listing_loops", listing_loops, setup)
        checks.run("hostile_xml", hostile_xml, setup)
        checks.run("odd_listing", odd_listing, setup)
        checks.run("unstageable_keys_refused", unstageable_keys_refused, setup)
        checks.run("bad_answers_refused", bad_answers_refused, setup)
        checks.run("whole_answer_eio", whole_answer_eio, setup)
        checks.run("flaky_answers_served", flaky_answers_served, setup)
        checks.run("get_error_named", get_error_named, setup)
        checks.run("drip_gives_up", drip_gives_up, setup)
        checks.run("odd_keys", odd_keys, setup)
        checks.run("bucket_not_a_host", bucket_not_a_host, setup)
        checks.run("no_secret_printed", no_secret_printed, setup)
    checks.finish()


if __name__ == "__main__":
    main()
