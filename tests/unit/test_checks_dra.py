"""The doctor's DRA checks (raygpu.plan.doctor.checks_dra): one case per line."""

from __future__ import annotations

import pytest
from raygpu.testing.builders.dra import claim, gpu_slice, health, with_dra
from raygpu.testing.builders.snapshots import NOW_S, snap

from raygpu.model.findings import FindingKind, Layer, Severity
from raygpu.model.views import DraDeviceView
from raygpu.plan.doctor.checks_dra import is_gpu_device
from raygpu.plan.doctor.reconcile import reconcile

NV = "gpu.nvidia.com"


def dev(name: str = "gpu-0", **attrs: str) -> DraDeviceView:
    return DraDeviceView(name=name, attributes=attrs)


@pytest.mark.parametrize("driver, device, want", [
    (NV, dev(type="gpu", uuid="GPU-1"), True),
    (NV, dev("gpu-0-mig-9-4-2", type="mig", uuid="MIG-1"), True),  # a MIG device is one unit, as nvidia.com/mig-* is
    (NV, dev("gpu-vfio-0", type="vfio", uuid="GPU-1"), False),  # passthrough to a VM: no container GPU
    (NV, dev(**{"gpu.nvidia.com/type": "gpu"}), True),  # the attribute written fully qualified
    (NV, dev(uuid="GPU-1"), True),  # no type attribute: the UUID says GPU
    (NV, dev(uuid="something-else"), False),
    (NV, dev("gpu-3"), True),  # neither: the driver's canonical name
    (NV, dev("gpu-vfio-3"), False),
    (NV, dev("nic-0"), False),
    ("compute-domain.nvidia.com", dev("channel-0", type="channel"), False),  # IMEX channels, not GPUs
    ("gpu.example.com", dev(type="gpu"), False),  # another vendor's driver: not an nvidia.com GPU
])
def test_is_gpu_device(driver, device, want):
    assert is_gpu_device(driver, device) is want


def report(s):
    return reconcile(s, NOW_S)


def kinds(s) -> list[str]:
    return [f"{f.kind.value}@{f.layer.value} {f.subject}" for f in report(s).findings]


def row(s, node: str):
    return next(r for r in report(s).rows if r.node == node)


DRA_ONLY = snap().gpu_node("n1", 0).obj()  # GFD labels, no nvidia.com/gpu: the GPUs come through DRA


# --- the kubelet layer counts DRA GPUs, once
@pytest.mark.parametrize("name, s, alloc, cap, dra", [
    ("DRA only", with_dra(DRA_ONLY, [gpu_slice("n1", 8)]), 8, 8, 8),
    ("both publish the same 8 GPUs: once, not 16", with_dra(snap().gpu_node("n1", 8).obj(), [gpu_slice("n1", 8)]), 8, 8, 8),
    ("a tainted device is not allocatable", with_dra(DRA_ONLY, [gpu_slice("n1", 8, taints={3: "xid=79:NoSchedule"})]), 7, 8, 8),
    ("NoExecute too", with_dra(DRA_ONLY, [gpu_slice("n1", 8, taints={3: "k:NoExecute", 4: "k:NoExecute"})]), 6, 8, 8),
    ("two slices of one pool", with_dra(DRA_ONLY, [gpu_slice("n1", 4, slice_count=2), gpu_slice("n1", 4, first=4, slice_count=2)]), 8, 8, 8),
    ("an old generation is not counted", with_dra(DRA_ONLY, [gpu_slice("n1", 8, generation=1), gpu_slice("n1", 4, generation=2, name="new")]), 4, 4, 4),
    ("a device in two slices counts once", with_dra(DRA_ONLY, [gpu_slice("n1", 8), gpu_slice("n1", 8, name="dup")]), 8, 8, 8),
    ("vfio devices are no GPUs", with_dra(DRA_ONLY, [gpu_slice("n1", 8, type_="vfio")]), 0, 0, 0),
    ("another node's slice", with_dra(snap().gpu_node("n1", 8).gpu_node("n2", 0).obj(), [gpu_slice("n2", 4)]), 8, 8, 0),
])
def test_kubelet_counts_dra_gpus_once(name, s, alloc, cap, dra):
    r = row(s, "n1")
    assert (r.kubelet_allocatable, r.kubelet_capacity, r.dra_gpus) == (alloc, cap, dra)


# --- findings: one line per case
CASES = [
    ("DRA only, healthy", with_dra(DRA_ONLY, [gpu_slice("n1", 8)]), []),
    ("same GPUs both ways: no finding", with_dra(snap().gpu_node("n1", 8).obj(), [gpu_slice("n1", 8)]), []),
    ("healthy device status", with_dra(snap().gpu_node("n1", 0).ray_pod("p1", "n1", created_at_s=NOW_S).obj(), [gpu_slice("n1", 8)],
                                       pod_health={"p1": [health(f"{NV}/n1/gpu-0", "Healthy")]}), []),
    ("allocatable and slices disagree", with_dra(snap().gpu_node("n1", 8).obj(), [gpu_slice("n1", 6)]),
     ["dra-allocatable-mismatch@device-plugin node/n1"]),
    ("zero allocatable is zero-allocatable's, not a mismatch", with_dra(snap().gpu_node("n1", 8, allocatable=0).obj(), [gpu_slice("n1", 8)]),
     ["zero-allocatable@kubelet node/n1"]),
    ("tainted, not allocated: warning", with_dra(DRA_ONLY, [gpu_slice("n1", 8, taints={2: "xid=79:NoExecute"})]),
     ["dra-device-tainted@device-plugin node/n1"]),
    ("PreferNoSchedule is no DRA effect: ignored", with_dra(DRA_ONLY, [gpu_slice("n1", 8, taints={2: "k:PreferNoSchedule"})]), []),
    ("unhealthy device in a Ray pod", with_dra(snap().gpu_node("n1", 0).ray_pod("p1", "n1", phase="Running", created_at_s=NOW_S).obj(), [gpu_slice("n1", 8)],
                                               pod_health={"p1": [health(f"{NV}/n1/gpu-5")]}),
     ["dra-device-unhealthy@device-plugin pod/default/p1"]),
    ("unhealthy device-plugin GPU too", with_dra(snap().gpu_node("n1", 8).worker("p1", "n1", 8).obj(),
                                                 pod_health={"p1": [health("GPU-abc", resource="nvidia.com/gpu")]}),
     ["dra-device-unhealthy@device-plugin pod/default/p1"]),
    ("a finished pod's device is no finding", with_dra(snap().gpu_node("n1", 0).ray_pod("p1", "n1", phase="Succeeded").obj(), [gpu_slice("n1", 8)],
                                                       pod_health={"p1": [health(f"{NV}/n1/gpu-5")]}), []),
]


@pytest.mark.parametrize("name, s, want", CASES, ids=[c[0] for c in CASES])
def test_findings(name, s, want):
    assert kinds(s) == want


def test_tainted_device_in_use_is_critical_and_names_claim_and_pod():
    s = with_dra(DRA_ONLY, [gpu_slice("n1", 8, taints={2: "xid=79:NoExecute"})],
                 claims=[claim("c1", "n1", 2, 3, pods=("p1",)), claim("c2", "n1", 4)])
    (f,) = report(s).findings
    assert (f.kind, f.severity, f.layer, f.node) == (FindingKind.DRA_DEVICE_TAINTED, Severity.CRITICAL,
                                                     Layer.DEVICE_PLUGIN, "n1")
    assert f.evidence.kubelet == 7 and f.evidence.kubelet_capacity == 8
    assert f.evidence.facts == (f"{NV}/n1/gpu-2 (uuid=GPU-n1-0002, productName=NVIDIA H100 80GB HBM3): taint "
                                "xid=79:NoExecute; claim default/c1 (pod p1)",)
    assert "1 of 8 DRA GPU devices" in f.message and "DeviceTaintRule" in f.remedy


def test_tainted_device_not_in_use_is_a_warning():
    s = with_dra(DRA_ONLY, [gpu_slice("n1", 8, taints={2: "xid=79:NoSchedule"})], claims=[claim("c2", "n1", 4)])
    (f,) = report(s).findings
    assert f.severity is Severity.WARNING and f.evidence.facts[0].endswith("not allocated")


def test_mismatch_names_node_and_both_counts():
    s = with_dra(snap().gpu_node("n1", 8).obj(), [gpu_slice("n1", 4, slice_count=2)])
    (f,) = report(s).findings
    assert f.node == "n1" and f.message == "node n1: allocatable says 8 GPUs but its ResourceSlices publish 4 GPU devices"
    assert f.evidence.facts == ("allocatable nvidia.com/gpu=8", f"ResourceSlices: 4 GPU devices of {NV}",
                                f"{NV}/n1: 1 of 2 slices published")
    assert row(s, "n1").kubelet_allocatable == 8  # the larger, never the sum


def test_unhealthy_evidence_names_the_device():
    s = with_dra(snap().gpu_node("n1", 0).ray_pod("p1", "n1", created_at_s=NOW_S).obj(), [gpu_slice("n1", 8)],
                 pod_health={"p1": [health(f"{NV}/n1/gpu-5"), health(f"{NV}/n1/gpu-6", "Healthy")]})
    (f,) = report(s).findings
    assert f.severity is Severity.CRITICAL and f.evidence.pod == 2 and f.evidence.kubelet == 8
    assert f.evidence.facts == (f"container ray-worker: claim:gpu/gpu device {NV}/n1/gpu-5 Unhealthy "
                                "(uuid=GPU-n1-0005, productName=NVIDIA H100 80GB HBM3)",)
    assert "1 unhealthy GPU device(s) of 2" in f.message


def test_without_dra_the_report_is_unchanged():
    """No DRA API (slices None), or slices without device detail: no dra check, rows and findings as before."""
    base = snap().gpu_node("n1", 8).gpu_node("n2", 0).ray_pod("p1", "n1", 8).ray_node("r1", "p1", 8)
    plain = reconcile(base.obj(), NOW_S)
    assert "dra-devices" not in plain.checks_run
    assert reconcile(with_dra(base.obj(), []), NOW_S) == plain  # served, nothing published
    assert "dra-devices" in reconcile(with_dra(base.obj(), [gpu_slice("n2", 8)]), NOW_S).checks_run


def test_node_outside_the_snapshot_is_not_reported():
    """--node-selector left n2 out: its slices and taints are not the report's."""
    s = with_dra(snap().gpu_node("n1", 8).obj(), [gpu_slice("n1", 8), gpu_slice("n2", 8, taints={0: "k:NoExecute"})])
    assert kinds(s) == [] and [r.node for r in report(s).rows] == ["n1"]
