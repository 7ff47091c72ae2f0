"""A small HTTPS upstream for the fault-injecting proxy's unit tests (tests/unit/test_faultproxy.py).

A real TLS server (certificate from ``raygpu.testing.pki``) that records each request; enough of the
Kubernetes API (discovery, ConfigMap get/create/watch) for the official Python client.
"""

from __future__ import annotations

import json
import queue
import socketserver
import ssl
import threading
from http.server import BaseHTTPRequestHandler

TOKEN = "test-token"


class Upstream(socketserver.ThreadingMixIn, socketserver.TCPServer):
    """An HTTPS server that records each request and answers:

    ``/echo...``: status ``X-Status`` (default 200) and a JSON echo of method, path, body, Authorization;
    ``/stream`` and configmap watches: a chunked body of the lines put on ``events(i)`` (None ends it);
    ``/version``, ``/apis``, ``/api/v1``, ``/api/v1/namespaces/<ns>/configmaps[/<name>]``: enough of
    the Kubernetes API for the Python client (discovery, get, create) with bearer ``TOKEN``.
    """

    daemon_threads, block_on_close, allow_reuse_address = True, False, True

    def __init__(self, crt, key) -> None:
        super().__init__(("127.0.0.1", 0), _UpstreamHandler)
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(str(crt), str(key))
        self.socket = ctx.wrap_socket(self.socket, server_side=True)
        self.seen: list[tuple[str, str, bytes]] = []
        self._queues: dict[int, queue.Queue] = {}
        self._streams = 0
        self._lock = threading.Lock()
        self.configmaps: dict[tuple[str, str], dict] = {}
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.server_address[1]}"

    def events(self, i: int = 0) -> queue.Queue:
        """The lines the ``i``-th streaming request (0 first) sends; None ends it."""
        with self._lock:
            return self._queues.setdefault(i, queue.Queue())

    def next_stream(self) -> queue.Queue:
        with self._lock:
            self._streams += 1
        return self.events(self._streams - 1)

    def paths(self, method: str | None = None) -> list[str]:
        return [p for m, p, _ in list(self.seen) if method in (None, m)]


class _UpstreamHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: Upstream

    def log_message(self, *args) -> None:
        pass

    def _json(self, status: int, obj: dict, extra: dict | None = None) -> None:
        body = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        for k, v in (extra or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(body)

    def _any(self) -> None:
        n = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(n) if n else b""
        self.server.seen.append((self.command, self.path, body))
        path = self.path.partition("?")[0]
        if path.startswith("/echo"):
            return self._json(int(self.headers.get("X-Status", "200")), {
                "method": self.command, "path": self.path, "body": body.decode(),
                "auth": self.headers.get("Authorization")}, {"X-Upstream": "yes"})
        if path == "/stream":
            return self._stream()
        if self.headers.get("Authorization") != f"Bearer {TOKEN}":
            return self._json(401, {"kind": "Status", "code": 401, "reason": "Unauthorized", "message": "no"})
        return self._kube(path, body)

    do_GET = do_POST = do_PATCH = do_PUT = do_DELETE = _any

    def _stream(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        events = self.server.next_stream()
        while not self.server.stopping.is_set():
            try:
                line = events.get(timeout=0.05)
            except queue.Empty:
                continue
            if line is None:
                break
            self.wfile.write(b"%x\r\n%s\r\n" % (len(line), line))
        self.wfile.write(b"0\r\n\r\n")

    def _kube(self, path: str, body: bytes) -> None:
        parts = path.strip("/").split("/")
        if path == "/version":
            return self._json(200, {"major": "1", "minor": "34", "gitVersion": "v1.34.4"})
        if path == "/apis":
            return self._json(200, {"kind": "APIGroupList", "apiVersion": "v1", "groups": []})
        if path == "/api/v1":
            return self._json(200, {"kind": "APIResourceList", "groupVersion": "v1", "resources": [
                {"name": "configmaps", "singularName": "configmap", "namespaced": True, "kind": "ConfigMap",
                 "verbs": ["create", "get", "list", "patch", "delete"]}]})
        if parts[:3] == ["api", "v1", "namespaces"] and len(parts) >= 5 and parts[4] == "configmaps":
            ns = parts[3]
            if self.command == "POST":
                obj = json.loads(body)
                obj["metadata"].update(namespace=ns, resourceVersion="1")
                self.server.configmaps[(ns, obj["metadata"]["name"])] = obj
                return self._json(201, obj)
            if "watch=" in self.path:
                return self._stream()
            obj = self.server.configmaps.get((ns, parts[5] if len(parts) > 5 else ""))
            if obj is None:
                return self._json(404, {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 404,
                                        "reason": "NotFound", "message": f"configmaps not found: {path}"})
            return self._json(200, obj)
        return self._json(404, {"kind": "Status", "code": 404, "reason": "NotFound", "message": path})
