"""The starvation guard as data: its policy, the scope's Lease, the gangs waiting in a scope, blockers.

Pure: no I/O, no clock. Parsers take raw Kubernetes dicts (what an adapter
returns) and never raise on a bad value. The guard's RayCluster keys are parsed with every other
cluster annotation (``raygpu.model.annotations.parse_cluster_policy``).
See docs/guard.md.
"""

from __future__ import annotations

import math
from typing import Any

from raygpu.model.annotations import DEFAULT_MAX_HOLD_S, GuardPolicy, parse_guard_policy  # noqa: F401 - the guard's data
from raygpu.model.base import Frozen, timestamp_s
from raygpu.model.labels import ANNOTATION_GUARD_START, ANNOTATION_GUARD_TIMEOUTS, ANNOTATION_RESERVATION_STATE

LEASE_DURATION_S = 30  # a holder that has not renewed for this long (on the reader's clock) has lost the Lease
MAX_TIMEOUTS = 1000  # raygpu.io/guard-timeouts is read bounded: a larger count orders the same


def parse_timeouts(raw: object) -> int:
    """``raygpu.io/guard-timeouts`` as written (a whole number) or as anyone else may have written it
    (``"1.0"``, ``"-4"``, ``"x"``): a whole number from 0 to ``MAX_TIMEOUTS``; never raises."""
    try:
        value = float(str(raw).strip())
    except ValueError:
        return 0
    return int(min(max(value, 0.0), MAX_TIMEOUTS)) if math.isfinite(value) else 0


class LeaseView(Frozen):
    """A coordination.k8s.io/v1 Lease as the guard reads it. ``holder`` "" means released."""

    name: str
    namespace: str
    resource_version: str
    holder: str = ""
    lease_duration_s: int = LEASE_DURATION_S
    renew_time: str = ""  # as written (the holder's clock): compared only for change, never against a clock
    transitions: int = 0
    estimated_start_s: float | None = None  # raygpu.io/guard-estimated-start: the hold's estimate (unix s), if any

    @property
    def record(self) -> tuple[str, str, str]:
        """What changes when the holder renews; the reader times how long it stays the same on its own clock."""
        return (self.holder, self.renew_time, self.resource_version)

    @classmethod
    def from_k8s(cls, obj: dict[str, Any]) -> "LeaseView":
        md, spec = obj["metadata"], obj.get("spec") or {}
        duration = spec.get("leaseDurationSeconds")
        try:
            start: float | None = float((md.get("annotations") or {}).get(ANNOTATION_GUARD_START) or "")
        except (TypeError, ValueError):
            start = None
        return cls(name=md["name"], namespace=md.get("namespace") or "", resource_version=md.get("resourceVersion", ""),
                   holder=spec.get("holderIdentity") or "",
                   lease_duration_s=duration if isinstance(duration, int) and duration > 0 else LEASE_DURATION_S,
                   renew_time=str(spec.get("renewTime") or ""), transitions=int(spec.get("leaseTransitions") or 0),
                   estimated_start_s=start if start is not None and math.isfinite(start) else None)


class WaitingGang(Frozen):
    """A guarded reservation's state ConfigMap: its name, uid, when the API server created it, its state."""

    name: str
    uid: str = ""
    created_at_s: float  # metadata.creationTimestamp: the API server's clock, never a driver's
    state: str = ""
    timeouts: int = 0  # holds of it that ran out: it queues behind gangs that had fewer

    @property
    def waiting(self) -> bool:
        return self.state in ("planned", "reserved")

    @classmethod
    def from_k8s(cls, cm: dict[str, Any]) -> "WaitingGang":
        md = cm["metadata"]
        ann = md.get("annotations") or {}
        timeouts = parse_timeouts(ann.get(ANNOTATION_GUARD_TIMEOUTS, "0"))
        return cls(name=md["name"], uid=md.get("uid", ""), created_at_s=timestamp_s(md.get("creationTimestamp")),
                   state=ann.get(ANNOTATION_RESERVATION_STATE, ""), timeouts=timeouts)


class Blocker(Frozen):
    """One blocker pod as read back: the node it is bound to (``spec.nodeName``), whether it holds that node."""

    name: str
    uid: str = ""
    node: str  # spec.nodeName (set at creation: the API server binds it, no scheduler)
    ended: bool = False  # phase Succeeded or Failed (e.g. a kubelet refused it): it blocks nothing
    deleting: bool = False

    @property
    def holds(self) -> bool:
        return bool(self.node) and not self.ended and not self.deleting


class HoldUnit(Frozen):
    """One blocker to create: ``name`` bound to ``node``."""

    name: str
    node: str


class GuardWiring(Frozen):
    """How one reservation is wired to the starvation guard and to backfill, fixed when ``reserve`` planned it
    (plan/gang/reserve.py) and given to the ``Reservation`` at construction; the watchdog's ``Guard.of`` and
    ``Backfill.of`` read it. Empty (the default): neither guarded nor backfilling."""

    guard: GuardPolicy | None = None  # guarded: the cluster's guard policy (enabled); None: not guarded
    cluster_uid: str = ""  # guarded: the RayCluster's uid (the guard's Events name it)
    template_spec: dict[str, Any] = {}  # guarded: the reserved pods' spec as patched in (nodeSelector, tolerations)
    scope_lease: str = ""  # an unguarded gang with a runtime hint that may backfill: the scope's Lease it reads
