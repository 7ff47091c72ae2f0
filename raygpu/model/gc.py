"""Reservation garbage collection as data: what a reservation's state ConfigMap says, and the verdict.

The gang module keeps each reservation's state on a ConfigMap (see
``raygpu.gang.reservation``). The sidecar parses those ConfigMaps into
:class:`ReservationRecord` as soon as they enter, and
``raygpu.plan.gc.plan_gc`` turns them (with Ray's view) into a :class:`GcPlan`:
one :class:`GcDecision` per reservation, keep or release, with a reason.
Pure data: no I/O, no ray/kubernetes imports.
"""

from __future__ import annotations

from enum import Enum
from typing import Any

from raygpu.model.base import Frozen, timestamp_s
from raygpu.model.labels import (ANNOTATION_DEADLINE, ANNOTATION_HEARTBEAT, ANNOTATION_PLACEMENT_GROUP,
                                 ANNOTATION_RESERVATION_STATE, LABEL_CLUSTER, LABEL_OWNER_JOB, LABEL_RESERVATION)

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
    annotation is absent or not a number.
    """

    name: str  # the ConfigMap's name (GangPlan.gang_name)
    namespace: str
    group: str  # label raygpu.io/reservation: the reservation's worker group
    cluster: str | None = None  # label raygpu.io/cluster
    state: str | None = None
    placement_group_id: str | None = None  # hex, once the driver created the Ray PG
    owner_job: str | None = None  # Ray job id (hex) of the driver
    heartbeat_at_s: float | None = None
    deadline_at_s: float | None = None
    created_at_s: float = 0.0
    uid: str = ""

    @classmethod
    def from_configmap(cls, cm: dict[str, Any]) -> "ReservationRecord":
        md = cm.get("metadata") or {}
        labels, ann = md.get("labels") or {}, md.get("annotations") or {}
        return cls(name=md.get("name", ""), namespace=md.get("namespace", ""),
                   group=labels.get(LABEL_RESERVATION) or md.get("name", ""), cluster=labels.get(LABEL_CLUSTER),
                   state=ann.get(ANNOTATION_RESERVATION_STATE), placement_group_id=ann.get(ANNOTATION_PLACEMENT_GROUP)
                   or None, owner_job=labels.get(LABEL_OWNER_JOB) or None,
                   heartbeat_at_s=_seconds(ann.get(ANNOTATION_HEARTBEAT)),
                   deadline_at_s=_seconds(ann.get(ANNOTATION_DEADLINE)),
                   created_at_s=timestamp_s(md.get("creationTimestamp")), uid=md.get("uid", ""))


class GcAction(str, Enum):
    KEEP = "keep"
    RELEASE = "release"


class GcReason(str, Enum):
    """Why a reservation is released (all but LIVE) or kept (LIVE). Checked in the order listed."""

    TERMINAL = "Terminal"  # state released / rolled_back: only leftovers remain
    FAILED = "Failed"  # state failed: the rollback never finished (its driver died during it)
    PLACEMENT_GROUP_GONE = "PlacementGroupGone"  # its recorded Ray PG is REMOVED or absent from Ray
    OWNER_JOB_DEAD = "OwnerJobDead"  # Ray's job table says its driver's job is dead
    HEARTBEAT_LOST = "HeartbeatLost"  # no heartbeat for longer than the timeout (driver killed)
    DEADLINE_MISSED = "DeadlineMissed"  # not ready long after its deadline (the watchdog never rolled back)
    STATE_LOST = "StateLost"  # a reservation worker group (rg-*) whose state ConfigMap is gone, for longer than the timeout
    LIVE = "Live"  # the one keep reason


class GcDecision(Frozen):
    reservation: str  # ConfigMap name
    group: str
    action: GcAction
    reason: GcReason
    detail: str = ""


class GcPlan(Frozen):
    """The garbage collector's output at ``planned_at_s``.

    ``to_release`` lists the reservations to release (remove the worker group,
    delete the state ConfigMap). ``reservation_groups`` names the worker group
    of every reservation that has a state ConfigMap, released or not: the
    reclaimer leaves them to the garbage collector.
    """

    planned_at_s: float
    decisions: tuple[GcDecision, ...] = ()  # one per reservation, sorted by name
    to_release: tuple[GcDecision, ...] = ()
    reservation_groups: frozenset[str] = frozenset()
