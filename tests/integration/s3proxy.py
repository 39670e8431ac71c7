"""A small HTTP proxy in front of the S3 server for the tests of sources read straight from S3:
it forwards every request as is (the Host header too, so SigV4 signatures stay valid), records
each one (method, path, Range header, status), and can be told to answer some GETs of data
objects with a fault instead: a 503, a dropped connection, a stall, or a body cut short.

    with S3Proxy(server.endpoint) as proxy:
        proxy.faults = lambda n, path, rng: "503" if n % 3 == 0 else None  # n: data GET number
        ... ckptfs mount s3://... --s3-endpoint proxy.endpoint ...
        proxy.data_gets()                                                # GETs of data objects
"""

import http.client
import http.server
import socket
import threading
import time
import urllib.parse

DATA_SUFFIXES = (".ckpt", ".safetensors", ".distcp", ".pt", ".pth", ".bin")


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address):
        pass  # a client that hangs up (curl after a stall) is expected here


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def _forward(self):
        proxy = self.server.proxy
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else None
        path = urllib.parse.urlsplit(self.path).path
        is_data = self.command == "GET" and path.endswith(DATA_SUFFIXES) and \
            "strategy" not in path.rsplit("/", 1)[-1]
        fault = None
        with proxy.lock:
            if is_data:
                proxy.data_count += 1
                n = proxy.data_count
                fault = proxy.faults(n, path, self.headers.get("Range")) if proxy.faults else None
            proxy.requests.append({"method": self.command, "path": path, "data": is_data,
                                   "range": self.headers.get("Range"), "fault": fault})
        if fault == "503":
            msg = b"<Error><Code>SlowDown</Code><Message>injected</Message></Error>"
            self.send_response(503)
            self.send_header("Content-Length", str(len(msg)))
            self.end_headers()
            self.wfile.write(msg)
            return
        if fault == "drop":
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)
            return
        conn = http.client.HTTPConnection(proxy.upstream_host, proxy.upstream_port, timeout=60)
        headers = {k: v for k, v in self.headers.items()}
        conn.request(self.command, self.path, body=body, headers=headers)
        resp = conn.getresponse()
        data = resp.read()
        conn.close()
        self.send_response(resp.status)
        for k, v in resp.getheaders():
            if k.lower() not in ("transfer-encoding", "connection", "content-length"):
                self.send_header(k, v)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if fault == "stall" and data:
            self.wfile.write(data[:len(data) // 2])
            self.wfile.flush()
            time.sleep(proxy.stall_seconds)
            self.close_connection = True
            return
        if fault == "cut" and data:
            self.wfile.write(data[:len(data) // 2])
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)
            return
        if self.command != "HEAD":
            self.wfile.write(data)
        with proxy.lock:
            proxy.requests[-1]["status"] = resp.status
            proxy.requests[-1]["bytes"] = len(data)


    do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = _forward


class S3Proxy:
    def __init__(self, upstream, stall_seconds=4):
        u = urllib.parse.urlsplit(upstream)
        self.upstream_host, self.upstream_port = u.hostname, u.port
        self.stall_seconds = stall_seconds
        self.lock = threading.Lock()
        self.requests = []
        self.data_count = 0
        self.faults = None
        self._server = _Server(("127.0.0.1", 0), _Handler)
        self._server.proxy = self
        self.endpoint = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._server.shutdown()
        self._server.server_close()

    def mark(self):
        with self.lock:
            return len(self.requests)

    def since(self, mark):
        with self.lock:
            return list(self.requests[mark:])

    @staticmethod
    def data_gets(requests):
        return [r for r in requests if r["data"]]
