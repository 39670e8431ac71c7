"""A fake S3 server for the tests of misbehaving stores: it answers ListObjectsV2 and ranged GETs
(If-Match honoured) from a dict of objects, and misbehaves on demand where a real server cannot
be made to: a GET that ignores If-Match, omits its ETag, answers another range, the whole
object, fewer bytes or a body that drips; a listing that is hostile XML or loops. Signatures are
not checked (the tests against SeaweedFS do that).

    with FakeS3("ckpt") as s3:                 # http://127.0.0.1:PORT, path-style
        s3.put("run/rank_0.ckpt", data)         # ETag: the quoted md5, as S3's for one part
        s3.get_fault = lambda n, key, rng: ...  # n: GET number; a fault name below, or None
        s3.list_answer = lambda prefix, token: (status, xml) or None for the normal page
        ... ckptfs ... s3://ckpt/run --s3-endpoint s3.endpoint ...
"""

import hashlib
import http.server
import socket
import threading
import time
import urllib.parse
from xml.sax.saxutils import escape

# What get_fault may answer, besides None (a correct answer):
#   "no-etag"      the right bytes, no ETag header
#   "weak-etag"    the right bytes, the ETag made weak (W/"..."), as a re-encoding proxy does
#   "whole"        200 with the whole object, whatever the Range
#   "other-range"  206 with the range one byte further on, its Content-Range saying so
#   "short"        206 with a correct Content-Range but one byte fewer (Content-Length agrees)
#   "cut"          206 whose body stops halfway and the connection closes
#   "long"         206 with one byte more than asked
#   "drip"         206 whose body comes a byte every drip_seconds
#   "503"          503 SlowDown
#   "403"          403 with an S3 error body (ExpiredToken)
#   "redirect"     307 back to the same URL (a client that follows it loops)
#   "huge-length"  206 with the right bytes and Content-Range, Content-Length 2^62, then closed
#   "resized"      206 with the right bytes, its Content-Range giving the object one byte more
#   "multipart"    206 multipart/byteranges holding the range, no Content-Range header
FAULTS = ("no-etag", "weak-etag", "whole", "other-range", "short", "cut", "long", "drip", "503",
          "403", "redirect", "huge-length", "resized", "multipart")


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address):
        pass  # a client that hangs up mid-answer is expected here


def _error(code, message):
    return (f"<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>{code}</Code>"
            f"<Message>{message}</Message></Error>").encode()


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def _send(self, status, body=b"", headers=()):
        self.send_response(status)
        for k, v in headers:
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):  # noqa: N802 (http.server's name)
        fake = self.server.fake
        url = urllib.parse.urlsplit(self.path)
        parts = url.path.split("/", 2)
        if len(parts) < 2 or parts[1] != fake.bucket:
            return self._send(404, _error("NoSuchBucket", "no such bucket"))
        if len(parts) == 2 or parts[2] == "":
            query = urllib.parse.parse_qs(url.query, keep_blank_values=True)
            return self._list(query.get("prefix", [""])[0],
                              query.get("continuation-token", [""])[0])
        self._get(urllib.parse.unquote(parts[2]))

    def _list(self, prefix, token):
        fake = self.server.fake
        with fake.lock:
            fake.lists += 1
            hook = fake.list_answer
        if hook:
            answer = hook(prefix, token)
            if answer is not None:
                return self._send(answer[0], answer[1].encode() if isinstance(answer[1], str)
                                  else answer[1])
        with fake.lock:
            keys = sorted(k for k in fake.objects if k.startswith(prefix))
            start = int(token) if token else 0
            page = keys[start:start + fake.page_size]
            entries = "".join(
                f"<Contents><Key>{escape(k)}</Key><Size>{len(fake.objects[k])}</Size>"
                f"<ETag>{escape(fake.listed_etag(k))}</ETag></Contents>" for k in page)
        more = start + len(page) < len(keys)
        body = ("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<ListBucketResult>"
                f"<Name>{fake.bucket}</Name><Prefix>{escape(prefix)}</Prefix>{entries}"
                f"<IsTruncated>{'true' if more else 'false'}</IsTruncated>"
                + (f"<NextContinuationToken>{start + len(page)}</NextContinuationToken>"
                   if more else "") + "</ListBucketResult>")
        self._send(200, body.encode())

    def _get(self, key):
        fake = self.server.fake
        rng = self.headers.get("Range")
        with fake.lock:
            fake.gets += 1
            n = fake.gets
            data, etag = fake.objects.get(key), fake.etags.get(key)
            fault = fake.get_fault(n, key, rng) if fake.get_fault else None
            fake.requests.append({"key": key, "range": rng, "if_match": self.headers.get(
                "If-Match"), "fault": fault})
        if data is None:
            return self._send(404, _error("NoSuchKey", "no such key"))
        if_match = self.headers.get("If-Match")
        if if_match and if_match != etag and not fake.ignore_if_match:
            return self._send(412, _error("PreconditionFailed", "the ETag does not match"))
        if fault == "503":
            return self._send(503, _error("SlowDown", "injected"))
        if fault == "403":
            return self._send(403, _error("ExpiredToken", "The provided token has expired."))
        if fault == "redirect":
            return self._send(307, b"", [("Location", self.path)])
        etag_header = ([] if fault == "no-etag" else
                       [("ETag", "W/" + etag)] if fault == "weak-etag" else [("ETag", etag)])
        if fault == "whole" or not rng:
            return self._send(200, data, etag_header)
        first, last = (int(x) for x in rng[len("bytes="):].split("-"))
        last = min(last, len(data) - 1)
        if fault == "other-range":
            first, last = first + 1, min(last + 1, len(data) - 1)
        body = data[first:last + 1]
        if fault == "short":
            body = body[:-1]
        if fault == "long":
            body += b"\0"
        total = len(data) + (fault == "resized")
        head = etag_header + [("Content-Range", f"bytes {first}-{last}/{total}")]
        if fault == "multipart":
            part = (f"--B\r\nContent-Type: application/octet-stream\r\nContent-Range: bytes "
                    f"{first}-{last}/{len(data)}\r\n\r\n").encode() + body + b"\r\n--B--\r\n"
            return self._send(206, part, etag_header +
                              [("Content-Type", "multipart/byteranges; boundary=B")])
        if fault == "huge-length":
            self.send_response(206)
            for k, v in head:
                self.send_header(k, v)
            self.send_header("Content-Length", str(1 << 62))
            self.end_headers()
            self.wfile.write(body)
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)
            return
        if fault in ("cut", "drip"):
            self.send_response(206)
            for k, v in head:
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if fault == "cut":
                self.wfile.write(body[:len(body) // 2])
                self.close_connection = True
                self.connection.shutdown(socket.SHUT_RDWR)
                return
            for i in range(len(body)):
                if fake.stopping.is_set():
                    return
                self.wfile.write(body[i:i + 1])
                self.wfile.flush()
                time.sleep(fake.drip_seconds)
            return
        self._send(206, body, head)


class FakeS3:
    def __init__(self, bucket):
        self.bucket = bucket
        self.lock = threading.Lock()
        self.objects, self.etags = {}, {}
        self.page_size = 1000
        self.ignore_if_match = False
        self.unquoted_listing = False  # list ETags without their quotes (GETs keep them)
        self.get_fault = None
        self.list_answer = None
        self.drip_seconds = 0.5
        self.stopping = threading.Event()
        self.gets = self.lists = 0
        self.requests = []
        self._server = _Server(("127.0.0.1", 0), _Handler)
        self._server.fake = self
        self.endpoint = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def put(self, key, data, etag=None):
        with self.lock:
            self.objects[key] = bytes(data)
            self.etags[key] = etag or '"' + hashlib.md5(data).hexdigest() + '"'

    def listed_etag(self, key):
        return self.etags[key].strip('"') if self.unquoted_listing else self.etags[key]

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self.stopping.set()
        self._server.shutdown()
        self._server.server_close()
