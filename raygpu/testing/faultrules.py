"""The rules of the fault-injecting proxy (``raygpu.testing.faultproxy``): what to break, and the log of what was.

A ``Rule`` matches requests (HTTP method, path regex, watch or not, request body) and names one action:

* ``Fail(status)``: answer ``status`` with a ``Status`` body like the API server's (``Retry-After`` and
  ``details.retryAfterSeconds`` for 429 and for a ``retry_after_s``); ``forward=True`` sends the request
  upstream first and drops the real answer: the write happened, the client hears it failed.
* ``Delay(s)``: wait ``s`` seconds, then forward.
* ``Hang()``: never answer; the connection is closed when ``FaultProxy.release()`` or ``stop()`` is
  called, or as soon as the client gives up.
* ``Reset()``: reset the TCP connection (RST) instead of answering; ``forward=True`` resets after the
  request went upstream and its answer came back (the answer is lost).
* ``EndWatch(after_events=N | after_s=T)``: forward a streaming response, then end it cleanly (the last
  chunk, as the API server does when a watch times out) after N events (lines) or T seconds.

Everything here is plain data; the proxy does the I/O.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from typing import Callable, Union

# The ``reason`` the API server puts in a Status for each code (k8s.io/apimachinery/pkg/api/errors).
STATUS_REASONS = {400: "BadRequest", 401: "Unauthorized", 403: "Forbidden", 404: "NotFound", 405: "MethodNotAllowed",
                  409: "Conflict", 410: "Expired", 422: "Invalid", 429: "TooManyRequests", 500: "InternalError",
                  502: "BadGateway", 503: "ServiceUnavailable", 504: "Timeout"}


@dataclass(frozen=True)
class Fail:
    """Answer ``status`` (400-599) with a Kubernetes ``Status`` body instead of the API server's answer.

    ``retry_after_s``: sent as ``Retry-After`` and ``details.retryAfterSeconds`` (default 1 for 429, none
    otherwise). ``forward=True``: the request is forwarded and answered upstream first ("succeeded but
    the answer is lost"); not for watches (the proxy would wait for the stream to end).
    """

    status: int
    retry_after_s: int | None = None
    message: str | None = None
    forward: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.status, int) or not 400 <= self.status <= 599:
            raise ValueError(f"Fail(status={self.status!r}): status must be an int in 400-599")
        if self.retry_after_s is not None and (not isinstance(self.retry_after_s, int) or self.retry_after_s < 0):
            raise ValueError(f"Fail(retry_after_s={self.retry_after_s!r}): must be a whole number of seconds >= 0")

    @property
    def retry_after(self) -> int | None:
        return self.retry_after_s if self.retry_after_s is not None else (1 if self.status == 429 else None)

    def body(self, verb: str, path: str) -> bytes:
        """The ``Status`` object the API server would send for this code (JSON bytes)."""
        status = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                  "message": self.message or f"injected by raygpu.testing.faultproxy: {self.status} for {verb} {path}",
                  "reason": STATUS_REASONS.get(self.status, "InternalError" if self.status >= 500 else "BadRequest"),
                  "code": self.status}
        if self.retry_after is not None:
            status["details"] = {"retryAfterSeconds": self.retry_after}
        return json.dumps(status).encode()


@dataclass(frozen=True)
class Delay:
    """Wait ``s`` seconds (finite, >= 0), then forward as usual. ``stop()`` cuts the wait short (no answer)."""

    s: float

    def __post_init__(self) -> None:
        if not isinstance(self.s, (int, float)) or not math.isfinite(self.s) or self.s < 0:
            raise ValueError(f"Delay(s={self.s!r}): must be a finite number of seconds >= 0")


@dataclass(frozen=True)
class Hang:
    """Read the request and never answer. The proxy closes the connection (no answer) on ``release()`` or
    ``stop()``; if the client gives up first, the request's log entry is done as soon as the proxy sees it."""


@dataclass(frozen=True)
class Reset:
    """Reset the connection (TCP RST, no TLS close) instead of answering.

    ``forward=True``: forward the request and read the whole upstream answer first, then reset: the
    write took effect, the client only sees a broken connection. Not for watches.
    """

    forward: bool = False


@dataclass(frozen=True)
class EndWatch:
    """Forward a streaming (chunked) response, then end it cleanly after ``after_events`` lines (watch
    events) or ``after_s`` seconds from its first byte, whichever comes first. At least one is needed.
    The client sees a normal end of stream, as when the API server's watch times out."""

    after_events: int | None = None
    after_s: float | None = None

    def __post_init__(self) -> None:
        if self.after_events is None and self.after_s is None:
            raise ValueError("EndWatch needs after_events=N or after_s=T")
        if self.after_events is not None and (not isinstance(self.after_events, int) or self.after_events < 0):
            raise ValueError(f"EndWatch(after_events={self.after_events!r}): must be an int >= 0")
        if self.after_s is not None and (not isinstance(self.after_s, (int, float)) or not math.isfinite(self.after_s)
                                         or self.after_s < 0):
            raise ValueError(f"EndWatch(after_s={self.after_s!r}): must be a finite number of seconds >= 0")


Action = Union[Fail, Delay, Hang, Reset, EndWatch]


@dataclass(frozen=True)
class Request:
    """One request as the proxy read it: what a rule's ``when`` predicate is given."""

    verb: str
    path: str
    query: str
    headers: dict[str, str]
    body: bytes

    @property
    def is_watch(self) -> bool:
        from urllib.parse import parse_qs
        return any(v.lower() in ("true", "1") for v in parse_qs(self.query).get("watch", []))


@dataclass(frozen=True, eq=False)
class Rule:
    """Which requests get ``action``. Compared by identity (``seen.rule is rule``).

    ``verb``: HTTP method (GET, POST, PUT, PATCH, DELETE; LIST and WATCH are GETs), None for any.
    ``path``: regex that must match the whole path (no query string). ``watch``: True only watches
    (``?watch=true``), False none, None both; an ``EndWatch`` rule with ``watch=None`` matches only
    watches. ``body_contains``: only requests whose body contains this text. ``when``: any other
    predicate on the ``Request``. ``times``: the rule applies to that many requests, then is spent
    (None: every one). Rules are tried in the order they were added; the first live match wins.
    """

    action: Action
    verb: str | None = None
    path: str = ".*"
    watch: bool | None = None
    times: int | None = None
    body_contains: str | None = None
    when: Callable[[Request], bool] | None = None
    _path_re: re.Pattern = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if not isinstance(self.action, (Fail, Delay, Hang, Reset, EndWatch)):
            raise ValueError(f"Rule(action={self.action!r}): not one of Fail, Delay, Hang, Reset, EndWatch")
        if self.times is not None and (not isinstance(self.times, int) or self.times < 1):
            raise ValueError(f"Rule(times={self.times!r}): must be an int >= 1 or None")
        try:
            object.__setattr__(self, "_path_re", re.compile(self.path))
        except re.error as e:
            raise ValueError(f"Rule(path={self.path!r}): not a regular expression: {e}") from None

    def matches(self, req: Request) -> bool:
        if self.verb is not None and self.verb.upper() != req.verb.upper():
            return False
        if not self._path_re.fullmatch(req.path):
            return False
        watch = True if self.watch is None and isinstance(self.action, EndWatch) else self.watch
        if watch is not None and watch != req.is_watch:
            return False
        if self.body_contains is not None and self.body_contains.encode() not in req.body:
            return False
        return self.when is None or bool(self.when(req))


@dataclass(frozen=True)
class Seen:
    """One request in ``FaultProxy.log``.

    ``action``: ``"forward"`` or the action applied (``repr``). ``status``: what the client got, None
    when it got no answer (reset, hang, stop) or the request is still in progress (``done`` False).
    ``upstream_status``: what the API server answered, None when nothing was forwarded (or the API server
    could not be reached). ``events``: lines streamed to the client for a chunked response, else None.
    """

    verb: str
    path: str
    query: str
    body: bytes
    action: str
    rule: Rule | None
    status: int | None = None
    upstream_status: int | None = None
    events: int | None = None
    done: bool = False
