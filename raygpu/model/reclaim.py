"""What the idle-node reclaimer decides: a policy in, a plan out.

``plan.reclaim.plan_reclaim(snapshot, cluster, policy, now_s)`` turns these into
a :class:`ReclaimPlan`. The plan is data: it names every worker pod it looked at
with one :class:`Decision` (keep or delete, and why), and one
:class:`GroupScaleDown` per worker group it shrinks. Applying it (one JSON patch
that starts with a ``test`` on the RayCluster's ``metadata.resourceVersion``) is
the caller's job, and only when ``policy.mode`` is ``on``.
"""

from __future__ import annotations

from enum import Enum
from collections import deque
from itertools import repeat
from typing import Iterable

from pydantic import BaseModel, Field

from raygpu.model.base import Frozen



class ReclaimMode(str, Enum):
    """What the reclaimer may do (annotation ``raygpu.io/reclaim``)."""

    OFF = "off"  # do not plan, do not write: never scale workers down
    DRY_RUN = "dry-run"  # plan and report (events, metrics), never write
    ON = "on"  # plan and apply: scale idle workers down


class ReclaimPolicy(Frozen):
    """The reclaimer's knobs; the sidecar builds it from the cluster's annotations.

    ``mode`` does not change the plan: the same plan is computed in ``dry-run``
    and ``on``, so a dry run shows exactly what ``on`` would do.
    """

    idle_timeout_s: float = Field(default=600.0, ge=0)
    group_idle_timeout_s: dict[str, float] = Field(default_factory=dict)  # per-group override
    startup_grace_s: float = Field(default=120.0, ge=0)  # pods younger than this are never idle
    mode: ReclaimMode = ReclaimMode.DRY_RUN
    # Names of the reservations that are live. None: every reservation member is
    # treated as live (the safe default when the sidecar cannot tell).
    live_reservations: frozenset[str] | None = None
    # Pods whose Ray node this sidecar drained (an accepted IDLE_TERMINATION drain) and that are not yet
    # in workersToDelete (the patch after the drain did not land): deleted without waiting for the idle
    # timeout, as a Ray node in DRAINING state is; the drain, not the timeout, proved them idle.
    drained_pods: frozenset[str] = frozenset()
    # Keep-warm (raygpu.io/idle-timeout: auto, raygpu.plan.reclaim.warm): group -> idle workers to keep warm. Such a
    # group has no idle timeout; after every protection it keeps this many idle candidates (KEEP_WARM) and
    # deletes the rest. warm_reasons says why (quantile, window, numbers). Empty: no group in auto.
    warm_targets: dict[str, int] = Field(default_factory=dict)
    warm_reasons: dict[str, str] = Field(default_factory=dict)
    # Keep-warm group -> minimum idle time before a worker beyond the target goes (plan.warm's hold_s; absent or 0:
    # at once). A worker idle less than this is kept (NotIdleLongEnough) and counts toward the target.
    warm_hold_s: dict[str, float] = Field(default_factory=dict)
    # Kubernetes node -> why a GPU health agent (or NVML) marked it unhealthy (plan.common.health.unhealthy_nodes).
    # An idle worker there is a candidate without waiting for its idle timeout, goes first, is never kept warm
    # nor kept for a pending placement group. Empty: none, or the sidecar does not read nodes.
    unhealthy_nodes: dict[str, str] = Field(default_factory=dict)

    def idle_timeout_for_s(self, group: str) -> float:
        """The idle timeout of ``group``: a keep-warm group's hold (0 without one: its target decides), else its
        override, else the cluster-wide one."""
        if group in self.warm_targets:
            return self.warm_hold_s.get(group, 0.0)
        return self.group_idle_timeout_s.get(group, self.idle_timeout_s)

    @property
    def applies(self) -> bool:
        """True when plans may be written to the cluster."""
        return self.mode is ReclaimMode.ON


class DecisionAction(str, Enum):
    KEEP = "keep"
    DELETE = "delete"


class ReclaimReason(str, Enum):
    """Why a worker is kept (every value but IDLE and DRAINED) or deleted (IDLE, DRAINED).

    Protections are checked in the order listed; the first that applies is the reason.
    """

    RAY_UNREACHABLE = "RayUnreachable"  # no Ray view: idleness and PGs unknown, keep all
    HEAD = "Head"
    ALREADY_DELETING = "AlreadyDeleting"  # in workersToDelete or has a deletionTimestamp
    STARTUP_GRACE = "StartupGrace"
    HOLDS_BUNDLE = "HoldsBundle"  # its Ray node hosts a placement-group bundle
    LIVE_RESERVATION = "LiveReservation"
    NOT_IDLE_LONG_ENOUGH = "NotIdleLongEnough"  # busy, idle < timeout, or no Ray node yet
    NEEDED_BY_PENDING_PG = "NeededByPendingPG"  # a pending/rescheduling PG needs it to fit
    GROUP_MINIMUM = "GroupMinimum"  # deleting it would go below minReplicas
    KEEP_WARM = "KeepWarm"  # an idle candidate of a keep-warm group, within its learned warm target
    DRAIN_REJECTED = "DrainRejected"  # Ray refused the idle drain (work landed after the plan) or it failed
    IDLE = "Idle"  # deleted: idle for the timeout (keep-warm: beyond the target), and Ray accepted its idle drain
    DRAINED = "Drained"  # deleted: its Ray node is DRAINING or was drained by us; it takes no new work


class Decision(Frozen):
    """The verdict on one pod of the cluster, with a machine reason and a human detail."""

    pod_name: str
    group: str
    action: DecisionAction
    reason: ReclaimReason
    detail: str = ""
    k8s_node_name: str | None = None
    ray_node_id: str | None = None
    gpus: float = 0.0  # GPUs of its Ray node
    idle_for_s: float | None = None  # None: busy or no Ray node

    @classmethod
    def typed_many(cls, rows: Iterable[tuple]) -> tuple[Decision, ...]:
        """One Decision per row of field values in field order (pod_name, group, action, reason, detail,
        k8s_node_name, ray_node_id, gpus, idle_for_s), built without running validation: ``typed_dicts``
        of the rows as dicts (the same promises and the same limits)."""
        return cls.typed_dicts([dict(zip(_FIELD_ORDER, row)) for row in rows])

    @classmethod
    def typed_dicts(cls, fields: list[dict]) -> tuple[Decision, ...]:
        """One Decision per dict of field values, built without running validation; each dict becomes the
        Decision's ``__dict__`` as it is (not copied: the caller hands it over).

        For ``plan_reclaim``, which decides every pod (21,000 at 10,000 nodes, where validating each cost
        more than the rest of the plan). Safe only for dicts that hold every field, in field order
        (pod_name, group, action, reason, detail, k8s_node_name, ray_node_id, gpus, idle_for_s), each
        value already of its field's type, as there: the strings and None come from validated views, the
        enums are members, and the numbers are floats (``gpus`` a value of a validated
        ``RayNodeView.total`` or 0.0, ``idle_for_s`` ``now_s`` minus a validated float, or None). It sets
        what ``BaseModel.model_construct(_fields_set=...)`` sets (``__dict__``; every field set, one set
        shared by the Decisions of a call, as ``model_construct`` shares the one it is given: a frozen
        model never changes it; no extra, no private) without its per-field default lookups, and with no
        Python-level step per Decision (``map`` over the slots' setters). tests/unit/test_plan_reclaim.py
        proves the result equals ``Decision(...)`` state for state, and
        tests/unit/test_decision_equivalence.py compares every golden plan as JSON text (where 8 and 8.0
        differ).
        """
        n = len(fields)
        out = tuple(map(_new, repeat(cls, n)))
        deque(map(_SET_DICT, out, fields), 0)
        deque(map(_SET_FIELDS_SET, out, repeat(set(_DECISION_FIELDS), n)), 0)  # one set, shared
        deque(map(_SET_EXTRA, out, repeat(None, n)), 0)
        deque(map(_SET_PRIVATE, out, repeat(None, n)), 0)
        return out


_new = object.__new__
# the setters of BaseModel's four slots (what object.__setattr__ finds for these names, called directly)
_SET_DICT, _SET_FIELDS_SET, _SET_EXTRA, _SET_PRIVATE = (BaseModel.__dict__[name].__set__ for name in (
    "__dict__", "__pydantic_fields_set__", "__pydantic_extra__", "__pydantic_private__"))
_FIELD_ORDER = tuple(Decision.model_fields)
_DECISION_FIELDS = frozenset(Decision.model_fields)


class GroupScaleDown(Frozen):
    """One worker group's new ``replicas`` and ``scaleStrategy.workersToDelete``.

    ``workers_to_delete`` is the full new list (what was there + ``added``);
    ``replicas`` is the old value minus ``len(added)``, never less.
    """

    group_name: str
    group_index: int  # index in spec.workerGroupSpecs, for the JSON-patch path
    old_replicas: int  # for a `test` op next to the resourceVersion test
    replicas: int
    workers_to_delete: tuple[str, ...]
    added: tuple[str, ...]  # pods this plan deletes, sorted


class ReclaimPlan(Frozen):
    """The reclaimer's output for one cluster at ``planned_at_s``.

    ``to_delete`` is empty when nothing is reclaimable. ``cluster_resource_version``
    is the version the plan was made from: apply it with a ``test`` on it, and on
    a conflict re-plan from a new snapshot, never overwrite.
    """

    cluster: str
    namespace: str
    cluster_resource_version: str = ""
    planned_at_s: float
    to_delete: tuple[GroupScaleDown, ...] = ()
    decisions: tuple[Decision, ...] = ()  # one per pod of the cluster, sorted by pod name
    freed_k8s_nodes: tuple[str, ...] = ()  # Kubernetes nodes left with no pod of the snapshot
    reclaimed_gpus: float = 0.0
    idle_gpu_s: float = 0.0  # GPU-seconds the deleted workers had sat idle
    # why the pending-PG searches ran out of budget ('' when they did not): what they could not judge was kept
    search_budget_spent: str = ""

    @property
    def deleted_pods(self) -> tuple[str, ...]:
        return tuple(sorted(n for g in self.to_delete for n in g.added))

    def decision(self, pod_name: str) -> Decision | None:
        return next((d for d in self.decisions if d.pod_name == pod_name), None)
