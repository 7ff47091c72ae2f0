"""GPU health: the GPU itself (NVML's XIDs and memory-error counters) and the health agents' marks on nodes.

``check_gpu_health`` and ``check_node_health`` are checks like the others (``SnapshotIndex`` in, findings
out) at the lowest layer, ``gpu-hardware``: a GPU that is present and counted but broken explains every
finding above it. ``blast_radius`` names, per unhealthy GPU or node, the Ray nodes, placement groups, Ray
jobs and raygpu reservations that sit on it. What counts as unhealthy is ``plan.common.health`` (shared with
the planners, which steer around the same nodes). Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections import defaultdict

from raygpu.model.findings import BlastRadius, Evidence, Finding, FindingKind, Layer, PlacementGroupRef, Severity
from raygpu.model.labels import LABEL_RESERVATION
from raygpu.model.views import NvmlDeviceView, NvmlView, PgState, RayNodeView
from raygpu.plan.common.health import CRITICAL_XIDS, critical_xids, device_health_problems, node_health_signals
from raygpu.plan.doctor.checks_index import SnapshotIndex

HEALTH_KINDS = (FindingKind.GPU_XID, FindingKind.GPU_ECC_UNCORRECTABLE, FindingKind.GPU_MEMORY_REMAP,
                FindingKind.NODE_HEALTH)
_MAX_FACTS = 6


# ------------------------------------------------------------------ NVML
def check_gpu_health(ix: SnapshotIndex) -> list[Finding]:
    """Critical XIDs, uncorrectable ECC errors and pending / failed memory remaps NVML reports, per GPU.

    Subject ``gpu/<ray node id>/<device index>``: the GPU as the Ray node's container sees it (NVML ignores
    ``CUDA_VISIBLE_DEVICES``; the index is NVML's). Only the NVML views of live Ray nodes are read.
    """
    out: list[Finding] = []
    live = {n.node_id: n for n in ix.live_ray_nodes}
    for node_id in sorted(ix.snapshot.nvml):
        view = ix.snapshot.nvml[node_id]
        rn = live.get(node_id)
        if rn is None or not view.available:
            continue
        devices = {d.index: d for d in view.devices}
        xids: dict[int | None, list[int]] = defaultdict(list)
        for index, xid in critical_xids(view):
            xids[index].append(xid)
        for index in sorted(xids, key=lambda i: -1 if i is None else i):
            out.append(_xid_finding(ix, rn, view, index, devices.get(index), xids[index]))
        for d in view.devices:
            for kind, critical, fact in device_health_problems(d):
                out.append(_memory_finding(ix, rn, view, d, kind, critical, fact))
    return out


def _where(ix: SnapshotIndex, rn: RayNodeView) -> tuple[str | None, Evidence]:
    pod = ix.ray_pod_named(rn.instance_id) if rn.instance_id else None
    node = ix.nodes.get(pod.node_name) if pod and pod.node_name else None
    ev = Evidence(ray=rn.gpu_total, pod=ix.pod_gpu_units(pod) if pod else None,
                  kubelet=ix.gpu_allocatable(node) if node else None,
                  kubelet_capacity=ix.gpu_capacity(node) if node else None)
    return (pod.node_name if pod else None), ev


def _gpu_name(rn: RayNodeView, index: int | None, device: NvmlDeviceView | None) -> str:
    shown = f"GPU {'?' if index is None else index}"
    if device is not None:
        shown += f" ({device.name} {device.uuid})"
    return f"{shown} of Ray node {rn.node_id[:12]}" + (f" (pod {rn.instance_id})" if rn.instance_id else "")


def _xid_finding(ix: SnapshotIndex, rn: RayNodeView, view: NvmlView, index: int | None,
                 device: NvmlDeviceView | None, xids: list[int]) -> Finding:
    node, ev = _where(ix, rn)
    names = ", ".join(f"XID {x} ({CRITICAL_XIDS[x]})" for x in dict.fromkeys(xids))
    facts = [f"XID {x}: {CRITICAL_XIDS[x]}" for x in xids[:_MAX_FACTS]]
    facts.append(f"NVML event set watched for {view.xid_wait_ms} ms")
    lost = 79 in xids
    return Finding(
        kind=FindingKind.GPU_XID, severity=Severity.CRITICAL, layer=Layer.GPU_HARDWARE,
        subject=f"gpu/{rn.node_id}/{'?' if index is None else index}", node=node,
        message=f"{_gpu_name(rn, index, device)} reported {names}",
        evidence=ev.model_copy(update={"nvml": view.gpu_units, "facts": tuple(facts)}),
        remedy=(f"Drain node {node or '(the Ray node)'} (cordon it; its Ray tasks on this GPU fail) and "
                + ("reseat or replace the GPU: it fell off the bus (`nvidia-smi` no longer lists it; "
                   "`dmesg | grep -i xid` on the host)." if lost else
                   "reset the GPU (`nvidia-smi -r -i <index>` with no process on it) or reboot the node; "
                   "`dmesg | grep -i xid` on the host shows the XID's context. If it recurs after the reset, "
                   "replace the GPU (NVIDIA's XID catalog: docs.nvidia.com/deploy/xid-errors).")),
    )


def _memory_finding(ix: SnapshotIndex, rn: RayNodeView, view: NvmlView, device: NvmlDeviceView, kind: str,
                    critical: bool, fact: str) -> Finding:
    node, ev = _where(ix, rn)
    h = device.health
    facts = [fact]
    if h is not None:
        facts.append(f"ECC uncorrected volatile={h.ecc_volatile_uncorrected} aggregate={h.ecc_aggregate_uncorrected}")
        if h.remapped_rows_uncorrectable is not None:
            facts.append(f"remapped rows uncorrectable={h.remapped_rows_uncorrectable} "
                         f"correctable={h.remapped_rows_correctable} pending={h.remap_pending} failure={h.remap_failure}")
        if h.retired_pages is not None:
            facts.append(f"retired pages={h.retired_pages} pending={h.retired_pages_pending}")
    if kind == "ecc":
        fk = FindingKind.GPU_ECC_UNCORRECTABLE
        remedy = ("Uncorrectable ECC errors since the driver loaded: results of work on this GPU may be corrupt; "
                  f"drain node {node or '(the Ray node)'}, reset the GPU (`nvidia-smi -r`) so the memory is remapped "
                  "or retired, and replace it if errors come back (`nvidia-smi -q -d ECC,ROW_REMAPPER`)."
                  if critical else
                  "Errors from before the last driver load, already handled by remapping or retirement: keep "
                  "watching `nvidia-smi -q -d ECC`; replace the GPU if the lifetime count keeps rising.")
    else:
        fk = FindingKind.GPU_MEMORY_REMAP
        failed = bool(h and h.remap_failure)
        remedy = (f"Row remapping failed: the GPU has no spare rows left; drain node {node or '(the Ray node)'} "
                  "and replace the GPU (RMA)." if failed else
                  f"Drain node {node or '(the Ray node)'} and reset the GPU (`nvidia-smi -r -i <index>`) or reboot: "
                  "the pending remap / retirement takes effect only then, and until then the bad memory stays in use.")
    return Finding(
        kind=fk, severity=Severity.CRITICAL if critical else Severity.WARNING, layer=Layer.GPU_HARDWARE,
        subject=f"gpu/{rn.node_id}/{device.index}", node=node,
        message=f"{_gpu_name(rn, device.index, device)}: {fact}",
        evidence=ev.model_copy(update={"nvml": view.gpu_units, "facts": tuple(facts)}),
        remedy=remedy,
    )


# ------------------------------------------------------------- node marks
def check_node_health(ix: SnapshotIndex) -> list[Finding]:
    """A node whose GPUs kubelet counts (capacity > 0) but a health agent marked unhealthy. One per node."""
    out: list[Finding] = []
    for name in ix.sorted_node_names():
        node = ix.nodes[name]
        signals = node_health_signals(node)
        cap = ix.gpu_capacity(node)
        if not signals or cap <= 0:
            continue
        tally = ix.tallies[name]
        out.append(Finding(
            kind=FindingKind.NODE_HEALTH, severity=Severity.CRITICAL, layer=Layer.GPU_HARDWARE,
            subject=f"node/{name}", node=name,
            message=f"node {name} has {cap:g} GPUs counted by kubelet"
                    + (f" ({tally.ray_gpus:g} by Ray)" if tally.ray_gpus else "")
                    + f" but is marked unhealthy: {signals[0]}",
            evidence=Evidence(ray=tally.ray_gpus, pod=tally.pod_gpus, kubelet=ix.gpu_allocatable(node),
                              kubelet_capacity=cap, facts=signals[:_MAX_FACTS]),
            remedy=(f"`kubectl describe node {name}` (the condition's reason and message, who set it); on the host "
                    "`nvidia-smi -q -d ECC,ROW_REMAPPER` and `dmesg | grep -i xid`. Cordon and drain the node, reset or "
                    "replace the GPU, then let the health agent clear its mark (NVSentinel, Node Problem Detector) - "
                    "raygpu plans no reservation onto it meanwhile."),
        ))
    return out


# ------------------------------------------------------------- blast radius
def blast_radius(ix: SnapshotIndex, findings: list[Finding] | tuple[Finding, ...]) -> tuple[BlastRadius, ...]:
    """Per unhealthy GPU or node (findings of ``HEALTH_KINDS``), the work on it, sorted by subject.

    A GPU finding's Ray node is the one whose NVML saw it; a node finding's are every live Ray node whose pod
    runs there. Placement groups: those not removed with a bundle placed on one of those Ray nodes; their
    creator jobs; reservations: the raygpu reservation group of each of those Ray nodes and the ones the
    placement groups' bundle label selectors name.
    """
    health = [f for f in findings if f.kind in HEALTH_KINDS]
    if not health:
        return ()
    by_subject: dict[str, list[Finding]] = {}
    for f in health:
        by_subject.setdefault(f.subject, []).append(f)
    on_node: dict[str, list[RayNodeView]] = defaultdict(list)
    pod_of: dict[str, str] = {}
    for rn in ix.live_ray_nodes:
        pod = ix.ray_pod_named(rn.instance_id) if rn.instance_id else None
        if pod is not None:
            pod_of[rn.node_id] = f"{pod.namespace}/{pod.name}"
            if pod.node_name:
                on_node[pod.node_name].append(rn)
    live = {n.node_id: n for n in ix.live_ray_nodes}
    pgs = [pg for pg in ix.snapshot.ray.placement_groups if pg.state != PgState.REMOVED]
    out = []
    for subject in sorted(by_subject):
        fs = by_subject[subject]
        node = fs[0].node
        if subject.startswith("gpu/"):
            rn = live.get(subject.split("/")[1])
            ray_nodes = [rn] if rn else []
        else:
            ray_nodes = on_node.get(node or "", [])
        ids = {rn.node_id for rn in ray_nodes}
        refs, jobs, reservations = [], [], [rn.reservation_group for rn in ray_nodes if rn.reservation_group]
        for pg in pgs:
            there = sum(1 for n in pg.bundle_node_ids if n in ids)
            if not there:
                continue
            refs.append(PlacementGroupRef(pg_id=pg.pg_id, name=pg.name, state=pg.state.value,
                                          job_id=pg.creator_job_id, bundles_there=there))
            if pg.creator_job_id:
                jobs.append(pg.creator_job_id)
            reservations.extend(s[LABEL_RESERVATION] for s in pg.bundle_label_selectors if s.get(LABEL_RESERVATION))
        out.append(BlastRadius(
            subject=subject, node=node, kinds=tuple(dict.fromkeys(f.kind for f in fs)),
            ray_nodes=tuple(sorted(ids)), pods=tuple(sorted(pod_of[i] for i in ids if i in pod_of)),
            placement_groups=tuple(sorted(refs, key=lambda r: r.pg_id)), jobs=tuple(sorted(set(jobs))),
            reservations=tuple(sorted(set(reservations))),
        ))
    return tuple(out)
