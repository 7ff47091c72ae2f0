"""Builders for unit tests: one readable line per RayCluster or gang request.

    cluster("c").worker("gpu", gpus=8, cpus=96).mig_worker("mig", profile="3g.40gb", slices=2).obj()
    cluster_view("rc").head(limits={"cpu": 4}).group("gpu", replicas=3, limits={"nvidia.com/gpu": 8}).obj()

``obj()`` goes through ``RayClusterView.from_k8s`` on a RayCluster dict shaped
like what the API server returns for KubeRay v1.5, so tests exercise the real parser;
``cluster_view(...)`` builds the GroupTemplates directly (simulations, where no dict exists).
"""

from __future__ import annotations

import copy
from typing import Any

from raygpu.model.gang import GangRequest
from raygpu.model.raycluster import GroupTemplate, RayClusterView

RAY_IMAGE = "rayproject/ray:2.60.0-py311-gpu"


def _container(limits: dict[str, str], requests: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "name": "ray-worker",
        "image": RAY_IMAGE,
        "resources": {"limits": dict(limits), "requests": dict(requests if requests is not None else limits)},
        "lifecycle": {"preStop": {"exec": {"command": ["/bin/sh", "-c", "ray stop"]}}},
    }


class ClusterBuilder:
    """A RayCluster dict under construction; every method returns a new builder (shared bases stay intact)."""

    def __init__(self, name: str, namespace: str = "default") -> None:
        self._obj: dict[str, Any] = {
            "apiVersion": "ray.io/v1",
            "kind": "RayCluster",
            "metadata": {"name": name, "namespace": namespace, "uid": f"uid-{name}",
                         "resourceVersion": "1001", "annotations": {}, "labels": {}},
            "spec": {
                "rayVersion": "2.60.0",
                "enableInTreeAutoscaling": True,
                "headGroupSpec": {
                    "rayStartParams": {"dashboard-host": "0.0.0.0", "num-cpus": "0"},
                    "template": {"spec": {"containers": [
                        {**_container({"cpu": "4", "memory": "16Gi"}), "name": "ray-head"}]}},
                },
                "workerGroupSpecs": [],
            },
        }

    def _group(self, name: str, limits: dict[str, str], params: dict[str, str], *, max_replicas: int,
               requests: dict[str, str] | None = None, labels: dict[str, str] | None = None,
               sidecar: dict[str, str] | None = None) -> "ClusterBuilder":
        containers = [_container(limits, requests)]
        if sidecar:
            containers.append({"name": "log-shipper", "image": "fluent/fluent-bit:3",
                               "resources": {"requests": dict(sidecar), "limits": dict(sidecar)}})
        new = self._copy()
        new._obj["spec"]["workerGroupSpecs"].append({
            "groupName": name,
            "replicas": 0,
            "minReplicas": 0,
            "maxReplicas": max_replicas,
            "rayStartParams": dict(params),
            "labels": dict(labels or {}),
            "template": {"metadata": {"labels": {"team": "ml"}},
                         "spec": {"containers": containers,
                                  "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}]}},
        })
        return new

    def worker(self, name: str, *, gpus: int = 0, cpus: int = 8, memory: str = "64Gi", max_replicas: int = 10,
               params: dict[str, str] | None = None, **kw: Any) -> "ClusterBuilder":
        """A whole-GPU (or CPU-only, gpus=0) worker group."""
        limits = {"cpu": str(cpus), "memory": memory, **({"nvidia.com/gpu": str(gpus)} if gpus else {})}
        return self._group(name, limits, params or {}, max_replicas=max_replicas, **kw)

    def mig_worker(self, name: str, *, profile: str = "3g.40gb", slices: int = 1, cpus: int = 16,
                   memory: str = "64Gi", max_replicas: int = 10, **kw: Any) -> "ClusterBuilder":
        """A worker group whose pods ask for ``slices`` MIG instances of ``profile``."""
        limits = {"cpu": str(cpus), "memory": memory, f"nvidia.com/mig-{profile}": str(slices)}
        return self._group(name, limits, {}, max_replicas=max_replicas, **kw)

    def share_worker(self, name: str, *, shares: int = 1, num_gpus: float | None = 1.0, cpus: int = 8,
                     memory: str = "32Gi", max_replicas: int = 10, **kw: Any) -> "ClusterBuilder":
        """A shared-GPU (time-sliced) worker group; ``num_gpus`` is rayStartParams num-gpus (None: unset)."""
        limits = {"cpu": str(cpus), "memory": memory, "nvidia.com/gpu.shared": str(shares)}
        params = {} if num_gpus is None else {"num-gpus": f"{num_gpus:g}"}
        return self._group(name, limits, params, max_replicas=max_replicas, **kw)

    def annotate(self, key: str, value: str) -> "ClusterBuilder":
        new = self._copy()
        new._obj["metadata"]["annotations"][key] = value
        return new

    def _copy(self) -> "ClusterBuilder":
        new = ClusterBuilder.__new__(ClusterBuilder)
        new._obj = copy.deepcopy(self._obj)
        return new

    def raw(self) -> dict[str, Any]:
        return copy.deepcopy(self._obj)

    def obj(self) -> RayClusterView:
        return RayClusterView.from_k8s(self.raw())


def cluster(name: str = "c", namespace: str = "default") -> ClusterBuilder:
    return ClusterBuilder(name, namespace)


class ViewBuilder:
    """A RayClusterView made of GroupTemplates directly, with no RayCluster dict to parse: the simulations'
    clusters (benchmarks) and the reclaimer's ``world()``. Template fields are GroupTemplate's own
    (``replicas``, ``min_replicas``, ``max_replicas``, ``limits``, ``requests``, ``workers_to_delete``, ...).

        cluster_view("rc", resource_version="1").head(limits={"cpu": 4}).group("gpu", replicas=2, limits=res).obj()
    """

    def __init__(self, name: str, namespace: str = "default", **view: Any) -> None:
        self._view = dict(name=name, namespace=namespace, **view)
        self._head = GroupTemplate(group_name="headgroup", is_head=True)
        self._groups: list[GroupTemplate] = []

    def head(self, name: str = "headgroup", **template: Any) -> "ViewBuilder":
        self._head = GroupTemplate(group_name=name, is_head=True, **template)
        return self

    def group(self, name: str, **template: Any) -> "ViewBuilder":
        self._groups.append(GroupTemplate(group_name=name, **template))
        return self

    def obj(self) -> RayClusterView:
        return RayClusterView(head=self._head, worker_groups=tuple(self._groups), **self._view)


def cluster_view(name: str = "rc", namespace: str = "default", **view: Any) -> ViewBuilder:
    """``view``: RayClusterView fields other than the groups (``resource_version``, ``autoscaling_enabled``, ...)."""
    return ViewBuilder(name, namespace, **view)


def gang(bundles: list[dict[str, float]], strategy: str = "PACK", *, name: str = "job1", cluster_name: str = "c",
         **kw: Any) -> GangRequest:
    """A GangRequest for cluster ``c`` in namespace ``default`` unless told otherwise."""
    return GangRequest(name=name, cluster=cluster_name, bundles=bundles, strategy=strategy, **kw)


def gpus(n: float, count: int = 1, **extra: float) -> list[dict[str, float]]:
    """``count`` bundles of ``n`` GPUs (plus ``extra`` resources each)."""
    return [{"GPU": n, **extra} for _ in range(count)]
