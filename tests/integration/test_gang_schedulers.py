"""Issue 2: the gang schedulers on the testbed are all-or-nothing for real."""

from __future__ import annotations

import time

import pytest

from raygpu.model.labels import ANNOTATION_REQUEUE, LABEL_POOL
from raygpu.testing.addons import SP_SCHEDULER_NAME
from raygpu.testing import manifests as m
from raygpu.testing.kube import apply
from tests.integration.util import pods, wait_for

pytestmark = pytest.mark.k137  # version skew: coscheduling and Kueue built for 1.34 against the 1.37 API server

REQUEUE_EVERY_S = 5.0  # how often the test touches a waiting PodGroup (raygpu's heartbeat: every 10 s)


def _gpu_pod(name: str, pool: str, labels: dict, annotations: dict | None = None,
             scheduler: str | None = None) -> dict:
    res = {"cpu": "8", "memory": "64Gi", "nvidia.com/gpu": "8"}
    spec = {"containers": [{"name": "c", "image": "busybox", "resources": {"limits": res, "requests": res}}],
            "nodeSelector": {LABEL_POOL: pool}}
    if scheduler:
        spec["schedulerName"] = scheduler
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": labels,
                                                            "annotations": annotations or {}}, "spec": spec}


def _unschedulable(p: dict) -> bool:
    return any(c["type"] == "PodScheduled" and c["status"] == "False"
               for c in p.get("status", {}).get("conditions") or [])


def test_coscheduling_podgroup_is_all_or_nothing(testbed, ns, pool, kube, core):
    pool.add({"g1": "h100x8", "g2": "h100x8"})
    apply(kube, {"apiVersion": "scheduling.x-k8s.io/v1alpha1", "kind": "PodGroup",
                 "metadata": {"name": "gang", "namespace": ns},
                 "spec": {"minMember": 3, "scheduleTimeoutSeconds": 30}})
    for i in range(3):
        apply(kube, _gpu_pod(f"p{i}", pool.name, {"scheduling.x-k8s.io/pod-group": "gang"},
                             scheduler=SP_SCHEDULER_NAME), ns)
    # The scheduler has looked at every pod and refused each: none bound, though 2 would fit.
    wait_for("all 3 pods marked unschedulable by the coscheduling scheduler",
             lambda: len([p for p in pods(core, ns) if _unschedulable(p)]) == 3, 90,
             log=testbed.logs / "sp-scheduler.log")
    assert [p["spec"].get("nodeName") for p in pods(core, ns)] == [None, None, None]
    pool.add({"g3": "h100x8"})
    # Coscheduling requeues the pods it rejected on a PodGroup update, not on a new node (else they wait
    # for the scheduler's 5-minute unschedulable flush), so raygpu's heartbeat touches a waiting gang's
    # PodGroup every 10 s; the test touches it the same way, repeatedly. One touch is not enough: a CI run
    # saw the scheduler drop p0 from its active queue ("the same pod is tracked in multiple places ... discard
    # it") while p1/p2 sat in Permit, so that p0, parked again after the single touch, waited for the flush.
    podgroups = kube.resources.get(api_version="scheduling.x-k8s.io/v1alpha1", kind="PodGroup")
    touched = [0.0]

    def all_bound() -> bool:
        ps = pods(core, ns)
        if len(ps) == 3 and all(p["spec"].get("nodeName") for p in ps):
            return True
        if time.monotonic() - touched[0] >= REQUEUE_EVERY_S:
            podgroups.patch(name="gang", namespace=ns, content_type="application/merge-patch+json",
                            body={"metadata": {"annotations": {ANNOTATION_REQUEUE: f"{time.time():.0f}"}}})
            touched[0] = time.monotonic()
        return False
    wait_for("all 3 pods bound once a third node exists", all_bound, 120, log=testbed.logs / "sp-scheduler.log")
    assert len({p["spec"]["nodeName"] for p in pods(core, ns)}) == 3


def test_kueue_pod_group_is_all_or_nothing(testbed, ns, pool, kube, core):
    pool.add({"g1": "h100x8", "g2": "h100x8"})
    cq = f"cq-{ns}"
    apply(kube, m.cluster_queue(cq, {"cpu": "192", "memory": "2Ti", "nvidia.com/gpu": "16"}))
    apply(kube, m.local_queue("lq", ns, cq))
    labels = {"kueue.x-k8s.io/queue-name": "lq", "kueue.x-k8s.io/pod-group-name": "gang"}
    try:
        for i in range(3):
            apply(kube, _gpu_pod(f"p{i}", pool.name, labels, {"kueue.x-k8s.io/pod-group-total-count": "3"}), ns)
        wl = kube.resources.get(api_version="kueue.x-k8s.io/v1beta2", kind="Workload")

        def pending_workload():
            items = wl.get(namespace=ns).to_dict()["items"]
            if len(items) != 1:
                return None
            conds = {c["type"]: c for c in items[0].get("status", {}).get("conditions") or []}
            q = conds.get("QuotaReserved")
            return items[0] if q and q["status"] == "False" else None
        w = wait_for("Kueue Workload for the pod group, quota not reserved", pending_workload, 90,
                     log=testbed.logs / "kueue.log")
        assert w["spec"]["podSets"][0]["count"] == 3
        ps = pods(core, ns)
        assert len(ps) == 3
        assert all(p["spec"].get("schedulingGates") for p in ps), "Kueue gates every pod of the group"
        assert all(not p["spec"].get("nodeName") for p in ps)
        # room for the third pod: a node, and the quota that says the cluster has it
        pool.add({"g3": "h100x8"})
        apply(kube, m.cluster_queue(cq, {"cpu": "288", "memory": "3Ti", "nvidia.com/gpu": "24"}))
        wait_for("all 3 pods admitted and bound",
                 lambda: all(p["spec"].get("nodeName") and not p["spec"].get("schedulingGates")
                             for p in pods(core, ns)), 120, log=testbed.logs / "kueue.log")
        assert len({p["spec"]["nodeName"] for p in pods(core, ns)}) == 3
    finally:
        for p in pods(core, ns):  # pods carry Kueue's finalizer; release them before the namespace goes
            core.delete_namespaced_pod(p["metadata"]["name"], ns)
        kube.resources.get(api_version="kueue.x-k8s.io/v1beta2", kind="ClusterQueue").delete(name=cq)
