"""One client connection of the fault-injecting proxy (``raygpu.testing.faultproxy``): read each request,
apply the action its rule names (``raygpu.testing.faultrules``), forward it and relay the answer.

HTTP/1.1 with keep-alive. Streaming (chunked) answers are copied to the client piece by piece as they
arrive (``read1``), never buffered whole; only ``Fail(forward=True)`` / ``Reset(forward=True)`` read a
whole answer, to drop it. Each log entry is marked done before the client can see the end of its answer,
so that a test that got an answer finds its entry done. Nothing here holds the proxy's lock across I/O.
"""

from __future__ import annotations

import http.client
import logging
import os
import select
import socket
import ssl
import struct
import threading
import time
from http.server import BaseHTTPRequestHandler
from typing import TYPE_CHECKING, Any

from raygpu.testing.faultrules import Action, Delay, EndWatch, Fail, Hang, Request, Reset

if TYPE_CHECKING:
    from raygpu.testing.faultproxy import FaultProxy

log = logging.getLogger("raygpu.testing.faultproxy")
POLL_S = 0.05
# Hop-by-hop headers (RFC 9110 7.6.1) and the ones the proxy sets itself are not copied across.
_HOP = {"connection", "keep-alive", "proxy-connection", "proxy-authenticate", "proxy-authorization", "te",
        "trailer", "transfer-encoding", "upgrade", "host", "content-length", "accept-encoding"}

class ConnectionHandler(BaseHTTPRequestHandler):
    """One client connection (HTTP/1.1, keep-alive): each request is matched against the rules and served.

    Part of ``FaultProxy``: it uses the proxy's internal methods (``_choose``, ``_record``, ``_track``...).
    Constructing it serves the connection until the client or ``stop()`` closes it.
    """

    protocol_version = "HTTP/1.1"
    server: Any

    def __init__(self, conn: socket.socket, addr: Any, proxy: FaultProxy) -> None:
        self.proxy = proxy
        super().__init__(conn, addr, proxy)  # type: ignore[arg-type] - handles the connection, then returns

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        log.debug("faultproxy: " + format, *args)

    def _one(self) -> None:
        path, _, query = self.path.partition("?")
        headers = {k: v for k, v in self.headers.items()}
        body = _read_body(self.rfile, self.headers)
        req = Request(self.command, path, query, headers, body)
        rule, idx = self.proxy._choose(req)
        try:
            self._apply(req, idx, rule.action if rule else None)
        except (OSError, http.client.HTTPException):  # either side went away (or stop() closed it) midway
            self.close_connection = True
            self.proxy._record(idx, done=True)
            raise

    def _apply(self, req: Request, idx: int, action: Action | None) -> None:
        p = self.proxy
        if isinstance(action, Fail) and not action.forward:
            self._fail(action, req, idx)
        elif isinstance(action, Hang):
            self._hang(idx)
        elif isinstance(action, Reset) and not action.forward:
            self._reset(idx)
        elif isinstance(action, Delay) and p._stopping.wait(action.s):
            self._reset(idx)
        else:
            self._forward(req, idx, action)

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = do_OPTIONS = _one

    # --------------------------------------------------------------- answers
    def _fail(self, fail: Fail, req: Request, idx: int, upstream_status: int | None = None) -> None:
        body = fail.body(req.verb, req.path)
        self.send_response_only(fail.status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        if fail.retry_after is not None:
            self.send_header("Retry-After", str(fail.retry_after))
        self.proxy._record(idx, status=fail.status, upstream_status=upstream_status, done=True)  # before the
        self.end_headers()  # client can see the answer, so that a test that got it finds its log entry done
        if req.verb != "HEAD":
            self.wfile.write(body)

    def _reset(self, idx: int, **fields: Any) -> None:
        """Close the connection with a TCP RST (no TLS close_notify, no answer)."""
        self.close_connection = True
        self.proxy._record(idx, status=None, done=True, **fields)
        conn = self.connection
        try:
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            # Close the descriptor now (rfile/wfile hold references that would delay a plain close()),
            # bypassing TLS (no close_notify): with SO_LINGER 0 the kernel answers with an RST.
            os.close(socket.socket.detach(conn))
        except OSError:
            pass

    def _hang(self, idx: int) -> None:
        ev = threading.Event()
        with self.proxy._lock:
            self.proxy._hangs.add(ev)
        try:
            while not (ev.wait(POLL_S) or self.proxy._stopping.is_set() or client_gone(self.connection)):
                pass
        finally:
            with self.proxy._lock:
                self.proxy._hangs.discard(ev)
        self._reset(idx)

    # -------------------------------------------------------------- forward
    def _forward(self, req: Request, idx: int, action: Action | None) -> None:
        p = self.proxy
        up, sock = p._upstream(), None
        try:
            target = req.path + (f"?{req.query}" if req.query else "")
            try:
                up.connect()
                sock = up.sock  # getresponse() forgets it when the upstream says Connection: close
                if not p._track(sock):
                    raise ConnectionError("faultproxy stopping")
                up.putrequest(req.verb, target, skip_accept_encoding=True)
                for k, v in req.headers.items():
                    if k.lower() not in _HOP:
                        up.putheader(k, v)
                if req.body or req.verb in ("POST", "PUT", "PATCH"):
                    up.putheader("Content-Length", str(len(req.body)))
                up.endheaders(req.body or None)
                resp = up.getresponse()
            except (OSError, http.client.HTTPException) as e:
                self._fail(Fail(502, message=f"faultproxy: cannot reach the API server: {e}"), req, idx)
                return
            if isinstance(action, (Fail, Reset)):  # forward=True: the write happens, the answer is lost
                resp.read()
                if isinstance(action, Fail):
                    self._fail(action, req, idx, upstream_status=resp.status)
                else:
                    self._reset(idx, upstream_status=resp.status)
                return
            self._relay(resp, req, idx, action if isinstance(action, EndWatch) else None, sock)
        finally:
            if sock is not None:
                p._untrack(sock)
            up.close()

    def _relay(self, resp: http.client.HTTPResponse, req: Request, idx: int, end: EndWatch | None,
               sock: socket.socket) -> None:
        self.send_response_only(resp.status, resp.reason)
        for k, v in resp.getheaders():
            if k.lower() not in _HOP:
                self.send_header(k, v)
        no_body = req.verb == "HEAD" or resp.status in (204, 304) or 100 <= resp.status < 200
        # Each entry is marked done before the client can see the end of its answer (see _fail).
        if no_body:
            self.send_header("Content-Length", resp.getheader("Content-Length", "0"))
            self.proxy._record(idx, status=resp.status, upstream_status=resp.status, done=True)
            self.end_headers()
            return
        if not resp.chunked and resp.length is not None:
            self.send_header("Content-Length", str(resp.length))
            self.proxy._record(idx, status=resp.status, upstream_status=resp.status, done=resp.length == 0)
            self.end_headers()
            while piece := resp.read(65536):
                if not resp.length:  # the last piece
                    self.proxy._record(idx, done=True)
                self.wfile.write(piece)
            return
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        self.proxy._record(idx, status=resp.status, upstream_status=resp.status, events=0)
        events = self._stream(resp, idx, end, sock)
        self.proxy._record(idx, events=events, done=True)
        self.wfile.write(b"0\r\n\r\n")

    def _stream(self, resp: http.client.HTTPResponse, idx: int, end: EndWatch | None, sock: socket.socket) -> int:
        """Copy ``resp``'s body to the client as chunks, as it arrives; stop where ``end`` says. Returns the
        number of lines (watch events) sent."""
        events = 0
        deadline = None if end is None or end.after_s is None else time.monotonic() + end.after_s
        limit = None if end is None else end.after_events
        while limit is None or events < limit:
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                sock.settimeout(left)
            try:
                piece = resp.read1(65536)
            except TimeoutError:
                break
            except (http.client.IncompleteRead, OSError):
                self.close_connection = True
                break
            if not piece:
                break
            if limit is not None and events + piece.count(b"\n") >= limit:  # cut right after the last event allowed
                cut = 0
                for _ in range(limit - events):
                    cut = piece.index(b"\n", cut) + 1
                piece = piece[:cut]
            events += piece.count(b"\n")
            self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
            self.proxy._record(idx, events=events)
        return events


def _read_body(rfile: Any, headers: Any) -> bytes:
    """The request body: Content-Length bytes, or the decoded chunks of a chunked body."""
    if "chunked" in headers.get("Transfer-Encoding", "").lower():
        out = bytearray()
        while True:
            size = int(rfile.readline().split(b";")[0].strip() or b"0", 16)
            if size == 0:
                while rfile.readline() not in (b"\r\n", b"\n", b""):
                    pass
                return bytes(out)
            out += rfile.read(size)
            rfile.readline()
    n = int(headers.get("Content-Length") or 0)
    return rfile.read(n) if n else b""


def client_gone(conn: socket.socket) -> bool:
    """True if the client closed its end (readable, and a read gives EOF or an error)."""
    try:
        readable, _, _ = select.select([conn], [], [], 0)
        if not readable:
            return False
        conn.setblocking(False)
        try:
            return conn.recv(1024) == b""
        finally:
            conn.setblocking(True)
    except ssl.SSLWantReadError:
        return False
    except (OSError, ValueError):
        return True


def shutdown(s: socket.socket) -> None:
    try:
        socket.socket.shutdown(s, socket.SHUT_RDWR)  # the plain shutdown: wakes a thread blocked reading
    except OSError:
        pass


def close(s: socket.socket) -> None:
    try:
        s.close()
    except OSError:
        pass
