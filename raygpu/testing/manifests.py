"""Builders for the objects tests and the demo apply: RayClusters, PodGroups, Kueue queues."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from raygpu.model.labels import LABEL_POOL, LABEL_TESTBED_SHAPE

RAY_IMAGE = "rayproject/ray:2.60.0"  # never pulled: kwok runs no containers


def worker_group(name: str, *, replicas: int = 0, min_replicas: int = 0, max_replicas: int = 16,
                 cpu: str = "8", memory: str = "64Gi", gpus: dict[str, int] | None = None,
                 ray_start_params: dict[str, str] | None = None, labels: dict[str, str] | None = None,
                 pool: str | None = None, tolerations: list[dict] | None = None) -> dict[str, Any]:
    """One KubeRay worker group whose Ray container asks for ``cpu``, ``memory`` and ``gpus``."""
    res = {"cpu": cpu, "memory": memory, **{k: str(v) for k, v in (gpus if gpus is not None else {"nvidia.com/gpu": 8}).items()}}
    spec: dict[str, Any] = {"containers": [{"name": "ray-worker", "image": RAY_IMAGE,
                                            "resources": {"limits": dict(res), "requests": dict(res)}}]}
    if pool:
        spec["nodeSelector"] = {LABEL_POOL: pool}
    if tolerations:
        spec["tolerations"] = tolerations
    g: dict[str, Any] = {"groupName": name, "replicas": replicas, "minReplicas": min_replicas,
                         "maxReplicas": max_replicas, "rayStartParams": dict(ray_start_params or {}),
                         "template": {"spec": spec}}
    if labels:
        g["labels"] = labels
    return g


def raycluster(name: str, namespace: str, workers: list[dict[str, Any]], *, pool: str | None = None,
               annotations: dict[str, str] | None = None, head_cpu: str = "2") -> dict[str, Any]:
    """A RayCluster with a CPU-only head (on the pool's CPU node) and ``workers``."""
    head_spec: dict[str, Any] = {"containers": [{"name": "ray-head", "image": RAY_IMAGE, "resources": {
        "limits": {"cpu": head_cpu, "memory": "8Gi"}, "requests": {"cpu": head_cpu, "memory": "8Gi"}}}]}
    if pool:
        head_spec["nodeSelector"] = {LABEL_POOL: pool, LABEL_TESTBED_SHAPE: "cpu16"}
    return {
        "apiVersion": "ray.io/v1", "kind": "RayCluster",
        "metadata": {"name": name, "namespace": namespace, "annotations": dict(annotations or {})},
        "spec": {"rayVersion": "2.60.0",
                 "headGroupSpec": {"rayStartParams": {}, "template": {"spec": head_spec}},
                 "workerGroupSpecs": workers},
    }


def cluster_queue(name: str, quotas: dict[str, str], flavor: str = "default-flavor") -> dict[str, Any]:
    """A Kueue ClusterQueue admitting from every namespace with ``quotas`` (e.g. {"nvidia.com/gpu": "16"})."""
    return {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue", "metadata": {"name": name},
            "spec": {"namespaceSelector": {}, "resourceGroups": [{
                "coveredResources": sorted(quotas),
                "flavors": [{"name": flavor, "resources": [{"name": r, "nominalQuota": q}
                                                          for r, q in sorted(quotas.items())]}]}]}}


def local_queue(name: str, namespace: str, cluster_queue_name: str) -> dict[str, Any]:
    return {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue",
            "metadata": {"name": name, "namespace": namespace}, "spec": {"clusterQueue": cluster_queue_name}}


def sidecar_deploy_objects(namespace: str) -> list[dict[str, Any]]:
    """The objects of ``deploy/sidecar`` (ServiceAccount, Role, RoleBinding) as its kustomization lists
    them, placed in ``namespace`` (what a kustomize overlay with ``namespace:`` would render)."""
    import yaml

    base = Path(__file__).resolve().parents[2] / "deploy" / "sidecar"
    out = []
    for f in yaml.safe_load((base / "kustomization.yaml").read_text())["resources"]:
        for obj in yaml.safe_load_all((base / f).read_text()):
            obj["metadata"]["namespace"] = namespace
            out.append(obj)
    return out
