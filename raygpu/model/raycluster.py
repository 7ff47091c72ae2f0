"""A RayCluster as raygpu reads it: typed as soon as it enters.

``RayClusterView.from_k8s`` parses the dict a Kubernetes client returns into
frozen models; no ``dict[str, Any]`` leaves this module except the raw
``template`` of each worker group, kept so that a reservation can copy it.

Parsing never fails on one bad value: a quantity that is not one (``"abc"``),
a ``rayStartParams`` number that is not a finite number >= 0, a replica count
that is not an integer each take a safe default and are recorded as a
:class:`ParseProblem` in the view (``RayClusterView.problems``), for the caller
to report. The raw ``rayStartParams`` are kept as written.
"""

from __future__ import annotations

import math
from typing import Any

from pydantic import Field

from raygpu.model.base import Frozen
from raygpu.model.shapes import ray_gpu_count_from_limits

_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {"n": 1e-9, "u": 1e-6, "m": 1e-3, "": 1.0, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18}


def parse_quantity(value: str | int | float) -> float:
    """Parse a Kubernetes resource quantity (``"500m"``, ``"1Ti"``, ``"8"``) to a float.

    Raises ValueError on anything else.
    """
    if isinstance(value, (int, float)):
        return float(value)
    s = str(value).strip()
    for suffix, mult in _BINARY.items():
        if s.endswith(suffix):
            return float(s[: -len(suffix)]) * mult
    if s and s[-1] in _DECIMAL and not s[-1].isdigit():
        return float(s[:-1]) * _DECIMAL[s[-1]]
    return float(s)  # plain number or exponent form like "1e3"


class ParseProblem(Frozen):
    """One value of a Kubernetes object raygpu could not use: where, which field, why, what it used instead."""

    obj: str  # e.g. "RayCluster team-a/rc group 'gpu'", "Pod team-a/rc-gpu-x"
    field: str  # e.g. "rayStartParams.num-gpus", "limits.nvidia.com/gpu"
    value: str
    reason: str
    default_used: str

    @property
    def message(self) -> str:
        return f"{self.obj}: {self.field}={self.value!r} {self.reason}; using {self.default_used}"


MAX_NUM_GPUS = 1024.0  # per Ray node (pod): past any node's devices, MIG slices or time-sliced shares
MAX_NUM_CPUS = 65536.0  # per Ray node (pod): past any node's cores


def param_number(value: str | None, maximum: float = MAX_NUM_GPUS) -> float | None:
    """A rayStartParams number (``num-gpus``, ``num-cpus``) as ray start reads it; None unless in [0, ``maximum``]."""
    if value is None:
        return None
    try:
        v = float(str(value).strip().strip("'\""))
    except ValueError:
        return None
    return v if math.isfinite(v) and 0 <= v <= maximum else None


def resource_map(raw: Any, obj: str, field: str, problems: list[ParseProblem]) -> dict[str, float]:
    """Parse a ``{name: quantity}`` map; a value that is no quantity is left out and recorded in ``problems``."""
    out: dict[str, float] = {}
    for k, v in (raw.items() if isinstance(raw, dict) else ()):
        try:
            q = parse_quantity(v)
            if not math.isfinite(q):
                raise ValueError("not finite")
            out[k] = q
        except (ValueError, TypeError):
            problems.append(ParseProblem(obj=obj, field=f"{field}.{k}", value=str(v),
                                         reason="is not a Kubernetes quantity", default_used=f"no {k}"))
    return out



class GroupTemplate(Frozen):
    """One head or worker group: what every pod of it asks Kubernetes and Ray for."""

    group_name: str
    is_head: bool = False
    replicas: int = 0
    min_replicas: int = 0
    max_replicas: int = 0
    requests: dict[str, float] = Field(default_factory=dict)  # ray container, Kubernetes names
    limits: dict[str, float] = Field(default_factory=dict)
    ray_start_params: dict[str, str] = Field(default_factory=dict)
    ray_labels: dict[str, str] = Field(default_factory=dict)  # group "labels" -> ray start --labels
    scheduler_name: str | None = None
    workers_to_delete: tuple[str, ...] = ()
    suspended: bool = False
    template: dict[str, Any] = Field(default_factory=dict, repr=False)  # raw pod template
    problems: tuple[ParseProblem, ...] = ()  # values of this group's spec that took a safe default

    @property
    def ray_gpus(self) -> float:
        """GPUs Ray will count on a pod of this group, as KubeRay computes it.

        rayStartParams ``num-gpus`` when it is a number, else (absent or bad) the container limit.
        """
        given = param_number(self.ray_start_params.get("num-gpus"))
        return given if given is not None else ray_gpu_count_from_limits(self.limits)

    @property
    def ray_cpus(self) -> float:
        """rayStartParams ``num-cpus`` when it is a number, else (absent or bad) the CPU limit or request."""
        given = param_number(self.ray_start_params.get("num-cpus"), MAX_NUM_CPUS)
        return given if given is not None else self.limits.get("cpu", self.requests.get("cpu", 0.0))


class RayClusterView(Frozen):
    name: str
    namespace: str
    uid: str = ""
    resource_version: str = ""
    annotations: dict[str, str] = Field(default_factory=dict)
    labels: dict[str, str] = Field(default_factory=dict)
    head: GroupTemplate
    worker_groups: tuple[GroupTemplate, ...] = ()
    autoscaling_enabled: bool = False

    @property
    def problems(self) -> tuple[ParseProblem, ...]:
        """Every value of the spec that took a safe default, head first, then the worker groups in order."""
        return self.head.problems + tuple(p for g in self.worker_groups for p in g.problems)

    def group(self, name: str) -> GroupTemplate | None:
        return next((g for g in self.worker_groups if g.group_name == name), None)

    def group_index(self, name: str) -> int:
        for i, g in enumerate(self.worker_groups):
            if g.group_name == name:
                return i
        raise KeyError(name)

    @classmethod
    def from_k8s(cls, obj: dict[str, Any]) -> "RayClusterView":
        meta = obj.get("metadata", {})
        spec = obj.get("spec", {})
        head_spec = spec.get("headGroupSpec", {})
        where = f"RayCluster {meta.get('namespace', 'default')}/{meta.get('name', '')}"
        head = _group_from_spec("head", head_spec, is_head=True, where=where)
        workers = tuple(
            _group_from_spec(w.get("groupName", f"group-{i}"), w, is_head=False, where=where)
            for i, w in enumerate(spec.get("workerGroupSpecs") or [])
        )
        return cls(
            name=meta.get("name", ""),
            namespace=meta.get("namespace", "default"),
            uid=meta.get("uid", ""),
            resource_version=meta.get("resourceVersion", ""),
            annotations=dict(meta.get("annotations") or {}),
            labels=dict(meta.get("labels") or {}),
            head=head,
            worker_groups=workers,
            autoscaling_enabled=bool(spec.get("enableInTreeAutoscaling", False)),
        )


def _group_from_spec(name: str, spec: dict[str, Any], *, is_head: bool, where: str) -> GroupTemplate:
    template = spec.get("template") or {}
    containers = (template.get("spec") or {}).get("containers") or [{}]
    res = containers[0].get("resources") or {}  # KubeRay: the Ray container is index 0
    obj = f"{where} {'head group' if is_head else f'group {name!r}'}"
    problems: list[ParseProblem] = []
    params = {k: str(v) for k, v in (spec.get("rayStartParams") or {}).items()}
    limits = resource_map(res.get("limits"), obj, "limits", problems)
    requests = resource_map(res.get("requests"), obj, "requests", problems)
    if "num-gpus" in params and param_number(params["num-gpus"]) is None:
        problems.append(ParseProblem(obj=obj, field="rayStartParams.num-gpus", value=params["num-gpus"],
                                     reason=f"is not a number in [0, {MAX_NUM_GPUS:g}]",
                                     default_used=f"the container's GPU limit ({ray_gpu_count_from_limits(limits):g})"))
    if "num-cpus" in params and param_number(params["num-cpus"], MAX_NUM_CPUS) is None:
        problems.append(ParseProblem(obj=obj, field="rayStartParams.num-cpus", value=params["num-cpus"],
                                     reason=f"is not a number in [0, {MAX_NUM_CPUS:g}]", default_used="the container's CPU limit"))
    if "memory" in params:
        try:
            parse_quantity(params["memory"])
        except ValueError:
            problems.append(ParseProblem(obj=obj, field="rayStartParams.memory", value=params["memory"],
                                         reason="is not a Kubernetes quantity",
                                         default_used="the container's memory limit"))
    replicas = _int(spec, "replicas", 1 if is_head else 0, 0, obj, problems)
    return GroupTemplate(
        group_name=name,
        is_head=is_head,
        replicas=replicas,
        # a bad minimum keeps every worker (headroom 0); a bad maximum is KubeRay's default (growth is
        # judged optimistically: keeping a worker too long is the safe error)
        min_replicas=_int(spec, "minReplicas", 0, replicas, obj, problems),
        max_replicas=_int(spec, "maxReplicas", 2**31 - 1, 2**31 - 1, obj, problems) if not is_head else 1,
        requests=requests,
        limits=limits,
        ray_start_params=params,
        ray_labels={k: str(v) for k, v in (spec.get("labels") or {}).items()},
        scheduler_name=(template.get("spec") or {}).get("schedulerName"),
        workers_to_delete=tuple((spec.get("scaleStrategy") or {}).get("workersToDelete") or ()),
        suspended=bool(spec.get("suspend", False)),
        template=template,
        problems=tuple(problems),
    )


def _int(spec: dict[str, Any], key: str, absent: int, bad: int, obj: str, problems: list[ParseProblem]) -> int:
    """``spec[key]`` as an int >= 0: ``absent`` when missing or null, ``bad`` (recorded) when not an integer."""
    raw = spec.get(key)
    if raw is None:
        return absent
    try:
        value = int(raw)
        if value < 0 or isinstance(raw, bool) or (isinstance(raw, float) and raw != value):
            raise ValueError
        return value
    except (ValueError, TypeError):
        problems.append(ParseProblem(obj=obj, field=key, value=str(raw), reason="is not an integer >= 0",
                                     default_used=str(bad)))
        return bad
