"""Checks of the lower layers: kernel driver, container toolkit, device plugin, kubelet.

Each check is ``check_x(ix: SnapshotIndex) -> list[Finding]``: pure, no I/O.
The layer a finding blames follows the evidence, e.g. a GPU node without
capacity is the device plugin's fault unless NVML on that node says the
driver is not loaded, in which case it is the kernel driver's.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator

from raygpu.model.findings import Evidence, Finding, FindingKind, Layer, Severity
from raygpu.model.shapes import GpuKind
from raygpu.model.views import K8sNodeView, K8sPodView, Taint, Toleration
from raygpu.plan.doctor.checks_index import SnapshotIndex
from raygpu.plan.doctor.facts import (
    EPS,
    GPU_PRODUCT_LABEL,
    MIG_STRATEGY_LABEL,
    fmt,
    is_blocking_taint_effect,
    nvml_reason_class,
    shape_of,
)

_MAX_FACTS = 5


# --------------------------------------------------------------- kernel driver
def check_driver(ix: SnapshotIndex) -> list[Finding]:
    """NVML cannot start because of the host driver, on a GPU node or in a GPU pod. One finding per node."""
    out: list[Finding] = []
    for node_name in sorted(ix.driver_broken_on_node):  # live Ray pods whose NVML blames the driver, by node
        node = ix.nodes.get(node_name)
        gpu_node = node is not None and ix.is_gpu_node(node)
        broken = [(p, v) for p, v in ix.driver_broken_on_node[node_name] if gpu_node or ix.pod_gpu_units(p) > 0]
        if not broken:
            continue
        pod, view = broken[0]
        cap = ix.gpu_capacity(node) if node else None
        out.append(
            Finding(
                kind=FindingKind.DRIVER_UNAVAILABLE,
                severity=Severity.CRITICAL,
                layer=Layer.KERNEL_DRIVER,
                subject=f"node/{node_name}",
                node=node_name,
                message=f"NVML cannot start on GPU node {node_name}: {view.reason}",
                evidence=Evidence(
                    pod=ix.pod_gpu_units(pod),
                    kubelet=ix.gpu_allocatable(node) if node else None,
                    kubelet_capacity=cap,
                    nvml=0,
                    facts=tuple(f"pod {p.namespace}/{p.name}: {v.reason}" for p, v in broken[:_MAX_FACTS]),
                ),
                remedy=(
                    f"On host {node_name}: `lsmod | grep nvidia`, `nvidia-smi`, `dmesg | grep -i -e NVRM -e Xid`. "
                    "Load or reinstall the NVIDIA kernel driver (GPU Operator: the nvidia-driver-daemonset pod on "
                    "that node); a 'version mismatch' means user-space and kernel module differ: reboot or reload."
                ),
            )
        )
    return out


# ----------------------------------------------------------- container toolkit
def check_container(ix: SnapshotIndex) -> list[Finding]:
    """NVML inside a Ray pod sees a different number of GPU units than the pod was given."""
    out: list[Finding] = []
    views, nvml_units = ix.nvml_by_pod, ix.nvml_units_by_pod
    for pod in ix.container_suspects:  # Running, bound Ray pods whose NVML view is down or disagrees
        view = views[pod.name]
        given = ix.pod_gpu_units(pod)
        if view.available and abs(nvml_units[pod.name] - given) < EPS:
            continue  # the common, healthy case: NVML sees what the pod was given
        node = ix.nodes.get(pod.node_name)
        node_cap = ix.gpu_capacity(node) if node else 0.0
        subject = f"pod/{pod.namespace}/{pod.name}"
        if not view.available:
            if nvml_reason_class(view) == "driver" or given <= 0:
                continue  # driver: check_driver owns it; no GPU asked: no NVML is expected
            severity, seen = Severity.CRITICAL, 0
            message = f"pod {pod.namespace}/{pod.name} was given {fmt(given)} GPUs but NVML cannot start in it: {view.reason}"
        else:
            seen = view.gpu_units
            if abs(seen - given) < EPS:
                continue
            if given <= 0 and node_cap <= 0:
                continue  # no GPU resource on the node: check_capacity reports it, with this NVML count as evidence
            if seen < given:
                severity = Severity.CRITICAL
                message = f"NVML in pod {pod.namespace}/{pod.name} sees {seen} GPU units but the pod was given {fmt(given)}"
            else:
                severity = Severity.WARNING
                message = (
                    f"NVML in pod {pod.namespace}/{pod.name} sees {seen} GPU units but the pod was given {fmt(given)}: "
                    "it can touch GPUs allotted to other pods"
                )
        rn = ix.live_ray_by_instance.get(pod.name)
        out.append(
            Finding(
                kind=FindingKind.CONTAINER_GPU_MISMATCH,
                severity=severity,
                layer=Layer.CONTAINER_TOOLKIT,
                subject=subject,
                node=pod.node_name,
                message=message,
                evidence=Evidence(
                    ray=rn.gpu_total if rn else None,
                    pod=given,
                    kubelet=ix.gpu_allocatable(node) if node else None,
                    kubelet_capacity=node_cap if node else None,
                    nvml=seen,
                    facts=tuple(f"NVML device {d.index}: {d.name} {d.uuid}" for d in view.devices[:_MAX_FACTS]),
                ),
                remedy=(
                    "Check the container runtime on that node: the pod's runtimeClassName (nvidia) and the containerd/"
                    "CRI-O config from nvidia-ctk, NVIDIA_VISIBLE_DEVICES in the image (must not be 'all' for pods without "
                    "a GPU limit), privileged: true (sees every GPU), and the toolkit/validator pods of the GPU Operator."
                ),
            )
        )
    return out


# --------------------------------------------------------------- device plugin
def _device_plugin_fact(ready: bool | None, node_name: str) -> str:
    if ready is None:
        return f"no device-plugin pod on {node_name}"
    return f"device-plugin pod on {node_name} is {'ready' if ready else 'NOT ready'}"


def check_capacity(ix: SnapshotIndex) -> list[Finding]:
    """A GPU node (labels, NVML) whose capacity has no GPU resource at all, and no DRA slice for it."""
    out: list[Finding] = []
    for node in ix.gpuless_nodes:  # no GPU units in capacity
        if ix.gpu_capacity(node) > 0 or not ix.is_gpu_node(node):
            continue
        if any(rs.device_count > 0 for rs in ix.slices_on_node.get(node.name, ())):
            continue  # DRA publishes these GPUs as ResourceSlices, not as an extended resource
        ready = ix.device_plugin_ready(node.name)
        nvml_seen = ix.nvml_devices_on_node(node.name)
        driver = ix.driver_broken_on(node.name)
        facts = [f"label {k}={v}" for k, v in sorted(node.labels.items()) if k.startswith("nvidia.com/gpu.")]
        facts.append(_device_plugin_fact(ready, node.name))
        if driver is not None:
            layer = Layer.KERNEL_DRIVER
            remedy = f"Fix the driver first ({driver.reason}); the device plugin finds no GPU without it."
        else:
            layer = Layer.DEVICE_PLUGIN
            if ready is None:
                remedy = (
                    f"No nvidia-device-plugin pod runs on {node.name}: check the DaemonSet's nodeSelector "
                    "(nvidia.com/gpu.present), its tolerations against the node's taints, and the GPU Operator's ClusterPolicy."
                )
            elif not ready:
                remedy = f"The device-plugin pod on {node.name} is not ready: read its logs (NVML init, MIG strategy, config map)."
            else:
                remedy = (
                    f"The device-plugin pod on {node.name} is ready but registered no resource: read its logs for "
                    "'No devices found' / 'could not load NVML' (driver root, failOnInitError) and its MIG strategy."
                )
        out.append(
            Finding(
                kind=FindingKind.MISSING_CAPACITY,
                severity=Severity.CRITICAL,
                layer=layer,
                subject=f"node/{node.name}",
                node=node.name,
                message=f"GPU node {node.name} advertises no GPU resource (capacity has no nvidia.com/gpu or mig-*)",
                evidence=Evidence(kubelet=0, kubelet_capacity=0, nvml=nvml_seen or (0 if driver else None), facts=tuple(facts)),
                remedy=remedy,
            )
        )
    return out


def check_allocatable(ix: SnapshotIndex) -> list[Finding]:
    """GPU capacity > 0 but allocatable 0, per GPU resource: the devices are registered but unhealthy or stale."""
    out: list[Finding] = []
    for node in ix.zero_allocatable_nodes:  # some GPU resource of the capacity is not > 0 in allocatable
        caps, alloc = ix.node_gpus(node, capacity=True), node.allocatable
        for resource, cap in sorted(caps.items()) if len(caps) > 1 else caps.items():
            if alloc.get(resource, 0.0) > 0:
                continue
            ready = ix.device_plugin_ready(node.name)
            facts = (_device_plugin_fact(ready, node.name), f"node Ready={node.ready}")
            if ready is not True:
                layer = Layer.DEVICE_PLUGIN
                remedy = (
                    f"Start or repair the device-plugin pod on {node.name}: kubelet keeps the last capacity but "
                    "allocates nothing until a plugin re-registers (read the DaemonSet's events and the pod's logs)."
                )
            else:
                layer = Layer.KUBELET
                remedy = (
                    f"`kubectl describe node {node.name}`: the plugin reports every device unhealthy (look for Xid "
                    "errors in its logs and `dmesg`) or kubelet restarted and lost the registration: restart the plugin pod."
                )
            out.append(
                Finding(
                    kind=FindingKind.ZERO_ALLOCATABLE,
                    severity=Severity.CRITICAL,
                    layer=layer,
                    subject=f"node/{node.name}",
                    node=node.name,
                    message=f"node {node.name} has {fmt(cap)} {resource} in capacity but 0 allocatable",
                    evidence=Evidence(
                        kubelet=0, kubelet_capacity=cap, nvml=ix.nvml_devices_on_node(node.name) or None, facts=facts
                    ),
                    remedy=remedy,
                )
            )
    return out


def check_mig_strategy(ix: SnapshotIndex) -> list[Finding]:
    """A node whose advertised resources contradict its MIG strategy label."""
    out: list[Finding] = []
    for node in ix.mig_labelled_nodes:
        strategy = node.labels.get(MIG_STRATEGY_LABEL)
        if strategy is None:
            continue
        res = ix.node_gpus(node, capacity=True)
        mig = {k: v for k, v in res.items() if (s := shape_of(k)) and s.kind is GpuKind.MIG}
        whole = sum(v for k, v in res.items() if (s := shape_of(k)) and s.kind is GpuKind.WHOLE)
        problem = None
        if strategy in ("single", "none") and mig:
            problem = f"label {MIG_STRATEGY_LABEL}={strategy} but the node advertises {', '.join(sorted(mig))}"
        elif strategy == "mixed" and mig and whole > 0:
            problem = (
                f"strategy mixed advertises both nvidia.com/gpu={fmt(whole)} and {', '.join(sorted(mig))}: "
                "a pod asking nvidia.com/gpu may get a full GPU or not depending on the node"
            )
        if problem is None:
            continue
        out.append(
            Finding(
                kind=FindingKind.MIG_SHARE_MISMATCH,
                severity=Severity.WARNING,
                layer=Layer.DEVICE_PLUGIN,
                subject=f"node/{node.name}",
                node=node.name,
                message=f"node {node.name} mixes MIG strategies: {problem}",
                evidence=Evidence(
                    kubelet=ix.gpu_allocatable(node),
                    kubelet_capacity=ix.gpu_capacity(node),
                    nvml=ix.nvml_devices_on_node(node.name) or None,
                    facts=tuple(f"capacity {k}={fmt(v)}" for k, v in sorted(res.items()))
                    + (f"label {GPU_PRODUCT_LABEL}={node.labels.get(GPU_PRODUCT_LABEL)}",),
                ),
                remedy=(
                    "Make the device plugin's MIG_STRATEGY (GPU Operator: ClusterPolicy mig.strategy) match the node's "
                    "MIG layout (nvidia.com/mig.config): 'single' only when every GPU has the same profile, "
                    "'mixed' with every GPU MIG-enabled, then restart the plugin pod on the node."
                ),
            )
        )
    return out


# --------------------------------------------------------------------- kubelet
def _untolerated(node: K8sNodeView, tolerations: tuple[Toleration, ...]) -> list[Taint]:
    if not node.taints and not node.unschedulable:
        return []  # the usual node: nothing to tolerate
    taints = list(node.taints)
    if node.unschedulable and not any(t.key == "node.kubernetes.io/unschedulable" for t in taints):
        taints.append(Taint(key="node.kubernetes.io/unschedulable", effect="NoSchedule"))
    return [
        t for t in taints if is_blocking_taint_effect(t.effect) and not any(tol.tolerates(t) for tol in tolerations)
    ]


def _selector(pod: K8sPodView) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(pod.node_selector.items()))


def _nodes_with(ix: SnapshotIndex, wanted: set[str], selector: dict[str, str]) -> Iterator[K8sNodeView]:
    """The snapshot's nodes with capacity of some ``wanted`` GPU resource whose labels match ``selector``,
    in snapshot order and one at a time: the taint check stops at the first node that takes the group."""
    for n in ix.snapshot.k8s.nodes:
        cap = n.capacity
        if any(cap.get(r, 0.0) > 0 for r in wanted) and all(n.labels.get(k) == v for k, v in selector.items()):
            yield n


def check_taints(ix: SnapshotIndex) -> list[Finding]:
    """Pending GPU pods of a Ray group, and every node with that GPU resource taints them away."""
    pending: dict[tuple[str, str], list[K8sPodView]] = defaultdict(list)
    for pod in ix.pending_gpu_ray_pods:  # Pending, unbound, not deleting, with GPUs
        pending[(pod.ray_cluster or "-", pod.ray_group or pod.ray_node_type or "-")].append(pod)
    out: list[Finding] = []
    for (cluster, group), pods in sorted(pending.items()):
        pod = pods[0]  # pods of a group share the template's tolerations
        wanted = set(ix.pod_gpus(pod))
        blocked, taken = [], False
        for n in _nodes_with(ix, wanted, pod.node_selector):
            taints = _untolerated(n, pod.tolerations)
            if not taints:
                taken = True  # one node takes the group: no finding (the rest need not be looked at)
                break
            blocked.append((n, taints))
        if taken or not blocked:
            continue  # or no node has the resource (or matches the selector): a capacity problem, not a taint one
        gpu_nodes = [n for n, _ in blocked]
        facts = [
            f"{n.name}: " + ", ".join(f"{t.key}{'=' + t.value if t.value else ''}:{t.effect}" for t in taints)
            for n, taints in blocked[:_MAX_FACTS]
        ]
        if len(blocked) > _MAX_FACTS:
            facts.append(f"... and {len(blocked) - _MAX_FACTS} more GPU nodes")
        first = blocked[0][1][0]
        out.append(
            Finding(
                kind=FindingKind.TAINTED_GPU_NODES,
                severity=Severity.CRITICAL,
                layer=Layer.KUBELET,
                subject=f"group/{cluster}/{group}",
                message=(
                    f"{len(pods)} pod(s) of group {group} are Pending and every one of the {len(gpu_nodes)} nodes "
                    f"with {', '.join(sorted(wanted))}"
                    + (f" matching nodeSelector {_selector(pod)}" if pod.node_selector else "")
                    + " has a taint they do not tolerate"
                ),
                evidence=Evidence(
                    pod=ix.pod_gpu_units(pod),
                    kubelet=sum(ix.gpu_allocatable(n) for n in gpu_nodes),
                    kubelet_capacity=sum(ix.gpu_capacity(n) for n in gpu_nodes),
                    facts=tuple(facts),
                ),
                remedy=(
                    f"Add to workerGroupSpecs[{group}].template.spec.tolerations e.g. "
                    f"{{key: {first.key}, operator: Exists, effect: {first.effect}}}, "
                    "or remove the taint / uncordon the node (`kubectl taint nodes <node> <key>-`)."
                ),
            )
        )
    return out
