"""``raygpu doctor`` without a cluster: the CLI over fake adapters, the pure repair planner, the repair applier."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

import pytest
from raygpu.testing.builders.snapshots import NOW_S, healthy, snap

from raygpu.cli import build_parser
from raygpu.doctor import run as doctor
from raygpu.errors import PermanentError
from raygpu.model.findings import DoctorReport
from raygpu.model.raycluster import RayClusterView
from raygpu.plan.doctor.reconcile import reconcile
from raygpu.plan.doctor.repair import EVENT_REASON, plan_repair
from raygpu.doctor.repair import repair_cluster
from raygpu.testing.fake_kube import FakeKube

OLD = NOW_S - 1000  # created long before NOW_S: past the orphan grace


def rc_obj(groups=(("gpu-group", 2, 0),), annotations=None, rv="41", wtd=None) -> dict:
    """A RayCluster dict: groups are (name, replicas, minReplicas)."""
    return {
        "apiVersion": "ray.io/v1", "kind": "RayCluster",
        "metadata": {"name": "rc", "namespace": "default", "uid": "uid-rc", "resourceVersion": rv,
                     "annotations": dict(annotations or {})},
        "spec": {"headGroupSpec": {"rayStartParams": {}, "template": {"spec": {"containers": [{}]}}},
                 "workerGroupSpecs": [
                     {"groupName": g, "replicas": r, "minReplicas": mn, "maxReplicas": 8, "rayStartParams": {},
                      **({"scaleStrategy": {"workersToDelete": list(wtd)}} if wtd and i == 0 else {}),
                      "template": {"spec": {"containers": [{"resources": {"limits": {"nvidia.com/gpu": "4"}}}]}}}
                     for i, (g, r, mn) in enumerate(groups)]},
    }


def orphaned(n_ok: int = 1, n_orphan: int = 1, group: str = "gpu-group"):
    """A healthy cluster plus ``n_orphan`` Running worker pods without a Ray node."""
    b = snap().cpu_node("cpu-0").head().gpu_node("n1", gpus=16)
    for i in range(n_ok):
        b.worker(f"ok-{i}", "n1", gpus=4, created_at_s=OLD, group=group)
    for i in range(n_orphan):
        b.ray_pod(f"orphan-{i}", node="n1", gpus=4, created_at_s=OLD, group=group)
    return b.obj()


def report_of(s):
    return reconcile(s, NOW_S)


# ---------------------------------------------------------------- planner
def test_orphan_goes_to_workers_to_delete_and_replicas_drop_in_one_tested_patch():
    s = orphaned()
    plan = plan_repair(report_of(s), RayClusterView.from_k8s(rc_obj()), s)
    assert [(a.pod, a.group, a.replicas_before, a.replicas_after) for a in plan.actions] == [
        ("orphan-0", "gpu-group", 2, 1)]
    assert list(plan.patch) == [
        {"op": "test", "path": "/metadata/resourceVersion", "value": "41"},
        {"op": "test", "path": "/spec/workerGroupSpecs/0/groupName", "value": "gpu-group"},
        {"op": "add", "path": "/spec/workerGroupSpecs/0/scaleStrategy", "value": {"workersToDelete": ["orphan-0"]}},
        {"op": "add", "path": "/spec/workerGroupSpecs/0/replicas", "value": 1},
    ]
    assert "orphan-0" in plan.actions[0].event_message and "2 -> 1" in plan.actions[0].event_message


def test_healthy_cluster_plans_nothing():
    s = healthy().obj()
    plan = plan_repair(report_of(s), RayClusterView.from_k8s(rc_obj()), s)
    assert plan.empty and plan.patch is None and not plan.skipped


def test_only_orphans_are_repaired_phantom_gpus_are_left_alone():
    s = snap().cpu_node("cpu-0").head().gpu_node("n1").ray_pod("p1", "n1", 4, created_at_s=OLD).ray_node(
        "r1", "p1", 8).obj()
    report = report_of(s)
    assert [f.kind.value for f in report.findings] == ["phantom-gpus"]
    assert plan_repair(report, RayClusterView.from_k8s(rc_obj()), s).patch is None


def test_existing_workers_to_delete_are_kept_and_listed_pods_skipped():
    s = orphaned(n_ok=3, n_orphan=2)
    view = RayClusterView.from_k8s(rc_obj(groups=(("gpu-group", 5, 0),), wtd=["orphan-0", "gone-pod"]))
    plan = plan_repair(report_of(s), view, s)
    assert [a.pod for a in plan.actions] == ["orphan-1"]
    assert [(k.subject, k.reason) for k in plan.skipped] == [("pod/default/orphan-0", "already in workersToDelete")]
    assert plan.patch[2]["value"] == {"workersToDelete": ["orphan-0", "gone-pod", "orphan-1"]}
    assert plan.patch[3]["value"] == 4


def test_replicas_never_drop_below_min_replicas():
    s = orphaned()
    plan = plan_repair(report_of(s), RayClusterView.from_k8s(rc_obj(groups=(("gpu-group", 2, 2),))), s)
    assert plan.actions[0].replicas_after == 2
    assert "fresh pod" in plan.actions[0].reason
    assert not any(op["path"].endswith("/replicas") for op in plan.patch)


def test_group_is_found_by_index_among_several():
    s = orphaned(group="b")
    view = RayClusterView.from_k8s(rc_obj(groups=(("a", 1, 0), ("b", 2, 0))))
    plan = plan_repair(report_of(s), view, s)
    assert plan.actions[0].group_index == 1
    assert plan.patch[1] == {"op": "test", "path": "/spec/workerGroupSpecs/1/groupName", "value": "b"}


def test_head_pod_is_never_deleted():
    s = snap().cpu_node("cpu-0").ray_pod("rc-head", "cpu-0", head=True, created_at_s=OLD).gpu_node("n1").worker(
        "w", "n1", 8, created_at_s=OLD).obj()
    report = report_of(s)
    assert [f.subject for f in report.findings] == ["pod/default/rc-head"]
    plan = plan_repair(report, RayClusterView.from_k8s(rc_obj()), s)
    assert plan.patch is None and "head" in plan.skipped[0].reason


def test_unknown_group_and_other_cluster_are_skipped():
    s = orphaned(group="retired")
    plan = plan_repair(report_of(s), RayClusterView.from_k8s(rc_obj()), s)
    assert plan.patch is None and "no worker group retired" in plan.skipped[0].reason
    s = orphaned()
    other = rc_obj()
    other["metadata"]["name"] = "rc2"
    plan = plan_repair(report_of(s), RayClusterView.from_k8s(other), s)
    assert plan.patch is None and "not a pod of RayCluster default/rc2" in plan.skipped[0].reason


def test_mass_orphaning_means_the_head_is_broken_and_nothing_is_repaired():
    s = orphaned(n_ok=1, n_orphan=2)
    plan = plan_repair(report_of(s), RayClusterView.from_k8s(rc_obj(groups=(("gpu-group", 3, 0),))), s)
    assert plan.patch is None
    assert len(plan.skipped) == 2 and all("GCS" in k.reason for k in plan.skipped)


def test_a_single_worker_cluster_can_still_be_repaired():
    s = orphaned(n_ok=0, n_orphan=1)
    plan = plan_repair(report_of(s), RayClusterView.from_k8s(rc_obj(groups=(("gpu-group", 1, 0),))), s)
    assert [a.replicas_after for a in plan.actions] == [0]


def test_a_single_worker_is_not_repaired_when_the_ray_address_is_another_clusters():
    # the Ray address answers for another cluster: its nodes are live, none is a pod of rc, so rc's head and
    # its one worker both look orphaned; the fraction rule (two or more orphans) cannot see it
    s = snap().cpu_node("cpu-0").ray_pod("rc-head", "cpu-0", head=True, created_at_s=OLD).gpu_node("n1").ray_pod(
        "w-0", "n1", 4, created_at_s=OLD).ray_node("r-other-head", "other-head", head=True).ray_node(
        "r-other-w", "other-w", 4).obj()
    report = report_of(s)
    assert {"pod/default/rc-head", "pod/default/w-0"} <= {f.subject for f in report.findings}
    plan = plan_repair(report, RayClusterView.from_k8s(rc_obj(groups=(("gpu-group", 1, 0),))), s)
    assert plan.patch is None and plan.empty
    worker_skip = [k.reason for k in plan.skipped if k.subject == "pod/default/w-0"]
    assert worker_skip and "no pod of RayCluster default/rc" in worker_skip[0]


def test_orphan_in_grace_is_not_repaired():
    s = snap().cpu_node("cpu-0").head().gpu_node("n1").worker("ok", "n1", 4).ray_pod(
        "young", "n1", 4, created_at_s=NOW_S - 10).obj()
    assert plan_repair(report_of(s), RayClusterView.from_k8s(rc_obj()), s).patch is None


# ---------------------------------------------------------------- applier
def test_repair_patches_once_and_records_an_event_per_action():
    s = orphaned()
    kube = FakeKube(rc_obj())
    out = repair_cluster(kube, "default", "rc", report_of(s), s)
    assert out.applied and out.conflicts == 0 and out.events == 1 and not out.errors
    assert len(kube.patches) == 1
    assert (kube.events[0].kind, kube.events[0].name, kube.events[0].reason) == ("RayCluster", "rc", EVENT_REASON)
    assert any(line.startswith("repaired: pod orphan-0") for line in out.lines())


def test_conflict_rereads_and_replans_never_overwrites():
    s = orphaned()
    kube = FakeKube(rc_obj(), conflicts=1)
    observed = []

    def observe():
        observed.append(1)
        return report_of(s), s
    out = repair_cluster(kube, "default", "rc", report_of(s), s, observe=observe)
    assert out.applied and out.conflicts == 1 and observed == [1]
    assert [p[0]["value"] for p in kube.patches] == ["42"], "the second patch tests the re-read version"


def test_conflicts_forever_give_up_without_writing():
    s = orphaned()
    kube = FakeKube(rc_obj(), conflicts=10)
    out = repair_cluster(kube, "default", "rc", report_of(s), s, attempts=3)
    assert not out.applied and out.conflicts == 3 and kube.patches == [] and kube.events == []
    assert "nothing was overwritten" in out.errors[0]


def test_recovered_orphan_after_conflict_is_not_deleted():
    s, healed = orphaned(), healthy().obj()
    kube = FakeKube(rc_obj(), conflicts=1)
    out = repair_cluster(kube, "default", "rc", report_of(s), s, observe=lambda: (report_of(healed), healed))
    assert not out.applied and kube.patches == [] and out.plan.empty


def test_a_rejected_patch_is_an_error_value():
    class Denied(FakeKube):
        def patch_raycluster(self, ns, name, patch):
            raise PermanentError("forbidden (403)")
    s = orphaned()
    out = repair_cluster(Denied(rc_obj()), "default", "rc", report_of(s), s)
    assert not out.applied and "forbidden" in out.errors[0]


# -------------------------------------------------------------------- CLI
class CliKube(FakeKube):
    def __init__(self, kubeconfig=None, obj=None):
        super().__init__(obj or rc_obj())


@pytest.fixture
def cli(monkeypatch, capsys):
    """Run ``raygpu doctor ARGS`` over a given snapshot and RayCluster; returns (exit code, stdout, stderr, kube)."""
    import raygpu.adapters.kube as kube_mod
    import raygpu.doctor.snapshot as snapshot_mod

    def go(argv, snapshot=None, obj=None, kube_cls=None):
        made = {}

        def adapter(kubeconfig=None, first_contact_timeout_s=None):
            made["kube"] = (kube_cls or CliKube)(kubeconfig, obj)
            return made["kube"]
        monkeypatch.setattr(kube_mod, "KubeAdapter", adapter)
        monkeypatch.setattr(doctor, "_testbed", lambda: None)
        monkeypatch.setattr(snapshot_mod, "take_snapshot",
                            lambda kube, addr, ns, cluster, now, with_nvml=False: snapshot.model_copy(
                                update={"taken_at_s": now}))
        monkeypatch.setattr(doctor.time, "time", lambda: NOW_S)
        args = build_parser().parse_args(["doctor", *argv])
        code = args.func(args)
        out, err = capsys.readouterr()
        return code, out, err, made.get("kube")
    return go


def test_cli_healthy_exits_0_with_a_row_per_gpu_node(cli):
    code, out, _, _ = cli(["--cluster", "rc", "--ray-address", "127.0.0.1:1"], healthy().obj())
    assert code == 0
    assert "ray: 127.0.0.1:1 (from --ray-address)" in out
    assert "NODE" in out and "gpu-0" in out and "gpu-1" in out and "cpu-0" not in out.split("NODE")[1].split("\n\n")[0]
    assert out.rstrip().endswith("exit 0: healthy")


def test_cli_findings_exit_1_and_json_reads_back(cli):
    code, out, _, kube = cli(["--cluster", "rc", "--ray-address", "x:1", "--json"], orphaned())
    assert code == 1
    d = json.loads(out)
    assert d["exit_code"] == 1 and d["repair"] is None and d["ray_address_source"] == "--ray-address"
    assert [f["kind"] for f in d["findings"]] == ["orphan-pod"]
    assert DoctorReport.model_validate_json(out).findings[0].subject == "pod/default/orphan-0"
    assert kube.patches == [], "report mode writes nothing"


def test_cli_repair_mode_follows_the_annotation(cli):
    obj = rc_obj(annotations={"raygpu.io/reconcile": "repair"})
    code, out, _, kube = cli(["--cluster", "rc", "--ray-address", "x:1"], orphaned(), obj)
    assert code == 1
    assert "repaired: pod orphan-0 (group gpu-group) -> workersToDelete, replicas 2 -> 1" in out
    assert len(kube.patches) == 1 and kube.events[0].reason == "RepairedOrphanPod"
    code, out, _, kube = cli(["--cluster", "rc", "--ray-address", "x:1", "--no-repair"], orphaned(), obj)
    assert kube.patches == [] and "--no-repair" in out


def test_cli_repair_json_and_bad_annotation_note(cli):
    obj = rc_obj(annotations={"raygpu.io/reconcile": "fix-it"})
    code, out, _, kube = cli(["--cluster", "rc", "--ray-address", "x:1", "--json"], orphaned(), obj)
    d = json.loads(out)
    assert kube.patches == [] and d["repair"] is None
    assert any("raygpu.io/reconcile" in n for n in d["notes"])
    obj = rc_obj(annotations={"raygpu.io/reconcile": "repair"})
    code, out, _, kube = cli(["--cluster", "rc", "--ray-address", "x:1", "--json"], orphaned(), obj)
    d = json.loads(out)
    assert d["repair"]["applied"] and d["repair"]["plan"]["actions"][0]["pod"] == "orphan-0"


def test_cli_unreachable_ray_exits_2_with_the_reason(cli):
    code, out, _, _ = cli(["--cluster", "rc"], healthy().ray_unreachable("cannot reach the Ray GCS at x:1").obj())
    assert code == 2
    assert "cannot read ray: cannot reach the Ray GCS at x:1" in out and "exit 2: cannot reach the cluster" in out


def test_cli_unreachable_ray_never_repairs(cli):
    obj = rc_obj(annotations={"raygpu.io/reconcile": "repair"})
    s = orphaned().model_copy(update={"ray": healthy().ray_unreachable().obj().ray})
    code, out, _, kube = cli(["--cluster", "rc"], s, obj)
    assert code == 2 and kube.patches == []


def test_cli_unknown_cluster_exits_2(cli):
    class Missing(CliKube):
        def get_raycluster(self, ns, name):
            raise PermanentError(f"unknown cluster: RayCluster {ns}/{name} does not exist")
    code, out, err, _ = cli(["--cluster", "nope", "--ray-address", "x:1"], healthy().obj(), kube_cls=Missing)
    assert code == 2 and "unknown cluster: RayCluster default/nope does not exist" in err


def test_cli_node_selector_scopes_the_node_checks(cli):
    s = healthy().gpu_node("elsewhere", gpus=8, allocatable=0, labels={"pool": "b"}).obj()
    code, out, _, _ = cli(["--cluster", "rc", "--ray-address", "x:1"], s)
    assert code == 1 and "zero-allocatable" in out
    nodes = tuple(n.model_copy(update={"labels": {**n.labels, "pool": "a"}}) if n.name != "elsewhere" else n
                  for n in s.k8s.nodes)
    s = s.model_copy(update={"k8s": s.k8s.model_copy(update={"nodes": nodes})})
    code, out, _, _ = cli(["--cluster", "rc", "--ray-address", "x:1", "-l", "pool=a"], s)
    assert code == 0 and "elsewhere" not in out


def test_cli_bad_node_selector_is_usage_error(cli):
    code, _, err, _ = cli(["--cluster", "rc", "--ray-address", "x:1", "-l", "pool"], healthy().obj())
    assert code == 2 and "not KEY=VALUE" in err


def test_cli_no_kubeconfig_exits_2_with_the_reason(tmp_path, monkeypatch):
    monkeypatch.setattr(doctor, "_testbed", lambda: None)
    args = build_parser().parse_args(["doctor", "--kubeconfig", str(tmp_path / "missing"), "--ray-address", "x:1"])
    assert args.func(args) == 2


def test_resolve_target_order(monkeypatch, tmp_path):
    args = argparse.Namespace(namespace="ns", cluster="c", ray_address=None)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    assert doctor.resolve_target(args, None) == ("ns", "c", None, "nowhere")
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
    assert doctor.resolve_target(args, None)[2] == "c-head-svc.ns.svc:6379"
    monkeypatch.setenv("RAY_ADDRESS", "env:6379")
    assert doctor.resolve_target(args, None)[2:] == ("env:6379", "$RAY_ADDRESS")
    args.ray_address = "given:1"
    assert doctor.resolve_target(args, None)[2:] == ("given:1", "--ray-address")


def test_help_names_the_exit_codes_and_repair():
    out = subprocess.run([sys.executable, "-m", "raygpu.cli", "doctor", "--help"], capture_output=True, text=True,
                         check=True).stdout
    for word in ("--cluster", "--namespace", "--ray-address", "--kubeconfig", "--json", "--nvml",
                 "exit codes: 0 healthy, 1 findings", "2 cannot reach", "raygpu.io/reconcile=repair",
                 "workersToDelete"):
        assert word in out, word
