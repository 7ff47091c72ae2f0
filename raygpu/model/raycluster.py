"""A RayCluster as raygpu reads it: typed as soon as it enters.

``RayClusterView.from_k8s`` parses the dict a Kubernetes client returns into
frozen models; no ``dict[str, Any]`` leaves this module except the raw
``template`` of each worker group, kept so that a reservation can copy it.
"""

from __future__ import annotations

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


def _resource_map(raw: dict[str, Any] | None) -> dict[str, float]:
    return {k: parse_quantity(v) for k, v in (raw or {}).items()}



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

    @property
    def ray_gpus(self) -> float:
        """GPUs Ray will count on a pod of this group, as KubeRay computes it."""
        if "num-gpus" in self.ray_start_params:
            return float(self.ray_start_params["num-gpus"])
        return ray_gpu_count_from_limits(self.limits)

    @property
    def ray_cpus(self) -> float:
        if "num-cpus" in self.ray_start_params:
            return float(self.ray_start_params["num-cpus"])
        return self.limits.get("cpu", self.requests.get("cpu", 0.0))


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
        head = _group_from_spec("head", head_spec, is_head=True)
        workers = tuple(
            _group_from_spec(w.get("groupName", f"group-{i}"), w, is_head=False)
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


def _group_from_spec(name: str, spec: dict[str, Any], *, is_head: bool) -> GroupTemplate:
    template = spec.get("template") or {}
    containers = (template.get("spec") or {}).get("containers") or [{}]
    res = containers[0].get("resources") or {}  # KubeRay: the Ray container is index 0
    replicas = spec.get("replicas", 1 if is_head else 0)
    return GroupTemplate(
        group_name=name,
        is_head=is_head,
        replicas=int(replicas if replicas is not None else 0),
        min_replicas=int(spec.get("minReplicas", 0) or 0),
        max_replicas=int(spec.get("maxReplicas", 2**31 - 1) if not is_head else 1),
        requests=_resource_map(res.get("requests")),
        limits=_resource_map(res.get("limits")),
        ray_start_params={k: str(v) for k, v in (spec.get("rayStartParams") or {}).items()},
        ray_labels={k: str(v) for k, v in (spec.get("labels") or {}).items()},
        scheduler_name=(template.get("spec") or {}).get("schedulerName"),
        workers_to_delete=tuple((spec.get("scaleStrategy") or {}).get("workersToDelete") or ()),
        suspended=bool(spec.get("suspend", False)),
        template=template,
    )
