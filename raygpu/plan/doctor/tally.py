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

    def __init__(self, node: K8sNodeView, capacity_gpus: dict[str, float] | None = None,
                 allocatable_gpus: dict[str, float] | None = None) -> None:
        """``capacity_gpus`` / ``allocatable_gpus``: ``gpu_resources`` of the node's maps when the caller has them."""
        self.node = node
        labels = node.labels
        self.product = labels.get(GPU_PRODUCT_LABEL)
        self.mig_single = labels.get(MIG_STRATEGY_LABEL) == "single"
        allocatable = node.allocatable
        self.capacity_gpus = cap = gpu_resources(node.capacity) if capacity_gpus is None else capacity_gpus
        # the usual node advertises its capacity as allocatable: one map then serves both (neither is changed)
        self.allocatable_gpus = allocatable_gpus = allocatable_gpus if allocatable_gpus is not None else (
            cap if allocatable == node.capacity else gpu_resources(allocatable))
        self.capacity_units = float(sum(cap.values()))
        self.allocatable_units = float(sum(allocatable_gpus.values()))
        self.allocatable_cpu = allocatable.get("cpu", 0.0)
        self.allocatable_memory = allocatable.get("memory", 0.0)
        self.used_cpu = self.used_memory = self.pod_gpus = self.ray_gpus = self.integer_model_gpus = 0.0
        self.used_gpus: dict[str, float] = {}
        self.nvml_units: int | None = None
        self.nvml_unavailable = False
        self.nvml_devices = 0
        self.leftovers: tuple[tuple[RayNodeView, float], ...] = ()
