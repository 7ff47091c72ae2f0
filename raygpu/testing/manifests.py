"""Builders for the objects tests and the demo apply: RayClusters, PodGroups, Kueue queues."""

from __future__ import annotations

import re
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


def ray_pod(cluster: str, namespace: str, name: str, *, group: str, node_name: str, owner_uid: str,
            head: bool = False, cpu: str = "8", memory: str = "64Gi", gpus: int = 0,
            annotations: dict[str, str] | None = None) -> dict[str, Any]:
    """A Ray pod as KubeRay's operator builds it for RayCluster ``cluster`` (uid ``owner_uid``), bound to
    ``node_name``: its labels (``ray.io/cluster``, ``ray.io/group``, ``ray.io/node-type``, ``ray.io/identifier``,
    ``app.kubernetes.io/*``), its controller ownerReference, the ``ray start`` command in
    ``KUBERAY_GEN_RAY_START_CMD`` and the Ray env, and the container's requests = limits.

    It lacks ``ray.io/is-ray-node=yes`` on purpose: the testbed's Ray bridge starts a Ray node only for pods
    with that label, so pods from here run no raylet (Ray's view of them is ``raygpu.testing.synthetic_ray``).
    """
    node_type = "head" if head else "worker"
    res = {"cpu": cpu, "memory": memory, **({"nvidia.com/gpu": str(gpus)} if gpus else {})}
    start = (f"ray start --head --num-gpus={gpus}" if head else
             f"ray start --address={cluster}-head-svc.{namespace}.svc.cluster.local:6379 --num-gpus={gpus}")
    env = [{"name": "KUBERAY_GEN_RAY_START_CMD", "value": start}, {"name": "RAY_CLOUD_INSTANCE_ID", "value": name},
           {"name": "RAY_NODE_TYPE_NAME", "value": group}, {"name": "RAY_CLUSTER_NAME", "value": cluster}]
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "annotations": dict(annotations or {}), "labels": {
            "ray.io/cluster": cluster, "ray.io/group": group, "ray.io/node-type": node_type,
            "ray.io/identifier": f"{cluster}-{node_type}", "app.kubernetes.io/name": "kuberay",
            "app.kubernetes.io/created-by": "kuberay-operator"},
            "ownerReferences": [{"apiVersion": "ray.io/v1", "kind": "RayCluster", "name": cluster, "uid": owner_uid,
                                 "controller": True, "blockOwnerDeletion": True}]},
        "spec": {"nodeName": node_name, "containers": [{
            "name": "ray-head" if head else "ray-worker", "image": RAY_IMAGE, "env": env,
            "resources": {"limits": dict(res), "requests": dict(res)}}]},
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


DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
# The name deploy/sidecar/role.yaml's rayclusters rule carries until an overlay sets the cluster's: upper case,
# so it can never match a RayCluster (a DNS subdomain name) and an unpatched base grants nothing on rayclusters.
RAYCLUSTER_NAME_PLACEHOLDER = "RAYCLUSTER_NAME"
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def _kustomize_resources(base: Path) -> list[dict[str, Any]]:
    """The objects of the kustomize base ``base``, in the order its ``resources`` list them."""
    import yaml

    return [obj for f in yaml.safe_load((base / "kustomization.yaml").read_text())["resources"]
            for obj in yaml.safe_load_all((base / f).read_text()) if obj]


def _fill_placeholder(base: str, namespace: str, cluster: str, rules: int) -> list[dict[str, Any]]:
    """The objects of ``deploy/<base>`` placed in ``namespace``, ``RAYCLUSTER_NAME`` in the Role's resourceNames
    replaced by ``cluster``. Raises ValueError for a ``cluster`` that is no RayCluster name (a DNS subdomain),
    or when the placeholder is not in exactly ``rules`` Role rules (an overlay's patch would then miss)."""
    if len(cluster) > 253 or not _DNS_SUBDOMAIN.match(cluster):
        raise ValueError(f"{cluster!r} is not a RayCluster name (a lower-case DNS subdomain name)")
    out = _kustomize_resources(DEPLOY / base)
    filled = 0
    for obj in out:
        obj["metadata"]["namespace"] = namespace
        for rule in obj.get("rules") or []:
            names = rule.get("resourceNames") or []
            if any(n.startswith(RAYCLUSTER_NAME_PLACEHOLDER) for n in names):
                rule["resourceNames"] = [cluster + n[len(RAYCLUSTER_NAME_PLACEHOLDER):]
                                         if n.startswith(RAYCLUSTER_NAME_PLACEHOLDER) else n for n in names]
                filled += 1
    if filled != rules:
        raise ValueError(f"deploy/{base}: expected {RAYCLUSTER_NAME_PLACEHOLDER} in {rules} Role rule(s), found {filled}")
    return out


def sidecar_deploy_objects(namespace: str, cluster: str) -> list[dict[str, Any]]:
    """The objects of ``deploy/sidecar`` (ServiceAccount, Role, RoleBinding) for RayCluster ``cluster``, as an
    overlay like ``deploy/examples/sidecar-overlay`` renders them: placed in ``namespace``, the Role's
    rayclusters rule naming ``cluster`` and its keep-warm ConfigMap rule naming ``<cluster>-raygpu-warm``
    instead of the placeholder.

    Raises ValueError for a ``cluster`` that is no RayCluster name (a DNS subdomain), or when the Role no
    longer carries the placeholder in exactly those two rules (the overlay's patch would then miss)."""
    return _fill_placeholder("sidecar", namespace, cluster, 2)


def driver_deploy_objects(namespace: str, cluster: str) -> list[dict[str, Any]]:
    """The objects of ``deploy/driver`` (ServiceAccount, Role, RoleBinding) for RayCluster ``cluster``, as
    ``deploy/examples/driver-overlay`` renders them: placed in ``namespace``, the Role's rayclusters rule
    naming ``cluster``. Raises ValueError as ``sidecar_deploy_objects`` does (one placeholder rule)."""
    return _fill_placeholder("driver", namespace, cluster, 1)


def sidecar_scale_up_objects(namespace: str) -> list[dict[str, Any]]:
    """The objects of ``deploy/sidecar-scale-up`` (the gang scale-up Role and its RoleBinding to the sidecar's
    ServiceAccount) placed in ``namespace``; they name no RayCluster."""
    out = _kustomize_resources(DEPLOY / "sidecar-scale-up")
    for obj in out:
        obj["metadata"]["namespace"] = namespace
    return out


def sidecar_policy_objects() -> list[dict[str, Any]]:
    """The cluster-scoped objects of ``deploy/sidecar-policy`` (ValidatingAdmissionPolicies and their bindings)."""
    return _kustomize_resources(DEPLOY / "sidecar-policy")


# ------------------------------------------------------------------ every manifest the repository ships
REPO = DEPLOY.parent
MANIFEST_ROOTS = ("deploy", "examples")
# deploy/helm (a Helm chart: templates, not manifests) is rendered and compared by its own tests;
# deploy/monitoring holds a Prometheus rule file, its promtool tests and a Grafana dashboard, no Kubernetes
# object (tests/unit/test_monitoring.py; the chart's PrometheusRule wraps the rules and is dry-run applied by
# tests/integration/test_deploy_helm_dry_run.py).
SKIPPED_DIRS = ("deploy/helm", "deploy/monitoring")
MANIFEST_SUFFIXES = (".yaml", ".yml")
# shipped trees that use an API an older control plane does not serve -> the oldest Kubernetes minor that
# serves it: deploy/workload's MutatingAdmissionPolicy is admissionregistration.k8s.io/v1 (GA in 1.36), and
# the workload backend needs the 1.37 testbed anyway (docs/testbed.md "Kubernetes versions")
NEEDS_KUBERNETES = {"deploy/workload": "1.37"}


def needs_kubernetes(rel: Path | str) -> str | None:
    """The Kubernetes minor (``"1.37"``) that the shipped manifest ``rel`` needs, or None if any served one does."""
    rel = Path(rel).as_posix()
    return next((v for d, v in NEEDS_KUBERNETES.items() if rel == d or rel.startswith(d + "/")), None)


def minor_at_least(have: str, need: str) -> bool:
    """``"1.34"`` >= ``"1.37"``? Compared as numbers, not strings."""
    return tuple(int(x) for x in have.split(".")) >= tuple(int(x) for x in need.split("."))


def shipped_manifests(repo: Path = REPO) -> tuple[list[Path], list[Path]]:
    """(plain manifest files, kustomization directories) under ``deploy/`` and ``examples/``, sorted, as paths
    relative to ``repo``. Plain: every ``*.yaml``/``*.yml`` but ``kustomization.yaml``; a directory holding a
    ``kustomization.yaml`` is rendered whole instead (``kubectl kustomize``). Skipped: ``SKIPPED_DIRS`` and
    every file of another suffix (a Containerfile, Python examples, READMEs)."""
    files, kustomizations = [], []
    for root in MANIFEST_ROOTS:
        for p in sorted((repo / root).rglob("*")):
            rel = p.relative_to(repo)
            if not p.is_file() or any(rel.as_posix() == d or rel.as_posix().startswith(d + "/") for d in SKIPPED_DIRS):
                continue
            if p.name == "kustomization.yaml":
                kustomizations.append(rel.parent)
            elif p.suffix in MANIFEST_SUFFIXES:
                files.append(rel)
    return files, kustomizations
