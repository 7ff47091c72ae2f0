"""What a reservation could leave behind (test_gang, test_faults)."""

from __future__ import annotations

from raygpu.adapters.kube import KubeAdapter
from raygpu.model.labels import LABEL_RESERVATION


def leftovers(kube: KubeAdapter, ns: str, cluster: str) -> dict:
    """Everything a reservation could leave behind."""
    view = kube.get_raycluster(ns, cluster)
    return {
        "worker_groups": [g.group_name for g in view.worker_groups if g.group_name.startswith("rg-")],
        "state_configmaps": [c["metadata"]["name"] for c in kube.list("v1", "ConfigMap", ns, LABEL_RESERVATION)],
        "podgroups": [p["metadata"]["name"] for p in kube.list("scheduling.x-k8s.io/v1alpha1", "PodGroup", ns)],
        "reserved_pods": [p.name for p in kube.ray_pods(ns, cluster) if LABEL_RESERVATION in p.labels],
    }


def nothing_left(kube: KubeAdapter, ns: str, cluster: str) -> dict | None:
    """None while something is left (for wait_for), else the empty leftovers."""
    left = leftovers(kube, ns, cluster)
    return left if not any(left.values()) else None
