"""reconcile(): one case per line, findings written as "kind@layer subject"."""

from __future__ import annotations

import subprocess
import sys

import pytest
from raygpu.testing.builders.snapshots import NOW_S, healthy, snap, tol

from raygpu.model.findings import DoctorReport, FindingKind, Layer, Severity
from raygpu.plan.doctor.reconcile import checks, reconcile

MIG = "nvidia.com/mig-3g.40gb"
SHARED = "nvidia.com/gpu.shared"
MIXED = {"nvidia.com/mig.strategy": "mixed"}
SINGLE = {"nvidia.com/mig.strategy": "single"}


def found(b) -> list[str]:
    return [f"{f.kind.value}@{f.layer.value} {f.subject}" for f in reconcile(b.obj(), NOW_S).findings]


CASES = [
    # --- healthy clusters say nothing
    ("healthy 2 nodes", healthy(), []),
    ("the issue's one-liner", snap().gpu_node("n1", gpus=8).ray_pod("p1", node="n1", gpus=8).ray_node("r1", instance="p1", gpus=8), []),
    ("healthy 8 nodes, 1 pod each", healthy(nodes=8, pods_per_node=1), []),
    ("healthy, orphan still in grace", healthy().ray_pod("young", node="gpu-9", created_at_s=NOW_S - 30), []),
    ("unscoped snapshot: other cluster's pods are not orphans", snap(cluster=None).gpu_node("n1").worker("p1", "n1", 4).ray_pod("other", "n1", 4, cluster="rc2"), []),
    ("healthy, deleting pod, raylet alive", snap().gpu_node("n1").worker("p1", "n1", 8, deleting=True), []),
    ("MIG slice Ray already names", snap().gpu_node("n1", 2, resource=MIG, labels=MIXED).ray_pod("p1", "n1", 2, resource=MIG).ray_node("r1", "p1", 2, resources={"mig-3g.40gb": 2}), []),
    ("DRA node without extended resource", snap().gpu_node("n1", 0).resource_slice("n1", 8), []),
    ("taint tolerated", snap().gpu_node("n1", taints=(("nvidia.com/gpu", "NoSchedule"),)).ray_pod("p1", gpus=8, tolerations=(tol("nvidia.com/gpu"),)), []),
    ("one of two GPU nodes untainted", snap().gpu_node("n1", taints=(("dedicated", "NoSchedule"),)).gpu_node("n2").ray_pod("p1", gpus=8), []),
    ("selected node untainted, another tainted", snap().gpu_node("n1", labels={"pool": "a"}).gpu_node("n2", labels={"pool": "b"}, taints=(("k", "NoSchedule"),)).ray_pod("p1", gpus=8, node_selector={"pool": "a"}), []),
    ("selector matches no GPU node: capacity, not taints", snap().gpu_node("n1", taints=(("k", "NoSchedule"),)).ray_pod("p1", gpus=8, node_selector={"pool": "z"}), []),
    ("Ray label 'migration' is not a MIG name", snap().gpu_node("n1").ray_pod("p1", "n1", 1).ray_node("r1", "p1", 1, labels={"team": "migration"}).nvml("r1", 1, mig=("7g.80gb",)), ["mig-share-mismatch@ray-config pod/default/p1"]),
    ("MIG slice Ray labels by profile", snap().gpu_node("n1", 2, resource=MIG, labels=MIXED).ray_pod("p1", "n1", 2, resource=MIG).ray_node("r1", "p1", 2, labels={"gpu-shape": "3g.40gb"}), []),
    ("PreferNoSchedule does not block", snap().gpu_node("n1", taints=(("dedicated", "PreferNoSchedule"),)).ray_pod("p1", gpus=8), []),
    ("CPU pod on GPU node without NVML", snap().gpu_node("n1").ray_pod("p1", "n1").ray_node("r1", "p1").nvml("r1", unavailable="NVML Shared Library Not Found"), []),
    # --- kernel driver
    ("driver not loaded on GPU node", snap().gpu_node("n1", 0).ray_pod("p1", "n1").ray_node("r1", "p1").nvml("r1", unavailable="Driver Not Loaded"),
     ["driver-unavailable@kernel-driver node/n1", "missing-capacity@kernel-driver node/n1"]),
    ("GPU lost in a GPU pod", snap().gpu_node("n1").worker("p1", "n1", 8).nvml("r-p1", unavailable="GPU is lost"), ["driver-unavailable@kernel-driver node/n1"]),
    # --- container toolkit
    ("NVML sees 0 devices, pod has 8", snap().gpu_node("n1").worker("p1", "n1", 8).nvml("r-p1", devices=0), ["container-gpu-mismatch@container-toolkit pod/default/p1"]),
    ("NVML library missing in GPU pod", snap().gpu_node("n1").worker("p1", "n1", 8).nvml("r-p1", unavailable="NVML Shared Library Not Found"), ["container-gpu-mismatch@container-toolkit pod/default/p1"]),
    ("CPU pod sees every GPU", snap().gpu_node("n1").ray_pod("p1", "n1").ray_node("r1", "p1").nvml("r1", devices=8), ["container-gpu-mismatch@container-toolkit pod/default/p1"]),
    # --- device plugin
    ("GPU labels, no capacity, plugin ready", snap().gpu_node("n1", 0), ["missing-capacity@device-plugin node/n1"]),
    ("NVML 8, capacity 0, no plugin pod", snap().gpu_node("n1", 0, device_plugin=None).ray_pod("p1", "n1").ray_node("r1", "p1").nvml("r1", 8), ["missing-capacity@device-plugin node/n1"]),
    ("capacity 8, allocatable 0, no plugin", snap().gpu_node("n1", allocatable=0, device_plugin=None), ["zero-allocatable@device-plugin node/n1"]),
    ("capacity 8, allocatable 0, plugin not ready", snap().gpu_node("n1", allocatable=0, device_plugin="not-ready"), ["zero-allocatable@device-plugin node/n1"]),
    ("strategy single but mig-* resources", snap().gpu_node("n1", 2, resource=MIG, labels=SINGLE), ["mig-share-mismatch@device-plugin node/n1"]),
    ("strategy mixed with gpu and mig-*", snap().gpu_node("n1", 4, labels=MIXED, capacity={MIG: 2}), ["mig-share-mismatch@device-plugin node/n1"]),
    # --- kubelet
    ("capacity 8, allocatable 0, plugin ready", snap().gpu_node("n1", allocatable=0), ["zero-allocatable@kubelet node/n1"]),
    ("every GPU node tainted", snap().gpu_node("n1", taints=(("nvidia.com/gpu", "NoSchedule"),)).gpu_node("n2", taints=(("x", "NoExecute"),)).ray_pod("p1", gpus=8), ["tainted-gpu-nodes@kubelet group/rc/gpu-group"]),
    ("only GPU node cordoned", snap().gpu_node("n1", unschedulable=True).ray_pod("p1", gpus=8).ray_pod("p2", gpus=8), ["tainted-gpu-nodes@kubelet group/rc/gpu-group"]),
    ("every node the selector picks is tainted", snap().gpu_node("n1", labels={"pool": "a"}, taints=(("k", "NoSchedule"),)).gpu_node("n2", labels={"pool": "b"}).ray_pod("p1", gpus=8, node_selector={"pool": "a"}), ["tainted-gpu-nodes@kubelet group/rc/gpu-group"]),
    ("toleration for another effect", snap().gpu_node("n1", taints=(("k", "NoExecute"),)).ray_pod("p1", gpus=8, tolerations=(tol("k", "NoSchedule"),)), ["tainted-gpu-nodes@kubelet group/rc/gpu-group"]),
    # --- Ray
    ("phantom: num-gpus 8 on a 4-GPU pod", snap().gpu_node("n1").ray_pod("p1", "n1", 4, num_gpus=8).ray_node("r1", "p1", 8), ["phantom-gpus@ray-config pod/default/p1"]),
    ("stranded: num-gpus 0 on an 8-GPU pod", snap().gpu_node("n1").ray_pod("p1", "n1", 8, num_gpus=0).ray_node("r1", "p1", 0), ["stranded-gpus@ray-config pod/default/p1"]),
    ("stranded: gpu.shared Ray does not count", snap().gpu_node("n1", 4, resource=SHARED).ray_pod("p1", "n1", 1, resource=SHARED).ray_node("r1", "p1", 0), ["stranded-gpus@ray-config pod/default/p1"]),
    ("fractional num-gpus strands the rest", snap().gpu_node("n1").ray_pod("p1", "n1", 1, num_gpus=0.5).ray_node("r1", "p1", 0.5), ["stranded-gpus@ray-config pod/default/p1"]),
    ("orphan: Running pod, no Ray node", snap().gpu_node("n1").ray_pod("p1", "n1", 8), ["orphan-pod@ray-config pod/default/p1"]),
    ("unscoped snapshot: own cluster's orphan found", snap(cluster=None).gpu_node("n1").worker("p1", "n1", 4).ray_pod("p2", "n1", 4), ["orphan-pod@ray-config pod/default/p2"]),
    ("orphan: its Ray node is dead", snap().gpu_node("n1").ray_pod("p1", "n1", 8).ray_node("r1", "p1", 8, alive=False), ["orphan-pod@ray-config pod/default/p1"]),
    ("ghost: Ray node, no pod", snap().ray_node("r9", "gone-pod", 8), ["ghost-ray-node@ray-config raynode/r9"]),
    ("ghost: its pod Failed", snap().gpu_node("n1").ray_pod("p1", "n1", 8, phase="Failed").ray_node("r1", "p1", 8), ["ghost-ray-node@ray-config raynode/r1"]),
    ("ghost: no instance id", snap().ray_node("r9", None, 0), ["ghost-ray-node@ray-config raynode/r9"]),
    ("MIG slice counted as whole GPU", snap().gpu_node("n1", 2, resource=MIG, labels=MIXED).ray_pod("p1", "n1", 2, resource=MIG).ray_node("r1", "p1", 2), ["mig-share-mismatch@ray-config pod/default/p1"]),
    ("share counted as whole via num-gpus", snap().gpu_node("n1", 4, resource=SHARED).ray_pod("p1", "n1", 1, resource=SHARED, num_gpus=1).ray_node("r1", "p1", 1), ["mig-share-mismatch@ray-config pod/default/p1"]),
    ("strategy single: nvidia.com/gpu is a slice", snap().gpu_node("n1", 7, product="NVIDIA-A100-SXM4-80GB-MIG-1g.10gb", labels=SINGLE).worker("p1", "n1", 7), ["mig-share-mismatch@ray-config pod/default/p1"]),
    ("NVML shows MIG on a whole-GPU pod", snap().gpu_node("n1").ray_pod("p1", "n1", 1).ray_node("r1", "p1", 1).nvml("r1", 1, mig=("7g.80gb",)), ["mig-share-mismatch@ray-config pod/default/p1"]),
    # --- several layers at once: sorted lowest layer first
    ("driver + ghost + phantom, sorted", snap().gpu_node("n1").ray_pod("p1", "n1", 4, num_gpus=8).ray_node("r1", "p1", 8).gpu_node("n2", 0).ray_pod("p2", "n2").ray_node("r2", "p2").nvml("r2", unavailable="Driver Not Loaded").ray_node("r9", "gone", 1),
     ["driver-unavailable@kernel-driver node/n2", "missing-capacity@kernel-driver node/n2", "ghost-ray-node@ray-config raynode/r9", "phantom-gpus@ray-config pod/default/p1"]),
    ("layer decides, not check order", snap().gpu_node("a", allocatable=0).gpu_node("b", 2, resource=MIG, labels=SINGLE),
     ["mig-share-mismatch@device-plugin node/b", "zero-allocatable@kubelet node/a"]),
    ("critical before warning in a layer", snap().cpu_node("c1").ray_pod("p1", "c1").ray_node("r9", "gone", 1),
     ["ghost-ray-node@ray-config raynode/r9", "orphan-pod@ray-config pod/default/p1"]),
]


@pytest.mark.parametrize("name, builder, expected", CASES, ids=[c[0] for c in CASES])
def test_findings(name, builder, expected):
    assert found(builder) == expected


# Evidence: the number each view gave.             ray   pod  kubelet cap  nvml
EVIDENCE = [
    ("phantom", snap().gpu_node("n1").ray_pod("p1", "n1", 4, num_gpus=8).ray_node("r1", "p1", 8).nvml("r1", 4), (8, 4, 8, 8, 4)),
    ("stranded", snap().gpu_node("n1").ray_pod("p1", "n1", 8, num_gpus=2).ray_node("r1", "p1", 2).nvml("r1", 8), (2, 8, 8, 8, 8)),
    ("NVML 0 devices", snap().gpu_node("n1").worker("p1", "n1", 8).nvml("r-p1", 0), (8, 8, 8, 8, 0)),
    ("NVML 8, no capacity", snap().gpu_node("n1", 0, device_plugin=None).ray_pod("p1", "n1").ray_node("r1", "p1").nvml("r1", 8), (None, None, 0, 0, 8)),
    ("zero allocatable", snap().gpu_node("n1", allocatable=0), (None, None, 0, 8, None)),
    ("orphan", snap().gpu_node("n1").ray_pod("p1", "n1", 8), (0, 8, 8, 8, None)),
    ("ghost", snap().ray_node("r9", "gone", 4), (4, 0, None, None, None)),
]


@pytest.mark.parametrize("name, builder, numbers", EVIDENCE, ids=[c[0] for c in EVIDENCE])
def test_evidence_numbers(name, builder, numbers):
    (f,) = reconcile(builder.obj(), NOW_S).findings
    e = f.evidence
    assert (e.ray, e.pod, e.kubelet, e.kubelet_capacity, e.nvml) == numbers


# The remedy names what to look at in the finding's layer.
REMEDIES = [
    ("driver", snap().gpu_node("n1").worker("p1", "n1", 8).nvml("r-p1", unavailable="Driver Not Loaded"), "nvidia-smi"),
    ("toolkit", snap().gpu_node("n1").worker("p1", "n1", 8).nvml("r-p1", 0), "runtimeClassName"),
    ("no plugin pod", snap().gpu_node("n1", 0, device_plugin=None), "DaemonSet"),
    ("plugin ready, no resource", snap().gpu_node("n1", 0), "No devices found"),
    ("taints", snap().gpu_node("n1", taints=(("nvidia.com/gpu", "NoSchedule"),)).ray_pod("p1", gpus=8), "tolerations"),
    ("phantom", snap().gpu_node("n1").ray_pod("p1", "n1", 4, num_gpus=8).ray_node("r1", "p1", 8), "num-gpus of group gpu-group to 4"),
    ("orphan", snap().gpu_node("n1").ray_pod("p1", "n1", 8), "raylet"),
]


@pytest.mark.parametrize("name, builder, phrase", REMEDIES, ids=[c[0] for c in REMEDIES])
def test_remedy_names_where_to_look(name, builder, phrase):
    (f,) = reconcile(builder.obj(), NOW_S).findings
    assert phrase in f.remedy


SEVERITY = [
    ("orphan with GPUs", snap().gpu_node("n1").ray_pod("p1", "n1", 8), Severity.CRITICAL),
    ("orphan without GPUs", snap().cpu_node("c1").ray_pod("p1", "c1"), Severity.WARNING),
    ("partly stranded", snap().gpu_node("n1").ray_pod("p1", "n1", 8, num_gpus=2).ray_node("r1", "p1", 2), Severity.WARNING),
    ("fully stranded", snap().gpu_node("n1").ray_pod("p1", "n1", 8, num_gpus=0).ray_node("r1", "p1", 0), Severity.CRITICAL),
    ("container sees too many", snap().gpu_node("n1").ray_pod("p1", "n1").ray_node("r1", "p1").nvml("r1", 8), Severity.WARNING),
]


@pytest.mark.parametrize("name, builder, severity", SEVERITY, ids=[c[0] for c in SEVERITY])
def test_severity(name, builder, severity):
    (f,) = reconcile(builder.obj(), NOW_S).findings
    assert f.severity is severity


EXIT = [
    ("healthy", healthy(), 0, 10),
    ("one finding", healthy().ray_node("r9", "gone", 1), 1, 10),
    ("kubernetes unreachable", healthy().k8s_unreachable(), 2, 0),
    ("ray unreachable: Ray checks skipped", healthy().ray_unreachable(), 2, 8),
]


@pytest.mark.parametrize("name, builder, code, n_checks", EXIT, ids=[c[0] for c in EXIT])
def test_exit_code_and_checks_run(name, builder, code, n_checks):
    report = reconcile(builder.obj(), NOW_S)
    assert (report.exit_code, len(report.checks_run)) == (code, n_checks)


def test_ray_unreachable_does_not_call_every_pod_an_orphan():
    report = reconcile(healthy().ray_unreachable("GCS timeout").obj(), NOW_S)
    assert report.findings == () and report.unreachable == ("ray: GCS timeout",)


def test_checks_run_lowest_layer_first():
    layers = [c.layer for c in checks(NOW_S)]
    assert layers == sorted(layers) and layers[0] is Layer.GPU_HARDWARE and layers[-1] is Layer.RAY_CONFIG


def test_layer_enum_is_ordered_as_the_issue_says():
    assert list(Layer) == sorted(Layer) and [l.value for l in Layer] == [
        "gpu-hardware", "kernel-driver", "container-toolkit", "device-plugin", "kubelet", "ray-config",
    ]


def test_orphan_grace_uses_now_s_not_a_clock():
    b = snap().gpu_node("n1").ray_pod("p1", "n1", 8, created_at_s=1000.0)
    assert reconcile(b.obj(), now_s=1060.0).findings == ()
    assert [f.kind for f in reconcile(b.obj(), now_s=1200.0).findings] == [FindingKind.ORPHAN_POD]


def test_rows_put_four_views_side_by_side():
    b = snap().gpu_node("n1").ray_pod("p1", "n1", 4, num_gpus=8).ray_node("r1", "p1", 8).nvml("r1", 4).cpu_node("c1")
    (row,) = reconcile(b.obj(), NOW_S).rows
    assert (row.node, row.ray_gpus, row.pod_gpus, row.kubelet_allocatable, row.nvml_gpus, row.findings) == ("n1", 8, 4, 8, 4, 1)


def test_report_is_deterministic_and_round_trips_as_json():
    b = healthy().ray_node("r9", "gone", 1).gpu_node("bad", allocatable=0)
    one, two = reconcile(b.obj(), NOW_S), reconcile(b.obj(), NOW_S)
    assert one == two
    assert DoctorReport.model_validate_json(one.model_dump_json()) == one


def test_plan_and_model_import_no_ray_kubernetes_or_pynvml():
    code = (
        "import sys, raygpu.plan.doctor.reconcile, raygpu.plan.doctor.stranded, raygpu.model.findings;"
        "bad = [m for m in ('ray', 'kubernetes', 'pynvml') if m in sys.modules]; print(bad); sys.exit(bool(bad))"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


# ------------------------------------------------------------------ rendering
from raygpu.doctor.render import render_json, render_text  # noqa: E402

RENDER = [
    ("healthy says so", healthy(), ["No finding: Ray, pods, kubelet and NVML agree.", "exit 0: healthy"]),
    ("table row has all four views", snap().gpu_node("n1").ray_pod("p1", "n1", 4, num_gpus=8).ray_node("r1", "p1", 8).nvml("r1", 4),
     ["n1    NVIDIA-H100-80GB-HBM3    8    4                8/8     4         1"]),
    ("NVML down shows n/a", snap().gpu_node("n1", 0).ray_pod("p1", "n1").ray_node("r1", "p1").nvml("r1", unavailable="Driver Not Loaded"),
     ["  n/a  ", "evidence: ray=- pod=0 kubelet=0/0 nvml=0", "fix: On host n1"]),
    ("finding header: severity layer kind subject", snap().ray_node("r9", "gone", 1), [" 1. CRITICAL ray-config        ghost-ray-node         raynode/r9"]),
    ("stranded line", snap().gpu_node("n1").worker("p1", "n1", 6).ray_pod("p2", None, 4), ["fragments 2", "n1: 2 nvidia.com/gpu free, smallest pending request is 4"]),
    ("kubernetes unreachable", healthy().k8s_unreachable("connection refused"), ["cannot read kubernetes: connection refused", "exit 2: cannot reach the cluster"]),
    ("ray unreachable", healthy().ray_unreachable(), ["cannot read ray: GCS timeout", "No finding in the checks that could run."]),
]


@pytest.mark.parametrize("name, builder, phrases", RENDER, ids=[c[0] for c in RENDER])
def test_render_text(name, builder, phrases):
    text = render_text(reconcile(builder.obj(), NOW_S))
    missing = [p for p in phrases if p not in text]
    assert not missing, text


def test_render_text_without_cluster_view_shows_no_table():
    text = render_text(reconcile(healthy().k8s_unreachable().obj(), NOW_S))
    assert "NODE" not in text and "Stranded" not in text


def test_render_json_round_trips_and_carries_exit_code():
    report = reconcile(healthy().ray_node("r9", "gone", 1).obj(), NOW_S)
    text = render_json(report)
    assert DoctorReport.model_validate_json(text) == report
    assert '"exit_code": 1' in text and '"kind": "ghost-ray-node"' in text and '"layer": "ray-config"' in text
