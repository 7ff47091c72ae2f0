"""Lookups over one Snapshot, built once per reconcile cycle (pure, O(pods + nodes)).

Every check, the node rows and the stranded arithmetic read this one index, so
that each per-pod and per-node fact (a pod's GPU map and units, a node's GPU
capacity and allocatable maps, the GPU units and MIG state NVML reports in a
pod) is computed at most once per cycle, however many checks ask for it.

The three views meet here: a Ray node is matched to its pod by
``RayNodeView.instance_id == K8sPodView.name`` (KubeRay sets
``RAY_CLOUD_INSTANCE_ID`` to the pod name), a pod to its Kubernetes node by
``node_name``, and an NVML view to its Ray node by Ray node id.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from functools import lru_cache

from raygpu.model.shapes import GpuKind, GpuShape, parse_gpu_resource
from raygpu.model.views import (
    DevicePluginPod,
    K8sNodeView,
    K8sPodView,
    NvmlView,
    RayNodeView,
    ResourceSliceView,
    Snapshot,
)

TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})
GPU_COUNT_LABEL = "nvidia.com/gpu.count"
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
MIG_STRATEGY_LABEL = "nvidia.com/mig.strategy"
EPS = 1e-6

# NVML error strings (pynvml's NVMLError.__str__) that mean the host driver is at fault.
_DRIVER_REASONS = (
    "driver not loaded",
    "gpu is lost",
    "version mismatch",
    "requires restart",
    "reset required",
)
_LIBRARY_REASONS = ("library not found", "shared library", "pynvml not installed")


@lru_cache(maxsize=4096)
def shape_of(resource: str) -> GpuShape | None:
    """``parse_gpu_resource``, memoised: a pure function of a handful of names, called per pod per check."""
    return parse_gpu_resource(resource)


def gpu_resources(resources: dict[str, float]) -> dict[str, float]:
    """The non-zero GPU entries of a Kubernetes resource map (``shapes.gpu_resources``, memoised parse)."""
    known = _GPU_NAMES  # a name seen before is one dict read, not a call
    return {k: v for k, v in resources.items() if v and (known.get(k) or (k not in known and _is_gpu(k)))}


_GPU_NAMES: dict[str, bool] = {}


def _is_gpu(resource: str) -> bool:
    """``shape_of(resource) is not None``, read from a plain dict (called for every key of every map)."""
    got = _GPU_NAMES.get(resource)
    if got is None:
        got = _GPU_NAMES[resource] = shape_of(resource) is not None
    return got


def gpu_units(resources: dict[str, float]) -> float:
    """All GPU units in a Kubernetes resource map (whole GPUs, MIG slices and shares alike)."""
    return float(sum(gpu_resources(resources).values()))


def pod_gpu_map(pod: K8sPodView) -> dict[str, float]:
    """GPU resources a pod holds. Extended resources have requests == limits; take the larger."""
    out = gpu_resources(pod.limits)
    for name, value in gpu_resources(pod.requests).items():
        out[name] = max(out.get(name, 0.0), value)
    return out


def _units_of(view: NvmlView) -> int:
    """``view.gpu_units`` (MIG instances where MIG is on, else whole devices), counted without a generator."""
    units = len(view.devices)
    for d in view.devices:
        if d.mig_enabled:
            units += len(d.mig_devices) - 1
    return units


def has_slices(gpu_map: dict[str, float]) -> bool:
    """Some resource of a pod's GPU map is a MIG slice or a time-sliced share (not a whole GPU)."""
    for name in gpu_map:
        shape = shape_of(name)
        if shape is not None and shape.kind is not GpuKind.WHOLE:
            return True
    return False


def mig_on(view: NvmlView) -> bool:
    """NVML reports MIG mode on for some device."""
    for d in view.devices:
        if d.mig_enabled:
            return True
    return False


def pod_gpu_kinds(pod: K8sPodView) -> set[GpuKind]:
    return {shape.kind for name in pod_gpu_map(pod) if (shape := shape_of(name))}


def nvml_reason_class(view: NvmlView) -> str:
    """Classify why NVML is unavailable: ``driver``, ``library`` or ``other``."""
    reason = (view.reason or "").lower()
    if any(r in reason for r in _DRIVER_REASONS):
        return "driver"
    if any(r in reason for r in _LIBRARY_REASONS):
        return "library"
    return "other"


def is_blocking_taint_effect(effect: str) -> bool:
    return effect in ("NoSchedule", "NoExecute")


@dataclass
class SnapshotIndex:
    """Every lookup the checks need, keyed the way the views join."""

    snapshot: Snapshot
    nodes: dict[str, K8sNodeView] = field(default_factory=dict)
    ray_pods: list[K8sPodView] = field(default_factory=list)  # Ray pods in scope, any phase
    ray_pod_by_name: dict[str, K8sPodView] = field(default_factory=dict)
    pods_on_node: dict[str, list[K8sPodView]] = field(default_factory=lambda: defaultdict(list))
    ray_pods_on_node: dict[str, list[K8sPodView]] = field(default_factory=lambda: defaultdict(list))
    live_ray_by_instance: dict[str, RayNodeView] = field(default_factory=dict)
    live_ray_nodes: list[RayNodeView] = field(default_factory=list)
    device_plugin_on_node: dict[str, list[DevicePluginPod]] = field(default_factory=lambda: defaultdict(list))
    slices_on_node: dict[str, list[ResourceSliceView]] = field(default_factory=lambda: defaultdict(list))
    nvml_by_pod: dict[str, NvmlView] = field(default_factory=dict)
    # by id(pod), for every pod of the snapshot: pod_gpu_map(pod) (do not change it) and its sum
    gpu_map_by_pod: dict[int, dict[str, float]] = field(default_factory=dict, repr=False)
    gpu_units_by_pod: dict[int, float] = field(default_factory=dict, repr=False)
    _node_maps: dict[tuple[int, bool], dict[str, float]] = field(default_factory=dict, repr=False)  # id(node)
    _node_units: dict[tuple[str, bool], float] = field(default_factory=dict, repr=False)
    nvml_units_by_pod: dict[str, int] = field(default_factory=dict)  # NvmlView.gpu_units of available views

    @classmethod
    def build(cls, snapshot: Snapshot) -> "SnapshotIndex":
        ix = cls(snapshot=snapshot)
        k8s = snapshot.k8s
        for rn in snapshot.ray.nodes:
            if not rn.alive:
                continue
            ix.live_ray_nodes.append(rn)
            if rn.instance_id:
                ix.live_ray_by_instance[rn.instance_id] = rn
                view = snapshot.nvml.get(rn.node_id)
                if view is not None:
                    ix.nvml_by_pod[rn.instance_id] = view
                    if view.available:
                        ix.nvml_units_by_pod[rn.instance_id] = _units_of(view)
        scope = _cluster_scope(snapshot, ix.live_ray_by_instance)
        for node in k8s.nodes:
            ix.nodes[node.name] = node
        maps, units = ix.gpu_map_by_pod, ix.gpu_units_by_pod
        for pod in k8s.pods:
            gpus = maps[id(pod)] = pod_gpu_map(pod)
            units[id(pod)] = sum(gpus.values())
            live = pod.phase not in TERMINAL_PHASES
            if live and pod.node_name:
                ix.pods_on_node[pod.node_name].append(pod)
            if not is_ray_pod(pod, scope):
                continue
            ix.ray_pods.append(pod)
            # A live pod wins over a terminated one of the same name (StatefulSet-like reuse).
            if live or pod.name not in ix.ray_pod_by_name:
                ix.ray_pod_by_name[pod.name] = pod
            if live and pod.node_name:
                ix.ray_pods_on_node[pod.node_name].append(pod)
        for dp in k8s.device_plugin_pods:
            ix.device_plugin_on_node[dp.node_name].append(dp)
        for rs in k8s.resource_slices or ():
            if rs.node_name:
                ix.slices_on_node[rs.node_name].append(rs)
        return ix

    # ----------------------------------------------------- memoised counts
    def pod_gpus(self, pod: K8sPodView) -> dict[str, float]:
        """``pod_gpu_map(pod)``, computed once per pod per cycle (the snapshot keeps ``pod`` alive)."""
        got = self.gpu_map_by_pod.get(id(pod))
        if got is None:
            got = self.gpu_map_by_pod[id(pod)] = pod_gpu_map(pod)
        return got

    def pod_gpu_units(self, pod: K8sPodView) -> float:
        got = self.gpu_units_by_pod.get(id(pod))
        if got is None:
            got = self.gpu_units_by_pod[id(pod)] = sum(self.pod_gpus(pod).values())
        return got

    # ----------------------------------------------------------- node facts
    def gpu_capacity(self, node: K8sNodeView) -> float:
        return self._units(node, capacity=True)

    def gpu_allocatable(self, node: K8sNodeView) -> float:
        return self._units(node, capacity=False)

    def node_gpus(self, node: K8sNodeView, *, capacity: bool) -> dict[str, float]:
        """``gpu_resources`` of the node's capacity or allocatable, computed once per node (do not change it)."""
        key = (id(node), capacity)
        got = self._node_maps.get(key)
        if got is None:
            got = self._node_maps[key] = gpu_resources(node.capacity if capacity else node.allocatable)
        return got

    def _units(self, node: K8sNodeView, *, capacity: bool) -> float:
        key = (node.name, capacity)
        got = self._node_units.get(key)
        if got is None:
            got = self._node_units[key] = float(sum(self.node_gpus(node, capacity=capacity).values()))
        return got

    def nvml_on_node(self, node_name: str) -> list[NvmlView]:
        return [v for p in self.ray_pods_on_node.get(node_name, ()) if (v := self.nvml_by_pod.get(p.name))]

    def nvml_devices_on_node(self, node_name: str) -> int:
        """Most GPU devices any container on the node sees (a lower bound on what the host has)."""
        return max((len(v.devices) for v in self.nvml_on_node(node_name) if v.available), default=0)

    def is_gpu_node(self, node: K8sNodeView) -> bool:
        """A node that has, or should have, GPUs: GPU capacity, GFD labels, DRA slices or NVML devices."""
        if self.gpu_capacity(node) > 0 or GPU_PRODUCT_LABEL in node.labels:
            return True
        if _as_float(node.labels.get(GPU_COUNT_LABEL)) > 0:
            return True
        if any(rs.device_count > 0 for rs in self.slices_on_node.get(node.name, ())):
            return True
        return self.nvml_devices_on_node(node.name) > 0

    def device_plugin_ready(self, node_name: str) -> bool | None:
        """True: a ready plugin pod runs there; False: one runs, none ready; None: none at all."""
        pods = self.device_plugin_on_node.get(node_name)
        if not pods:
            return None
        return any(p.ready for p in pods)

    def driver_broken_on(self, node_name: str) -> NvmlView | None:
        """An NVML view on this node whose failure blames the host driver, if any."""
        for view in self.nvml_on_node(node_name):
            if not view.available and nvml_reason_class(view) == "driver":
                return view
        return None


def _cluster_scope(snapshot: Snapshot, live_by_instance: dict[str, RayNodeView]) -> frozenset[str] | None:
    """The RayClusters whose pods Ray's view covers: the snapshot's, else those its live nodes' pods belong to.

    Ray's view is one cluster's GCS; without this, every pod of another
    RayCluster in the same snapshot would look like an orphan.
    """
    if snapshot.cluster is not None:
        return frozenset({snapshot.cluster})
    seen = frozenset(
        p.ray_cluster for p in snapshot.k8s.pods if p.ray_cluster is not None and p.name in live_by_instance
    )
    return seen or None


def is_ray_pod(pod: K8sPodView, scope: frozenset[str] | None) -> bool:
    """A KubeRay pod (``ray.io/cluster`` or ``ray.io/node-type`` label) of a cluster in ``scope`` (None: any)."""
    if pod.ray_cluster is None and pod.ray_node_type is None:
        return False
    return scope is None or pod.ray_cluster is None or pod.ray_cluster in scope


def _as_float(value: str | None) -> float:
    try:
        return float(value) if value is not None else 0.0
    except ValueError:
        return 0.0


def fmt(x: float | None) -> str:
    """A count for messages: ``8`` not ``8.0``, ``0.5`` stays."""
    if x is None:
        return "-"
    return str(int(x)) if abs(x - round(x)) < EPS else f"{x:g}"
