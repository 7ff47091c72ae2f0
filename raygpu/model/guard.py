"""The starvation guard as data: its policy, the scope's Lease, the gangs waiting in a scope, blockers.

Pure: no I/O, no clock. Parsers take raw Kubernetes dicts (what an adapter
returns) and never raise on a bad value: ``parse_guard_policy`` reports it as
an :class:`~raygpu.model.annotations.AnnotationProblem` and keeps the default.
See docs/guard.md.
"""

from __future__ import annotations

import math
from typing import Any

from raygpu.model.annotations import AnnotationProblem, parse_duration_s
from raygpu.model.base import Frozen, timestamp_s
from raygpu.model.labels import (ANNOTATION_GUARD_START, ANNOTATION_GUARD_TIMEOUTS, ANNOTATION_RESERVATION_STATE, GUARD_LEASE_PREFIX,
                                 KEY_GUARD, KEY_GUARD_SCOPE, KEY_MAX_HOLD, dns_label)

DEFAULT_MAX_HOLD_S = 900.0  # raygpu.io/max-hold default: 15 minutes
LEASE_DURATION_S = 30  # a holder that has not renewed for this long (on the reader's clock) has lost the Lease
_ON, _OFF = ("on", "true", "yes", "1"), ("off", "false", "no", "0", "")


class GuardPolicy(Frozen):
    """What a RayCluster's annotations say about the guard; every field has the default used for a bad value."""

    enabled: bool = False  # raygpu.io/guard: on
    max_hold_s: float = DEFAULT_MAX_HOLD_S  # raygpu.io/max-hold
    scope: str | None = None  # raygpu.io/guard-scope; None: the namespace

    def scope_for(self, namespace: str) -> str:
        """The scope's name as a DNS label (a node pool, a queue, or the namespace)."""
        return dns_label(self.scope or namespace)

    def lease_name(self, namespace: str) -> str:
        return dns_label(self.scope_for(namespace), GUARD_LEASE_PREFIX)


def parse_guard_policy(annotations: dict[str, str] | None) -> tuple[GuardPolicy, list[AnnotationProblem]]:
    """The guard's annotations on a RayCluster. Never raises: a bad value is a problem and its default."""
    ann = annotations or {}
    fields: dict[str, Any] = {}
    problems: list[AnnotationProblem] = []
    if KEY_GUARD in ann:
        raw = str(ann[KEY_GUARD]).strip().lower()
        if raw in _ON or raw in _OFF:
            fields["enabled"] = raw in _ON
        else:
            problems.append(AnnotationProblem(key=KEY_GUARD, value=str(ann[KEY_GUARD]), reason="expected on or off",
                                              default_used="off"))
    if KEY_MAX_HOLD in ann:
        try:
            fields["max_hold_s"] = parse_duration_s(str(ann[KEY_MAX_HOLD]))
        except ValueError as e:
            problems.append(AnnotationProblem(key=KEY_MAX_HOLD, value=str(ann[KEY_MAX_HOLD]), reason=str(e),
                                              default_used=f"{DEFAULT_MAX_HOLD_S:g}s"))
    if KEY_GUARD_SCOPE in ann:
        raw = str(ann[KEY_GUARD_SCOPE]).strip()
        if raw:
            fields["scope"] = raw
        else:
            problems.append(AnnotationProblem(key=KEY_GUARD_SCOPE, value="", reason="empty",
                                              default_used="the namespace"))
    return GuardPolicy(**fields), problems


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
        try:
            timeouts = max(0, int(ann.get(ANNOTATION_GUARD_TIMEOUTS, "0")))
        except ValueError:
            timeouts = 0
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
