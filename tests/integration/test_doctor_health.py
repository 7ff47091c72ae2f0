"""Issue 28 on the testbed: a GPU health condition appears on a node under a running gang.

Pool: two kwok H100x8 nodes and a CPU node; RayCluster ``c`` with a 4-GPU worker group and
``raygpu.io/doctor-interval: 1m``. A gang (one bundle of 4 GPUs, backend none) runs from this test's Ray
driver. Then the node under it gets the condition NVSentinel's platform connector sets for a fatal XID
(``GpuXidError=True``), through the node status subresource as the agent writes it. Shown:

* ``raygpu doctor`` names the node (``node-health``, layer gpu-hardware) and, in its blast radius, the
  gang's placement group, its Ray job and its reservation;
* a sidecar (the real command, the admin's kubeconfig: it may list nodes) exports
  ``raygpu_doctor_findings{check="node-health",severity="critical"} 1`` and records exactly one
  ``DoctorFinding`` Warning Event naming the node, also after further cycles;
* the next reservation avoids the node although kube-scheduler would prefer it: the other node is made
  busier (a pod of another workload takes 4 GPUs and most of its CPU), so without the avoidance the
  next pod would go to the marked node (NodeResourcesFit's least-allocated scoring).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request

import ray

import raygpu
from raygpu.adapters.kube import KubeAdapter
from raygpu.model.labels import LABEL_POOL, LABEL_RESERVATION
from raygpu.testing import manifests as m
from raygpu.testing.kube import apply
from tests.integration.gang_helpers import nothing_left
from tests.integration.sidecar_helpers import Sidecar, _events
from tests.integration.util import holds_for, pods, ray_address, wait_for

XID = {"type": "GpuXidError", "status": "True", "reason": "XidCriticalError",
       "message": "ErrorCode:79 GPU 3 has fallen off the bus"}


def node_of(core, ns: str, group: str) -> str | None:
    ps = [p for p in pods(core, ns, f"{LABEL_RESERVATION}={group}") if p["status"].get("phase") == "Running"]
    return ps[0]["spec"].get("nodeName") if len(ps) == 1 else None


def mark_unhealthy(core, node: str) -> None:
    """Add the condition as a health agent does: the node's status subresource, its conditions list."""
    current = core.read_node_status(node).to_dict()["status"]["conditions"] or []
    conds = [{"type": c["type"], "status": c["status"], "reason": c.get("reason"), "message": c.get("message"),
              "lastTransitionTime": c.get("last_transition_time"), "lastHeartbeatTime": c.get("last_heartbeat_time")}
             for c in current if c["type"] != XID["type"]]
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    conds.append({**XID, "lastTransitionTime": now, "lastHeartbeatTime": now})
    core.patch_node_status(node, {"status": {"conditions": conds}})


def has_condition(core, node: str) -> bool:
    return any(c.type == XID["type"] and c.status == "True" for c in core.read_node_status(node).status.conditions or [])


def metric(port: int, name: str, labels: dict[str, str]) -> float | None:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    for line in text.splitlines():
        if line.startswith(name + "{"):
            got = ",".join(sorted(line[len(name) + 1:line.index("}")].split(",")))
            if got == want:
                return float(line.rsplit(" ", 1)[1])
    return None


def test_a_gpu_health_condition_under_a_running_gang(testbed, ns, pool, kube, core, tmp_path):
    pool.add({"cpu": "cpu16", "g1": "h100x8", "g2": "h100x8"})
    apply(kube, m.raycluster("c", ns, [m.worker_group("gpu", replicas=0, pool=pool.name, cpu="8",
                                                      gpus={"nvidia.com/gpu": 4})],
                             pool=pool.name, annotations={"raygpu.io/doctor-interval": "1m",
                                                          "raygpu.io/reclaim": "off"}))
    address = ray_address(testbed, ns, "c")
    ray.init(address=address, logging_level="ERROR", log_to_driver=False)
    sidecar = None
    gang = nxt = None
    try:
        job = ray.get_runtime_context().get_job_id()
        gang = raygpu.placement_group([{"GPU": 4}], cluster="c", namespace=ns, backend="none", timeout_s=150,
                                      name="train", kubeconfig=str(testbed.kubeconfig))
        assert gang.wait(180), f"gang not ready: {gang.state} {gang.error}"
        bad = wait_for("the gang's pod Running on a node", lambda: node_of(core, ns, "rg-train"), 60)
        good = next(n for n in (pool.node("g1"), pool.node("g2")) if n != bad)
        pg_id = gang.placement_group.id.hex()

        # the other node busier than the marked one: kube-scheduler's scoring would pick the marked node next
        apply(kube, {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "other-workload", "namespace": ns},
                     "spec": {"nodeName": good, "containers": [{"name": "x", "image": "busybox", "resources": {
                         "requests": {"cpu": "80", "memory": "512Gi", "nvidia.com/gpu": "4"},
                         "limits": {"cpu": "80", "memory": "512Gi", "nvidia.com/gpu": "4"}}}]}})

        mark_unhealthy(core, bad)
        holds_for("the condition stays on the node (kwok keeps it)", lambda: has_condition(core, bad), 3)

        # 1. raygpu doctor names the node, the gang and its Ray job
        proc = subprocess.run([sys.executable, "-m", "raygpu.cli", "doctor", "--cluster", "c", "--namespace", ns,
                               "--kubeconfig", str(testbed.kubeconfig), "--orphan-grace", "0",
                               "--node-selector", f"{LABEL_POOL}={pool.name}", "--json", "--no-repair"],
                              capture_output=True, text=True, timeout=120)
        print(proc.stdout[-4000:], proc.stderr[-2000:])
        assert proc.returncode == 1
        report = json.loads(proc.stdout)
        health = [f for f in report["findings"] if f["kind"] == "node-health"]
        assert [(f["subject"], f["layer"], f["severity"]) for f in health] == [(f"node/{bad}", "gpu-hardware",
                                                                                "critical")]
        assert "GpuXidError=True (XidCriticalError: ErrorCode:79 GPU 3 has fallen off the bus)" in \
            health[0]["evidence"]["facts"][0]
        (blast,) = report["blast_radius"]
        assert blast["subject"] == f"node/{bad}"
        assert [p["pg_id"] for p in blast["placement_groups"]] == [pg_id]
        assert blast["jobs"] == [job] and blast["reservations"] == ["rg-train"]

        # 2. the sidecar's metric and exactly one Event
        sidecar = Sidecar(testbed, ns, "c", address, tmp_path / "sidecar.log")
        sidecar.wait("a health cycle", lambda: sidecar.records("doctor"), 90)
        assert metric(sidecar.metrics_port, "raygpu_doctor_findings",
                      {"check": "node-health", "severity": "critical"}) == 1.0
        told = wait_for("a DoctorFinding Event", lambda: [e for e in _events(core, ns, "DoctorFinding", "c")
                                                           if "node-health" in e.message] or None, 30)
        assert len(told) == 1 and told[0].type == "Warning" and f"node/{bad}" in told[0].message
        assert pg_id in told[0].message and "rg-train" in told[0].message
        cycles = len(sidecar.records("cycle"))
        sidecar.wait("three more cycles", lambda: len(sidecar.records("cycle")) >= cycles + 3, 60)
        assert len([e for e in _events(core, ns, "DoctorFinding", "c") if "node-health" in e.message]) == 1
        assert sum((e.count or 1) for e in _events(core, ns, "DoctorFinding", "c") if "node-health" in e.message) == 1

        # 3. the next reservation avoids the node
        said: list[str] = []
        nxt = raygpu.placement_group([{"GPU": 4}], cluster="c", namespace=ns, backend="none", timeout_s=150,
                                     name="next", kubeconfig=str(testbed.kubeconfig), progress=said.append)
        assert nxt.wait(180), f"next reservation not ready: {nxt.state} {nxt.error}"
        assert node_of(core, ns, "rg-next") == good
        assert any(f"kept out of the reservation: {bad}" in s for s in said)
    finally:
        if sidecar is not None:
            sidecar.stop()
        for h in (nxt, gang):
            if h is not None:
                raygpu.remove_placement_group(h)
        ray.shutdown()
    wait_for("reservations released", lambda: nothing_left(KubeAdapter(str(testbed.kubeconfig)), ns, "c"), 90)
