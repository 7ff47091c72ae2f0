"""Checks of the top layer: Ray's membership and its GPU count per node.

A Ray node and its pod are paired by ``instance_id == pod name``. Orphan
pods and ghost Ray nodes are pairs with one side missing; phantom and
stranded GPUs are pairs whose counts differ; a MIG slice or a time-sliced
share that Ray counts as ``GPU`` is a shape mismatch.
"""

from __future__ import annotations

import re

from raygpu.model.findings import Evidence, Finding, FindingKind, Layer, Severity
from raygpu.model.shapes import GpuKind, ray_gpu_count_from_limits
from raygpu.model.views import K8sPodView, RayNodeView
from raygpu.plan.doctor.checks_index import SnapshotIndex
from raygpu.plan.doctor.facts import (
    EPS,
    GPU_PRODUCT_LABEL,
    MIG_STRATEGY_LABEL,
    TERMINAL_PHASES,
    fmt,
    pod_gpu_kinds,
    shape_of,
)

def _kubelet(ix: SnapshotIndex, node_name: str | None) -> tuple[float | None, float | None]:
    node = ix.nodes.get(node_name or "")
    return (ix.gpu_allocatable(node), ix.gpu_capacity(node)) if node else (None, None)


def _nvml_units(ix: SnapshotIndex, pod_name: str) -> int | None:
    return ix.nvml_units_by_pod.get(pod_name)


def _group(pod: K8sPodView) -> str:
    return pod.ray_group or ("head" if pod.is_head else "?")


# ------------------------------------------------------------------ membership
def check_membership(ix: SnapshotIndex, now_s: float, orphan_grace_s: float) -> list[Finding]:
    """Orphan pods (Running, no live Ray node) and ghost Ray nodes (live, no pod)."""
    out: list[Finding] = []
    for pod in ix.running_unpaired:  # Running, not deleting Ray pods with no live Ray node
        age_s = now_s - pod.created_at_s
        if age_s < orphan_grace_s:
            continue  # the raylet may still be starting
        gpus = ix.pod_gpu_units(pod)
        alloc, cap = _kubelet(ix, pod.node_name)
        out.append(
            Finding(
                kind=FindingKind.ORPHAN_POD,
                severity=Severity.CRITICAL if gpus > 0 else Severity.WARNING,
                layer=Layer.RAY_CONFIG,
                subject=f"pod/{pod.namespace}/{pod.name}",
                node=pod.node_name,
                message=(
                    f"pod {pod.namespace}/{pod.name} (group {_group(pod)}) is Running with {fmt(gpus)} GPUs "
                    f"but no live Ray node has instance id {pod.name}"
                ),
                evidence=Evidence(
                    ray=0,
                    pod=gpus,
                    kubelet=alloc,
                    kubelet_capacity=cap,
                    facts=(f"pod age {age_s:.0f} s (grace {orphan_grace_s:.0f} s)",),
                ),
                remedy=(
                    f"`kubectl logs {pod.name} -c ray-worker` and /tmp/ray/session_latest/logs/raylet.out: the raylet "
                    "failed to start or lost the GCS (head address, port, version skew). Delete the pod to free its GPUs."
                ),
            )
        )
    for rn in ix.ghost_suspects:  # live Ray nodes that may lack a live pod (all of them, unless every one pairs)
        pod = ix.ray_pod_named(rn.instance_id or "")
        if pod is not None and pod.phase not in TERMINAL_PHASES:
            continue  # paired (a deleting pod is a transient, not a ghost)
        why = (
            "no RAY_CLOUD_INSTANCE_ID (not started by KubeRay)"
            if not rn.instance_id
            else (f"pod {rn.instance_id} is {pod.phase}" if pod is not None else f"no pod named {rn.instance_id}")
        )
        out.append(
            Finding(
                kind=FindingKind.GHOST_RAY_NODE,
                severity=Severity.CRITICAL if rn.gpu_total > 0 else Severity.WARNING,
                layer=Layer.RAY_CONFIG,
                subject=f"raynode/{rn.node_id}",
                message=f"Ray node {rn.node_id} ({rn.ip or 'no ip'}) is alive with {fmt(rn.gpu_total)} GPUs: {why}",
                evidence=Evidence(ray=rn.gpu_total, pod=0, facts=(why,)),
                remedy=(
                    "Ray schedules onto GPUs no pod holds. If the pod is gone, the raylet outlived it: "
                    f"`ray.util.state.list_nodes()` then stop it (`ray stop` on {rn.ip or 'its host'}) or restart the head; "
                    "if it was started by hand, it must not join a KubeRay cluster."
                ),
            )
        )
    return out


# ------------------------------------------------------------------- GPU count
def check_gpu_count(ix: SnapshotIndex) -> list[Finding]:
    """Phantom GPUs (Ray > pod), stranded GPUs (pod > Ray), slices or shares counted as whole GPUs."""
    out: list[Finding] = []
    live = ix.live_ray_by_instance
    for pod in ix.count_suspects:  # paired pods whose counts differ or whose GPUs may be slices
        out.extend(_count_findings(ix, pod, live[pod.name]))
    return out


def _count_findings(ix: SnapshotIndex, pod: K8sPodView, rn: RayNodeView) -> list[Finding]:
    gpu_map = ix.pod_gpus(pod)
    given = ix.pod_gpu_units(pod)  # sum(gpu_map.values()) + its claims' GPU devices, once per pod
    ray = rn.gpu_total
    slice_why = _slice_counted_whole(ix, pod, rn) if ray > 0 else None
    if abs(ray - given) <= EPS and slice_why is None:
        return []  # the common, healthy case: build nothing
    alloc, cap = _kubelet(ix, pod.node_name)
    evidence = Evidence(ray=ray, pod=given, kubelet=alloc, kubelet_capacity=cap, nvml=_nvml_units(ix, pod.name))
    subject = f"pod/{pod.namespace}/{pod.name}"
    group = _group(pod)
    param = (
        f"rayStartParams num-gpus={fmt(pod.ray_start_num_gpus)}"
        if pod.ray_start_num_gpus is not None
        else f"no num-gpus: KubeRay derives {fmt(ray_gpu_count_from_limits(pod.limits))} from the limits"
    )
    limits = ", ".join(f"{k}={fmt(v)}" for k, v in sorted(gpu_map.items())) or "no GPU limit"
    claimed = ix.pod_claim_gpus(pod)
    claim_facts: tuple[str, ...] = ()
    if claimed is not None:  # GPUs of its ResourceClaims (DRA): given to it, but KubeRay derives nothing from them
        limits = f"{limits}; {claimed.describe()}"
        claim_facts = claimed.facts()
        if pod.ray_start_num_gpus is None:
            claim_facts += ("KubeRay derives num-gpus from container limits only, not from ResourceClaims",)
    out: list[Finding] = []
    if ray > given + EPS:
        out.append(
            Finding(
                kind=FindingKind.PHANTOM_GPUS,
                severity=Severity.CRITICAL,
                layer=Layer.RAY_CONFIG,
                subject=subject,
                node=pod.node_name,
                message=f"Ray counts {fmt(ray)} GPUs on {pod.name} but the pod was given {fmt(given)} ({limits})",
                evidence=evidence.model_copy(update={"facts": (param, f"Ray node {rn.node_id}", *claim_facts)}),
                remedy=(
                    (f"Set rayStartParams num-gpus of group {group} to {fmt(given)} (the GPUs of its limits and "
                     "ResourceClaims; KubeRay derives none from claims), or give the claim more GPU devices"
                     if claimed is not None else
                     f"Set rayStartParams num-gpus of group {group} to {fmt(given)} or remove it so KubeRay uses the "
                     "container limits")
                    + "; tasks placed on the extra GPUs fail with CUDA 'no device'."
                ),
            )
        )
    elif given > ray + EPS:
        facts = [param, f"Ray node {rn.node_id}", *claim_facts]
        if GpuKind.SHARE in pod_gpu_kinds(pod):
            facts.append("KubeRay does not count nvidia.com/gpu.shared (the name does not end in 'gpu')")
        out.append(
            Finding(
                kind=FindingKind.STRANDED_GPUS,
                severity=Severity.CRITICAL if ray <= 0 else Severity.WARNING,
                layer=Layer.RAY_CONFIG,
                subject=subject,
                node=pod.node_name,
                message=f"pod {pod.name} holds {fmt(given)} GPU units ({limits}) but Ray schedules only {fmt(ray)}",
                evidence=evidence.model_copy(update={"facts": tuple(facts)}),
                remedy=(
                    f"Set rayStartParams num-gpus of group {group} to {fmt(given)} (or lower the pod's GPU "
                    f"{'limit and claims' if claimed is not None else 'limit'} to {fmt(ray)}): Kubernetes holds "
                    "these GPUs for a pod Ray never uses them on."
                ),
            )
        )
    if slice_why is not None:
        out.append(
            Finding(
                kind=FindingKind.MIG_SHARE_MISMATCH,
                severity=Severity.WARNING,
                layer=Layer.RAY_CONFIG,
                subject=subject,
                node=pod.node_name,
                message=f"Ray counts {fmt(ray)} whole GPUs on {pod.name} but each is {slice_why}",
                evidence=evidence.model_copy(update={"facts": (limits, param)}),
                remedy=(
                    "A task asking num_gpus=1 here gets a slice, not a GPU. Advertise the shape to Ray: add a custom "
                    f"resource or label naming it to group {group} (rayStartParams resources '{{\"mig-3g.40gb\": N}}' "
                    "or labels) and request it, or give this group whole GPUs."
                ),
            )
        )
    return out


def _slice_counted_whole(ix: SnapshotIndex, pod: K8sPodView, rn: RayNodeView) -> str | None:
    """Why each of this Ray pod's GPUs is a slice or share, or None if they are whole or Ray already says so."""
    why = None
    node = ix.nodes.get(pod.node_name or "")
    if id(pod) not in ix.sliced_pods and (node is None or node.labels.get(MIG_STRATEGY_LABEL) != "single") \
            and pod.name not in ix.nvml_mig_pods:
        return None  # the common case, decided without building anything
    view = ix.nvml_by_pod.get(pod.name)
    shapes = [s for k in ix.pod_gpus(pod) if (s := shape_of(k))]
    if any(s.kind is GpuKind.MIG for s in shapes):
        why = "a MIG slice (" + ", ".join(s.label for s in shapes if s.kind is GpuKind.MIG) + ")"
    elif any(s.kind is GpuKind.SHARE for s in shapes):
        why = "a time-sliced / MPS share of a GPU (nvidia.com/gpu.shared)"
    elif node is not None and node.labels.get(MIG_STRATEGY_LABEL) == "single" and "MIG" in node.labels.get(GPU_PRODUCT_LABEL, ""):
        why = f"a MIG slice ({node.labels[GPU_PRODUCT_LABEL]}, strategy single names it nvidia.com/gpu)"
    elif view is not None and view.available and any(d.mig_enabled for d in view.devices):
        profiles = sorted({m.profile for d in view.devices for m in d.mig_devices})
        why = f"a MIG slice (NVML: {', '.join(profiles) or 'MIG mode on'})"
    if why is None:
        return None
    names = [k for k in rn.total if k != "GPU"] + [t for kv in rn.labels.items() for t in kv]
    return None if any(_NAMES_SLICE.search(t.lower()) for t in names) else why


# A Ray resource or label that names a slice or share: "mig", "mig-3g.40gb", "3g.40gb", "gpu.shared", "mps",
# "time-sliced" as a word; not a word that merely contains them ("migration", "sharepoint-team").
_NAMES_SLICE = re.compile(r"(?<![a-z])(mig|mps|shared?|time-?slic(e|ed|ing))(?![a-z])|\d+g\.\d+gb")
