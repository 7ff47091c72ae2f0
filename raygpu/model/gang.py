"""Gang reservations as data: the request, the plan, and the reservation lifecycle.

A :class:`GangRequest` is what a driver asks for (Ray bundles + strategy); a
:class:`GangPlan` is what ``raygpu.plan.gang.reservation.plan_gang`` decides (one worker
group of ``n`` pods copied from one template group, and which bundle lands on
which pod). :data:`ALLOWED_TRANSITIONS` is the whole reservation lifecycle in
one table. Pure data: no I/O, no ray/kubernetes imports.

Constructing a request with bad input raises :class:`~raygpu.errors.PermanentError`
(never a bare pydantic ``ValidationError`` for the checks below), so callers
see raygpu's error vocabulary from the first line.
"""

from __future__ import annotations

import math
import numbers
from enum import Enum
from typing import Any, Mapping

from pydantic import Field, field_validator, model_validator

from raygpu.errors import PermanentError
from raygpu.model.base import Frozen
from raygpu.model.labels import DNS_SUBDOMAIN, DNS_SUBDOMAIN_MAX, LABEL_VALUE
from raygpu.model.shapes import GpuShape
from raygpu.model.topology import Topology


MAX_TIMEOUT_S = 2**31 - 1  # Kubernetes int32 seconds (PodGroup scheduleTimeoutSeconds)
# Backend coscheduling: the scheduler profile running the Coscheduling plugin, as the upstream scheduler-plugins
# chart names it. raygpu.io/gang-scheduler-name / scheduler_name= name another (docs/gang.md).
DEFAULT_GANG_SCHEDULER_NAME = "scheduler-plugins-scheduler"


def parse_scheduler_name(value: Any) -> str:
    """``value`` as a pod's ``spec.schedulerName``: a DNS-1123 subdomain name (lower-case a-z, 0-9, '-', '.',
    alphanumeric at both ends, <= 253 chars), as Kubernetes validates it. Raises ValueError saying why."""
    if not isinstance(value, str):
        raise ValueError(f"a scheduler name is a string, got {type(value).__name__}")
    if not value:
        raise ValueError("empty scheduler name")
    if len(value) > DNS_SUBDOMAIN_MAX or not DNS_SUBDOMAIN.fullmatch(value):
        raise ValueError("not a DNS-1123 subdomain name (lower-case a-z, 0-9, '-' and '.', alphanumeric at "
                         f"both ends, at most {DNS_SUBDOMAIN_MAX} characters)")
    return value


class Strategy(str, Enum):
    """Ray placement strategies (same spelling as ``ray.util.placement_group``)."""

    PACK = "PACK"
    SPREAD = "SPREAD"
    STRICT_PACK = "STRICT_PACK"
    STRICT_SPREAD = "STRICT_SPREAD"


class Backend(str, Enum):
    """How the reserved pods are made all-or-nothing at the Kubernetes layer."""

    COSCHEDULING = "coscheduling"  # scheduler-plugins PodGroup
    KUEUE = "kueue"  # Kueue plain-pod groups
    VOLCANO = "volcano"  # Volcano PodGroup
    WORKLOAD = "workload"  # Kubernetes' own Workload + PodGroup (scheduling.k8s.io, KEP-4671), default kube-scheduler
    NONE = "none"  # the worker group alone: atomic scale-up, no Kubernetes gang


def parse_enum(enum: type[Enum], value: Any, what: str) -> Any:
    """``enum(value)`` (case-insensitive for strings), else PermanentError listing the choices."""
    if isinstance(value, enum):
        return value
    for member in enum:  # type: ignore[var-annotated]
        if isinstance(value, str) and value.strip().lower() == str(member.value).lower():
            return member
    choices = ", ".join(str(m.value) for m in enum)  # type: ignore[var-annotated]
    raise PermanentError(f"unknown {what} {value!r}; expected one of: {choices}")


def _shown(value: Any) -> str:
    """``value`` for an error message: never thousands of digits."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 128:
        return f"<an integer of {value.bit_length()} bits>"
    text = str(value) if isinstance(value, numbers.Real) and not isinstance(value, bool) else repr(value)
    return text if len(text) <= 60 else text[:40] + f"...<{len(text)} chars>"


def real_number(value: Any, what: str) -> float:
    """``value`` as a float: ints, floats and other real numbers (numpy's ``int64``/``float32``,
    ``Fraction``) are accepted as the numbers they are; bools are not numbers here.

    Raises PermanentError starting with ``what`` for anything else and for an integer too
    large for a float (``10**400``). Range checks (finite, > 0) are the caller's.
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise PermanentError(f"{what}={_shown(value)}; amounts must be numbers, not {type(value).__name__}")
    try:
        return float(value)
    except (OverflowError, ValueError, TypeError):
        raise PermanentError(f"{what}={_shown(value)}; too large for a number (at most ~1.8e308)") from None


def check_bundle(raw: Any, index: int | None = None) -> dict[str, float]:
    """Validate one Ray bundle: a non-empty map of resource name -> finite real number > 0.

    numpy numbers are accepted as the numbers they are. Raises PermanentError naming
    the bundle index (when given), the resource and the amount.
    """
    where = "bundle" if index is None else f"bundle {index}"
    if not isinstance(raw, Mapping) or not raw:
        raise PermanentError(f"{where} must be a non-empty dict of Ray resources, got {_shown(raw)}")
    out: dict[str, float] = {}
    for key, amount in raw.items():
        if not isinstance(key, str) or not key:
            raise PermanentError(f"{where}: resource names must be non-empty strings, got {_shown(key)}")
        value = real_number(amount, f"{where} asks {key}")
        if not math.isfinite(value) or value <= 0:
            raise PermanentError(f"{where} asks {key}={_shown(amount)}; amounts must be finite and > 0")
        out[key] = value
    return out


class Bundle(Frozen):
    """One Ray bundle, e.g. ``Bundle(resources={"GPU": 8, "CPU": 32})``; ``memory`` is in bytes."""

    resources: dict[str, float]

    @model_validator(mode="before")
    @classmethod
    def _wrap_plain_dict(cls, data: Any) -> Any:
        if isinstance(data, Mapping) and not (set(data) == {"resources"} and isinstance(data["resources"], Mapping)):
            return {"resources": data}  # Bundle.model_validate({"GPU": 1}) works too
        return data

    @field_validator("resources", mode="before")
    @classmethod
    def _check(cls, value: Any) -> dict[str, float]:
        return check_bundle(value)

    def get(self, resource: str) -> float:
        return self.resources.get(resource, 0.0)


class GangRequest(Frozen):
    """What a driver asks for: ``bundles`` placed with ``strategy`` on RayCluster ``cluster``.

    ``backend``/``queue`` of None mean "use the cluster's annotations". ``timeout_s``
    bounds the wait for the whole gang; past it everything is rolled back.
    Amounts and ``timeout_s`` take any real number (numpy's ``int64`` too, as the
    number it is); anything else, a bool, or a number no float holds raises
    PermanentError naming the bundle and resource or the field, as does a
    ``queue`` that is not a string usable as a label value.
    """

    name: str
    cluster: str
    namespace: str = "default"
    bundles: tuple[Bundle, ...]
    strategy: Strategy = Strategy.PACK
    backend: Backend | None = None
    timeout_s: float = 300.0
    queue: str | None = None
    owner_job: str | None = None  # Ray job id; labels the pods so a dead driver's gang is collected
    guard: bool | None = None  # the starvation guard; None: the cluster's raygpu.io/guard annotation
    expected_runtime_s: float | None = None  # the driver's runtime hint: on the pods; backfill (docs/guard.md)
    topology: Topology | None = None  # all pods in one node-label domain (model/topology.py)
    # backend coscheduling: the schedulerName its pods ask for; None: raygpu.io/gang-scheduler-name, else the default
    scheduler_name: str | None = None

    @field_validator("name", "cluster", "namespace", mode="before")
    @classmethod
    def _non_empty(cls, value: Any) -> Any:
        if not isinstance(value, str) or not value.strip():
            raise PermanentError(f"gang request names must be non-empty strings, got {value!r}")
        return value

    @field_validator("bundles", mode="before")
    @classmethod
    def _check_bundles(cls, value: Any) -> tuple[Bundle, ...]:
        try:
            items = [] if isinstance(value, (str, bytes, Mapping)) else list(value)
        except TypeError:
            items = []
        if not items:
            raise PermanentError(f"a gang needs a non-empty list of bundles, got {_shown(value)}")
        return tuple(b if isinstance(b, Bundle) else Bundle(resources=check_bundle(b, i)) for i, b in enumerate(items))

    @field_validator("strategy", mode="before")
    @classmethod
    def _strategy(cls, value: Any) -> Strategy:
        return parse_enum(Strategy, value, "placement strategy")

    @field_validator("backend", mode="before")
    @classmethod
    def _backend(cls, value: Any) -> Backend | None:
        return None if value is None else parse_enum(Backend, value, "gang backend")

    @field_validator("timeout_s", mode="before")
    @classmethod
    def _timeout(cls, value: Any) -> float:
        seconds = real_number(value, "timeout_s")
        if not math.isfinite(seconds) or not 0 < seconds <= MAX_TIMEOUT_S:
            raise PermanentError(f"timeout_s must be a number of seconds > 0 and <= {MAX_TIMEOUT_S} (a PodGroup's "
                                 f"int32 scheduleTimeoutSeconds), got {_shown(value)}")
        return seconds

    @field_validator("queue", mode="before")
    @classmethod
    def _queue(cls, value: Any) -> str | None:
        """None or "" (use raygpu.io/queue), or a queue name that can be a label value (Kueue puts it in one)."""
        if value is None or value == "":
            return value
        if not isinstance(value, str) or not LABEL_VALUE.fullmatch(value):
            raise PermanentError(f"queue must be a queue name (a label value: <= 63 of [A-Za-z0-9-_.], alphanumeric "
                                 f"at both ends), got {_shown(value)}")
        return value

    @field_validator("guard", mode="before")
    @classmethod
    def _guard(cls, value: Any) -> bool | None:
        if value is not None and not isinstance(value, bool):
            raise PermanentError(f"guard must be True, False or None (the cluster's raygpu.io/guard), got {_shown(value)}")
        return value

    @field_validator("expected_runtime_s", mode="before")
    @classmethod
    def _expected_runtime(cls, value: Any) -> float | None:
        if value is None:
            return None
        seconds = real_number(value, "expected_runtime_s")
        if not math.isfinite(seconds) or not 0 < seconds <= MAX_TIMEOUT_S:
            raise PermanentError(f"expected_runtime_s must be a number of seconds > 0 and <= {MAX_TIMEOUT_S}, "
                                 f"got {_shown(value)}")
        return seconds

    @field_validator("topology", mode="before")
    @classmethod
    def _topology(cls, value: Any) -> Topology | None:
        if value is None or isinstance(value, Topology):
            return value
        raise PermanentError(f"topology must be a Topology (raygpu.model.topology) or None, got {_shown(value)}")

    @field_validator("scheduler_name", mode="before")
    @classmethod
    def _scheduler_name(cls, value: Any) -> str | None:
        if value is None:
            return None
        try:
            return parse_scheduler_name(value)
        except ValueError as e:
            raise PermanentError(f"scheduler_name={_shown(value)}: {e}") from None

    @field_validator("owner_job", mode="before")
    @classmethod
    def _owner_job(cls, value: Any) -> str | None:
        if value is not None and not isinstance(value, str):
            raise PermanentError(f"owner_job must be a Ray job id (a string) or None, got {_shown(value)}")
        return value


class PodNeed(Frozen):
    """The pods a plan needs: ``pod_count`` copies of worker group ``template_group``.

    ``k8s_requests``/``k8s_limits`` are per pod in Kubernetes names (all containers,
    what a PodGroup's minResources sums); ``ray_resources`` is what Ray will see
    on each pod (``GPU``, ``CPU``, ``memory`` in bytes, custom resources).
    ``gpu_shape`` is None for pods without GPUs.
    """

    template_group: str
    pod_count: int = Field(gt=0)
    k8s_requests: dict[str, float]
    k8s_limits: dict[str, float]
    ray_resources: dict[str, float]
    gpu_shape: GpuShape | None = None


class GangPlan(Frozen):
    """The decision for one GangRequest; nothing exists in Kubernetes yet.

    ``bundle_to_pod[i]`` is the pod index (0..pod_count-1) bundle ``i`` is planned on.
    ``reservation_group`` is the new worker group's name and the value of
    :data:`LABEL_RESERVATION`; ``gang_name`` names the backend's gang object
    (PodGroup / Kueue pod group), unique per cluster and namespace.
    """

    name: str
    cluster: str
    namespace: str
    strategy: Strategy
    backend: Backend
    queue: str | None
    timeout_s: float
    need: PodNeed
    bundle_to_pod: tuple[int, ...]
    reservation_group: str
    gang_name: str
    reason: str
    notes: tuple[str, ...] = ()
    topology: Topology | None = None  # the request's constraint, for the backend to write (docs/gang.md)
    # the schedulerName the pods ask for where the plan chooses it (backend coscheduling: the request's, else
    # raygpu.io/gang-scheduler-name, else DEFAULT_GANG_SCHEDULER_NAME); None: the backend's fixed one or the template's
    scheduler_name: str | None = None

    @property
    def pod_count(self) -> int:
        return self.need.pod_count

    def bundles_on_pod(self, pod_index: int) -> tuple[int, ...]:
        """Bundle indices planned on pod ``pod_index``."""
        return tuple(i for i, p in enumerate(self.bundle_to_pod) if p == pod_index)


class NodeFree(Frozen):
    """What the Kubernetes scheduler could still bind on ``count`` identical nodes, in Kubernetes names.

    ``free`` is allocatable minus the requests of the pods bound there (a resource
    that is absent is 0); ``allocatable`` is the node's whole allocatable, so the
    planner can tell an untouched node (every resource free) from a fragment.
    The caller lists only the nodes the reservation's pods may use (selectors,
    taints); ``raygpu.plan.gang.shapes.free_nodes`` builds the list from the
    Kubernetes views. Amounts must be finite (negative = overcommitted, treated
    as 0); ``count`` >= 1, so nodes of one shape can be given once.
    """

    free: dict[str, float]
    allocatable: dict[str, float] = Field(default_factory=dict)
    count: int = 1
    name: str = ""  # one node's name, or a label for the group; for messages only

    @field_validator("count", mode="before")
    @classmethod
    def _count(cls, value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
            raise PermanentError(f"node count must be an integer >= 1, got {_shown(value)}")
        return int(value)

    @field_validator("free", "allocatable", mode="before")
    @classmethod
    def _amounts(cls, value: Any) -> dict[str, float]:
        if not isinstance(value, Mapping):
            raise PermanentError(f"node capacity must be a dict of resource -> amount, got {_shown(value)}")
        out = {}
        for k, v in value.items():
            amount = real_number(v, f"node capacity {k}")
            if not math.isfinite(amount):
                raise PermanentError(f"node capacity {k}={_shown(v)}; amounts must be finite")
            out[str(k)] = amount
        return out


class ReservationState(str, Enum):
    """Lifecycle of one reservation; stored in annotation :data:`ANNOTATION_RESERVATION_STATE`."""

    PLANNED = "planned"  # plan computed, nothing created
    RESERVED = "reserved"  # gang objects created and the worker group patched into the RayCluster
    ADMITTED = "admitted"  # the backend admitted the whole gang (PodGroup scheduled / Kueue admitted)
    BOUND = "bound"  # all n pods bound to nodes and Running
    READY = "ready"  # all n Ray nodes joined with the reservation label; the Ray PG is pinned to them
    RELEASED = "released"  # normal end: objects deleted after the PG was removed or its driver died
    FAILED = "failed"  # something broke or timed out; the reservation must be rolled back
    ROLLED_BACK = "rolled_back"  # after a failure: every object of the reservation deleted


S = ReservationState
ALLOWED_TRANSITIONS: dict[ReservationState, frozenset[ReservationState]] = {
    S.PLANNED: frozenset({
        S.RESERVED,  # one RayCluster patch (test on resourceVersion) + gang objects created
        S.FAILED,  # creating failed for good (denied, infeasible after re-plan, retries exhausted)
    }),
    S.RESERVED: frozenset({
        S.ADMITTED,  # the backend admitted the gang whole (backend "none": at once)
        S.FAILED,  # not admitted within timeout_s, or the PodGroup / workload was rejected
        S.RELEASED,  # the driver removed the PG (or died) before admission: delete what exists
    }),
    S.ADMITTED: frozenset({
        S.BOUND,  # kube-scheduler bound all n pods and they are Running
        S.FAILED,  # pods did not bind/run within timeout_s, or were evicted
        S.RELEASED,  # cancelled while pods were starting
    }),
    S.BOUND: frozenset({
        S.READY,  # all n Ray nodes registered with the reservation label; PG created on them
        S.FAILED,  # Ray nodes never joined within timeout_s, or the PG could not be created
        S.RELEASED,  # cancelled while Ray nodes were joining
    }),
    S.READY: frozenset({
        S.RELEASED,  # remove_placement_group, the PG vanished from Ray, or its driver died
        S.FAILED,  # a reserved pod or Ray node was lost for good; the gang is broken
    }),
    S.FAILED: frozenset({
        S.ROLLED_BACK,  # worker group removed, gang objects deleted: nothing stays held
    }),
    S.RELEASED: frozenset(),  # terminal
    S.ROLLED_BACK: frozenset(),  # terminal
}
del S


def is_terminal(state: ReservationState | str) -> bool:
    """True when no transition leaves ``state``."""
    return not ALLOWED_TRANSITIONS[parse_enum(ReservationState, state, "reservation state")]


def check_transition(current: ReservationState | str, target: ReservationState | str) -> ReservationState:
    """Return ``target`` as a ReservationState if ``current -> target`` is an edge of the table.

    Strings (annotation values) are accepted. Raises PermanentError on an unknown
    state or an illegal edge; staying in the same state is not an edge.
    """
    a = parse_enum(ReservationState, current, "reservation state")
    b = parse_enum(ReservationState, target, "reservation state")
    if b not in ALLOWED_TRANSITIONS[a]:
        allowed = ", ".join(sorted(s.value for s in ALLOWED_TRANSITIONS[a])) or "nothing (terminal)"
        raise PermanentError(f"illegal reservation transition {a.value} -> {b.value}; from {a.value} allowed: {allowed}")
    return b
