"""Read the testbed API server's audit log: how many requests an identity made, by verb and resource.

The testbed audits every identity but its own (``controlplane.AUDIT_POLICY``)
at Metadata level, one JSON line per stage; a request is counted once, by its
``auditID``, at its last stage seen (``ResponseComplete``, or ``ResponseStarted``
for a watch still open).
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

from raygpu.model.base import timestamp_s


@dataclass
class Request:
    user: str
    verb: str  # get, list, watch, patch, create, ...
    resource: str  # e.g. "pods", "rayclusters.ray.io", "events"
    at_s: float  # unix seconds of requestReceivedTimestamp
    code: int | None = None
    user_agent: str = ""


@dataclass
class AuditCount:
    users: dict[str, Counter] = field(default_factory=dict)  # user -> Counter of "verb resource"

    def total(self, user: str) -> int:
        return sum(self.users.get(user, Counter()).values())


def read_requests(path: Path, users: Iterable[str] | None = None, since_s: float = 0.0,
                  until_s: float = float("inf")) -> list[Request]:
    """Requests received in [since_s, until_s) by ``users`` (all audited users when None), one per auditID."""
    wanted = set(users) if users is not None else None
    seen: dict[str, Request] = {}
    for p in [*sorted(path.parent.glob(path.stem + "-*" + path.suffix)), path]:  # rotated backups first
        if not p.exists():
            continue
        with open(p) as f:
            for line in f:
                try:
                    ev = json.loads(line)
                except ValueError:
                    continue
                user = (ev.get("user") or {}).get("username", "")
                if wanted is not None and user not in wanted:
                    continue
                at = timestamp_s(ev["requestReceivedTimestamp"])
                if not since_s <= at < until_s:
                    continue
                ref = ev.get("objectRef") or {}
                res = ref.get("resource", ev.get("requestURI", "?"))
                if ref.get("apiGroup"):
                    res = f"{res}.{ref['apiGroup']}"
                seen[ev["auditID"]] = Request(user=user, verb=ev.get("verb", "?"), resource=res, at_s=at,
                                              code=(ev.get("responseStatus") or {}).get("code"),
                                              user_agent=ev.get("userAgent", ""))
    return sorted(seen.values(), key=lambda r: r.at_s)


def count(requests: Iterable[Request]) -> AuditCount:
    out = AuditCount()
    for r in requests:
        out.users.setdefault(r.user, Counter())[f"{r.verb} {r.resource}"] += 1
    return out
