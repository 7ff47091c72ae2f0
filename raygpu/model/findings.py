"""What the doctor finds: typed findings, the layer that broke, stranded-GPU arithmetic.

A :class:`Finding` names one disagreement between the three views of a GPU
(Ray's, kubelet's, NVML's), the :class:`Layer` whose fault explains it, the
numbers each view gave (:class:`Evidence`) and where to look to fix it.
:class:`DoctorReport` is what ``raygpu.plan.doctor.reconcile.reconcile`` returns and
what ``raygpu doctor`` renders.

Pure data: no I/O, no clock, no ray / kubernetes / pynvml imports.
"""

from __future__ import annotations

from enum import Enum
from collections.abc import Iterable
from typing import Any, TypeVar

from pydantic import Field

from raygpu.model.base import Frozen



class _Ranked(str, Enum):
    """A string enum whose members compare by declaration order (``rank``)."""

    @property
    def rank(self) -> int:
        return list(type(self)).index(self)

    def __lt__(self, other: object) -> bool:
        return self.rank < other.rank if isinstance(other, type(self)) else NotImplemented

    def __le__(self, other: object) -> bool:
        return self.rank <= other.rank if isinstance(other, type(self)) else NotImplemented

    def __gt__(self, other: object) -> bool:
        return self.rank > other.rank if isinstance(other, type(self)) else NotImplemented

    def __ge__(self, other: object) -> bool:
        return self.rank >= other.rank if isinstance(other, type(self)) else NotImplemented


class Layer(_Ranked):
    """Where a GPU fault lives, in the order that isolates it fastest.

    Each layer depends on the one before it: no driver, no device in the
    container; no device in the node's plugin, no capacity in kubelet; no
    allocatable GPU, no pod; no pod, nothing for Ray to count. The doctor
    checks, and lists findings, top to bottom.
    """

    GPU_HARDWARE = "gpu-hardware"  # the GPU itself: XIDs, ECC errors, memory rows; health agents' node conditions
    KERNEL_DRIVER = "kernel-driver"  # nvidia.ko loaded, GPUs alive (nvidia-smi on the host)
    CONTAINER_TOOLKIT = "container-toolkit"  # nvidia-container-toolkit / runtime injects devices + libnvidia-ml
    DEVICE_PLUGIN = "device-plugin"  # k8s-device-plugin DaemonSet, MIG strategy, time-slicing config
    KUBELET = "kubelet"  # node capacity / allocatable, taints, cordons
    RAY_CONFIG = "ray-config"  # rayStartParams num-gpus, raylet membership in the GCS


class Severity(_Ranked):
    """How bad a finding is; ``CRITICAL`` first when sorting."""

    CRITICAL = "critical"  # GPUs are lost to every scheduler, or pods cannot be placed at all
    WARNING = "warning"  # GPUs are usable but miscounted or at risk
    INFO = "info"


class FindingKind(_Ranked):
    """The symptom. The same symptom can come from different layers.

    Declared in check order; within a layer and severity, findings sort by it
    (membership before counts: a ghost node explains more than a miscount).
    """

    GPU_XID = "gpu-xid"  # NVML delivered a critical XID (reset or replace the GPU)
    GPU_ECC_UNCORRECTABLE = "gpu-ecc-uncorrectable"  # uncorrectable ECC errors on a GPU
    GPU_MEMORY_REMAP = "gpu-memory-remap"  # row remap / page retirement pending or failed
    NODE_HEALTH = "node-health"  # a health agent marked a node whose GPUs are counted unhealthy
    DRIVER_UNAVAILABLE = "driver-unavailable"  # NVML cannot start on a GPU node
    CONTAINER_GPU_MISMATCH = "container-gpu-mismatch"  # NVML in the pod sees != the pod's GPU limit
    MISSING_CAPACITY = "missing-capacity"  # GPU node (labels / NVML) without any GPU resource
    ZERO_ALLOCATABLE = "zero-allocatable"  # GPU capacity > 0, allocatable 0
    MIG_SHARE_MISMATCH = "mig-share-mismatch"  # slice counted as a whole GPU, or MIG strategies mixed
    DRA_DEVICE_UNHEALTHY = "dra-device-unhealthy"  # a pod's allocatedResourcesStatus says a device is Unhealthy
    DRA_DEVICE_TAINTED = "dra-device-tainted"  # a DRA GPU device carries a NoSchedule / NoExecute taint
    DRA_ALLOCATABLE_MISMATCH = "dra-allocatable-mismatch"  # node allocatable and its ResourceSlices disagree
    TAINTED_GPU_NODES = "tainted-gpu-nodes"  # pending GPU pods, every GPU node taints them away
    ORPHAN_POD = "orphan-pod"  # Running Ray pod, no live Ray node
    GHOST_RAY_NODE = "ghost-ray-node"  # live Ray node, no pod
    PHANTOM_GPUS = "phantom-gpus"  # Ray counts more GPUs than the pod was given
    STRANDED_GPUS = "stranded-gpus"  # the pod holds GPUs Ray does not schedule


class Evidence(Frozen):
    """The number each view gave for the subject; None where that view says nothing.

    ``ray``: GPUs in the Ray node's total. ``pod``: GPU units in the pod's
    limits (or requested, for pending pods). ``kubelet``: the node's
    allocatable GPU units, ``kubelet_capacity`` its capacity. ``nvml``: GPU
    units NVML sees in the container (MIG instances where MIG is on).
    ``facts`` holds the few other observations the finding rests on.
    """

    ray: float | None = None
    pod: float | None = None
    kubelet: float | None = None
    kubelet_capacity: float | None = None
    nvml: int | None = None
    facts: tuple[str, ...] = ()


class Finding(Frozen):
    kind: FindingKind
    severity: Severity
    layer: Layer
    subject: str  # "node/<name>", "pod/<ns>/<name>", "raynode/<id>", "group/<cluster>/<group>"
    node: str | None = None  # the Kubernetes node involved, when there is one
    message: str
    evidence: Evidence = Field(default_factory=Evidence)
    remedy: str  # what to look at, in ``layer``

    @property
    def sort_key(self) -> tuple[int, int, int, str]:
        """Lower layer first, then worse severity, then kind, then subject."""
        return (self.layer.rank, self.severity.rank, self.kind.rank, self.subject)


# ------------------------------------------------------------ stranded GPUs
class NodeStranded(Frozen):
    """GPUs of one Kubernetes node that are allocatable but cannot be used.

    ``free_gpus`` = allocatable - requested by the pods bound to the node.
    Each free unit is charged to at most one cause, in this order:
    ``cpu_memory_gpus`` (no worker template that asks for this GPU resource
    fits the node's free CPU or memory), then ``fragment_gpus`` (fewer free
    than the smallest pending request for that resource).
    ``integer_model_gpus`` is separate: the unused remainder of GPUs that
    fractional Ray tasks occupy (a 0.5-GPU task leaves 0.5 no whole-GPU task
    can use), summed over the Ray nodes on this node.
    """

    node: str
    allocatable_gpus: float = 0.0
    requested_gpus: float = 0.0
    free_gpus: float = 0.0
    integer_model_gpus: float = 0.0
    cpu_memory_gpus: float = 0.0
    fragment_gpus: float = 0.0
    free_cpu: float = 0.0
    free_memory_bytes: float = 0.0
    reasons: tuple[str, ...] = ()

    @property
    def stranded_gpus(self) -> float:
        return self.integer_model_gpus + self.cpu_memory_gpus + self.fragment_gpus

    @classmethod
    def typed_many(cls, rows: Iterable[tuple]) -> tuple[NodeStranded, ...]:
        """One NodeStranded per row of field values in field order (node, allocatable_gpus, requested_gpus,
        free_gpus, integer_model_gpus, cpu_memory_gpus, fragment_gpus, free_cpu, free_memory_bytes,
        reasons), built without running validation.

        For the stranded arithmetic's one row per GPU node (10,000 at 10,000 nodes). Safe only for values
        already of the field's type: the name a validated node's, the counts floats (sums of a validated
        snapshot's floats, starting from 0.0), ``reasons`` a tuple of str. See :func:`_typed_many`.
        """
        out = []
        for node, alloc, requested, free, integer, cpu_mem, frag, free_cpu, free_mem, reasons in rows:
            out.append({"node": node, "allocatable_gpus": alloc, "requested_gpus": requested, "free_gpus": free,
                        "integer_model_gpus": integer, "cpu_memory_gpus": cpu_mem, "fragment_gpus": frag,
                        "free_cpu": free_cpu, "free_memory_bytes": free_mem, "reasons": reasons})
        return _typed_many(cls, out)


class StrandedReport(Frozen):
    """Stranded-GPU arithmetic over the whole snapshot (GPU nodes only)."""

    nodes: tuple[NodeStranded, ...] = ()
    smallest_pending_gpus: dict[str, float] = Field(default_factory=dict)  # by GPU resource name
    allocatable_gpus: float = 0.0
    free_gpus: float = 0.0
    integer_model_gpus: float = 0.0
    cpu_memory_gpus: float = 0.0
    fragment_gpus: float = 0.0

    @property
    def stranded_gpus(self) -> float:
        return self.integer_model_gpus + self.cpu_memory_gpus + self.fragment_gpus


# -------------------------------------------------------------- blast radius
class PlacementGroupRef(Frozen):
    """A placement group with a bundle on an unhealthy GPU's Ray node, and who made it."""

    pg_id: str
    name: str = ""
    state: str = ""
    job_id: str | None = None  # Ray's creator job id
    bundles_there: int = 0  # bundles placed on the unhealthy Ray nodes


class BlastRadius(Frozen):
    """What sits on one unhealthy GPU or node: the work that will fail, or already failed, because of it.

    ``subject`` is the finding's (``node/<name>`` or ``raynode/<id>``); ``ray_nodes`` the live Ray nodes
    on it (a GPU finding: the Ray node whose NVML saw it; a node finding: every Ray node whose pod runs
    on the node); ``reservations`` the raygpu reservation groups (gangs) those Ray nodes belong to.
    """

    subject: str
    node: str | None = None
    kinds: tuple[FindingKind, ...] = ()
    ray_nodes: tuple[str, ...] = ()
    pods: tuple[str, ...] = ()  # "<ns>/<name>"
    placement_groups: tuple[PlacementGroupRef, ...] = ()
    jobs: tuple[str, ...] = ()
    reservations: tuple[str, ...] = ()


# ------------------------------------------------------------------ report
class NodeRow(Frozen):
    """One GPU node, the four views' counts side by side (``raygpu doctor``'s table)."""

    node: str
    product: str | None = None
    ray_gpus: float = 0.0  # sum over live Ray nodes whose pod runs here
    pod_gpus: float = 0.0  # GPU units in the limits of the Ray pods bound here
    kubelet_capacity: float = 0.0
    kubelet_allocatable: float = 0.0
    nvml_gpus: int | None = None  # None: no NVML view from any pod here
    nvml_unavailable: bool = False  # some NVML view here could not start
    dra_gpus: int = 0  # GPU devices its current DRA ResourceSlices publish (counted in kubelet_* once, see docs)
    findings: int = 0

    @classmethod
    def typed_many(cls, rows: Iterable[tuple]) -> tuple[NodeRow, ...]:
        """One NodeRow per row of field values in field order (node, product, ray_gpus, pod_gpus,
        kubelet_capacity, kubelet_allocatable, nvml_gpus, nvml_unavailable, findings), built without
        running validation; ``dra_gpus`` is 0 (``checks_dra.with_dra_rows`` fills it).

        For the doctor's one row per GPU node. Safe only for values already of the field's type: the
        name and product a validated node's, the GPU counts floats (sums of a validated snapshot's floats,
        starting from 0.0), ``nvml_gpus`` an int or None, a bool, an int. See :func:`_typed_many`.
        """
        out = []
        for node, product, ray, pod, cap, alloc, nvml, nvml_unavailable, findings in rows:
            out.append({"node": node, "product": product, "ray_gpus": ray, "pod_gpus": pod, "kubelet_capacity": cap,
                        "kubelet_allocatable": alloc, "nvml_gpus": nvml, "nvml_unavailable": nvml_unavailable,
                        "dra_gpus": 0, "findings": findings})
        return _typed_many(cls, out)


def _typed_many(cls: type[_M], values: list[dict[str, Any]]) -> tuple[_M, ...]:
    """A ``cls`` per dict of ``values`` (every field, in field order, each of its field's type), not validated.

    Sets what ``BaseModel.model_construct(_fields_set=...)`` sets (``__dict__``; every field set, one set
    shared by the models of a call, as ``model_construct`` shares the one it is given: a frozen model
    never changes it and ``model_copy`` copies it; no extra, no private) without its per-field default
    and alias lookups, which cost more than validating (as ``Decision.typed_many`` in model/reclaim.py).
    tests/unit/test_reconcile_typed.py proves the result equals the validated model state for state;
    the golden reports compare every output as JSON text (where 8 and 8.0 differ).
    """
    fields_set = set(cls.model_fields)
    out = []
    for d in values:
        m = _new(cls)
        _set(m, "__dict__", d)
        _set(m, "__pydantic_fields_set__", fields_set)
        _set(m, "__pydantic_extra__", None)
        _set(m, "__pydantic_private__", None)
        out.append(m)
    return tuple(out)


_new, _set = object.__new__, object.__setattr__
_M = TypeVar("_M", bound=Frozen)


class DoctorReport(Frozen):
    """The doctor's answer for one snapshot.

    ``findings`` are sorted by :attr:`Finding.sort_key`. ``exit_code`` is
    what ``raygpu doctor`` exits with: 0 healthy, 1 findings, 2 when a view
    (Kubernetes or Ray) could not be read at all.
    """

    taken_at_s: float
    now_s: float
    cluster: str | None = None
    namespace: str | None = None
    unreachable: tuple[str, ...] = ()  # "kubernetes: <reason>", "ray: <reason>"
    checks_run: tuple[str, ...] = ()
    rows: tuple[NodeRow, ...] = ()
    findings: tuple[Finding, ...] = ()
    stranded: StrandedReport = Field(default_factory=StrandedReport)
    blast_radius: tuple[BlastRadius, ...] = ()  # one per unhealthy GPU or node (gpu-hardware findings)

    @property
    def healthy(self) -> bool:
        return not self.findings and not self.unreachable

    @property
    def exit_code(self) -> int:
        if self.unreachable:
            return 2
        return 1 if self.findings else 0
