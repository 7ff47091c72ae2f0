"""GPU health in the doctor (issue 28): NVML recordings replayed through probe_nvml, then reconcile;
health agents' node marks; the blast radius of an unhealthy GPU or node."""

from __future__ import annotations

import pytest
from raygpu.testing.builders import snap
from raygpu.testing.nvml_recordings import (
    H100_ECC_DBE,
    H100_ECC_HISTORY,
    H100_NODE,
    H100_REMAP_FAILED,
    H100_XID_13,
    H100_XID_79,
    V100_RETIRED_PENDING,
    FakeNvml,
)

from raygpu.adapters.nvml import probe_nvml
from raygpu.doctor.render import render_text
from raygpu.model.findings import FindingKind, Layer, Severity
from raygpu.model.labels import LABEL_RESERVATION
from raygpu.model.views import K8sNodeView, NodeCondition, PgState, Taint
from raygpu.plan.common.health import node_health_signals, unhealthy_nodes
from raygpu.plan.doctor.reconcile import reconcile

NOW_S = 10_000.0


def _probed(recording, node_id="r-w1", wait_ms=50):
    fake = FakeNvml(recording)
    view = probe_nvml(node_id, nvml=fake, xid_wait_ms=wait_ms)
    assert all(s.freed for s in fake.event_sets)  # the event set is always freed
    return view


def _world(view, gpus=8):
    """One 8-GPU node, one worker pod on it with a live Ray node whose NVML view is ``view``."""
    return (snap().gpu_node("g1").ray_pod("w1", "g1", gpus).ray_node("r-w1", "w1", gpus).nvml_view(view))


# recording -> (kind, severity, subject, a word of the message, a word of the fix)
CASES = [
    ("XID 79: fell off the bus", H100_XID_79,
     (FindingKind.GPU_XID, Severity.CRITICAL, "gpu/r-w1/2", "XID 79 (GPU has fallen off the bus)", "reseat or replace")),
    ("uncorrectable ECC since driver load, remap pending", H100_ECC_DBE, None),
    ("ECC only in the lifetime", H100_ECC_HISTORY,
     (FindingKind.GPU_ECC_UNCORRECTABLE, Severity.WARNING, "gpu/r-w1/1", "in its lifetime", "keep watching")),
    ("row remap failed", H100_REMAP_FAILED,
     (FindingKind.GPU_MEMORY_REMAP, Severity.CRITICAL, "gpu/r-w1/7", "row remapping failed", "RMA")),
]


@pytest.mark.parametrize("name, recording, expected", [c for c in CASES if c[2]], ids=[c[0] for c in CASES if c[2]])
def test_one_health_finding_per_recording(name, recording, expected):
    report = reconcile(_world(_probed(recording)).obj(), NOW_S)
    (f,) = report.findings
    kind, severity, subject, said, fix = expected
    assert (f.kind, f.severity, f.layer, f.subject, f.node) == (kind, severity, Layer.GPU_HARDWARE, subject, "g1")
    assert said in f.message and fix in f.remedy
    assert f.evidence.ray == 8 and f.evidence.pod == 8 and f.evidence.kubelet == 8 and f.evidence.nvml == 8
    assert f.evidence.facts  # the counters or the XID it rests on
    assert report.checks_run[:2] == ("gpu-health", "node-health")


def test_ecc_and_pending_remap_are_two_critical_findings_on_one_gpu():
    report = reconcile(_world(_probed(H100_ECC_DBE)).obj(), NOW_S)
    assert [(f.kind, f.severity, f.subject) for f in report.findings] == [
        (FindingKind.GPU_ECC_UNCORRECTABLE, Severity.CRITICAL, "gpu/r-w1/5"),
        (FindingKind.GPU_MEMORY_REMAP, Severity.CRITICAL, "gpu/r-w1/5"),
    ]
    ecc, remap = report.findings
    assert "2 uncorrectable ECC errors since the driver loaded" in ecc.message
    assert any("pending=True" in fact for fact in remap.evidence.facts) and "reset the GPU" in remap.remedy


def test_retired_pages_on_a_gpu_without_row_remapping():
    view = _probed(V100_RETIRED_PENDING)
    (dev,) = view.devices
    assert (dev.health.remap_pending, dev.health.retired_pages, dev.health.retired_pages_pending) == (None, 1, True)
    kinds = [(f.kind, f.severity) for f in reconcile(_world(view, gpus=1).obj(), NOW_S).findings]
    assert kinds == [(FindingKind.GPU_ECC_UNCORRECTABLE, Severity.CRITICAL), (FindingKind.GPU_MEMORY_REMAP, Severity.CRITICAL)]


def test_healthy_gpus_and_an_application_xid_give_no_finding():
    for recording in (H100_NODE, H100_XID_13):
        view = _probed(recording)
        assert all(d.health.ecc_volatile_uncorrected == 0 and d.health.remap_pending is False for d in view.devices)
        assert reconcile(_world(view).obj(), NOW_S).findings == ()
    assert [e.xid for e in _probed(H100_XID_13).xid_events] == [13]  # seen, but 13 is an application's fault


def test_xid_event_names_its_device_and_the_wait():
    view = _probed(H100_XID_79, wait_ms=200)
    assert [(e.xid, e.device_index, e.uuid) for e in view.xid_events] == [(79, 2, H100_NODE["devices"][2]["uuid"])]
    assert view.xid_wait_ms == 200
    assert _probed(H100_XID_79, wait_ms=0).xid_events == ()  # 0: not watched


# ------------------------------------------------------------------ node marks
SIGNALS = [
    ("NVSentinel condition", dict(conditions=(NodeCondition(type="GpuXidError", reason="XID79"),)), True),
    ("AKS NPD condition", dict(conditions=(NodeCondition(type="GPUMissing"),)), True),
    ("a custom NPD plugin naming NVLink", dict(conditions=(NodeCondition(type="NVLinkDown"),)), True),
    ("an unrelated condition", dict(conditions=(NodeCondition(type="MemoryPressure"),)), False),
    ("xid taint", dict(taints=(Taint(key="xid", value="79", effect="NoExecute"),)), True),
    ("gpu-unhealthy taint", dict(taints=(Taint(key="example.com/gpu-unhealthy", effect="NoSchedule"),)), True),
    ("the GPU-only node taint is not a health mark", dict(taints=(Taint(key="nvidia.com/gpu", effect="NoSchedule"),)), False),
    ("a PreferNoSchedule xid taint", dict(taints=(Taint(key="xid", effect="PreferNoSchedule"),)), False),
    ("NVSentinel quarantine label", dict(labels={"k8saas.nvidia.com/cordon-by": "fault-quarantine"}), True),
]


@pytest.mark.parametrize("name, fields, unhealthy", SIGNALS, ids=[c[0] for c in SIGNALS])
def test_node_health_signals(name, fields, unhealthy):
    assert bool(node_health_signals(K8sNodeView(name="n", **fields))) is unhealthy


def test_node_health_finding_for_counted_gpus_only():
    b = (snap().gpu_node("g1", conditions=(("GpuXidError", "XID 79 on GPU 3"),)).worker("w1", "g1", 8)
         .cpu_node("c1"))
    report = reconcile(b.obj(), NOW_S)
    (f,) = report.findings
    assert (f.kind, f.severity, f.layer, f.subject) == (FindingKind.NODE_HEALTH, Severity.CRITICAL, Layer.GPU_HARDWARE, "node/g1")
    assert f.evidence.ray == 8 and f.evidence.kubelet_capacity == 8 and "GpuXidError=True (XID 79 on GPU 3)" in f.evidence.facts[0]
    assert "kubectl describe node g1" in f.remedy
    # a CPU node with the same mark counts no GPU: not this finding
    b2 = snap().node("c1", {"cpu": 8}).obj()
    b2 = b2.model_copy(update={"k8s": b2.k8s.model_copy(update={"nodes": (b2.k8s.nodes[0].model_copy(
        update={"conditions": (NodeCondition(type="GpuXidError"),)}),)})})
    assert reconcile(b2, NOW_S).findings == ()


# ------------------------------------------------------------------ blast radius
def test_blast_radius_two_placement_groups_over_a_bad_gpu():
    """XID 79 on one worker's GPU: the two placement groups with a bundle there, their jobs and gang
    reservations are named; a third placement group elsewhere, and a removed one, are not."""
    b = (snap().gpu_node("g1").gpu_node("g2")
         .ray_pod("w1", "g1", 8).ray_node("r-w1", "w1", 8, labels={LABEL_RESERVATION: "rg-train-a"})
         .nvml_view(_probed(H100_XID_79))
         .worker("w2", "g2", 8)
         .pg("pg-a", 4, 4, state=PgState.CREATED, name="train-a", node_ids=("r-w1", "r-w2"), job_id="02000000",
             label_selectors=({LABEL_RESERVATION: "rg-train-a"}, {LABEL_RESERVATION: "rg-train-a"}))
         .pg("pg-b", 2, state=PgState.CREATED, name="eval-b", node_ids=("r-w1",), job_id="03000000")
         .pg("pg-c", 8, state=PgState.CREATED, node_ids=("r-w2",), job_id="04000000")
         .pg("pg-gone", 1, state=PgState.REMOVED, node_ids=("r-w1",), job_id="05000000"))
    report = reconcile(b.obj(), NOW_S)
    (blast,) = report.blast_radius
    assert (blast.subject, blast.node, blast.kinds) == ("gpu/r-w1/2", "g1", (FindingKind.GPU_XID,))
    assert blast.ray_nodes == ("r-w1",) and blast.pods == ("default/w1",)
    assert [(p.pg_id, p.name, p.bundles_there, p.job_id) for p in blast.placement_groups] == [
        ("pg-a", "train-a", 1, "02000000"), ("pg-b", "eval-b", 1, "03000000")]
    assert blast.jobs == ("02000000", "03000000") and blast.reservations == ("rg-train-a",)
    text = render_text(report)
    assert "Blast radius (1 unhealthy" in text and "placement group pg-a train-a" in text and "job 03000000" in text


def test_blast_radius_of_a_marked_node_covers_every_ray_node_on_it():
    b = (snap().gpu_node("g1", 16, conditions=(("GpuXidError", "XID 48"),)).worker("w1", "g1", 8).worker("w2", "g1", 8)
         .pg("pg-a", 8, 8, state=PgState.CREATED, node_ids=("r-w1", "r-w2"), job_id="02000000"))
    (blast,) = reconcile(b.obj(), NOW_S).blast_radius
    assert blast.subject == "node/g1" and blast.ray_nodes == ("r-w1", "r-w2")
    assert [(p.pg_id, p.bundles_there) for p in blast.placement_groups] == [("pg-a", 2)]


def test_unhealthy_nodes_for_the_planners():
    b = (snap().gpu_node("g1").gpu_node("g2", taints=(("xid", "NoSchedule"),)).gpu_node("g3")
         .ray_pod("w1", "g1", 8).ray_node("r-w1", "w1", 8).nvml_view(_probed(H100_ECC_DBE))
         .worker("w3", "g3", 8))
    bad = unhealthy_nodes(b.obj())
    assert sorted(bad) == ["g1", "g2"]
    assert "GPU 5" in bad["g1"][0] and bad["g2"] == ("taint xid:NoSchedule",)
