"""``raygpu doctor`` sees GPUs offered through DRA, on the testbed (issue 13 item 3).

kwok nodes, and ResourceSlices, a ResourceClaim and a pod's
``allocatedResourcesStatus`` written by the test, as a DRA driver and kubelet
would (no driver is needed to publish slices). The testbed's kube-apiserver
(v1.34) serves ``resource.k8s.io/v1`` by default and runs with the alpha
gates ``DRADeviceTaints`` and ``ResourceHealthStatus`` (raygpu.testing.controlplane):
without them it drops device taints and ``allocatedResourcesStatus`` from
every write, which the test checks first so that a testbed started without
them fails with that reason.

No Ray cluster: ``--ray-address 127.0.0.1:1`` makes Ray unreachable (exit 2,
the Ray checks skipped); the Kubernetes checks, DRA's included, still run.
"""

from __future__ import annotations

import pytest
import json
import subprocess
import sys

from raygpu.model.labels import LABEL_POOL
from raygpu.testing.builders.dra import gpu_slice, slice_object
from tests.integration.util import wait_for

pytestmark = pytest.mark.k137  # DRA device taints are GA on 1.37: it differs there

DRIVER = "gpu.nvidia.com"


def doctor(testbed, ns: str) -> tuple[int, dict]:
    argv = [sys.executable, "-m", "raygpu.cli", "doctor", "--namespace", ns, "--kubeconfig", str(testbed.kubeconfig),
            "--ray-address", "127.0.0.1:1", "--node-selector", f"{LABEL_POOL}={ns}", "--json"]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    print(f"raygpu doctor exit {proc.returncode}\n{proc.stdout[-6000:]}{proc.stderr[-2000:]}")
    return proc.returncode, json.loads(proc.stdout)


def test_doctor_counts_dra_gpus_and_finds_taint_health_and_mismatch(testbed, ns, pool, kube, core):
    g1, g2, d1 = pool.add({"g1": "h100x8", "g2": "h100x8", "d1": "cpu16"})
    slices = kube.resources.get(api_version="resource.k8s.io/v1", kind="ResourceSlice")
    claims = kube.resources.get(api_version="resource.k8s.io/v1", kind="ResourceClaim")
    written = [gpu_slice(g1, 6, name=f"{g1}-gpu"),  # allocatable says 8: disagree
               gpu_slice(g2, 8, name=f"{g2}-gpu"),  # the same 8 GPUs both ways: counted once
               gpu_slice(d1, 8, name=f"{d1}-gpu", taints={2: "xid=79:NoSchedule"})]  # DRA only, one device tainted
    # NoSchedule, not NoExecute: from 1.37 (DRADeviceTaints GA, and on 1.34 with the gate on the controller-manager)
    # the device taint eviction controller deletes a pod whose claim holds a NoExecute-tainted device, as it should
    try:
        for s in written:
            slices.create(body=slice_object(s))
        got = slices.get(name=f"{d1}-gpu").to_dict()
        assert got["spec"]["devices"][2].get("taints"), (
            "the API server dropped the device taint: the testbed's kube-apiserver runs without "
            "--feature-gates=DRADeviceTaints=true (restart the testbed with this checkout)")

        claims.create(namespace=ns, body={
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": "gpu"},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]}}})
        labels = {"ray.io/cluster": "c", "ray.io/node-type": "worker", "ray.io/is-ray-node": "yes", "ray.io/group": "gpu"}
        container = {"name": "ray-worker", "image": "ray", "resources": {"claims": [{"name": "gpu", "request": "gpu"}]}}
        core.create_namespaced_pod(ns, {"metadata": {"name": "p1", "labels": labels}, "spec": {
            "nodeName": d1, "resourceClaims": [{"name": "gpu", "resourceClaimName": "gpu"}], "containers": [container]}})
        pod_uid = wait_for("pod p1 Running (kwok)", lambda: (lambda p: p.metadata.uid if p.status.phase == "Running" else None)(
            core.read_namespaced_pod("p1", ns)), 60)
        claims.status.patch(namespace=ns, name="gpu", content_type="application/merge-patch+json", body={"status": {
            "allocation": {"devices": {"results": [{"request": "gpu", "driver": DRIVER, "pool": d1, "device": "gpu-2"}]},
                           "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                               {"key": "metadata.name", "operator": "In", "values": [d1]}]}]}},
            "reservedFor": [{"resource": "pods", "name": "p1", "uid": pod_uid}]}})
        core.patch_namespaced_pod_status("p1", ns, {"status": {"containerStatuses": [{
            "name": "ray-worker", "allocatedResourcesStatus": [{"name": "claim:gpu/gpu", "resources": [
                {"resourceID": f"{DRIVER}/{d1}/gpu-2", "health": "Unhealthy"}]}]}]}})
        status = core.read_namespaced_pod("p1", ns).to_dict()["status"]["container_statuses"]
        assert status and status[0].get("allocated_resources_status"), (
            "the API server dropped allocatedResourcesStatus: the testbed's kube-apiserver runs without "
            "--feature-gates=ResourceHealthStatus=true")

        def report():
            code, out = doctor(testbed, ns)
            return (code, out) if any(f["kind"] == "dra-device-unhealthy" for f in out.get("findings", [])) else None

        code, out = wait_for("the doctor sees the unhealthy device", report, 60, interval_s=2)
        assert code == 2 and out["unreachable"] and out["unreachable"][0].startswith("ray:")  # no Ray here, on purpose
        assert "dra-devices" in out["checks_run"]
        rows = {r["node"]: (r["kubelet_allocatable"], r["kubelet_capacity"], r["dra_gpus"]) for r in out["rows"]}
        assert rows == {g1: (8, 8, 6), g2: (8, 8, 8), d1: (7, 8, 8)}  # DRA GPUs in the kubelet layer, once
        dra = sorted((f["kind"], f["severity"], f["layer"], f["subject"]) for f in out["findings"]
                     if f["kind"].startswith("dra-"))
        assert dra == [("dra-allocatable-mismatch", "warning", "device-plugin", f"node/{g1}"),
                       ("dra-device-tainted", "critical", "device-plugin", f"node/{d1}"),
                       ("dra-device-unhealthy", "critical", "device-plugin", f"pod/{ns}/p1")]
        tainted = next(f for f in out["findings"] if f["kind"] == "dra-device-tainted")
        assert tainted["evidence"]["facts"] == [
            f"{DRIVER}/{d1}/gpu-2 (uuid=GPU-{d1}-0002, productName=NVIDIA H100 80GB HBM3): taint xid=79:NoSchedule; "
            f"claim {ns}/gpu (pod p1)"]
        mismatch = next(f for f in out["findings"] if f["kind"] == "dra-allocatable-mismatch")
        assert mismatch["node"] == g1 and "publish 6 GPU devices" in mismatch["message"]
        assert not any(n.startswith("DRA:") for n in out["notes"])
    finally:
        for s in written:
            try:
                slices.delete(name=s.name)
            except Exception:  # noqa: BLE001 - best effort; the next test's names differ
                pass
