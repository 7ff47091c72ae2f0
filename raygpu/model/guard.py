"""The starvation guard as data: its policy, the scope's Lease, the gangs waiting in a scope, blockers.

Pure: no I/O, no clock. Parsers take raw Kubernetes dicts (what an adapter
returns) and never raise on a bad value. The guard's RayCluster keys are parsed with every other
cluster annotation (``raygpu.model.annotations.parse_cluster_policy``).
See docs/guard.md.
"""

from __future__ import annotations

import math
from enum import Enum
from typing import Any, Mapping

from raygpu.model.annotations import DEFAULT_MAX_HOLD_S, GuardPolicy, parse_guard_policy  # noqa: F401 - the guard's data
from raygpu.errors import PermanentError
from raygpu.model.base import Frozen, timestamp_s
from raygpu.model.labels import (ANNOTATION_EXPECTED_RUNTIME, ANNOTATION_GUARD_ASK, ANNOTATION_GUARD_GANG,
                                 ANNOTATION_GUARD_GRANTS, ANNOTATION_GUARD_START, ANNOTATION_GUARD_TIMEOUTS, LABEL_GUARD_ASK,
                                 ANNOTATION_RESERVATION_STATE, DEFAULT_GUARD_NAMESPACE, GUARD_NAMESPACE_ENV, KEY_GUARD_SCOPE,
                                 LABEL_GUARD_TICKET, dns_label)

LEASE_DURATION_S = 30  # a holder that has not renewed for this long (on the reader's clock) has lost the Lease
STEP_DOWN_S = 2 * LEASE_DURATION_S / 3  # a holder whose last renewal landed this long ago stops blocking: before
#   anyone can take its Lease (LEASE_DURATION_S after they last saw it change, on their clocks)
MAX_TIMEOUTS = 1000  # raygpu.io/guard-timeouts is read bounded: a larger count orders the same


class HoldPhase(str, Enum):
    """Where one guarded gang's hold stands (its driver's view; never written anywhere)."""

    WAITING = "waiting"  # in line: its ticket renewed, the scope held by another or by nobody yet
    CHOOSING = "choosing"  # holds the scope's Lease; no nodes chosen yet (none fit the gang's pods)
    BLOCKING = "blocking"  # nodes chosen: blockers created, waiting for room on each
    SWAPPING = "swapping"  # the swap's patches began (labelled, pinned, ungating): finished even if cut short
    SWAPPED = "swapped"  # every gang pod ungated onto its node; waiting for all to bind
    UNBLOCKED = "unblocked"  # every gang pod bound and the blockers deleted
    STOPPED = "stopped"  # the hold ended early (Lease lost, or not renewed in time): its blockers still to delete
    FAILED = "failed"  # max-hold spent, or the hold lost after the swap: never holds again; the gang is rolled back
    RELEASED = "released"  # the reservation left ``reserved``: blockers, Lease and ticket gone; the guard is done


P = HoldPhase
HELD = frozenset({P.CHOOSING, P.BLOCKING, P.SWAPPING, P.SWAPPED, P.UNBLOCKED})  # holding the scope's Lease
ALLOWED_HOLD_TRANSITIONS: dict[HoldPhase, frozenset[HoldPhase]] = {
    P.WAITING: frozenset({
        P.CHOOSING,  # first in line took (or created) the scope's Lease
        P.RELEASED,  # admitted or released while in line
    }),
    P.CHOOSING: frozenset({
        P.BLOCKING,  # a node per gang pod chosen (plan.guard.choose_nodes)
        P.STOPPED,  # the Lease is another's, or was not renewed for STEP_DOWN_S
        P.FAILED,  # max-hold spent (all this gang's holds together)
        P.RELEASED,
    }),
    P.BLOCKING: frozenset({
        P.SWAPPING,  # every blocker bound and room for the gang on every chosen node
        P.STOPPED, P.FAILED, P.RELEASED,
    }),
    P.SWAPPING: frozenset({
        P.SWAPPED,  # every gang pod labelled, pinned and ungated
        P.STOPPED, P.FAILED, P.RELEASED,
    }),
    P.SWAPPED: frozenset({
        P.UNBLOCKED,  # every gang pod bound: blockers deleted
        P.STOPPED,  # lost after the swap: the gang is rolled back (its failure is set)
        P.FAILED,  # not all bound within max-hold
        P.RELEASED,
    }),
    P.UNBLOCKED: frozenset({
        P.STOPPED, P.FAILED, P.RELEASED,  # the reservation is admitted next (RELEASED) unless the hold is lost first
    }),
    P.STOPPED: frozenset({
        P.WAITING,  # blockers deleted: back in line with the rest of max-hold
        P.FAILED,  # blockers deleted, but the gang was already swapped in: rolled back
        P.RELEASED,
    }),
    P.FAILED: frozenset({
        P.RELEASED,  # the watchdog rolled the gang back: Lease and ticket go
    }),
    P.RELEASED: frozenset(),  # terminal
}
del P


def check_hold_transition(current: HoldPhase, target: HoldPhase) -> HoldPhase:
    """Return ``target`` if ``current -> target`` is an edge of :data:`ALLOWED_HOLD_TRANSITIONS`. Raises
    PermanentError on an illegal edge (a bug in the guard, never a cluster's state); staying in the same
    phase is not an edge."""
    if target not in ALLOWED_HOLD_TRANSITIONS[current]:
        allowed = ", ".join(sorted(p.value for p in ALLOWED_HOLD_TRANSITIONS[current])) or "nothing (terminal)"
        raise PermanentError(f"illegal hold transition {current.value} -> {target.value}; from {current.value} "
                             f"allowed: {allowed}")
    return target


def parse_timeouts(raw: object) -> int:
    """``raygpu.io/guard-timeouts`` as written (a whole number) or as anyone else may have written it
    (``"1.0"``, ``"-4"``, ``"x"``): a whole number from 0 to ``MAX_TIMEOUTS``; never raises."""
    try:
        value = float(str(raw).strip())
    except ValueError:
        return 0
    return int(min(max(value, 0.0), MAX_TIMEOUTS)) if math.isfinite(value) else 0


def guard_namespace(environ: Mapping[str, str]) -> str:
    """The guard namespace of a driver's Kubernetes cluster: ``RAYGPU_GUARD_NAMESPACE`` in ``environ`` (the
    driver's environment) or raygpu-system. Every driver of a cluster must use the same one (one holder per
    scope across namespaces)."""
    return (environ.get(GUARD_NAMESPACE_ENV) or "").strip() or DEFAULT_GUARD_NAMESPACE


def guard_tag(namespace: str, gang: str) -> str:
    """A guarded gang's tag, unique across namespaces: its namespace and state ConfigMap name as one DNS label.
    It is the scope Lease's holderIdentity while it holds, the value of ``raygpu.io/guard-for`` on its pods and
    blockers, and of ``raygpu.io/guard-pass`` on pods it lets in."""
    return dns_label(f"{namespace}.{gang}")


def ticket_name(lease_name: str, tag: str) -> str:
    """The ticket Lease of the gang ``tag`` waiting in the scope whose Lease is ``lease_name``."""
    return f"{lease_name}.{tag}"


class _Renewed(Frozen):
    """A Lease its writer renews: its ``record`` (renewTime, resourceVersion) changes with each renewal, and a
    reader that sees it unchanged for ``lease_duration_s`` on its own clock counts the writer gone."""

    resource_version: str = ""
    renew_time: str = ""
    lease_duration_s: int = LEASE_DURATION_S

    @property
    def record(self) -> tuple[str, str]:
        return (self.renew_time, self.resource_version)


class Ticket(_Renewed):
    """A guarded gang waiting in a scope: its ticket Lease in the guard namespace, renewed by its driver.

    Only a *proven* ticket queues (:meth:`from_k8s` returns None for anything else): it is in the guard
    namespace (only raygpu's identities may write Leases there: deploy/guard/rbac.yaml), labelled
    ``raygpu.io/guard-ticket=<scope>`` and ``raygpu.io/guard-scope=<scope>``, named
    ``<scope lease>.<holderIdentity>`` (:func:`ticket_name`). Its ``record`` changes with each renewal; a
    reader that sees it unchanged for ``lease_duration_s`` on its own clock counts the gang gone."""

    name: str
    uid: str
    tag: str  # its holderIdentity: the gang's guard_tag
    gang: str = ""  # <namespace>/<state ConfigMap>, for messages
    created_at_s: float = 0.0  # metadata.creationTimestamp: the API server's clock
    timeouts: int = 0

    def waiting(self) -> "WaitingGang":
        """As a gang in line (decide_lease's queue): named by its tag."""
        return WaitingGang(name=self.tag, uid=self.uid, created_at_s=self.created_at_s, state="reserved",
                           timeouts=self.timeouts)

    @classmethod
    def from_k8s(cls, obj: dict[str, Any], scope: str, lease_name: str) -> "Ticket | None":
        """The ticket, or None when ``obj`` is not a proven ticket of this scope (a lookalike never queues)."""
        md, spec = obj.get("metadata") or {}, obj.get("spec") or {}
        labels, ann = md.get("labels") or {}, md.get("annotations") or {}
        tag = spec.get("holderIdentity") or ""
        if (not tag or labels.get(LABEL_GUARD_TICKET) != scope or labels.get(KEY_GUARD_SCOPE) != scope
                or md.get("name") != ticket_name(lease_name, tag) or not md.get("uid")):
            return None
        duration = spec.get("leaseDurationSeconds")
        try:
            created = timestamp_s(md.get("creationTimestamp"))
        except (TypeError, ValueError):
            return None
        return cls(name=md["name"], uid=md["uid"], tag=tag, gang=ann.get(ANNOTATION_GUARD_GANG, ""),
                   created_at_s=created,
                   timeouts=parse_timeouts(ann.get(ANNOTATION_GUARD_TIMEOUTS, "0")),
                   resource_version=md.get("resourceVersion", ""), renew_time=str(spec.get("renewTime") or ""),
                   lease_duration_s=duration if isinstance(duration, int) and duration > 0 else LEASE_DURATION_S)


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
    grant_rev: int = 0  # raygpu.io/guard-grants: the answers' revision; only grows while the Lease exists
    grants: dict[str, bool] = {}  # asking gang's tag -> granted (absent: not answered)

    @property
    def record(self) -> tuple[str, str, str]:
        """What changes when the holder renews; the reader times how long it stays the same on its own clock."""
        return (self.holder, self.renew_time, self.resource_version)

    @classmethod
    def from_k8s(cls, obj: dict[str, Any]) -> "LeaseView":
        md, spec = obj["metadata"], obj.get("spec") or {}
        ann = md.get("annotations") or {}
        duration = spec.get("leaseDurationSeconds")
        try:
            start: float | None = float(ann.get(ANNOTATION_GUARD_START) or "")
        except (TypeError, ValueError):
            start = None
        grant_rev, grants = parse_grants(ann.get(ANNOTATION_GUARD_GRANTS))
        return cls(name=md["name"], namespace=md.get("namespace") or "", resource_version=md.get("resourceVersion", ""),
                   holder=spec.get("holderIdentity") or "",
                   lease_duration_s=duration if isinstance(duration, int) and duration > 0 else LEASE_DURATION_S,
                   renew_time=str(spec.get("renewTime") or ""), transitions=int(spec.get("leaseTransitions") or 0),
                   estimated_start_s=start if start is not None and math.isfinite(start) else None,
                   grant_rev=grant_rev, grants=grants)


def format_grants(rev: int, grants: Mapping[str, bool]) -> str:
    """``raygpu.io/guard-grants``: ``<rev>;<tag>=yes|no,...`` (tags are DNS labels: no ``;``, ``=`` or ``,``).
    The revision counts every write for the life of the Lease, across holders (taking or freeing the Lease
    writes ``<rev + 1>;``, no answers): an asker's report of the revision it acted on names one write only."""
    return f"{rev};" + ",".join(f"{t}={'yes' if g else 'no'}" for t, g in sorted(grants.items()))


def parse_grants(raw: object) -> tuple[int, dict[str, bool]]:
    """(revision, answers) from ``raygpu.io/guard-grants``; (0, {}) for anything unreadable. Never raises."""
    rev_s, _, body = str(raw or "").partition(";")
    if not rev_s.strip().isdigit():
        return 0, {}
    rev = int(rev_s)
    out = {}
    for item in filter(None, body.split(",")):
        tag, _, v = item.partition("=")
        if tag and v in ("yes", "no"):
            out[tag] = v == "yes"
    return rev, out


def _whole(raw: str) -> int:
    """A whole number >= 0 as written, 0 for anything else; never raises."""
    raw = raw.strip()
    return int(raw) if raw.isdigit() else 0


def ask_name(lease_name: str, tag: str) -> str:
    """The ask Lease of the backfilling gang ``tag`` in the scope whose Lease is ``lease_name``."""
    return f"{lease_name}.ask.{tag}"


class Ask(_Renewed):
    """A backfilling gang's ask for a pass, as the holder reads it: only a *proven* ask (:meth:`from_k8s`: in
    the guard namespace, labelled ``raygpu.io/guard-ask=<scope lease>``, named
    ``<scope lease>.ask.<holderIdentity>``) is answered. Written by its gang only: its runtime hint,
    the grant revision it last acted on, and how many of its pending pods carry a pass. Its record
    (renewTime, resourceVersion) unchanged for ``lease_duration_s`` on the holder's clock: gone, and the
    holder deletes it."""

    name: str
    tag: str
    uid: str = ""  # the holder deletes a gone ask under this uid precondition
    hint_s: float | None = None
    seen_rev: int = 0
    passes: int = 0

    @classmethod
    def from_k8s(cls, obj: dict[str, Any], lease_name: str) -> "Ask | None":
        md, spec = obj.get("metadata") or {}, obj.get("spec") or {}
        labels, ann = md.get("labels") or {}, md.get("annotations") or {}
        tag = spec.get("holderIdentity") or ""
        if not tag or labels.get(LABEL_GUARD_ASK) != lease_name or md.get("name") != ask_name(lease_name, tag):
            return None
        try:
            hint: float | None = float(ann.get(ANNOTATION_EXPECTED_RUNTIME, ""))
        except ValueError:
            hint = None
        seen_s, _, passes_s = str(ann.get(ANNOTATION_GUARD_ASK, "")).partition(";")
        seen, passes = _whole(seen_s), _whole(passes_s)
        duration = spec.get("leaseDurationSeconds")
        return cls(name=md["name"], tag=tag, uid=md.get("uid", ""), hint_s=hint if hint is not None and 0 < hint < math.inf else None,
                   seen_rev=seen, passes=passes, resource_version=md.get("resourceVersion", ""),
                   renew_time=str(spec.get("renewTime") or ""),
                   lease_duration_s=duration if isinstance(duration, int) and duration > 0 else LEASE_DURATION_S)


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
    owner_uid: str = ""  # the uid of the ticket Lease it is owned by (ownerReference)

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
