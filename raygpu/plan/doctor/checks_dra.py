"""The DRA checks: GPUs offered through ResourceSlices, their taints and health (pure, no I/O).

DRA (Dynamic Resource Allocation, ``resource.k8s.io``) publishes a node's
GPUs as devices of ResourceSlices instead of (or, during a migration, as
well as) a device plugin's ``nvidia.com/gpu`` allocatable. Since Kubernetes
1.37 (KEP-5004, DRAExtendedResource) an ``nvidia.com/gpu`` request can be
served by a DRA device on a node that does not advertise that resource, so
node allocatable alone can misstate a node's GPUs.

* :func:`is_gpu_device` (``dra_gpus``): which devices are GPUs, as NVIDIA's
  DRA driver publishes them.
* :func:`dra_gpus_by_node`: the GPU devices of the current slices, per node.
* :func:`with_dra_rows`: the kubelet counts of the node rows, DRA GPUs
  counted once (the larger of allocatable and the slices' GPU devices,
  never their sum).
* :func:`check_dra`: unhealthy devices (``allocatedResourcesStatus``),
  tainted GPU devices, nodes whose allocatable and slices disagree; all at
  the device layer (``Layer.DEVICE_PLUGIN``: the device plugin or the DRA
  driver, whichever publishes the GPUs).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from raygpu.model.findings import Evidence, Finding, FindingKind, Layer, NodeRow, Severity
from raygpu.model.views import DraDeviceView, K8sView, ResourceSliceView
from raygpu.plan.doctor.checks_index import SnapshotIndex
from raygpu.plan.doctor.dra_gpus import (  # noqa: F401 - attribute, is_gpu_device: read from here too
    GPU_DEVICE_TYPES,
    NVIDIA_GPU_DRIVER,
    attribute,
    current_slices,
    device_id,
    is_gpu_device,
)
from raygpu.plan.doctor.facts import TERMINAL_PHASES, fmt

BLOCKING_EFFECTS = frozenset({"NoSchedule", "NoExecute"})
_MAX_FACTS = 6


@dataclass
class NodeDra:
    """The GPU devices the current ResourceSlices publish for one node (filled by :func:`dra_gpus_by_node`)."""

    gpus: dict[str, tuple[ResourceSliceView, DraDeviceView]] = field(default_factory=dict)  # by device_id
    incomplete_pools: set[str] = field(default_factory=set)  # "<driver>/<pool>: k of n slices"

    @property
    def count(self) -> int:
        return len(self.gpus)

    def tainted(self) -> list[tuple[str, ResourceSliceView, DraDeviceView]]:
        """The GPU devices with a NoSchedule / NoExecute taint, by device id."""
        return [(i, s, d) for i, (s, d) in sorted(self.gpus.items())
                if any(t.effect in BLOCKING_EFFECTS for t in d.taints)]

    @property
    def usable(self) -> int:
        """GPU devices a new claim can get: the untainted ones."""
        return self.count - len(self.tainted())


def dra_gpus_by_node(k8s: K8sView) -> dict[str, NodeDra]:
    """GPU devices (:func:`is_gpu_device`) of the current slices, by the node they are on.

    A device's node is its own ``nodeName``, else its slice's; devices of
    slices for no single node (``nodeSelector`` / ``allNodes``: network-attached)
    belong to no node. A device published twice (same driver, pool and name)
    counts once. A pool with fewer current slices than its
    ``resourceSliceCount`` is still being published: what is there counts,
    and the node's ``incomplete_pools`` says so.
    """
    out: dict[str, NodeDra] = {}
    current = current_slices(k8s.resource_slices or ())
    published: dict[tuple[str, str], int] = {}
    for s in current:
        published[(s.driver, s.pool)] = published.get((s.driver, s.pool), 0) + 1
    for s in current:
        for d in s.devices:
            node = d.node_name or s.node_name
            if not node or not is_gpu_device(s.driver, d):
                continue
            entry = out.setdefault(node, NodeDra())
            entry.gpus.setdefault(device_id(s.driver, s.pool, d.name), (s, d))
            have = published[(s.driver, s.pool)]
            if have < s.pool_slice_count:
                entry.incomplete_pools.add(f"{s.driver}/{s.pool}: {have} of {s.pool_slice_count} slices published")
    return out


def applies(ix: SnapshotIndex) -> bool:
    """The DRA check has something to read: slice devices, or a pod's ``allocatedResourcesStatus``.

    Without either (no DRA API, or slices whose devices were not read) it is
    not run and the report is what it was without DRA.
    """
    return any(s.devices for s in ix.snapshot.k8s.resource_slices or ()) or ix.any_device_health


def with_dra_rows(rows: tuple[NodeRow, ...], ix: SnapshotIndex) -> tuple[NodeRow, ...]:
    """The node rows with DRA GPUs in the kubelet counts, each GPU counted once.

    ``kubelet_capacity`` = max(GPU capacity, GPU devices of the node's
    slices), ``kubelet_allocatable`` = max(GPU allocatable, untainted GPU
    devices): a node that advertises ``nvidia.com/gpu`` and publishes DRA
    devices for the same GPUs has those GPUs once, not twice (when the two
    numbers differ, :func:`check_dra` names the node). ``dra_gpus``: the
    slices' GPU devices.
    """
    if not applies(ix):
        return rows
    by_node = dra_gpus_by_node(ix.snapshot.k8s)
    out = []
    for row in rows:
        dra = by_node.get(row.node)
        if dra is None:
            out.append(row)
            continue
        out.append(row.model_copy(update={
            "dra_gpus": dra.count,
            "kubelet_capacity": max(row.kubelet_capacity, float(dra.count)),
            "kubelet_allocatable": max(row.kubelet_allocatable, float(dra.usable)),
        }))
    return tuple(out)


def check_dra(ix: SnapshotIndex) -> list[Finding]:
    """Unhealthy devices in pods, tainted DRA GPU devices, nodes whose allocatable and slices disagree."""
    by_node = dra_gpus_by_node(ix.snapshot.k8s)
    return _unhealthy(ix, by_node) + _tainted(ix, by_node) + _mismatch(ix, by_node)


def _kubelet(ix: SnapshotIndex, node_name: str | None, dra: NodeDra | None) -> tuple[float | None, float | None]:
    """(allocatable, capacity) of a node, DRA GPUs counted once as in :func:`with_dra_rows`; None for no node."""
    tally = ix.tallies.get(node_name) if node_name else None
    if tally is None:
        return None, None
    if dra is None:
        return tally.allocatable_units, tally.capacity_units
    return max(tally.allocatable_units, float(dra.usable)), max(tally.capacity_units, float(dra.count))


def _describe(driver: str, d: DraDeviceView) -> str:
    said = [f"{k}={v}" for k in ("uuid", "productName") if (v := attribute(driver, d, k))]
    return f" ({', '.join(said)})" if said else ""


def _claims_of(ix: SnapshotIndex) -> dict[str, list[str]]:
    """device_id -> "claim ns/name (pods a, b)" of every allocated claim in the snapshot."""
    out: dict[str, list[str]] = {}
    for c in ix.snapshot.k8s.resource_claims or ():
        pods = f" (pod {', '.join(c.reserved_for_pods)})" if c.reserved_for_pods else " (no pod)"
        for a in c.allocated:
            out.setdefault(device_id(a.driver, a.pool, a.device), []).append(f"claim {c.namespace}/{c.name}{pods}")
    return out


def _unhealthy(ix: SnapshotIndex, by_node: dict[str, NodeDra]) -> list[Finding]:
    out = []
    for pod in ix.snapshot.k8s.pods:
        bad = [h for h in pod.device_health if h.health == "Unhealthy"]
        if not bad or pod.phase in TERMINAL_PHASES:
            continue
        dra = by_node.get(pod.node_name or "")
        alloc, cap = _kubelet(ix, pod.node_name, dra)
        facts = []
        for h in bad[:_MAX_FACTS]:
            known = dra.gpus.get(h.resource_id) if dra else None
            facts.append(f"container {h.container}: {h.resource} device {h.resource_id} Unhealthy"
                         + (_describe(known[0].driver, known[1]) if known else ""))
        devices = len({h.resource_id for h in pod.device_health})
        out.append(Finding(
            kind=FindingKind.DRA_DEVICE_UNHEALTHY, severity=Severity.CRITICAL, layer=Layer.DEVICE_PLUGIN,
            subject=f"pod/{pod.namespace}/{pod.name}", node=pod.node_name,
            message=(f"pod {pod.namespace}/{pod.name} holds {len({h.resource_id for h in bad})} unhealthy GPU "
                     f"device(s) of {devices}: {', '.join(sorted({h.resource_id for h in bad}))}"),
            evidence=Evidence(pod=max(ix.pod_gpu_units(pod), float(devices)), kubelet=alloc, kubelet_capacity=cap,
                              facts=tuple(facts)),
            remedy=(f"The driver reports the device unhealthy (kubelet's allocatedResourcesStatus): on node "
                    f"{pod.node_name}, `nvidia-smi -q` and `dmesg | grep -i xid` for that GPU, and the DRA driver's "
                    "kubelet-plugin logs. Keep new work off it (a DeviceTaintRule, or the driver's own taint), then "
                    "restart this pod so it gets a healthy device; reset or replace the GPU."),
        ))
    return out


def _tainted(ix: SnapshotIndex, by_node: dict[str, NodeDra]) -> list[Finding]:
    out = []
    claims = _claims_of(ix)
    for node_name in ix.sorted_node_names():
        dra = by_node.get(node_name)
        tainted = dra.tainted() if dra else []
        if not dra or not tainted:
            continue
        in_use = [i for i, _, _ in tainted if claims.get(i)]
        facts = []
        for i, s, d in tainted[:_MAX_FACTS]:
            taints = ", ".join(f"{t.key}{'=' + t.value if t.value else ''}:{t.effect}" for t in d.taints
                               if t.effect in BLOCKING_EFFECTS)
            used = "; ".join(claims.get(i, ())) or "not allocated"
            facts.append(f"{i}{_describe(s.driver, d)}: taint {taints}; {used}")
        alloc, cap = _kubelet(ix, node_name, dra)
        out.append(Finding(
            kind=FindingKind.DRA_DEVICE_TAINTED, severity=Severity.CRITICAL if in_use else Severity.WARNING,
            layer=Layer.DEVICE_PLUGIN, subject=f"node/{node_name}", node=node_name,
            message=(f"{len(tainted)} of {dra.count} DRA GPU devices on node {node_name} are tainted "
                     f"(NoSchedule/NoExecute): no new claim gets them"
                     + (f"; {len(in_use)} allocated to a claim" if in_use else "")),
            evidence=Evidence(kubelet=alloc, kubelet_capacity=cap, facts=tuple(facts)),
            remedy=(f"`kubectl get resourceslices --field-selector spec.nodeName={node_name} -o yaml` shows each "
                    "taint and its timeAdded: the DRA driver taints a device it found unhealthy, an admin through a "
                    "DeviceTaintRule. Repair or replace the GPU, then remove the taint (delete the rule, or the driver "
                    "republishes the device). Pods whose claim does not tolerate a NoExecute taint are evicted."),
        ))
    return out


def _mismatch(ix: SnapshotIndex, by_node: dict[str, NodeDra]) -> list[Finding]:
    out = []
    for node_name in ix.sorted_node_names():
        dra, tally = by_node.get(node_name), ix.tallies[node_name]
        if dra is None or not dra.count or not tally.allocatable_units > 0:
            continue  # only one publisher (the usual case), or allocatable 0 (zero-allocatable reports it)
        if abs(tally.allocatable_units - dra.count) < 1e-6:
            continue  # the same GPUs, published both ways: counted once
        resources = ", ".join(f"{k}={fmt(v)}" for k, v in sorted(tally.allocatable_gpus.items()))
        facts = [f"allocatable {resources}", f"ResourceSlices: {dra.count} GPU devices of {NVIDIA_GPU_DRIVER}"]
        facts += sorted(dra.incomplete_pools)
        out.append(Finding(
            kind=FindingKind.DRA_ALLOCATABLE_MISMATCH, severity=Severity.WARNING, layer=Layer.DEVICE_PLUGIN,
            subject=f"node/{node_name}", node=node_name,
            message=(f"node {node_name}: allocatable says {fmt(tally.allocatable_units)} GPUs but its ResourceSlices "
                     f"publish {dra.count} GPU devices"),
            evidence=Evidence(kubelet=tally.allocatable_units, kubelet_capacity=tally.capacity_units,
                              facts=tuple(facts)),
            remedy=(f"A device plugin (allocatable) and a DRA driver (ResourceSlices) both publish GPUs of {node_name} "
                    "and disagree: let one own each GPU (NVIDIA's DRA driver with the device plugin off for those "
                    "GPUs, or the plugin alone). Compare `kubectl describe node` with `kubectl get resourceslices "
                    f"--field-selector spec.nodeName={node_name} -o yaml`; a pool with missing slices counts low."),
        ))
    return out
