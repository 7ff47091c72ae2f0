"""The RayCluster annotations raygpu reads, parsed into one frozen model.

``parse_cluster_policy`` never raises: a bad value becomes an
:class:`AnnotationProblem` (the caller turns it into a Kubernetes Event
``InvalidAnnotation``) and the field keeps its safe default. A misspelt key
close to a known one (``raygpu.io/gang-backed``) is reported too.
"""

from __future__ import annotations

import difflib
import math
import re
from enum import Enum

from pydantic import Field

from raygpu.model.base import Frozen
from raygpu.model.gang import DEFAULT_GANG_SCHEDULER_NAME, Backend, parse_scheduler_name
from raygpu.model.labels import (GROUP_IDLE_TIMEOUT_PREFIX, GUARD_KEYS, GUARD_LEASE_PREFIX, IDLE_TIMEOUT_AUTO,
                                 KEY_DOCTOR_INTERVAL, KEY_GANG_BACKEND, KEY_GANG_SCHEDULER_NAME, KEY_GUARD, KEY_GUARD_SCOPE, KEY_MAX_HOLD,
                                 KEY_GANG_SCALE_UP, KEY_GANG_SCALE_UP_IN_FLIGHT, KEY_GANG_SCALE_UP_TIMEOUT,
                                 KEY_GANG_TEMPLATE, KEY_IDLE_TIMEOUT, KEY_QUEUE, KEY_RECLAIM, KEY_RECONCILE, KEY_WARM_FALLBACK,
                                 KEY_WARM_HISTORY, KEY_WARM_HOLD, KEY_WARM_QUANTILE, POLICY_KEYS, PREFIX, dns_label)
from raygpu.model.reclaim import ReclaimMode
from raygpu.model.warm import WarmSettings

DEFAULT_IDLE_TIMEOUT_S = 600.0
MIN_IDLE_TIMEOUT_S = 1.0  # shorter is no idle time at all: every worker between two tasks would go
MAX_IDLE_TIMEOUT_S = 30 * 86400.0  # longer than 30 days is a typo (and 1e300 s is not "never")
_UNIT_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
_DURATION_RE = re.compile(r"^(?:\d+(?:\.\d+)?(?:ms|s|m|h))+$")
_DURATION_PART_RE = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h)")
_QUEUE_RE = re.compile(r"^[a-z0-9]([a-z0-9.-]*[a-z0-9])?$")
DEFAULT_SCALE_UP_IN_FLIGHT = 4
MAX_SCALE_UP_IN_FLIGHT = 64
DEFAULT_SCALE_UP_TIMEOUT_S = 600.0
MIN_SCALE_UP_TIMEOUT_S, MAX_SCALE_UP_TIMEOUT_S = 30.0, 86400.0  # shorter than pods take to start; a day: a typo
DEFAULT_MAX_HOLD_S = 900.0  # raygpu.io/max-hold default: 15 minutes
MIN_MAX_HOLD_S, MAX_MAX_HOLD_S = 30.0, 6 * 3600.0  # shorter than pods take to bind; longer starves a pool for hours
_ON, _OFF = ("on", "true", "yes", "1"), ("off", "false", "no", "0", "")
MIN_DOCTOR_INTERVAL_S, MAX_DOCTOR_INTERVAL_S = 60.0, 86400.0  # a node list per cycle more often is load; a day: a typo
_GROUP_RE = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9_.-]*[A-Za-z0-9])?$")


class ReconcileMode(str, Enum):
    REPORT = "report"  # findings only
    REPAIR = "repair"  # findings plus the safe fixes


class GuardPolicy(Frozen):
    """What a RayCluster's annotations say about the starvation guard (docs/guard.md); every field has the
    default used for a bad value."""

    enabled: bool = False  # raygpu.io/guard: on
    max_hold_s: float = DEFAULT_MAX_HOLD_S  # raygpu.io/max-hold: the most nodes are blocked for one gang, in all
    scope: str | None = None  # raygpu.io/guard-scope; None: the namespace

    def scope_for(self, namespace: str) -> str:
        """The scope's name as a DNS label (a node pool, a queue, or the namespace)."""
        return dns_label(self.scope or namespace)

    def lease_name(self, namespace: str) -> str:
        return dns_label(self.scope_for(namespace), GUARD_LEASE_PREFIX)


class ClusterPolicy(Frozen):
    """Per-RayCluster settings; every field has the safe default used when its annotation is bad."""


    gang_backend: Backend = Backend.NONE
    queue: str | None = None
    gang_scheduler_name: str = DEFAULT_GANG_SCHEDULER_NAME  # backend coscheduling: the pods' schedulerName
    gang_template: str | None = None  # None: the planner chooses the worker group
    idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S
    reclaim: ReclaimMode = ReclaimMode.DRY_RUN
    reconcile: ReconcileMode = ReconcileMode.REPORT
    group_idle_timeout_s: dict[str, float] = Field(default_factory=dict)
    # raygpu.io/idle-timeout: auto (the cluster) and raygpu.io/idle-timeout.<group>: auto (a group)
    idle_timeout_auto: bool = False
    group_idle_timeout_auto: frozenset[str] = frozenset()
    warm: WarmSettings = Field(default_factory=WarmSettings)  # the keep-warm knobs
    # gang scale-up (docs/gang-scale-up.md): a reservation per pending placement group raygpu did not create
    gang_scale_up: bool = False
    scale_up_in_flight: int = DEFAULT_SCALE_UP_IN_FLIGHT  # reservations not yet used, at most, per cluster
    scale_up_timeout_s: float = DEFAULT_SCALE_UP_TIMEOUT_S  # a reservation not used by then is rolled back
    guard: GuardPolicy = Field(default_factory=GuardPolicy)  # the starvation guard's keys (docs/guard.md)
    # raygpu.io/doctor-interval: the sidecar runs the doctor's checks this often (None: off, the default)
    doctor_interval_s: float | None = None

    def idle_timeout_for(self, group_name: str) -> float:
        """Idle timeout of worker group ``group_name``: its override, else the cluster's."""
        return self.group_idle_timeout_s.get(group_name, self.idle_timeout_s)

    def is_auto(self, group_name: str) -> bool:
        """True when ``group_name`` uses the keep-warm policy: its own ``auto``, or the cluster's ``auto``
        and no fixed override of its own."""
        if group_name in self.group_idle_timeout_auto:
            return True
        return self.idle_timeout_auto and group_name not in self.group_idle_timeout_s


class AnnotationProblem(Frozen):
    """One annotation raygpu could not use: which, its value, why, and what it used instead."""


    key: str
    value: str
    reason: str
    default_used: str


def parse_duration_s(value: str) -> float:
    """``"300s"``, ``"5m"``, ``"1h30m"``, ``"250ms"`` or a plain number of seconds -> seconds.

    Raises ValueError unless the result is finite and > 0.
    """
    s = value.strip().lower()
    if _DURATION_RE.match(s):
        seconds = sum(float(n) * _UNIT_S[u] for n, u in _DURATION_PART_RE.findall(s))
    else:
        try:
            seconds = float(s)
        except ValueError:
            raise ValueError("not a duration; use a number of seconds or e.g. 300s, 5m, 1h") from None
    if not math.isfinite(seconds) or seconds <= 0:
        raise ValueError("a duration must be finite and > 0")
    return seconds


def parse_idle_timeout_s(value: str) -> float:
    """An idle timeout (``parse_duration_s``) from ``MIN_IDLE_TIMEOUT_S`` to ``MAX_IDLE_TIMEOUT_S``; ValueError else."""
    return _duration_between(value, MIN_IDLE_TIMEOUT_S, MAX_IDLE_TIMEOUT_S, f"{MAX_IDLE_TIMEOUT_S / 86400:g} days",
                             "an idle timeout ")


def _duration_between(value: str, low_s: float, high_s: float, high_shown: str, what: str = "") -> float:
    """``parse_duration_s(value)`` from ``low_s`` to ``high_s`` (said as ``high_shown``); ValueError naming both."""
    seconds = parse_duration_s(value)
    if not low_s <= seconds <= high_s:
        raise ValueError(f"{what}must be between {low_s:g} s and {high_shown}, got {seconds:g} s")
    return seconds


def _enum_value(enum: type[Enum], raw: str) -> Enum:
    for member in enum:  # type: ignore[var-annotated]
        if raw.strip().lower() == member.value:
            return member
    raise ValueError("expected one of: " + "|".join(m.value for m in enum))  # type: ignore[var-annotated]


def _text(raw: object) -> str:
    if not isinstance(raw, str):
        raise TypeError(f"annotation values are strings, got {type(raw).__name__}")
    return raw


def _queue_name(raw: str) -> str:
    s = raw.strip()
    if not _QUEUE_RE.match(s) or len(s) > 253:
        raise ValueError("empty value" if not s else "not a Kubernetes object name (lowercase a-z, 0-9, '-', '.')")
    return s


def _group_name(raw: str) -> str:
    s = raw.strip()
    if not _GROUP_RE.match(s) or len(s) > 63:
        raise ValueError("empty value" if not s else "not a worker group name (a label value: <= 63 of A-Z a-z 0-9 - _ .)")
    return s


def parse_cluster_policy(annotations: dict[str, str] | None) -> tuple[ClusterPolicy, list[AnnotationProblem]]:
    """Parse raygpu's annotations of a RayCluster. Never raises.

    Returns the policy and one AnnotationProblem per value that was ignored
    (the field keeps its default) or per key that looks like a misspelt raygpu key.
    """
    ann = annotations or {}
    fields: dict[str, object] = {}
    problems: list[AnnotationProblem] = []
    defaults = ClusterPolicy()

    def take(key: str, field: str, parse) -> None:  # parse: str -> value, ValueError when bad
        if key not in ann:
            return
        raw = ann[key]
        try:
            fields[field] = parse(_text(raw))
        except (ValueError, TypeError) as exc:
            default = getattr(defaults, field)
            shown = (default.value if isinstance(default, Enum) else ("on" if default else "off")
                     if isinstance(default, bool) else "off" if default is None and field == "doctor_interval_s"
                     else default)
            problems.append(AnnotationProblem(key=key, value=str(raw), reason=str(exc), default_used=repr(shown)))

    take(KEY_GANG_BACKEND, "gang_backend", lambda v: _enum_value(Backend, v))
    take(KEY_QUEUE, "queue", _queue_name)
    take(KEY_GANG_SCHEDULER_NAME, "gang_scheduler_name", lambda v: parse_scheduler_name(v.strip()))
    take(KEY_GANG_TEMPLATE, "gang_template", _group_name)
    if _is_auto(ann.get(KEY_IDLE_TIMEOUT)):
        fields["idle_timeout_auto"] = True
    else:
        take(KEY_IDLE_TIMEOUT, "idle_timeout_s", parse_idle_timeout_s)
    take(KEY_RECLAIM, "reclaim", lambda v: _enum_value(ReclaimMode, v))
    take(KEY_RECONCILE, "reconcile", lambda v: _enum_value(ReconcileMode, v))
    take(KEY_GANG_SCALE_UP, "gang_scale_up", _on_off)
    take(KEY_GANG_SCALE_UP_IN_FLIGHT, "scale_up_in_flight", _in_flight)
    take(KEY_GANG_SCALE_UP_TIMEOUT, "scale_up_timeout_s", _scale_up_timeout_s)
    take(KEY_DOCTOR_INTERVAL, "doctor_interval_s", _doctor_interval_s)

    warm = _warm_settings(ann, problems)
    fields["guard"], guard_problems = parse_guard_policy(ann)
    problems.extend(guard_problems)
    group_timeouts: dict[str, float] = {}
    group_auto: set[str] = set()
    cluster_timeout = fields.get("idle_timeout_s", defaults.idle_timeout_s)
    for key in sorted(ann):
        raw = str(ann[key])
        if key.startswith(GROUP_IDLE_TIMEOUT_PREFIX):
            group = key[len(GROUP_IDLE_TIMEOUT_PREFIX):]
            try:
                if not group:
                    raise ValueError("no worker group name after 'raygpu.io/idle-timeout.'")
                if _is_auto(ann[key]):
                    group_auto.add(group)
                else:
                    group_timeouts[group] = parse_idle_timeout_s(_text(ann[key]))
            except (ValueError, TypeError) as exc:
                problems.append(AnnotationProblem(key=key, value=raw, reason=str(exc),
                                                  default_used=f"cluster idle timeout {cluster_timeout:g}s"))
        elif key.startswith(PREFIX) and key not in POLICY_KEYS:
            close = difflib.get_close_matches(key, POLICY_KEYS, n=1, cutoff=0.85)
            if close:
                problems.append(AnnotationProblem(key=key, value=raw, reason=f"unknown key; did you mean {close[0]}?",
                                                  default_used="ignored"))
    fields["group_idle_timeout_s"] = group_timeouts
    fields["group_idle_timeout_auto"] = frozenset(group_auto)
    fields["warm"] = warm
    return ClusterPolicy(**fields), problems


def is_guard_problem(problem: AnnotationProblem) -> bool:
    """A problem with a guard key, or a misspelt key closest to one (the driver says these as Events too)."""
    return problem.key in GUARD_KEYS or any(problem.reason.endswith(f"{k}?") for k in GUARD_KEYS)


def parse_guard_policy(annotations: dict[str, str] | None) -> tuple[GuardPolicy, list[AnnotationProblem]]:
    """The guard's keys of a RayCluster's annotations (part of :func:`parse_cluster_policy`, which also reports
    misspelt guard keys). Never raises: a bad value is a problem and its default; ``max-hold`` from
    ``MIN_MAX_HOLD_S`` to ``MAX_MAX_HOLD_S``."""
    ann = annotations or {}
    fields: dict[str, object] = {}
    problems: list[AnnotationProblem] = []

    def take(key: str, field: str, parse, default_used: str) -> None:
        if key in ann:
            try:
                fields[field] = parse(_text(ann[key]))
            except (ValueError, TypeError) as exc:
                problems.append(AnnotationProblem(key=key, value=str(ann[key]), reason=str(exc),
                                                  default_used=default_used))

    take(KEY_GUARD, "enabled", _guard_on, "off")
    take(KEY_MAX_HOLD, "max_hold_s", lambda v: _duration_between(v, MIN_MAX_HOLD_S, MAX_MAX_HOLD_S,
                                                                 f"{MAX_MAX_HOLD_S / 3600:g} h", "max-hold "),
         f"{DEFAULT_MAX_HOLD_S:g}s")
    take(KEY_GUARD_SCOPE, "scope", _scope_name, "the namespace")
    return GuardPolicy(**fields), problems


def _guard_on(raw: str) -> bool:
    s = raw.strip().lower()
    if s not in _ON and s not in _OFF:
        raise ValueError("expected on or off")
    return s in _ON


def _scope_name(raw: str) -> str:
    s = raw.strip()
    if not s:
        raise ValueError("empty")
    return s


def _on_off(raw: str) -> bool:
    s = raw.strip().lower()
    if s not in ("on", "off"):
        raise ValueError("expected on|off")
    return s == "on"


def _in_flight(raw: str) -> int:
    try:
        n = int(raw.strip())
    except ValueError:
        raise ValueError(f"not a whole number; use 1..{MAX_SCALE_UP_IN_FLIGHT}") from None
    if not 1 <= n <= MAX_SCALE_UP_IN_FLIGHT:
        raise ValueError(f"must be between 1 and {MAX_SCALE_UP_IN_FLIGHT}, got {n}")
    return n


def _scale_up_timeout_s(raw: str) -> float:
    return _duration_between(raw, MIN_SCALE_UP_TIMEOUT_S, MAX_SCALE_UP_TIMEOUT_S, f"{MAX_SCALE_UP_TIMEOUT_S / 3600:g} h")


def _doctor_interval_s(raw: str) -> float | None:
    """``off`` (None) or a duration from 1 minute to 24 hours."""
    if raw.strip().lower() == "off":
        return None
    return _duration_between(raw, MIN_DOCTOR_INTERVAL_S, MAX_DOCTOR_INTERVAL_S, f"{MAX_DOCTOR_INTERVAL_S / 3600:g} h",
                             "a doctor interval ")


def _is_auto(raw: object) -> bool:
    return isinstance(raw, str) and raw.strip().lower() == IDLE_TIMEOUT_AUTO


def _quantile(raw: str) -> float:
    try:
        q = float(raw.strip())
    except ValueError:
        raise ValueError("not a number; use a quantile in (0, 1], e.g. 0.8") from None
    if not math.isfinite(q) or not 0 < q <= 1:
        raise ValueError("a quantile must be in (0, 1]")
    return q


def _hold(raw: str) -> float:
    try:
        h = float(raw.strip())
    except ValueError:
        raise ValueError("not a number; use start-ups from 0 to 100, e.g. 1") from None
    if not math.isfinite(h) or not 0 <= h <= 100:
        raise ValueError("a hold must be from 0 to 100 start-ups")
    return h


def _warm_settings(ann: dict[str, str], problems: list[AnnotationProblem]) -> WarmSettings:
    """The keep-warm knobs; each bad value is a problem and keeps its default."""
    defaults = WarmSettings()
    out: dict[str, float] = {}
    for key, field, parse in ((KEY_WARM_QUANTILE, "quantile", _quantile),
                              (KEY_WARM_HISTORY, "history_s", parse_duration_s),
                              (KEY_WARM_FALLBACK, "fallback_timeout_s", parse_duration_s),
                              (KEY_WARM_HOLD, "hold_startups", _hold)):
        if key in ann:
            try:
                out[field] = parse(_text(ann[key]))
            except (ValueError, TypeError) as exc:
                problems.append(AnnotationProblem(key=key, value=str(ann[key]), reason=str(exc),
                                                  default_used=repr(getattr(defaults, field))))
    return WarmSettings(**out)
