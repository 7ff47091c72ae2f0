"""A fault-injecting HTTPS proxy in front of the testbed's kube-apiserver (issue 14: "Never break a running job").

``FaultProxy`` listens on 127.0.0.1 (port 0 or a given one), terminates TLS with its own serving
certificate (signed by the testbed CA, SAN 127.0.0.1), and forwards every request to the API server over
TLS, verifying the CA. While a test runs, it adds rules (``raygpu.testing.faultrules``) that make chosen
requests fail (500/503/429 with a ``Status`` body), wait, hang, lose their connection, lose their answer
after the write took effect, or end a watch early. ``log`` lists every request and what was done to it.

Promises:

* Streaming responses (watches) go through chunk by chunk, as they arrive; nothing buffers a whole body
  but ``Fail(forward=True)`` / ``Reset(forward=True)``, which must read the answer to drop it.
* One thread per client connection; the one lock guards only the rules and the log, never I/O.
* ``stop()`` (or leaving the ``with`` block) ends every thread and closes every socket it opened,
  hung and streaming requests included, and raises if a thread is still alive after ``join_timeout_s``.
* ``Authorization`` is forwarded as is. Client certificates cannot be: a proxied client must
  authenticate with a bearer token (``kubeconfig_for_token``). ``Accept-Encoding`` is dropped so that
  bodies stay plain (watch events can be counted); upgrades (exec, port-forward) are not supported.

The module reads top down: ``FaultProxy`` (lifecycle, rules, log, the sockets and threads it owns),
``start_for``, then ``ConnectionHandler``, one client connection (HTTP/1.1 with keep-alive): it reads each
request, applies the action its rule names, forwards it and relays the answer. Streaming (chunked) answers
are copied to the client piece by piece as they arrive (``read1``). Each log entry is marked done before
the client can see the end of its answer, so that a test that got an answer finds its entry done.
"""

from __future__ import annotations

import http.client
import logging
import os
import select
import socket
import socketserver
import ssl
import struct
import threading
import time
from dataclasses import replace
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any, Callable
from urllib.parse import urlsplit

from raygpu.testing.faultrules import Action, Delay, EndWatch, Fail, Hang, Request, Reset, Rule, Seen

log = logging.getLogger("raygpu.testing.faultproxy")
HANDSHAKE_TIMEOUT_S = 10.0
POLL_S = 0.05
# Hop-by-hop headers (RFC 9110 7.6.1) and the ones the proxy sets itself are not copied across.
_HOP = {"connection", "keep-alive", "proxy-connection", "proxy-authenticate", "proxy-authorization", "te",
        "trailer", "transfer-encoding", "upgrade", "host", "content-length", "accept-encoding"}


class _Listener(socketserver.TCPServer):
    """The listening socket; each accepted connection is handed to ``FaultProxy._serve`` in its own thread."""

    allow_reuse_address = True

    def __init__(self, addr: tuple[str, int], proxy: FaultProxy) -> None:
        self.proxy = proxy
        super().__init__(addr, None)  # type: ignore[arg-type] - process_request does not use a handler class

    def process_request(self, request: Any, client_address: Any) -> None:
        self.proxy._spawn(request, client_address)

    def shutdown_request(self, request: Any) -> None:  # the connection thread closes it
        pass


class FaultProxy:
    """An HTTPS proxy to ``upstream`` (``https://127.0.0.1:<port>``) that injects the faults its rules say.

    ``ca_file`` verifies the upstream and is what clients of the proxy trust; ``cert_file``/``key_file``
    is the proxy's serving certificate (signed by that CA, valid for 127.0.0.1). Use as a context
    manager, or ``start()`` / ``stop()``.
    """

    def __init__(self, upstream: str, ca_file: str | Path, cert_file: str | Path, key_file: str | Path,
                 port: int = 0, host: str = "127.0.0.1", join_timeout_s: float = 10.0) -> None:
        u = urlsplit(upstream)
        if u.scheme != "https" or not u.hostname or not u.port:
            raise ValueError(f"upstream {upstream!r}: expected https://HOST:PORT")
        self.upstream_host, self.upstream_port = u.hostname, u.port
        self.ca_file, self.host, self.port, self.join_timeout_s = Path(ca_file), host, port, join_timeout_s
        self._server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self._server_ctx.load_cert_chain(str(cert_file), str(key_file))
        self._client_ctx = ssl.create_default_context(cafile=str(ca_file))
        self._lock = threading.Lock()  # rules, log, sockets, threads, hangs: never held across I/O
        self._rules: list[list[Any]] = []  # [rule, uses left or None]
        self._log: list[Seen] = []
        self._socks: set[socket.socket] = set()
        self._threads: set[threading.Thread] = set()
        self._hangs: set[threading.Event] = set()
        self._stopping = threading.Event()
        self._listener: _Listener | None = None
        self._accept_thread: threading.Thread | None = None

    # ------------------------------------------------------------- lifecycle
    @property
    def url(self) -> str:
        """``https://127.0.0.1:<port>``; the port is known once started."""
        return f"https://{self.host}:{self.port}"

    def start(self) -> FaultProxy:
        """Bind and serve in a background thread. Returns self. Idempotent."""
        if self._listener is None:
            self._listener = _Listener((self.host, self.port), self)
            self.port = self._listener.server_address[1]
            self._accept_thread = threading.Thread(target=self._listener.serve_forever, kwargs={"poll_interval": 0.1},
                                                   name=f"faultproxy-accept-{self.port}", daemon=True)
            self._accept_thread.start()
        return self

    def stop(self) -> None:
        """Stop accepting, wake every hung or delayed request, close every socket, join every thread.

        Raises RuntimeError naming the threads still alive after ``join_timeout_s``. Idempotent.
        """
        if self._listener is None:
            return
        self._stopping.set()
        self._listener.shutdown()
        self._listener.server_close()
        assert self._accept_thread is not None
        self._accept_thread.join(self.join_timeout_s)
        with self._lock:
            socks, threads, hangs = list(self._socks), list(self._threads), list(self._hangs)
        for ev in hangs:
            ev.set()
        for s in socks:
            shutdown(s)
        deadline = time.monotonic() + self.join_timeout_s
        for t in threads:
            t.join(max(0.0, deadline - time.monotonic()))
        alive = [t.name for t in threads + [self._accept_thread] if t.is_alive()]
        self._listener = None
        if alive:
            raise RuntimeError(f"faultproxy: threads still alive after stop: {alive}")

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def open_sockets(self) -> int:
        """How many client and upstream sockets are open now (0 after ``stop()``)."""
        with self._lock:
            return len(self._socks)

    # ----------------------------------------------------------------- rules
    def add(self, rule: Rule) -> Rule:
        """Arm ``rule`` after the ones already armed; returns it (for ``seen.rule is rule``)."""
        if not isinstance(rule, Rule):
            raise TypeError(f"add() takes a Rule, not {type(rule).__name__}")
        with self._lock:
            self._rules.append([rule, rule.times])
        return rule

    def clear(self) -> None:
        """Disarm every rule (requests in progress keep the action they got) and release hung requests."""
        with self._lock:
            self._rules.clear()
        self.release()

    def release(self) -> None:
        """Close every hung request's connection now (the client gets no answer)."""
        with self._lock:
            hangs = list(self._hangs)
        for ev in hangs:
            ev.set()

    def spent(self, rule: Rule) -> bool:
        """True when ``rule`` has applied ``times`` times (or was never added / was cleared)."""
        with self._lock:
            return not any(r is rule and left != 0 for r, left in self._rules)

    @property
    def log(self) -> list[Seen]:
        """A copy of the requests seen so far, in arrival order (entries in progress have ``done`` False)."""
        with self._lock:
            return list(self._log)

    def wait_seen(self, pred: Callable[[Seen], bool], timeout_s: float = 10.0) -> Seen:
        """The first finished log entry for which ``pred`` holds; polls until ``timeout_s``, then raises
        AssertionError listing the log."""
        deadline = time.monotonic() + timeout_s
        while True:
            hit = next((s for s in self.log if s.done and pred(s)), None)
            if hit is not None:
                return hit
            if time.monotonic() > deadline:
                raise AssertionError(f"faultproxy: no such request within {timeout_s}s; log: {self.log}")
            time.sleep(POLL_S)

    def write_log(self, path: str | Path) -> Path:
        """Write the whole log to ``path``, one line per request in arrival order (index, verb, path?query, the
        action, what the client and the API server answered, events streamed, done, the rule, the whole body),
        for a failed test to leave behind. Returns the path."""
        path = Path(path)
        lines = [f"{i} {s.verb} {s.path}{'?' + s.query if s.query else ''} action={s.action} status={s.status} "
                 f"upstream={s.upstream_status} events={s.events} done={s.done} "
                 f"rule={s.rule!r} body={s.body.decode('utf-8', 'replace')!r}" for i, s in enumerate(self.log)]
        path.write_text("".join(line + "\n" for line in lines))
        return path

    def kubeconfig_for_token(self, token: str, path: str | Path, user: str = "proxied") -> Path:
        """Write a kubeconfig (mode 0600: it holds a token) that reaches the API server through this proxy."""
        import yaml

        from raygpu.testing.pki import write_private
        path = Path(path)
        write_private(path, yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": "faultproxy",
            "clusters": [{"name": "faultproxy", "cluster": {"server": self.url,
                                                            "certificate-authority": str(self.ca_file)}}],
            "users": [{"name": user, "user": {"token": token}}],
            "contexts": [{"name": "faultproxy", "context": {"cluster": "faultproxy", "user": user}}]}))
        return path

    # ------------------------------------------------------ internals: state
    def _choose(self, req: Request) -> tuple[Rule | None, int]:
        """The first live rule matching ``req`` (its use counted) and the log index of ``req``'s entry."""
        chosen = None
        with self._lock:
            for armed in self._rules:
                rule, left = armed
                if left != 0 and rule.matches(req):
                    armed[1] = None if left is None else left - 1
                    chosen = rule
                    break
            self._log.append(Seen(req.verb, req.path, req.query, req.body,
                                  repr(chosen.action) if chosen else "forward", chosen))
            return chosen, len(self._log) - 1

    def _record(self, index: int, **fields: Any) -> None:
        with self._lock:
            self._log[index] = replace(self._log[index], **fields)

    def _track(self, s: socket.socket) -> bool:
        """Register ``s`` so that stop() can close it; False (and ``s`` closed) if stopping already."""
        with self._lock:
            if not self._stopping.is_set():
                self._socks.add(s)
                return True
        close(s)
        return False

    def _untrack(self, s: socket.socket) -> None:
        with self._lock:
            self._socks.discard(s)
        close(s)

    def _spawn(self, raw: socket.socket, addr: Any) -> None:
        t = threading.Thread(target=self._serve, args=(raw, addr), name=f"faultproxy-conn-{addr[1]}", daemon=True)
        with self._lock:
            self._threads.add(t)
        t.start()

    # ------------------------------------------------- internals: connection
    def _serve(self, raw: socket.socket, addr: Any) -> None:
        try:
            try:
                conn = self._server_ctx.wrap_socket(raw, server_side=True, do_handshake_on_connect=False)
            except OSError:
                close(raw)
                return
            if not self._track(conn):
                return
            try:
                conn.settimeout(HANDSHAKE_TIMEOUT_S)
                conn.do_handshake()
                conn.settimeout(None)
                ConnectionHandler(conn, addr, self)
            except (OSError, ValueError, http.client.HTTPException) as e:  # a side went away, or stop() closed it
                log.debug("faultproxy connection from %s ended: %s", addr, e)
            except Exception:  # noqa: BLE001 - a bug here must not kill the thread silently nor leak the socket
                log.exception("faultproxy connection from %s failed", addr)
            finally:
                self._untrack(conn)
        finally:
            with self._lock:
                self._threads.discard(threading.current_thread())

    def _upstream(self) -> http.client.HTTPSConnection:
        return http.client.HTTPSConnection(self.upstream_host, self.upstream_port, context=self._client_ctx)


def start_for(testbed: Any, port: int = 0) -> FaultProxy:
    """A started proxy in front of ``testbed``'s kube-apiserver (a running ``raygpu.testing.controlplane.Testbed``),
    with a serving certificate signed by the testbed CA (``<run dir>/pki/faultproxy.crt``).

    Raises RuntimeError if the testbed has no API server port recorded (not up).
    """
    from raygpu.testing import pki
    api_port = (testbed.state.get("ports") or {}).get("apiserver")
    if not api_port:
        raise RuntimeError(f"faultproxy.start_for: the testbed at {testbed.root} is not up (no API server port)")
    pkid = Path(testbed.root) / "pki"
    ca = (pkid / "ca.crt", pkid / "ca.key")
    crt, key = pki.ensure_serving_cert(pkid, "faultproxy", ca, ["localhost"])
    return FaultProxy(f"https://127.0.0.1:{api_port}", ca[0], crt, key, port=port).start()


# ------------------------------------------------------------ one client connection
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


__all__ = ["FaultProxy", "start_for", "Rule", "Fail", "Delay", "Hang", "Reset", "EndWatch", "Request", "Seen"]
