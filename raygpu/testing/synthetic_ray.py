"""Ray's view synthesized from Kubernetes pods, for scale tests that run no raylets (testing only).

The testbed's Ray bridge starts a real Ray node per Ray pod, which a 2-core box
can do for a handful of pods, not for thousands. A scale test of the sidecar
(``raygpu.testing.scale``) therefore creates kwok pods without the bridge's
label and gives the sidecar this provider as its Ray source (the ``read_ray``
parameter of ``raygpu.reclaim.loop.Reclaimer``; nothing in the product path
changes): each Running pod of the watch cache becomes the Ray node its raylet
would report to the GCS.

The pod says what Ray would say about it through one test-only annotation,
``testing.raygpu.io/ray-idle-s``: present, the node is IDLE for that many
seconds (nothing in use); absent, it is RUNNING with every resource in use
(busy). A head pod (``ray.io/node-type: head``) carries Ray's head resource.
Nodes are built as ``dataclasses.asdict(ray.autoscaler.v2.schema.NodeInfo)``
dicts (what ``read_ray_view`` gets from the GCS) and converted by the
adapter's own ``ray_gcs.node_view``, so each cycle pays that conversion as the
real one does; the gRPC read itself is not simulated. No placement groups, no
pending demand, an empty job table.
"""

from __future__ import annotations

import hashlib
from typing import Any, Callable, Iterable

from raygpu.adapters.ray_gcs import HEAD_RESOURCE, node_view
from raygpu.model.views import K8sPodView, RayView

# Test-only, never read by the product: seconds this pod's (absent) Ray node has been idle; no value: busy.
ANNOTATION_RAY_IDLE_S = "testing.raygpu.io/ray-idle-s"
GPU_RESOURCE = "nvidia.com/gpu"


def ray_node_id(pod: K8sPodView) -> str:
    """A stable 56-hex-digit Ray node id (Ray's length) for ``pod``, from its uid (else its name)."""
    return hashlib.sha224((pod.uid or f"{pod.namespace}/{pod.name}").encode()).hexdigest()


def node_info(pod: K8sPodView) -> dict[str, Any]:
    """The GCS's NodeInfo (as ``dataclasses.asdict``) for the Ray node ``pod`` would run.

    Resources come from the pod's limits (GPUs: ``nvidia.com/gpu``, else ``rayStartParams`` num-gpus as KubeRay
    passes it); idleness from ``ANNOTATION_RAY_IDLE_S``. Raises ValueError for an annotation that is no
    number >= 0: a test that asks for an impossible Ray state should fail, not get a busy node.
    """
    gpus = pod.ray_start_num_gpus if pod.ray_start_num_gpus is not None else pod.limits.get(GPU_RESOURCE, 0.0)
    cpus = pod.limits.get("cpu", 1.0)
    raw_idle = pod.annotations.get(ANNOTATION_RAY_IDLE_S)
    idle_s = None if raw_idle is None else float(raw_idle)
    if idle_s is not None and not idle_s >= 0:  # also NaN
        raise ValueError(f"pod {pod.namespace}/{pod.name}: {ANNOTATION_RAY_IDLE_S}={raw_idle!r} is no number >= 0")
    busy, node_id = idle_s is None, ray_node_id(pod)
    ip = "10." + ".".join(str(b) for b in bytes.fromhex(node_id[:6]))  # stable, unique enough for a label
    usage = [{"resource_name": "CPU", "total": cpus, "used": cpus if busy else 0.0},
             {"resource_name": "memory", "total": pod.limits.get("memory", 0.0), "used": 0.0},
             {"resource_name": f"node:{ip}", "total": 1.0, "used": 0.0}]
    if gpus:
        usage.append({"resource_name": "GPU", "total": gpus, "used": gpus if busy else 0.0})
    if pod.is_head:
        usage.append({"resource_name": HEAD_RESOURCE, "total": 1.0, "used": 0.0})
    return {"instance_type_name": "", "ray_node_type_name": pod.ray_group or "headgroup", "instance_id": pod.name,
            "ip_address": ip, "node_status": "RUNNING" if busy else "IDLE", "node_id": node_id,
            "failure_detail": None, "details": None, "node_activity": [] if not busy else ["GPU in use"],
            "labels": {"ray.io/node-id": node_id},
            "resource_usage": {"idle_time_ms": 0 if busy else int(idle_s * 1000), "usage": usage}}


def ray_view_of(pods: Iterable[K8sPodView], now_s: float) -> RayView:
    """Ray's view of ``pods``: one live node per Running pod that is not being deleted (a raylet runs there)."""
    return RayView(nodes=tuple(node_view(node_info(p), now_s) for p in pods
                               if p.phase == "Running" and not p.deleting))


class PodsRayView:
    """A ``read_ray`` for ``Reclaimer``: Ray's view synthesized from the pods ``pods()`` returns at each call.

    ``PodsRayView(lambda: cache.view().pods)`` reads the sidecar's own watch cache, so Ray sees exactly the
    pods the cycle plans from. Never contacts anything; raises only for a bad ``ANNOTATION_RAY_IDLE_S``.
    """

    def __init__(self, pods: Callable[[], Iterable[K8sPodView]]) -> None:
        self._pods = pods
        self.calls, self.last_nodes = 0, 0  # reads so far; Ray nodes in the last view

    def __call__(self, address: str | None = None, timeout_s: float = 10, now_s: float | None = None) -> RayView:
        import time
        view = ray_view_of(self._pods(), time.time() if now_s is None else now_s)
        self.calls, self.last_nodes = self.calls + 1, len(view.nodes)
        return view


def no_jobs(address: str, timeout_s: float = 5.0) -> dict[str, bool]:
    """A ``read_jobs`` for ``Reclaimer``: Ray's job table, empty (no driver ever ran)."""
    return {}
