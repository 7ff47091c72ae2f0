"""One Kubernetes node and what the pods bound to it add up to: the unit the doctor's index fills per node (pure)."""

from __future__ import annotations

from raygpu.model.views import K8sNodeView, RayNodeView
from raygpu.plan.doctor.facts import GPU_PRODUCT_LABEL, MIG_STRATEGY_LABEL, gpu_resources


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

    def __init__(self, node: K8sNodeView, shape: NodeShape | None = None) -> None:
        """``shape``: :func:`node_shape` of the node when the caller has it (nodes of a pool share one)."""
        self.node = node
        labels = node.labels
        self.product = labels.get(GPU_PRODUCT_LABEL)
        self.mig_single = labels.get(MIG_STRATEGY_LABEL) == "single"
        (self.capacity_gpus, self.allocatable_gpus, self.capacity_units, self.allocatable_units,
         self.allocatable_cpu, self.allocatable_memory, _) = node_shape(node) if shape is None else shape
        self.used_cpu = self.used_memory = self.pod_gpus = self.ray_gpus = self.integer_model_gpus = 0.0
        self.used_gpus: dict[str, float] = {}
        self.nvml_units: int | None = None
        self.nvml_unavailable = False
        self.nvml_devices = 0
        self.leftovers: tuple[tuple[RayNodeView, float], ...] = ()


# (capacity GPU map, allocatable GPU map, their units, allocatable CPU, allocatable memory, a GPU not allocatable)
NodeShape = tuple[dict[str, float], dict[str, float], float, float, float, float, bool]


def node_shape(node: K8sNodeView) -> NodeShape:
    """What a node's resource maps say, for its tally: a pure function of ``capacity`` and ``allocatable``.

    The GPU maps are ``gpu_resources`` of the maps (not to be changed: tallies of one pool share them);
    CPU and memory are the allocatable ones (0.0 when absent); the last is True when some GPU resource
    of the capacity is not > 0 in allocatable.
    """
    cap, alloc = node.capacity, node.allocatable
    cap_gpus = gpu_resources(cap)
    # the usual node advertises its capacity as allocatable: one map then serves both
    alloc_gpus = cap_gpus if alloc == cap else gpu_resources(alloc)
    zero = any(not alloc.get(resource, 0.0) > 0 for resource in cap_gpus)
    return (cap_gpus, alloc_gpus, float(sum(cap_gpus.values())), float(sum(alloc_gpus.values())),
            alloc.get("cpu", 0.0), alloc.get("memory", 0.0), zero)
