"""Which GPUs and nodes are unhealthy: the signals the doctor reports and the planners steer around.

Two sources, both already in a :class:`Snapshot`:

* **a health agent's mark on the node** (:func:`node_health_signals`): a node condition with status
  ``True`` or a taint that a GPU health agent sets. Named from their sources:

  - NVSentinel (NVIDIA/NVSentinel): its platform connector sets a node condition named after the
    health check that found a fatal event, e.g. ``GpuXidError`` (XIDs from the syslog / DCGM monitors),
    ``GpuDcgmConnectivityFailure`` (its runbooks), and its fault-quarantine module labels the node it
    cordons ``<labelPrefix>cordon-by`` (default prefix ``k8saas.nvidia.com/``);
  - Node Problem Detector with GPU checks: AKS's ``GPUMissing``, ``GPUXIDErrors``, ``NVLinkStatusInactive``;
    Nebius's ``NebiusGPUError``; Meta GCM's ``GcmXidErrorsProblem``. Upstream NPD ships no GPU monitor, so
    any custom-plugin condition whose type names a GPU part (``gpu``, ``xid``, ``nvlink``, ``nvswitch``,
    ``dcgm``) counts as well;
  - the GPU Operator / DCGM set no node condition: the device plugin marks a GPU unhealthy by dropping it
    from allocatable (the doctor's ``zero-allocatable``) and DCGM exports metrics. A taint an operator or a
    remediation controller puts on a bad GPU node counts when its key says so (``xid``, or ``gpu`` with
    ``unhealthy`` / ``health`` / ``fault`` / ``error``), with effect ``NoSchedule`` or ``NoExecute``. The plain
    ``nvidia.com/gpu`` taint that keeps CPU pods off GPU nodes is not a health mark.

* **NVML in the node's Ray pods** (:func:`nvml_unhealthy_gpus`): a critical XID delivered during the
  probe, uncorrectable ECC errors since the driver loaded, a pending or failed row remap, a retired page
  waiting for a reset.

Pure: no I/O, no clock.
"""

from __future__ import annotations

import re

from raygpu.model.views import K8sNodeView, NvmlDeviceView, NvmlView, Snapshot

# NVIDIA, "XID Errors" (https://docs.nvidia.com/deploy/xid-errors/index.html, the XID catalog and its
# "Resolution" column): the XIDs whose documented action is a GPU reset or node reboot, or that mean the GPU is
# lost or its memory corrupted. Other XIDs (13, 31, 43, 45: application faults) are not a GPU's health.
CRITICAL_XIDS: dict[int, str] = {
    48: "double-bit ECC error",
    62: "internal micro-controller halt",
    63: "ECC page retirement or row remapping recording event",
    64: "ECC page retirement or row remapper recording failure",
    74: "NVLink error",
    79: "GPU has fallen off the bus",
    92: "high single-bit ECC error rate",
    94: "contained ECC error",
    95: "uncontained ECC error",
    119: "GSP RPC timeout",
    120: "GSP error",
}

# Node condition types set by the health agents above (status True = the problem is present).
KNOWN_HEALTH_CONDITIONS = frozenset({
    "GpuXidError", "GpuDcgmConnectivityFailure",  # NVSentinel
    "GPUMissing", "GPUXIDErrors", "NVLinkStatusInactive",  # AKS Node Problem Detector GPU checks
    "NebiusGPUError",  # Nebius managed Kubernetes (NPD)
    "GcmXidErrorsProblem",  # Meta GCM health checks under NPD
})
NVSENTINEL_CORDON_LABEL = "k8saas.nvidia.com/cordon-by"  # NVSentinel fault-quarantine, default label prefix
_GPU_CONDITION_RE = re.compile(r"gpu|xid|nvlink|nvswitch|dcgm", re.IGNORECASE)
_HEALTH_TAINT_WORDS = ("unhealthy", "health", "fault", "error")
_BLOCKING = ("NoSchedule", "NoExecute")


def node_health_signals(node: K8sNodeView) -> tuple[str, ...]:
    """What marks ``node`` unhealthy, one line per signal (empty: none). Conditions, then taints, then labels."""
    out: list[str] = []
    for c in node.conditions:
        if c.type in KNOWN_HEALTH_CONDITIONS or _GPU_CONDITION_RE.search(c.type):
            why = ": ".join(x for x in (c.reason, c.message) if x)
            out.append(f"condition {c.type}=True" + (f" ({why})" if why else ""))
    for t in node.taints:
        key = t.key.lower()
        if t.effect in _BLOCKING and ("xid" in key or ("gpu" in key and any(w in key for w in _HEALTH_TAINT_WORDS))):
            out.append(f"taint {t.key}{'=' + t.value if t.value else ''}:{t.effect}")
    by = node.labels.get(NVSENTINEL_CORDON_LABEL)
    if by:
        out.append(f"label {NVSENTINEL_CORDON_LABEL}={by} (NVSentinel fault-quarantine)")
    return tuple(out)


def device_health_problems(device: NvmlDeviceView) -> list[tuple[str, bool, str]]:
    """A GPU's memory-error problems as ``(kind, critical, fact)``; kind is ``ecc`` or ``remap``.

    Uncorrectable ECC errors since the driver loaded are critical (the work on that GPU may have read
    corrupted memory); only in its lifetime (before the last load) a warning. A pending remap or page
    retirement (a reset applies it) and a failed remap (no spare row) are critical.
    """
    h = device.health
    if h is None:
        return []
    out: list[tuple[str, bool, str]] = []
    if h.ecc_volatile_uncorrected:
        out.append(("ecc", True, f"{h.ecc_volatile_uncorrected} uncorrectable ECC errors since the driver loaded "
                                 f"({h.ecc_aggregate_uncorrected or 0} in its lifetime)"))
    elif h.ecc_aggregate_uncorrected:
        out.append(("ecc", False, f"{h.ecc_aggregate_uncorrected} uncorrectable ECC errors in its lifetime, "
                                  "none since the driver loaded"))
    if h.remap_failure:
        out.append(("remap", True, f"row remapping failed ({h.remapped_rows_uncorrectable or 0} rows remapped "
                                   "for uncorrectable errors): no spare row left"))
    elif h.remap_pending:
        out.append(("remap", True, f"row remapping pending ({h.remapped_rows_uncorrectable or 0} rows for "
                                   "uncorrectable errors): a GPU reset applies it"))
    if h.retired_pages_pending:
        out.append(("remap", True, f"page retirement pending ({h.retired_pages or 0} retired pages): a GPU reset "
                                   "applies it"))
    return out


def critical_xids(view: NvmlView) -> list[tuple[int | None, int]]:
    """``(device index, xid)`` of the critical XIDs in ``view``, in delivery order."""
    return [(e.device_index, e.xid) for e in view.xid_events if e.xid in CRITICAL_XIDS]


def nvml_unhealthy_gpus(view: NvmlView) -> dict[int | None, list[str]]:
    """Device index -> why it is unhealthy (critical problems only); empty for a healthy or unavailable view."""
    out: dict[int | None, list[str]] = {}
    if not view.available:
        return out
    for index, xid in critical_xids(view):
        out.setdefault(index, []).append(f"XID {xid} ({CRITICAL_XIDS[xid]})")
    for d in view.devices:
        for _, critical, fact in device_health_problems(d):
            if critical:
                out.setdefault(d.index, []).append(fact)
    return out


def unhealthy_nodes(snapshot: Snapshot) -> dict[str, tuple[str, ...]]:
    """Kubernetes node name -> why it is unhealthy: a health agent's mark on it, or NVML in one of its Ray pods
    seeing a critical GPU problem. For the planners: no reservation is planned onto these nodes and their idle
    workers are reclaimed first. One pass over the nodes, one over the NVML views (with their pods)."""
    out: dict[str, list[str]] = {}
    for node in snapshot.k8s.nodes:
        signals = node_health_signals(node)
        if signals:
            out[node.name] = list(signals)
    if snapshot.nvml:
        pod_node = {p.name: p.node_name for p in snapshot.k8s.pods if p.node_name}
        instance = {n.node_id: n.instance_id for n in snapshot.ray.nodes if n.alive and n.instance_id}
        for node_id, view in snapshot.nvml.items():
            bad = nvml_unhealthy_gpus(view)
            where = pod_node.get(instance.get(node_id) or "")
            if bad and where:
                out.setdefault(where, []).extend(
                    f"GPU {'?' if i is None else i}: {'; '.join(why)}" for i, why in sorted(bad.items(), key=_by_index))
    return {k: tuple(v) for k, v in out.items()}


def _by_index(item: tuple[int | None, list[str]]) -> int:
    return -1 if item[0] is None else item[0]
