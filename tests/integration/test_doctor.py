"""``raygpu doctor`` on the real testbed: inject one fault, get exactly that finding, at the right layer.

Each test builds a RayCluster on a private node pool, waits until KubeRay's
pods are Running and the bridge's Ray nodes are alive, injects one fault and
runs the real command (``python -m raygpu.cli doctor --json``) in a
subprocess. The Ray address is not passed: the command finds it through the
testbed's bridge, as a user on the testbed would. ``--node-selector`` limits
the node checks to the test's pool (other tests share the control plane),
``--orphan-grace 0`` lets an orphan count at once.

Deadlines are generous (up to 180 s to see a Ray node) because the bridge
starts raylets one at a time for every test and demo sharing the testbed;
alone, each test takes 20-50 s.

Fault injections, all through the real components:

* Ray configuration: ``rayStartParams.num-gpus`` disagreeing with the limits
  (KubeRay passes it to ``ray start``, the bridge runs exactly that);
* kubelet / device plugin: the node's allocatable ``nvidia.com/gpu`` patched to
  0 through the status subresource (kwok keeps it);
* orphan pod: the pod annotation ``raygpu.io/testbed-ray: stopped`` makes the
  bridge stop that pod's Ray node and not restart it, the pod stays Running;
* ghost Ray node: pods of a group annotated ``raygpu.io/testbed-ray: keep`` keep
  their Ray node when the pod is deleted (KubeRay starts a replacement pod);
* MIG: a group asking for ``nvidia.com/mig-3g.40gb`` with ``num-gpus`` = slices;
* taints: the pool's only GPU node tainted, the group without tolerations.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from raygpu.testing import addons
from raygpu.testing import manifests as m
from raygpu.model.labels import ANNOTATION_TESTBED_RAY, LABEL_POOL
from raygpu.testing.kube import apply
from tests.integration.util import alive_ray_nodes, holds_for, pods, ray_address, wait_for

CLUSTER = "doc"
REPO = Path(__file__).resolve().parents[2]


# ------------------------------------------------------------------ helpers
def doctor(testbed, ns: str, *extra: str, json_out: bool = True, pool: str | None = None) -> tuple[int, dict | str]:
    """Run ``raygpu doctor`` for RayCluster ns/doc; returns (exit code, parsed JSON or text)."""
    argv = [sys.executable, "-m", "raygpu.cli", "doctor", "--cluster", CLUSTER, "--namespace", ns,
            "--kubeconfig", str(testbed.kubeconfig), "--orphan-grace", "0",
            "--node-selector", f"{LABEL_POOL}={pool or ns}", *extra]
    if json_out:
        argv.append("--json")
    t0 = time.monotonic()
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    print(f"raygpu doctor ({time.monotonic() - t0:.1f} s) exit {proc.returncode}\n{proc.stdout}{proc.stderr}")
    return proc.returncode, (json.loads(proc.stdout) if json_out else proc.stdout + proc.stderr)


def found(report: dict) -> list[tuple[str, str, str]]:
    return [(f["kind"], f["layer"], f["subject"]) for f in report["findings"]]


def running(core, ns: str, group: str, n: int) -> list[dict] | None:
    ps = [p for p in pods(core, ns, f"ray.io/group={group}")
          if p["status"].get("phase") == "Running" and not p["metadata"].get("deletionTimestamp")]
    return ps if len(ps) == n else None


def start_cluster(testbed, ns, kube, core, workers: list[dict], *, pool: str, annotations=None,
                  wait_workers: dict[str, int] | None = None) -> str:
    """Apply RayCluster ns/doc; wait for ``wait_workers`` {group: n} Running pods with live Ray nodes."""
    apply(kube, m.raycluster(CLUSTER, ns, workers, pool=pool, annotations=annotations))
    addr = ray_address(testbed, ns, CLUSTER, timeout_s=180)  # the bridge is shared with other tests
    for group, n in (wait_workers or {}).items():
        ps = wait_for(f"{n} Running pods of group {group}", lambda: running(core, ns, group, n), 90,
                      log=testbed.logs / "ray-operator.log")
        names = {p["metadata"]["name"] for p in ps}
        wait_for(f"live Ray nodes for {sorted(names)}",
                 lambda: names <= {x.instance_id for x in alive_ray_nodes(addr)}, 180, log=testbed.logs / "bridge.log")
    return addr


def annotate_pod(core, ns: str, name: str, value: str) -> None:
    core.patch_namespaced_pod(name, ns, {"metadata": {"annotations": {ANNOTATION_TESTBED_RAY: value}}})


# -------------------------------------------------------------------- tests
def test_healthy_cluster_has_no_finding_and_exit_0(testbed, ns, pool, kube, core):
    pool.add({"cpu": "cpu16", "g1": "h100x8", "g2": "h100x8"})
    start_cluster(testbed, ns, kube, core, [m.worker_group("gpu", replicas=1, pool=pool.name)], pool=pool.name,
                  wait_workers={"gpu": 1})
    code, report = doctor(testbed, ns)
    assert (code, found(report), report["unreachable"]) == (0, [], [])
    assert report["healthy"] and report["ray_address_source"] == "the testbed's Ray bridge"
    rows = {r["node"]: r for r in report["rows"]}
    assert set(rows) == {pool.node("g1"), pool.node("g2")}, "one row per GPU node of the pool, none for the CPU node"
    busy = [r for r in rows.values() if r["pod_gpus"]]
    assert [(r["ray_gpus"], r["pod_gpus"], r["kubelet_allocatable"], r["kubelet_capacity"]) for r in busy] == [
        (8, 8, 8, 8)]
    code, text = doctor(testbed, ns, json_out=False)
    assert code == 0 and "No finding: Ray, pods, kubelet and NVML agree." in text and "exit 0: healthy" in text
    assert pool.node("g1") in text and "RAY" in text and "KUBELET alloc/cap" in text


def test_unreachable_ray_exits_2_with_the_reason(testbed, ns, pool, kube, core):
    pool.add({"cpu": "cpu16", "g1": "h100x8"})
    start_cluster(testbed, ns, kube, core, [m.worker_group("gpu", replicas=0, pool=pool.name)], pool=pool.name)
    code, report = doctor(testbed, ns, "--ray-address", "127.0.0.1:1")
    assert code == 2 and report["exit_code"] == 2
    # (Ray canonicalizes 127.0.0.1 to this host's IP address)
    assert report["unreachable"] and report["unreachable"][0].startswith("ray: cannot reach the Ray GCS at ")
    assert ":1: " in report["unreachable"][0] and "refused" in report["unreachable"][0]
    code, report = doctor(testbed, ns, "--kubeconfig", str(testbed.root / "no-such.kubeconfig"))
    assert code == 2 and "kubeconfig" in report["error"]


@pytest.mark.parametrize("gpus, num_gpus, kind", [
    (4, "8", "phantom-gpus"),  # Ray schedules on 8 GPUs, the pod has 4
    (8, "2", "stranded-gpus"),  # the pod holds 8 GPUs, Ray uses 2
])
def test_num_gpus_disagreeing_with_limits(testbed, ns, pool, kube, core, gpus, num_gpus, kind):
    pool.add({"cpu": "cpu16", "g1": "h100x8"})
    addr = start_cluster(testbed, ns, kube, core, [m.worker_group(
        "gpu", replicas=1, pool=pool.name, gpus={"nvidia.com/gpu": gpus},
        ray_start_params={"num-gpus": num_gpus})], pool=pool.name, wait_workers={"gpu": 1})
    (pod,) = running(core, ns, "gpu", 1)
    name = pod["metadata"]["name"]
    assert {x.instance_id: x.total_resources().get("GPU") for x in alive_ray_nodes(addr)}[name] == float(num_gpus)
    code, report = doctor(testbed, ns)
    assert code == 1
    assert found(report) == [(kind, "ray-config", f"pod/{ns}/{name}")]
    ev = report["findings"][0]["evidence"]
    assert (ev["ray"], ev["pod"]) == (float(num_gpus), gpus)
    assert "num-gpus" in report["findings"][0]["remedy"]


def test_zero_allocatable_node(testbed, ns, pool, kube, core):
    pool.add({"cpu": "cpu16", "g1": "h100x8", "g2": "h100x8"})
    start_cluster(testbed, ns, kube, core, [m.worker_group("gpu", replicas=1, pool=pool.name)], pool=pool.name,
                  wait_workers={"gpu": 1})
    (pod,) = running(core, ns, "gpu", 1)
    broken = pool.node("g2") if pod["spec"]["nodeName"] == pool.node("g1") else pool.node("g1")
    addons.patch_node_status(testbed, broken, {"allocatable": {"nvidia.com/gpu": "0"}})
    wait_for("allocatable 0 visible", lambda: core.read_node(broken).status.allocatable["nvidia.com/gpu"] == "0", 30)
    code, report = doctor(testbed, ns)
    assert code == 1
    # the testbed runs no NVIDIA device-plugin pod, so the device plugin is the layer that broke
    assert found(report) == [("zero-allocatable", "device-plugin", f"node/{broken}")]
    f = report["findings"][0]
    assert (f["evidence"]["kubelet"], f["evidence"]["kubelet_capacity"]) == (0, 8)
    assert any("device-plugin" in fact for fact in f["evidence"]["facts"])
    assert {r["node"]: r["kubelet_allocatable"] for r in report["rows"]}[broken] == 0
    # the library example finds the same (testbed kubeconfig and Ray address found by itself)
    ex = subprocess.run([sys.executable, str(REPO / "examples" / "doctor_alert.py"), "--namespace", ns, "--cluster", CLUSTER,
                         "--orphan-grace-s", "0"], capture_output=True, text=True, timeout=120)
    print(ex.stdout, ex.stderr)
    assert ex.returncode == 1, ex.stderr[-2000:]
    assert any(ln.split()[2:4] == ["zero-allocatable", f"node/{broken}"] for ln in ex.stdout.splitlines()
               if ln.startswith("CRITICAL")), ex.stdout
    assert "look at:" in ex.stdout


def test_raylet_stopped_under_running_pod_is_an_orphan(testbed, ns, pool, kube, core):
    pool.add({"cpu": "cpu16", "g1": "h100x8", "g2": "h100x8"})
    addr = start_cluster(testbed, ns, kube, core, [m.worker_group("gpu", replicas=2, pool=pool.name)],
                         pool=pool.name, wait_workers={"gpu": 2})
    victim = sorted(p["metadata"]["name"] for p in running(core, ns, "gpu", 2))[0]
    annotate_pod(core, ns, victim, "stopped")
    wait_for(f"Ray node of {victim} gone", lambda: victim not in {x.instance_id for x in alive_ray_nodes(addr)}, 60,
             log=testbed.logs / "bridge.log")
    holds_for("the bridge does not restart it", lambda: victim not in {x.instance_id for x in alive_ray_nodes(addr)}
              and running(core, ns, "gpu", 2) is not None, 3)
    code, report = doctor(testbed, ns)
    assert code == 1
    assert found(report) == [("orphan-pod", "ray-config", f"pod/{ns}/{victim}")]
    f = report["findings"][0]
    assert f["severity"] == "critical" and (f["evidence"]["ray"], f["evidence"]["pod"]) == (0, 8)
    assert report["repair"] is None, "report mode (no annotation) writes nothing"
    assert victim not in (kube_view(testbed, ns).worker_groups[0].workers_to_delete)


def test_pod_deleted_under_live_raylet_is_a_ghost(testbed, ns, pool, kube, core):
    pool.add({"cpu": "cpu16", "g1": "h100x8", "g2": "h100x8"})
    group = m.worker_group("gpu", replicas=1, pool=pool.name)
    group["template"]["metadata"] = {"annotations": {ANNOTATION_TESTBED_RAY: "keep"}}
    addr = start_cluster(testbed, ns, kube, core, [group], pool=pool.name, wait_workers={"gpu": 1})
    (pod,) = running(core, ns, "gpu", 1)
    old = pod["metadata"]["name"]
    ghost_id = next(x.node_id for x in alive_ray_nodes(addr) if x.instance_id == old)
    core.delete_namespaced_pod(old, ns, grace_period_seconds=0)

    def replaced():
        ps = running(core, ns, "gpu", 1)
        if not ps or ps[0]["metadata"]["name"] == old or any(p["metadata"]["name"] == old for p in pods(core, ns)):
            return None
        new = ps[0]["metadata"]["name"]
        alive = {x.instance_id: x.node_id for x in alive_ray_nodes(addr)}
        return new if new in alive and alive.get(old) == ghost_id else None
    new = wait_for("pod gone, replacement Running with its Ray node, old Ray node still alive", replaced, 90,
                   log=testbed.logs / "bridge.log")
    code, report = doctor(testbed, ns)
    assert code == 1
    assert found(report) == [("ghost-ray-node", "ray-config", f"raynode/{ghost_id}")]
    f = report["findings"][0]
    assert f["severity"] == "critical" and (f["evidence"]["ray"], f["evidence"]["pod"]) == (8, 0)
    assert f"no pod named {old}" in f["evidence"]["facts"]
    assert new != old


def test_mig_slices_counted_as_whole_gpus(testbed, ns, pool, kube, core):
    pool.add({"cpu": "cpu16", "m1": "a100x8-mig-mixed"})
    # (the group is not called "mig": the check takes a Ray label value naming MIG, such as
    # ray.io/node-group=mig, as Ray already knowing the slice shape)
    start_cluster(testbed, ns, kube, core, [m.worker_group(
        "a100", replicas=1, pool=pool.name, gpus={"nvidia.com/mig-3g.40gb": 2},
        ray_start_params={"num-gpus": "2"})], pool=pool.name, wait_workers={"a100": 1})
    (pod,) = running(core, ns, "a100", 1)
    code, report = doctor(testbed, ns)
    assert code == 1
    assert found(report) == [("mig-share-mismatch", "ray-config", f"pod/{ns}/{pod['metadata']['name']}")]
    f = report["findings"][0]
    assert (f["evidence"]["ray"], f["evidence"]["pod"]) == (2, 2) and "3g.40gb" in f["message"]
    (row,) = report["rows"]
    assert row["kubelet_capacity"] == 36  # 8 x 3g.40gb + 28 x 1g.10gb


def test_tainted_node_leaves_worker_pods_pending(testbed, ns, pool, kube, core):
    pool.add({"cpu": "cpu16", "g1": "h100x8"})
    core.patch_node(pool.node("g1"), {"spec": {"taints": [
        {"key": "dedicated", "value": "inference", "effect": "NoSchedule"}]}})
    start_cluster(testbed, ns, kube, core, [m.worker_group("gpu", replicas=1, pool=pool.name)], pool=pool.name)

    def unschedulable():
        ps = pods(core, ns, "ray.io/group=gpu")
        conds = [c for p in ps for c in (p["status"].get("conditions") or []) if c["type"] == "PodScheduled"]
        return ps if ps and conds and all(c["status"] == "False" and c.get("reason") == "Unschedulable"
                                          for c in conds) else None
    wait_for("worker pod Pending, Unschedulable", unschedulable, 60, log=testbed.logs / "kube-scheduler.log")
    code, report = doctor(testbed, ns)
    assert code == 1
    assert found(report) == [("tainted-gpu-nodes", "kubelet", f"group/{CLUSTER}/gpu")]
    f = report["findings"][0]
    assert f["evidence"]["facts"] == [f"{pool.node('g1')}: dedicated=inference:NoSchedule"]
    assert "tolerations" in f["remedy"]


def test_repair_mode_deletes_the_orphan_through_workers_to_delete(testbed, ns, pool, kube, core):
    pool.add({"cpu": "cpu16", "g1": "h100x8", "g2": "h100x8"})
    addr = start_cluster(testbed, ns, kube, core, [m.worker_group("gpu", replicas=2, pool=pool.name)],
                         pool=pool.name, annotations={"raygpu.io/reconcile": "repair"}, wait_workers={"gpu": 2})
    victim = sorted(p["metadata"]["name"] for p in running(core, ns, "gpu", 2))[0]
    annotate_pod(core, ns, victim, "stopped")
    wait_for(f"Ray node of {victim} gone", lambda: victim not in {x.instance_id for x in alive_ray_nodes(addr)}, 60,
             log=testbed.logs / "bridge.log")
    rv_before = kube_view(testbed, ns).resource_version
    code, report = doctor(testbed, ns)
    assert code == 1 and found(report) == [("orphan-pod", "ray-config", f"pod/{ns}/{victim}")]
    rep = report["repair"]
    assert rep["applied"] and rep["errors"] == [] and rep["events"] == 1
    assert [(a["pod"], a["replicas_before"], a["replicas_after"]) for a in rep["plan"]["actions"]] == [(victim, 2, 1)]
    assert rep["plan"]["patch"][0] == {"op": "test", "path": "/metadata/resourceVersion", "value": rv_before}

    view = kube_view(testbed, ns)
    g = view.group("gpu")
    # KubeRay may already have acted on it (deleted the pod and emptied the list)
    assert g.replicas == 1 and (victim in g.workers_to_delete or not any(
        p["metadata"]["name"] == victim and not p["metadata"].get("deletionTimestamp") for p in pods(core, ns)))
    events = core.list_namespaced_event(ns, field_selector=f"involvedObject.name={CLUSTER},reason=RepairedOrphanPod")
    assert len(events.items) == 1 and victim in events.items[0].message
    assert events.items[0].involved_object.kind == "RayCluster"

    wait_for(f"KubeRay deleted {victim}", lambda: victim not in {p["metadata"]["name"] for p in pods(core, ns)}, 60,
             log=testbed.logs / "ray-operator.log")
    code, report = doctor(testbed, ns)
    assert (code, found(report)) == (0, []) and report["repair"]["plan"]["actions"] == []


def kube_view(testbed, ns: str):
    from raygpu.adapters.kube import KubeAdapter
    return KubeAdapter(str(testbed.kubeconfig)).get_raycluster(ns, CLUSTER)
