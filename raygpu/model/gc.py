"""Reservation garbage collection as data: what a reservation's state ConfigMap says, and the verdict.

The gang module keeps each reservation's state on a ConfigMap (see
``raygpu.gang.reservation``). The sidecar parses those ConfigMaps into
:class:`ReservationRecord` as soon as they enter, and
``raygpu.plan.reclaim.gc.plan_gc`` turns them (with Ray's view, and what the sidecar
saw when, :class:`SeenAt` and :class:`OrphanGroup`) into a :class:`GcPlan`:
one :class:`GcDecision` per reservation, keep or release, with a reason.

Proof of creation: the collector touches only what raygpu provably created.
A state ConfigMap is raygpu's when ``ReservationRecord.owned_by`` (labels
``raygpu.io/reservation`` and ``raygpu.io/cluster`` of this cluster, and an
ownerReference to this RayCluster's uid, as ``gang.reservation.reserve``
creates it); a worker group when ``is_reservation_group`` (its pod template
carries ``raygpu.io/reservation=<the group's own name>``, as
``gang.backends`` builds it). Pure data: no I/O, no ray/kubernetes imports.
"""

from __future__ import annotations

from enum import Enum
from typing import Any

from raygpu.model.base import Frozen, timestamp_s
from raygpu.model.guard import parse_timeouts
from raygpu.model.labels import (ANNOTATION_DEADLINE, ANNOTATION_GUARD_TIMEOUTS, ANNOTATION_HEARTBEAT,
                                 ANNOTATION_PLACEMENT_GROUP, ANNOTATION_RESERVATION_STATE, CREATED_BY_SCALE_UP,
                                 KEY_GUARD_SCOPE, LABEL_CLUSTER, LABEL_CREATED_BY, LABEL_OWNER_JOB, LABEL_RESERVATION,
                                 dns_label)
from raygpu.model.raycluster import GroupTemplate

DEFAULT_HEARTBEAT_TIMEOUT_S = 60.0


def _seconds(raw: Any) -> float | None:
    try:
        return float(raw) if raw not in (None, "") else None
    except (TypeError, ValueError):
        return None


class ReservationRecord(Frozen):
    """One reservation's state ConfigMap, typed.

    ``state`` is the raw annotation value (an unknown value is kept, so the
    planner can say so); ``heartbeat_at_s``/``deadline_at_s`` are None when the
    annotation is absent or not a number. Both are the *driver's* clock: the
    planner never compares them with the sidecar's (see ``SeenAt``).
    """

    name: str  # the ConfigMap's name (GangPlan.gang_name)
    namespace: str
    group: str  # label raygpu.io/reservation: the reservation's worker group ("" when the label is absent)
    cluster: str | None = None  # label raygpu.io/cluster
    state: str | None = None
    placement_group_id: str | None = None  # hex, once the driver created the Ray PG
    owner_job: str | None = None  # Ray job id (hex) of the driver
    heartbeat_at_s: float | None = None
    deadline_at_s: float | None = None
    created_at_s: float = 0.0
    uid: str = ""
    owner_uids: tuple[str, ...] = ()  # uids of its RayCluster ownerReferences
    guard_scope: str | None = None  # label raygpu.io/guard-scope: a guarded reservation's scope (docs/guard.md)
    guard_timeouts: int = 0  # annotation raygpu.io/guard-timeouts: its holds that ran out (0 if absent or bad)
    created_by: str | None = None  # label raygpu.io/created-by: "gang-scale-up" when the sidecar made it

    @property
    def by_scale_up(self) -> bool:
        """Made by the sidecar's gang scale-up for a placement group raygpu did not create (docs/gang-scale-up.md):
        judged by that placement group in Ray's table, never by a heartbeat."""
        return self.created_by == CREATED_BY_SCALE_UP

    def owned_by(self, cluster: str, cluster_uid: str) -> bool:
        """True when raygpu provably created this ConfigMap for RayCluster ``cluster`` (uid ``cluster_uid``).

        Labels ``raygpu.io/reservation`` (non-empty) and ``raygpu.io/cluster`` =
        the cluster's DNS label, and an ownerReference to that cluster's uid.
        """
        return bool(self.group and self.uid and cluster_uid and self.cluster == dns_label(cluster)
                    and cluster_uid in self.owner_uids)

    def missing_proof(self, cluster: str, cluster_uid: str) -> str:
        """Which proof of ``owned_by`` is missing, for humans ("" when none)."""
        if not self.group:
            return f"no label {LABEL_RESERVATION}"
        if self.cluster != dns_label(cluster):
            return f"label {LABEL_CLUSTER}={self.cluster!r}, not {dns_label(cluster)!r}"
        if not cluster_uid or cluster_uid not in self.owner_uids:
            return f"no ownerReference to RayCluster {cluster} (uid {cluster_uid or 'unknown'})"
        return "" if self.uid else "no uid"

    @classmethod
    def from_configmap(cls, cm: dict[str, Any]) -> "ReservationRecord":
        md = cm.get("metadata") or {}
        labels, ann = md.get("labels") or {}, md.get("annotations") or {}
        owners = tuple(o.get("uid", "") for o in md.get("ownerReferences") or []
                       if o.get("kind") == "RayCluster" and str(o.get("apiVersion", "")).startswith("ray.io/"))
        return cls(name=md.get("name", ""), namespace=md.get("namespace", ""),
                   group=labels.get(LABEL_RESERVATION) or "", cluster=labels.get(LABEL_CLUSTER), owner_uids=owners,
                   state=ann.get(ANNOTATION_RESERVATION_STATE), placement_group_id=ann.get(ANNOTATION_PLACEMENT_GROUP)
                   or None, owner_job=labels.get(LABEL_OWNER_JOB) or None,
                   heartbeat_at_s=_seconds(ann.get(ANNOTATION_HEARTBEAT)),
                   deadline_at_s=_seconds(ann.get(ANNOTATION_DEADLINE)),
                   created_at_s=timestamp_s(md.get("creationTimestamp")), uid=md.get("uid", ""),
                   guard_scope=labels.get(KEY_GUARD_SCOPE) or None, guard_timeouts=parse_timeouts(ann.get(ANNOTATION_GUARD_TIMEOUTS, "0")),
                   created_by=labels.get(LABEL_CREATED_BY) or None)


def is_reservation_group(group: GroupTemplate) -> bool:
    """True when ``group`` is provably a raygpu reservation group: its pod template carries
    ``raygpu.io/reservation`` with the group's own name as value (``gang.backends`` builds it so)."""
    labels = (group.template.get("metadata") or {}).get("labels") or {}
    return bool(group.group_name) and labels.get(LABEL_RESERVATION) == group.group_name


class SeenAt(Frozen):
    """When the sidecar, on its own clock, saw a reservation's state ConfigMap.

    ``first_s``: first sight by this process (a restarted sidecar starts again);
    ``heartbeat_s``: when it saw the heartbeat annotation take its current
    value (``first_s`` if unchanged since). Liveness is measured on this clock
    only, so the driver's clock may be any amount off.
    """

    first_s: float
    heartbeat_s: float


class OrphanGroup(Frozen):
    """A worker group with no (provably raygpu's) state ConfigMap, as the sidecar saw it."""

    since_s: float  # the sidecar's clock: when it first saw the group so
    state_seen: bool = False  # this process saw a proven state ConfigMap for this group before it went


class GcAction(str, Enum):
    KEEP = "keep"
    RELEASE = "release"  # remove the (proven) group once drained, delete the (proven) state ConfigMap
    SCALE_TO_ZERO = "scale-to-zero"  # the group only: to zero replicas, never removed; no ConfigMap touched


class GcReason(str, Enum):
    """Why a reservation is released or kept. LIVE, RAY_SAYS_ALIVE and UNPROVEN only keep; STATE_LOST keeps a
    group already at zero replicas. The release reasons are checked in the order listed."""

    TERMINAL = "Terminal"  # state released / rolled_back: only leftovers remain
    FAILED = "Failed"  # state failed: the rollback never finished (its driver died during it)
    PLACEMENT_GROUP_GONE = "PlacementGroupGone"  # its recorded Ray PG is REMOVED or absent from Ray
    OWNER_JOB_DEAD = "OwnerJobDead"  # Ray's job table says its driver's job is dead
    HEARTBEAT_LOST = "HeartbeatLost"  # heartbeat unchanged, on the sidecar's clock, for longer than the timeout
    DEADLINE_MISSED = "DeadlineMissed"  # not ready long after its deadline (the watchdog never rolled back)
    STATE_LOST = "StateLost"  # a proven reservation group whose proven state ConfigMap went: scaled to zero only
    # gang scale-up's reservations (ReservationRecord.by_scale_up), judged by their placement group in Ray's table:
    PLACED_ELSEWHERE = "PlacedElsewhere"  # its placement group is CREATED and no bundle of any group is on its pods
    TIMED_OUT = "TimedOut"  # its placement group still pending at the reservation's deadline: rolled back
    INCOMPLETE = "Incomplete"  # left half-made (no worker group) by a sidecar that stopped while making it
    IN_USE = "InUse"  # kept: bundles of a placement group sit on its pods (never deleted under a bundle)
    LIVE = "Live"  # kept: alive, or waiting before it may be judged (StateLost is kept too once at zero)
    # kept: its heartbeat is stale, but Ray says its job lives (job alive, or its PG held in Ray's table); a driver
    # that lost API access (expired token, revoked RoleBinding, partition from the API server) keeps its gang
    RAY_SAYS_ALIVE = "RaySaysAlive"
    UNPROVEN = "Unproven"  # kept: not provably raygpu's (or its loss not provable), never touched


class GcDecision(Frozen):
    """One verdict. Writes are allowed only where the planner proved creation: the group when
    ``group_owned``, the state ConfigMap (by name, only with this uid) when ``state_uid``."""

    reservation: str  # ConfigMap name; for a group without one, the group's name
    group: str
    action: GcAction
    reason: GcReason
    detail: str = ""
    group_owned: bool = False  # is_reservation_group(the group in the spec the plan was made from)
    state_uid: str = ""  # uid of the proven state ConfigMap; "" = no ConfigMap may be deleted


class GcPlan(Frozen):
    """The garbage collector's output at ``planned_at_s``.

    ``to_release`` lists every decision that writes (action ``release`` or
    ``scale-to-zero``). ``reservation_groups`` names every group the collector
    judged, released, kept or unproven: the reclaimer leaves them to it.
    """

    planned_at_s: float
    decisions: tuple[GcDecision, ...] = ()  # one per reservation, sorted by name
    to_release: tuple[GcDecision, ...] = ()
    reservation_groups: frozenset[str] = frozenset()
