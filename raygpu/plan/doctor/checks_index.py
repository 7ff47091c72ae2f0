"""The one index over a Snapshot, built once per reconcile cycle in one pass per view (pure, O(pods + nodes)).

Every check, the node rows and the stranded arithmetic read this index and
none walks the snapshot's pods again: the pass over the pods works out a
pod's GPU map and units once per distinct shape (the units plus the GPU
devices of the ResourceClaims reserved for it: ``dra_gpus.claim_gpus_by_pod``,
built once before the pass), adds every live bound pod into its node's
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

from raygpu.model.views import (
    K8sNodeView,
    K8sPodView,
    NvmlView,
    RayNodeView,
    ResourceSliceView,
    Snapshot,
)
from raygpu.plan.doctor.dra_gpus import ClaimGpus, claim_gpus_by_pod
from raygpu.plan.doctor.facts import (
    EPS,
    GPU_COUNT_LABEL,
    MIG_STRATEGY_LABEL,
    TERMINAL_PHASES,
    as_float,
    nvml_reason_class,
    pod_facts,
    pod_gpu_map,
)
from raygpu.plan.doctor.tally import NodeShape, NodeTally, node_shape
from raygpu.plan.common.index import RayJoin, join_ray


@dataclass
class SnapshotIndex:
    """Every lookup the checks need, keyed the way the views join. Built by :meth:`build`; read-only after."""

    snapshot: Snapshot
    ray: RayJoin | None = None  # Ray's live nodes joined to pod names (``plan.common.index``: plan_reclaim reads it too)
    nodes: dict[str, K8sNodeView] = field(default_factory=dict)
    tallies: dict[str, NodeTally] = field(default_factory=dict)  # by node name, snapshot order
    ray_pods: list[K8sPodView] = field(default_factory=list)  # Ray pods in scope, any phase
    # the first non-head Ray pod of each (ray_cluster, ray_group), in order of first sight (any phase)
    first_worker_of_group: dict[tuple[str | None, str | None], K8sPodView] = field(default_factory=dict)
    live_ray_by_instance: dict[str, RayNodeView] = field(default_factory=dict)
    live_ray_nodes: list[RayNodeView] = field(default_factory=list)
    device_plugin_ready_on: dict[str, bool] = field(default_factory=dict)  # node name -> some plugin pod ready
    slices_on_node: dict[str, list[ResourceSliceView]] = field(default_factory=dict)
    nvml_by_pod: dict[str, NvmlView] = field(default_factory=dict)  # by pod name (the live Ray node's instance id)
    nvml_units_by_pod: dict[str, int] = field(default_factory=dict)  # NvmlView.gpu_units of available views
    nvml_mig_pods: set[str] = field(default_factory=set)  # pods whose available NVML view has MIG on
    # by id(pod): the GPU units (sum of pod_gpu_map, plus its claims' GPU devices) of the Ray pods in the check
    # lists; Ray pods whose GPUs are slices or shares
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
    # (namespace, pod name) -> GPU devices of the ResourceClaims reserved for it (dra_gpus.claim_gpus_by_pod):
    # part of what the pod was given; empty without claims
    claim_gpus: dict[tuple[str, str], ClaimGpus] = field(default_factory=dict)
    any_device_health: bool = False  # some pod has an allocatedResourcesStatus entry (the DRA check reads them)
    driver_broken_on_node: dict[str, list[tuple[K8sPodView, NvmlView]]] = field(default_factory=dict)  # any node name
    _gpu_maps: dict[int, dict[str, float]] = field(default_factory=dict, repr=False)  # pod_gpus, as asked
    _sorted_names: list[str] | None = field(default=None, repr=False)
    _ray_pod_by_name: dict[str, K8sPodView] | None = field(default=None, repr=False)

    @classmethod
    def build(cls, snapshot: Snapshot) -> "SnapshotIndex":
        """The index of ``snapshot``: one pass over its Ray nodes, one over its nodes, one over its pods."""
        ix = cls(snapshot=snapshot, ray=join_ray(snapshot.ray.nodes, snapshot.nvml))
        k8s = snapshot.k8s
        ix._index_ray(snapshot)
        ix._index_nodes(k8s.nodes)
        ix.claim_gpus = claim_gpus_by_pod(k8s)
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
        """The live Ray nodes and each pod's NVML view, units and MIG flag: ``self.ray``'s (one visit per node)."""
        join = self.ray
        self.live_ray_by_instance, self.live_ray_nodes = join.by_instance, join.live
        self.ghost_suspects = join.without_instance()
        self.nvml_by_pod, self.nvml_units_by_pod, self.nvml_mig_pods = \
            join.nvml_by_pod, join.nvml_units_by_pod, join.nvml_mig_pods

    def _index_nodes(self, nodes: tuple[K8sNodeView, ...]) -> None:
        """A tally per node and the node lists of the checks.

        Nodes of one pool have equal resource maps: their GPU maps and units are worked out once per
        distinct map within this call and shared (read-only) by those nodes' tallies. The maps of a
        validated snapshot hold floats, so equal maps are equal value for value, type included.
        """
        by_name, tallies = self.nodes, self.tallies
        shapes: dict[tuple, NodeShape] = {}  # (capacity items, allocatable items) -> node_shape
        for node in nodes:
            cap, alloc = node.capacity, node.allocatable
            key = (tuple(cap.items()), tuple(alloc.items()))
            shape = shapes.get(key)
            if shape is None:
                shape = shapes[key] = node_shape(node)
            by_name[node.name] = node
            tallies[node.name] = NodeTally(node, shape)
            if not shape[2] > 0:
                self.gpuless_nodes.append(node)
            if shape[6]:
                self.zero_allocatable_nodes.append(node)
            if MIG_STRATEGY_LABEL in node.labels:
                self.mig_labelled_nodes.append(node)

    def _index_pods(self, pods: tuple[K8sPodView, ...], scope: frozenset[str] | None) -> set[str]:
        """Fill the tallies and the check lists; return the names of the live Ray pods with a live Ray node.

        The hot loop of the doctor (21,000 pods at 10,000 nodes). What a pod's maps say (GPU map, units,
        slices, CPU, memory: :func:`pod_facts`) is worked out once per distinct limits map of the pods
        whose requests equal their limits (the usual pod: the pods of a group share one shape) and shared,
        read-only; a pod whose maps differ gets its own.
        """
        tallies, units, sliced_pods = self.tallies, self.gpu_units_by_pod, self.sliced_pods
        live_ray, views, nvml_units = self.live_ray_by_instance, self.nvml_by_pod, self.nvml_units_by_pod
        ray_pods, nvml_mig = self.ray_pods, self.nvml_mig_pods
        count_suspects, running_unpaired, container = self.count_suspects, self.running_unpaired, self.container_suspects
        paired: set[str] = set()
        first_worker = self.first_worker_of_group
        last_group: tuple[str | None, str | None] | None = None
        # a map's resource names -> (its GPU names, some of them a slice or share), within this call
        names_memo: dict[tuple[str, ...], tuple[tuple[str, ...], bool]] = {}
        claim_gpus = self.claim_gpus
        facts_memo: dict[tuple, tuple] = {}  # limits items -> pod_facts, of pods whose requests equal their limits
        for pod in pods:
            req, lim = pod.requests, pod.limits
            if req == lim:
                key = tuple(lim.items())
                facts = facts_memo.get(key)
                if facts is None:
                    facts = facts_memo[key] = pod_facts(req, lim, names_memo)
            else:
                facts = pod_facts(req, lim, names_memo)
            gpus, given, sliced, cpu, memory = facts
            if claim_gpus and (claimed := claim_gpus.get((pod.namespace, pod.name))) is not None:
                given += claimed.units  # GPUs of its ResourceClaims: given to it as its limits' are
            if pod.device_health:
                self.any_device_health = True
            phase, node_name = pod.phase, pod.node_name
            tally = None
            if phase in TERMINAL_PHASES:
                live = False
            else:
                live = True
                if node_name:
                    tally = tallies.get(node_name)
                    if tally is not None:
                        tally.used_cpu += cpu
                        tally.used_memory += memory
                        if gpus:
                            used = tally.used_gpus
                            for resource, count in gpus.items():
                                used[resource] = used.get(resource, 0.0) + count
                elif gpus and phase == "Pending" and not pod.deleting:
                    self.pending_gpu_pods.append(pod)
            # a KubeRay pod (ray.io/cluster or ray.io/node-type label) of a cluster in scope (None: any)
            cluster = pod.ray_cluster
            node_type = pod.ray_node_type
            if cluster is None:
                if node_type is None:
                    continue
            elif scope is not None and cluster not in scope:
                continue
            ray_pods.append(pod)
            if node_type != "head":  # not pod.is_head
                group = pod.ray_group
                if last_group is None or last_group[0] != cluster or last_group[1] != group:
                    last_group = (cluster, group)  # pods of a group come one after another: one tuple per run
                    if last_group not in first_worker:
                        first_worker[last_group] = pod
            if sliced:
                sliced_pods.add(id(pod))
            if not live:
                continue
            name = pod.name
            rn = live_ray.get(name)
            if rn is not None:
                paired.add(name)
                total = rn.total.get("GPU", 0.0)  # rn.gpu_total
                # Ray's count differs from the pod's, or the pod's GPUs may be slices Ray counts as whole
                if not abs(total - given) <= EPS or (total > 0 and (
                        sliced or name in nvml_mig or (tally is not None and tally.mig_single))):
                    count_suspects.append(pod)
                    units[id(pod)] = given
            elif phase == "Running" and not pod.deleting:
                running_unpaired.append(pod)
                units[id(pod)] = given
            if not node_name:
                if gpus and phase == "Pending" and not pod.deleting:
                    self.pending_gpu_ray_pods.append(pod)
                continue
            view = views.get(name)
            if view is not None:
                # NVML's units, present for an available view (the one the index keeps for this name)
                seen = nvml_units.get(name)
                available = view.available
                if phase == "Running" and not (available and abs(seen - given) < EPS):
                    container.append(pod)
                    units[id(pod)] = given
                if not available and nvml_reason_class(view) == "driver":
                    self.driver_broken_on_node.setdefault(node_name, []).append((pod, view))
                    units[id(pod)] = given
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
                if seen is not None:
                    tally.nvml_units = (tally.nvml_units or 0) + seen
                    if len(view.devices) > tally.nvml_devices:
                        tally.nvml_devices = len(view.devices)
                else:
                    tally.nvml_unavailable = True
        return paired

    # ----------------------------------------------------------- pod facts
    def ray_pod_named(self, name: str) -> K8sPodView | None:
        """The Ray pod in scope of that name: the last live one, else the first (all ended); built once, when asked."""
        if self._ray_pod_by_name is None:
            by_name: dict[str, K8sPodView] = {}
            for pod in self.ray_pods:
                if pod.phase not in TERMINAL_PHASES or pod.name not in by_name:  # a live pod wins over an ended one
                    by_name[pod.name] = pod
            self._ray_pod_by_name = by_name
        return self._ray_pod_by_name.get(name)

    def pod_gpus(self, pod: K8sPodView) -> dict[str, float]:
        """``pod_gpu_map(pod)``, computed once per pod asked for (do not change it)."""
        got = self._gpu_maps.get(id(pod))
        if got is None:
            got = self._gpu_maps[id(pod)] = pod_gpu_map(pod)
        return got

    def pod_gpu_units(self, pod: K8sPodView) -> float:
        """The GPU units the pod was given: the sum of :meth:`pod_gpus` plus its claims' GPU devices (of a pod
        in a check list: read from the index)."""
        got = self.gpu_units_by_pod.get(id(pod))
        if got is not None:
            return got
        claimed = self.pod_claim_gpus(pod)
        return sum(self.pod_gpus(pod).values()) + (claimed.units if claimed is not None else 0.0)

    def pod_claim_gpus(self, pod: K8sPodView) -> ClaimGpus | None:
        """The GPU devices of the ResourceClaims reserved for the pod, or None (no such claim, or none read)."""
        return self.claim_gpus.get((pod.namespace, pod.name)) if self.claim_gpus else None

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


def index_snapshot(snapshot: Snapshot) -> SnapshotIndex:
    """The one index of ``snapshot`` for a whole cycle: read it with ``reconcile`` and ``plan_reclaim``."""
    return SnapshotIndex.build(snapshot)
