"""Take one ``Snapshot``: Ray's, Kubernetes' and (optionally) NVML's view of the GPUs.

Promises: ``take_snapshot`` never raises for an unreachable side; that side
comes back ``reachable=False`` with the reason, and the other sides are
still read. It reads; it never writes anything to either cluster.
"""

from __future__ import annotations

from typing import Any

from raygpu.adapters.kube import KubeAdapter
from raygpu.adapters.kube_dra import read_dra, resource_slice  # noqa: F401 - resource_slice: re-exported
from raygpu.adapters.nvml_collect import collect_nvml_at
from raygpu.adapters.ray_gcs import read_ray_view
from raygpu.model.views import DevicePluginPod, K8sView, Snapshot

DEVICE_PLUGIN_SELECTORS = ("app=nvidia-device-plugin-daemonset", "app.kubernetes.io/name=nvidia-device-plugin")


def take_snapshot(kube: KubeAdapter | None, ray_address: str | None, namespace: str | None,
                  cluster: str | None, now_s: float, with_nvml: bool = False,
                  ray_timeout_s: float = 10.0, nvml_timeout_s: float = 30.0) -> Snapshot:
    """Read all views of RayCluster ``namespace/cluster`` at ``now_s``.

    ``kube`` None: the Kubernetes view is unreachable ("no Kubernetes client").
    ``ray_address`` None: the driver's cluster, else ``RAY_ADDRESS``, else the
    latest local one (see ``read_ray_view``). ``with_nvml`` probes every alive
    Ray node; it uses this process's driver when connected to that cluster,
    else connects one for the duration of the probe.
    """
    ray_view = read_ray_view(ray_address, timeout_s=ray_timeout_s, now_s=now_s)
    alive = [n.node_id for n in ray_view.nodes if n.alive]
    nvml = collect_nvml_at(alive, ray_address, nvml_timeout_s) if with_nvml and ray_view.reachable else {}
    return Snapshot(taken_at_s=now_s, cluster=cluster, namespace=namespace, ray=ray_view,
                    k8s=read_k8s_view(kube, namespace, cluster), nvml=nvml)


def read_k8s_view(kube: KubeAdapter | None, namespace: str | None, cluster: str | None) -> K8sView:
    """Nodes, the cluster's Ray pods, device-plugin pods (all namespaces), DRA ResourceSlices and ResourceClaims.

    Failing to read nodes, Ray pods or device-plugin pods makes the whole
    view unreachable: a partial view would read as "no device plugin".
    ResourceSlices and ResourceClaims (``namespace``'s; every namespace when
    None) are None when ``resource.k8s.io`` is not served or not readable,
    with one line in ``notes`` saying so (``adapters.kube_dra.read_dra``).
    """
    if kube is None:
        return K8sView(reachable=False, reason="no Kubernetes client")
    try:
        nodes = kube.nodes()
        pods = kube.ray_pods(namespace, cluster)
        plugins = {(p.namespace, p.name): p for sel in DEVICE_PLUGIN_SELECTORS
                   for p in map(device_plugin_pod, kube.list("v1", "Pod", None, label_selector=sel)) if p}
    except Exception as e:  # noqa: BLE001 - raygpu errors from the adapter, or anything the client threw
        return K8sView(reachable=False, reason=f"{type(e).__name__}: {e}")
    dra = read_dra(kube, namespace)
    return K8sView(nodes=tuple(nodes), pods=tuple(pods), device_plugin_pods=tuple(plugins.values()),
                   resource_slices=dra.slices, resource_claims=dra.claims, notes=dra.notes)


def device_plugin_pod(p: dict[str, Any]) -> DevicePluginPod | None:
    """A device-plugin pod; its node from ``spec.nodeName`` or, while unscheduled, the
    DaemonSet's ``metadata.name`` node affinity. None when neither names a node."""
    md, spec, st = p["metadata"], p.get("spec") or {}, p.get("status") or {}
    node = spec.get("nodeName") or _daemonset_node(spec)
    if not node:
        return None
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in st.get("conditions") or [])
    return DevicePluginPod(name=md["name"], namespace=md["namespace"], node_name=node, ready=ready)


def _daemonset_node(spec: dict[str, Any]) -> str | None:
    required = (((spec.get("affinity") or {}).get("nodeAffinity") or {})
                .get("requiredDuringSchedulingIgnoredDuringExecution") or {})
    for term in required.get("nodeSelectorTerms") or []:
        for f in term.get("matchFields") or []:
            if f.get("key") == "metadata.name" and f.get("values"):
                return f["values"][0]
    return None

