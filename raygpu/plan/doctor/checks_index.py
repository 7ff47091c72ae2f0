"""The one index over a Snapshot, built once per reconcile cycle in one pass per view (pure, O(pods + nodes)).

Every check, the node rows and the stranded arithmetic read this index and
none walks the snapshot's pods again: the pass over the pods computes each
pod's GPU map and units once, adds every live bound pod into its node's
:class:`NodeTally` (the CPU, memory and GPUs requested there; the Ray, pod
and NVML counts of its Ray pods; the GPUs fractional Ray tasks leave over),
and sorts the Ray pods into the few lists the checks start from (paired
with a live Ray node, Running without one, Pending with GPUs, with an NVML
view).

The three views meet here: a Ray node is matched to its pod by
``RayNodeView.instance_id == K8sPodView.name`` (KubeRay sets
``RAY_CLOUD_INSTANCE_ID`` to the pod name), a pod to its Kubernetes node by
``node_name``, and an NVML view to its Ray node by Ray node id. Kubernetes
node names are unique; were two nodes of a snapshot to share one, the last
is the node of that name.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from raygpu.model.shapes import GpuKind
from raygpu.model.views import (
    K8sNodeView,
    K8sPodView,
    NvmlView,
    RayNodeView,
    ResourceSliceView,
    Snapshot,
)
from raygpu.plan.doctor.facts import (
    EPS,
    GPU_COUNT_LABEL,
    GPU_PRODUCT_LABEL,
    KIND_OF,
    MIG_STRATEGY_LABEL,
    TERMINAL_PHASES,
    as_float,
    gpu_resources,
    nvml_reason_class,
    nvml_units_and_mig,
    pod_gpu_map,
)


class NodeTally:
    """One Kubernetes node and what the pods bound to it add up to (filled by :meth:`SnapshotIndex.build`).

    ``capacity_gpus`` / ``allocatable_gpus``: the non-zero GPU entries of the
    node's maps (do not change them), ``*_units`` their sums. Over every live
    pod bound here: ``used_cpu``, ``used_memory`` (a missing request counts
    its limit, as in Kubernetes) and ``used_gpus`` by resource. Over the live
    Ray pods bound here, in snapshot order: ``pod_gpus`` (their GPU units),
    ``ray_gpus`` (their live Ray nodes' ``GPU``), ``nvml_units`` (None when no
    available NVML view), ``nvml_unavailable``, ``nvml_devices`` (most devices
    one available view sees), ``integer_model_gpus`` and ``leftovers`` (Ray
    node, GPU left over by its fractional tasks). ``product``: the GFD product
    label; ``mig_single``: MIG strategy label ``single``; ``allocatable_cpu``
    / ``allocatable_memory``: the node's (0.0 when absent).
    """

    __slots__ = (
        "node", "capacity_gpus", "allocatable_gpus", "capacity_units", "allocatable_units", "allocatable_cpu",
        "allocatable_memory", "product", "mig_single", "used_cpu", "used_memory", "used_gpus", "pod_gpus", "ray_gpus", "nvml_units",
        "nvml_unavailable", "nvml_devices", "integer_model_gpus", "leftovers",
    )

    def __init__(self, node: K8sNodeView) -> None:
        self.node = node
        labels = node.labels
        self.product = labels.get(GPU_PRODUCT_LABEL)
        self.mig_single = labels.get(MIG_STRATEGY_LABEL) == "single"
        self.capacity_gpus = cap = gpu_resources(node.capacity)
        # the usual node advertises its capacity as allocatable: one map then serves both (neither is changed)
        self.allocatable_gpus = alloc = cap if node.allocatable == node.capacity else gpu_resources(node.allocatable)
        self.capacity_units = float(sum(cap.values()))
        self.allocatable_cpu = node.allocatable.get("cpu", 0.0)
        self.allocatable_memory = node.allocatable.get("memory", 0.0)
        self.allocatable_units = float(sum(alloc.values()))
        self.used_cpu = self.used_memory = self.pod_gpus = self.ray_gpus = self.integer_model_gpus = 0.0
        self.used_gpus: dict[str, float] = {}
        self.nvml_units: int | None = None
        self.nvml_unavailable = False
        self.nvml_devices = 0
        self.leftovers: tuple[tuple[RayNodeView, float], ...] = ()


@dataclass
class SnapshotIndex:
    """Every lookup the checks need, keyed the way the views join. Built by :meth:`build`; read-only after."""

    snapshot: Snapshot
    nodes: dict[str, K8sNodeView] = field(default_factory=dict)
    tallies: dict[str, NodeTally] = field(default_factory=dict)  # by node name, snapshot order
    ray_pods: list[K8sPodView] = field(default_factory=list)  # Ray pods in scope, any phase
    ray_pod_by_name: dict[str, K8sPodView] = field(default_factory=dict)
    # the first non-head Ray pod of each (ray_cluster, ray_group), in order of first sight (any phase)
    first_worker_of_group: dict[tuple[str | None, str | None], K8sPodView] = field(default_factory=dict)
    live_ray_by_instance: dict[str, RayNodeView] = field(default_factory=dict)
    live_ray_nodes: list[RayNodeView] = field(default_factory=list)
    device_plugin_ready_on: dict[str, bool] = field(default_factory=dict)  # node name -> some plugin pod ready
    slices_on_node: dict[str, list[ResourceSliceView]] = field(default_factory=dict)
    nvml_by_pod: dict[str, NvmlView] = field(default_factory=dict)  # by pod name (the live Ray node's instance id)
    nvml_units_by_pod: dict[str, int] = field(default_factory=dict)  # NvmlView.gpu_units of available views
    nvml_mig_pods: set[str] = field(default_factory=set)  # pods whose available NVML view has MIG on
    # by id(pod): the GPU units of every Ray pod in scope (sum of pod_gpu_map); pods whose GPUs are slices or shares
    gpu_units_by_pod: dict[int, float] = field(default_factory=dict, repr=False)
    sliced_pods: set[int] = field(default_factory=set, repr=False)
    # where the checks start, in snapshot order. A *suspect* list holds every object the check could find
    # something about (a superset: the check decides), so that no check walks all pods or Ray nodes again.
    count_suspects: list[K8sPodView] = field(default_factory=list)  # live Ray pod, live Ray node: GPU count or shape
    container_suspects: list[K8sPodView] = field(default_factory=list)  # Running, bound; NVML down or != units
    ghost_suspects: list[RayNodeView] = field(default_factory=list)  # live Ray nodes perhaps without a live pod
    running_unpaired: list[K8sPodView] = field(default_factory=list)  # Running, not deleting Ray pod, no live Ray node
    pending_gpu_pods: list[K8sPodView] = field(default_factory=list)  # Pending, unbound, not deleting, any GPU
    pending_gpu_ray_pods: list[K8sPodView] = field(default_factory=list)  # the Ray pods of pending_gpu_pods
    gpuless_nodes: list[K8sNodeView] = field(default_factory=list)  # no GPU units in capacity
    zero_allocatable_nodes: list[K8sNodeView] = field(default_factory=list)  # a GPU resource not > 0 in allocatable
    mig_labelled_nodes: list[K8sNodeView] = field(default_factory=list)  # with a MIG strategy label
    driver_broken_on_node: dict[str, list[tuple[K8sPodView, NvmlView]]] = field(default_factory=dict)  # any node name
    _gpu_maps: dict[int, dict[str, float]] = field(default_factory=dict, repr=False)  # pod_gpus, as asked
    _sorted_names: list[str] | None = field(default=None, repr=False)

    @classmethod
    def build(cls, snapshot: Snapshot) -> "SnapshotIndex":
        """The index of ``snapshot``: one pass over its Ray nodes, one over its nodes, one over its pods."""
        ix = cls(snapshot=snapshot)
        k8s = snapshot.k8s
        ix._index_ray(snapshot)
        tallies = ix.tallies
        for node in k8s.nodes:
            ix.nodes[node.name] = node
            tally = tallies[node.name] = NodeTally(node)
            if not tally.capacity_units > 0:
                ix.gpuless_nodes.append(node)
            alloc = node.allocatable
            for resource in tally.capacity_gpus:
                if not alloc.get(resource, 0.0) > 0:
                    ix.zero_allocatable_nodes.append(node)
                    break
            if MIG_STRATEGY_LABEL in node.labels:
                ix.mig_labelled_nodes.append(node)
        paired_names = ix._index_pods(k8s.pods, _cluster_scope(snapshot, ix.live_ray_by_instance))
        # every live Ray node with an instance id has a live pod of that name when each name was paired
        if len(paired_names) != len(ix.live_ray_by_instance):
            ix.ghost_suspects = ix.live_ray_nodes
        ready = ix.device_plugin_ready_on
        for dp in k8s.device_plugin_pods:
            ready[dp.node_name] = dp.ready or ready.get(dp.node_name, False)
        for rs in k8s.resource_slices or ():
            if rs.node_name:
                ix.slices_on_node.setdefault(rs.node_name, []).append(rs)
        return ix

    def _index_ray(self, snapshot: Snapshot) -> None:
        nvml, live, views = snapshot.nvml, self.live_ray_by_instance, self.nvml_by_pod
        for rn in snapshot.ray.nodes:
            if not rn.alive:
                continue
            self.live_ray_nodes.append(rn)
            instance = rn.instance_id
            if not instance:
                self.ghost_suspects.append(rn)
            else:
                live[instance] = rn
                view = nvml.get(rn.node_id)
                if view is not None:
                    views[instance] = view
                    if view.available:
                        self.nvml_units_by_pod[instance], mig = nvml_units_and_mig(view)
                        if mig:
                            self.nvml_mig_pods.add(instance)

    def _index_pods(self, pods: tuple[K8sPodView, ...], scope: frozenset[str] | None) -> set[str]:
        """Fill the tallies and the check lists; return the names of the live Ray pods with a live Ray node."""
        units, tallies = self.gpu_units_by_pod, self.tallies
        live_ray, views, nvml_units = self.live_ray_by_instance, self.nvml_by_pod, self.nvml_units_by_pod
        by_name, ray_pods, nvml_mig = self.ray_pod_by_name, self.ray_pods, self.nvml_mig_pods
        paired: set[str] = set()
        first_worker = self.first_worker_of_group
        for pod in pods:
            # the pod's GPU map (pod_gpu_map, inlined: the usual pod has requests == limits); not kept
            req, lim = pod.requests, pod.limits
            gpus = gpu_resources(lim)
            if req != lim:
                for name, value in gpu_resources(req).items():
                    gpus[name] = max(gpus.get(name, 0.0), value)
            phase, node_name = pod.phase, pod.node_name
            tally = None
            if phase in TERMINAL_PHASES:
                live = False
            else:
                live = True
                if node_name:
                    tally = tallies.get(node_name)
                    if tally is not None:
                        got = req.get("cpu")
                        tally.used_cpu += lim.get("cpu", 0.0) if got is None else got
                        got = req.get("memory")
                        tally.used_memory += lim.get("memory", 0.0) if got is None else got
                        if gpus:
                            used = tally.used_gpus
                            for resource, count in gpus.items():
                                used[resource] = used.get(resource, 0.0) + count
                elif gpus and phase == "Pending" and not pod.deleting:
                    self.pending_gpu_pods.append(pod)
            # a KubeRay pod (ray.io/cluster or ray.io/node-type label) of a cluster in scope (None: any)
            cluster = pod.ray_cluster
            if cluster is None:
                if pod.ray_node_type is None:
                    continue
            elif scope is not None and cluster not in scope:
                continue
            ray_pods.append(pod)
            if pod.ray_node_type != "head":  # not pod.is_head
                group = (cluster, pod.ray_group)
                if group not in first_worker:
                    first_worker[group] = pod
            name = pod.name
            if live or name not in by_name:  # a live pod wins over a terminated one of the same name
                by_name[name] = pod
            given = units[id(pod)] = sum(gpus.values())
            sliced = False
            for resource in gpus:
                if KIND_OF[resource] is not GpuKind.WHOLE:  # every key of a GPU map has its kind there
                    sliced = True
                    self.sliced_pods.add(id(pod))
                    break
            if not live:
                continue
            rn = live_ray.get(name)
            if rn is not None:
                paired.add(name)
                total = rn.total.get("GPU", 0.0)  # rn.gpu_total
                # Ray's count differs from the pod's, or the pod's GPUs may be slices Ray counts as whole
                if not abs(total - given) <= EPS or (total > 0 and (
                        sliced or name in nvml_mig or (tally is not None and tally.mig_single))):
                    self.count_suspects.append(pod)
            elif phase == "Running" and not pod.deleting:
                self.running_unpaired.append(pod)
            if not node_name:
                if gpus and phase == "Pending" and not pod.deleting:
                    self.pending_gpu_ray_pods.append(pod)
                continue
            view = views.get(name)
            if view is not None:
                if phase == "Running" and not (view.available and abs(nvml_units[name] - given) < EPS):
                    self.container_suspects.append(pod)
                if not view.available and nvml_reason_class(view) == "driver":
                    self.driver_broken_on_node.setdefault(node_name, []).append((pod, view))
            if tally is None:
                continue
            tally.pod_gpus += given
            if rn is not None:
                tally.ray_gpus += total
                free = rn.available.get("GPU", 0.0)  # rn.gpu_available
                if total - free > EPS:
                    busy = total - free
                    rest = min(math.ceil(busy - EPS) - busy, free)
                    if rest > EPS:
                        tally.integer_model_gpus += rest
                        tally.leftovers += ((rn, rest),)
            if view is not None:
                seen = nvml_units.get(name)
                if seen is not None:
                    tally.nvml_units = (tally.nvml_units or 0) + seen
                    if len(view.devices) > tally.nvml_devices:
                        tally.nvml_devices = len(view.devices)
                else:
                    tally.nvml_unavailable = True
        return paired

    # ----------------------------------------------------------- pod facts
    def pod_gpus(self, pod: K8sPodView) -> dict[str, float]:
        """``pod_gpu_map(pod)``, computed once per pod asked for (do not change it)."""
        got = self._gpu_maps.get(id(pod))
        if got is None:
            got = self._gpu_maps[id(pod)] = pod_gpu_map(pod)
        return got

    def pod_gpu_units(self, pod: K8sPodView) -> float:
        """The sum of :meth:`pod_gpus` (of a Ray pod in scope: read from the index)."""
        got = self.gpu_units_by_pod.get(id(pod))
        return sum(self.pod_gpus(pod).values()) if got is None else got

    # ----------------------------------------------------------- node facts
    def sorted_node_names(self) -> list[str]:
        """The snapshot's node names, sorted (computed once)."""
        if self._sorted_names is None:
            self._sorted_names = sorted(self.nodes)
        return self._sorted_names

    def gpu_capacity(self, node: K8sNodeView) -> float:
        return self.tallies[node.name].capacity_units

    def gpu_allocatable(self, node: K8sNodeView) -> float:
        return self.tallies[node.name].allocatable_units

    def node_gpus(self, node: K8sNodeView, *, capacity: bool) -> dict[str, float]:
        """``gpu_resources`` of the node's capacity or allocatable (do not change it)."""
        tally = self.tallies[node.name]
        return tally.capacity_gpus if capacity else tally.allocatable_gpus

    def nvml_devices_on_node(self, node_name: str) -> int:
        """Most GPU devices any container on the node sees (a lower bound on what the host has)."""
        tally = self.tallies.get(node_name)
        return tally.nvml_devices if tally is not None else 0

    def is_gpu_node(self, node: K8sNodeView) -> bool:
        """A node that has, or should have, GPUs: GPU capacity, GFD labels, DRA slices or NVML devices."""
        tally = self.tallies[node.name]
        if tally.capacity_units > 0 or tally.product is not None:
            return True
        if as_float(node.labels.get(GPU_COUNT_LABEL)) > 0:
            return True
        if any(rs.device_count > 0 for rs in self.slices_on_node.get(node.name, ())):
            return True
        return tally.nvml_devices > 0

    def device_plugin_ready(self, node_name: str) -> bool | None:
        """True: a ready plugin pod runs there; False: one runs, none ready; None: none at all."""
        return self.device_plugin_ready_on.get(node_name)

    def driver_broken_on(self, node_name: str) -> NvmlView | None:
        """An NVML view on this node whose failure blames the host driver, if any."""
        broken = self.driver_broken_on_node.get(node_name)
        return broken[0][1] if broken else None


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
