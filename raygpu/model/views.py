"""The three views of every GPU, frozen into one snapshot.

* Ray's view (GCS): nodes, their resources and labels, the placement-group table.
* Kubernetes' view (kubelet / API server): nodes, Ray pods, device-plugin pods,
  DRA ResourceSlices.
* The container's view (NVML), read on each Ray node.

Adapters build these from the outside world; ``plan/`` only reads them.
Resource maps use Kubernetes names (``cpu``, ``memory`` in bytes,
``nvidia.com/gpu``, ``nvidia.com/mig-3g.40gb``) for Kubernetes objects and Ray
names (``CPU``, ``GPU``, ``memory``) for Ray objects.
"""

from __future__ import annotations

from enum import Enum
from typing import Any

from pydantic import Field

from raygpu.model.base import Frozen
from raygpu.model.labels import LABEL_RESERVATION, RESERVATION_GROUP_PREFIX
from raygpu.model.raycluster import ParseProblem



# ----------------------------------------------------------------- Ray view
class RayNodeView(Frozen):
    node_id: str
    alive: bool
    is_head: bool = False
    instance_id: str | None = None  # RAY_CLOUD_INSTANCE_ID = pod name under KubeRay
    node_type: str | None = None  # RAY_NODE_TYPE_NAME = worker group name
    ip: str | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    total: dict[str, float] = Field(default_factory=dict)  # Ray resource names
    available: dict[str, float] = Field(default_factory=dict)
    idle_since_s: float | None = None  # None while busy
    accelerator_type: str | None = None
    # Ray's DRAINING state: the node takes no new work and is going away (an accepted drain)
    draining: bool = False

    @property
    def gpu_total(self) -> float:
        return self.total.get("GPU", 0.0)

    @property
    def gpu_available(self) -> float:
        return self.available.get("GPU", 0.0)

    @property
    def reservation_group(self) -> str | None:
        """The reservation worker group this node belongs to: its Ray label ``raygpu.io/reservation`` (the
        backends put it on every reservation pod's Ray node), else its node type when that is a reservation
        group's name (``rg-*``); None for any other node."""
        group = self.labels.get(LABEL_RESERVATION)
        if group:
            return group
        return self.node_type if self.node_type and self.node_type.startswith(RESERVATION_GROUP_PREFIX) else None


class PgState(str, Enum):
    PENDING = "PENDING"
    PREPARED = "PREPARED"
    CREATED = "CREATED"
    REMOVED = "REMOVED"
    RESCHEDULING = "RESCHEDULING"


class PlacementGroupView(Frozen):
    pg_id: str
    name: str = ""
    state: PgState
    strategy: str = "PACK"
    bundles: tuple[dict[str, float], ...] = ()
    bundle_node_ids: tuple[str | None, ...] = ()  # node id per bundle, None when unplaced
    bundle_label_selectors: tuple[dict[str, str], ...] = ()
    creator_job_id: str | None = None
    # when the GCS took the create request (ms, the GCS host's clock): orders PGs oldest first, never compared
    # with another clock; None when Ray did not say
    created_ms: float | None = None


class ResourceDemand(Frozen):
    """``count`` pending tasks or actors that each need ``bundle`` (Ray resource names)."""

    bundle: dict[str, float] = Field(default_factory=dict)
    count: int = 1


class RayView(Frozen):
    reachable: bool = True
    reason: str | None = None  # why not reachable
    nodes: tuple[RayNodeView, ...] = ()
    placement_groups: tuple[PlacementGroupView, ...] = ()
    # tasks and actors waiting for resources (the autoscaler's demand; PGs are in placement_groups)
    resource_demand: tuple[ResourceDemand, ...] = ()


# ---------------------------------------------------------- Kubernetes view
class Taint(Frozen):
    key: str
    value: str | None = None
    effect: str


class Toleration(Frozen):
    key: str | None = None
    operator: str = "Equal"
    value: str | None = None
    effect: str | None = None

    def tolerates(self, taint: Taint) -> bool:
        if self.effect and self.effect != taint.effect:
            return False
        if self.key is None:  # empty key + Exists tolerates everything
            return self.operator == "Exists"
        if self.key != taint.key:
            return False
        return self.operator == "Exists" or self.value == taint.value


class NodeCondition(Frozen):
    """A node condition whose status is ``True`` (health agents set their problem conditions to True)."""

    type: str
    reason: str = ""
    message: str = ""


class K8sNodeView(Frozen):
    name: str
    labels: dict[str, str] = Field(default_factory=dict)
    capacity: dict[str, float] = Field(default_factory=dict)
    allocatable: dict[str, float] = Field(default_factory=dict)
    taints: tuple[Taint, ...] = ()
    ready: bool = True
    unschedulable: bool = False
    problems: tuple[ParseProblem, ...] = ()  # values the adapter could not parse (left out)
    # conditions with status True other than Ready (MemoryPressure, a health agent's GpuXidError...)
    conditions: tuple[NodeCondition, ...] = ()


class K8sPodView(Frozen):
    name: str
    namespace: str
    uid: str = ""
    node_name: str | None = None
    phase: str = "Pending"  # Pending | Running | Succeeded | Failed | Unknown
    deleting: bool = False
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)
    requests: dict[str, float] = Field(default_factory=dict)  # summed over containers
    limits: dict[str, float] = Field(default_factory=dict)
    tolerations: tuple[Toleration, ...] = ()
    node_selector: dict[str, str] = Field(default_factory=dict)  # spec.nodeSelector
    created_at_s: float = 0.0
    started_at_s: float | None = None  # status.startTime (the kubelet's clock); None: not started
    active_deadline_s: float | None = None  # spec.activeDeadlineSeconds: the kubelet ends it that long after start
    ray_cluster: str | None = None  # label ray.io/cluster
    ray_group: str | None = None  # label ray.io/group
    ray_node_type: str | None = None  # label ray.io/node-type: head | worker
    ray_start_num_gpus: float | None = None  # rayStartParams["num-gpus"] of its group, if set and a number
    scheduling_group: str | None = None  # spec.schedulingGroup.podGroupName: the Kubernetes PodGroup it is in
    # spec.schedulerName: the scheduler (profile) the pod asked for; the API server fills in default-scheduler
    scheduler_name: str | None = None
    problems: tuple[ParseProblem, ...] = ()  # values the adapter could not parse (safe default used)
    device_health: tuple[DeviceHealthView, ...] = ()  # allocatedResourcesStatus of its containers

    @property
    def is_head(self) -> bool:
        return self.ray_node_type == "head"


class DevicePluginPod(Frozen):
    name: str
    namespace: str
    node_name: str
    ready: bool


class DraDeviceTaint(Frozen):
    """A DRA device taint (``spec.devices[].taints[]``; alpha gate ``DRADeviceTaints`` in 1.34, GA in 1.37)."""

    key: str
    value: str | None = None
    effect: str  # NoSchedule | NoExecute (DRA has no PreferNoSchedule)


class DraDeviceView(Frozen):
    """One device of a ResourceSlice: its name, attributes and taints.

    ``attributes``: the device's attributes by name as the driver wrote it
    (``type``, ``uuid``, ``productName``, or fully qualified
    ``gpu.nvidia.com/type``), each value as a string whatever its kind
    (string, int, bool, version). ``node_name``: the device's own
    ``nodeName`` (``perDeviceNodeSelection``), else None.
    """

    name: str
    attributes: dict[str, str] = Field(default_factory=dict)
    taints: tuple[DraDeviceTaint, ...] = ()
    node_name: str | None = None


class ResourceSliceView(Frozen):
    """A DRA ResourceSlice (resource.k8s.io), reduced to what the doctor needs.

    ``device_count``: ``len(spec.devices)``; ``devices``: those devices
    (empty when only the count is known). ``pool`` / ``pool_generation`` /
    ``pool_slice_count``: ``spec.pool``; of a pool only the slices of its
    highest generation are current (older ones are being replaced).
    """

    name: str
    node_name: str | None
    driver: str
    device_count: int
    pool: str = ""
    pool_generation: int = 0
    pool_slice_count: int = 1
    devices: tuple[DraDeviceView, ...] = ()


class DraAllocatedDevice(Frozen):
    """One ``status.allocation.devices.results[]`` entry of a ResourceClaim."""

    request: str = ""
    driver: str
    pool: str
    device: str


class ResourceClaimView(Frozen):
    """A ResourceClaim: the devices allocated to it and the pods it is reserved for (``status.reservedFor``)."""

    name: str
    namespace: str
    allocated: tuple[DraAllocatedDevice, ...] = ()
    reserved_for_pods: tuple[str, ...] = ()  # pod names (same namespace)
    # annotation resource.kubernetes.io/extended-resource-claim=true: made by the scheduler for a pod's
    # nvidia.com/gpu request served by DRA (KEP-5004); the pod's limit already counts its devices
    extended_resource: bool = False


class DeviceHealthView(Frozen):
    """One device of a container's ``status.containerStatuses[].allocatedResourcesStatus`` (KEP-4680).

    ``resource``: ``claim:<claim>/<request>`` for DRA, else the resource name
    (``nvidia.com/gpu``); ``resource_id``: ``<driver>/<pool>/<device>`` for
    DRA, else the device plugin's device id; ``health``: Healthy, Unhealthy
    or Unknown.
    """

    container: str
    resource: str
    resource_id: str
    health: str

    @classmethod
    def of_pod_status(cls, status: dict[str, Any]) -> tuple["DeviceHealthView", ...]:
        """Every container status's ``allocatedResourcesStatus``; an entry without a resource id is left out."""
        out = []
        for cs in (status.get("initContainerStatuses") or []) + (status.get("containerStatuses") or []):
            for rs in (cs.get("allocatedResourcesStatus") if isinstance(cs, dict) else None) or []:
                for r in (rs.get("resources") if isinstance(rs, dict) else None) or []:
                    if isinstance(r, dict) and r.get("resourceID"):
                        out.append(cls(container=str(cs.get("name", "")), resource=str(rs.get("name", "")),
                                       resource_id=str(r["resourceID"]), health=str(r.get("health") or "Unknown")))
        return tuple(out)


class K8sView(Frozen):
    reachable: bool = True
    reason: str | None = None
    nodes: tuple[K8sNodeView, ...] = ()
    pods: tuple[K8sPodView, ...] = ()
    device_plugin_pods: tuple[DevicePluginPod, ...] = ()
    resource_slices: tuple[ResourceSliceView, ...] | None = None  # None: API not served
    resource_claims: tuple[ResourceClaimView, ...] | None = None  # None: API not served or not readable
    notes: tuple[str, ...] = ()  # what could not be read and was left out (DRA not served, a slice skipped)


# -------------------------------------------------------------- NVML view
class MigDeviceView(Frozen):
    uuid: str
    profile: str  # e.g. "3g.40gb"
    memory_total_bytes: int = 0


class NvmlHealthView(Frozen):
    """One GPU's memory-error counters as NVML reports them; None where the GPU does not support the query.

    ``ecc_*``: uncorrectable (double-bit) ECC errors, volatile (since the driver loaded) and aggregate
    (the GPU's lifetime, in its InfoROM). Ampere and newer remap rows (``remapped_rows_*``,
    ``remap_pending``: a reset applies it, ``remap_failure``: no spare row left); older GPUs retire pages
    (``retired_pages``, ``retired_pages_pending``: retired at the next reset).
    """

    ecc_volatile_uncorrected: int | None = None
    ecc_aggregate_uncorrected: int | None = None
    remapped_rows_uncorrectable: int | None = None
    remapped_rows_correctable: int | None = None
    remap_pending: bool | None = None
    remap_failure: bool | None = None
    retired_pages: int | None = None
    retired_pages_pending: bool | None = None


class XidEvent(Frozen):
    """A critical XID NVML delivered on the probe's event set (``nvmlEventTypeXidCriticalError``)."""

    xid: int
    device_index: int | None = None
    uuid: str | None = None


class NvmlDeviceView(Frozen):
    index: int
    uuid: str
    name: str
    memory_total_bytes: int
    mig_enabled: bool = False
    mig_devices: tuple[MigDeviceView, ...] = ()
    health: NvmlHealthView | None = None  # None: not read (an older probe)


class NvmlView(Frozen):
    """What NVML reports inside one Ray node's container."""

    node_id: str
    available: bool
    reason: str | None = None  # "NVML unavailable: <reason>" when not available
    driver_version: str | None = None
    cuda_version: str | None = None
    devices: tuple[NvmlDeviceView, ...] = ()
    xid_events: tuple[XidEvent, ...] = ()  # delivered during the probe's bounded wait
    xid_wait_ms: int | None = None  # how long the probe waited for them; None: not watched

    @property
    def gpu_units(self) -> int:
        """Schedulable units: MIG instances where MIG is on, else whole devices."""
        return sum(len(d.mig_devices) if d.mig_enabled else 1 for d in self.devices)


# --------------------------------------------------------------- snapshot
class Snapshot(Frozen):
    """One consistent-enough read of all three views, taken at ``taken_at_s``."""

    taken_at_s: float
    cluster: str | None = None  # RayCluster name the snapshot is scoped to
    namespace: str | None = None
    ray: RayView = Field(default_factory=RayView)
    k8s: K8sView = Field(default_factory=K8sView)
    nvml: dict[str, NvmlView] = Field(default_factory=dict)  # by Ray node id
