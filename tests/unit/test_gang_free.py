"""Free capacity per template (plan.gang_free) and reserve() reading it only when this identity may (gang.free)."""

from __future__ import annotations

import time

from raygpu.adapters.kube import node_view
from raygpu.gang.free import BOUND_AND_RUNNING
from raygpu.gang.requests import gang_request
from raygpu.gang.reservation import reserve
from raygpu.model.views import K8sPodView
from raygpu.plan.gang.free import free_by_template
from raygpu.testing.builders.clusters import cluster, gang, gpus
from raygpu.testing.fake_kube import FakeKube

GPU = "nvidia.com/gpu"


def raw_node(name: str, pool: str, taints: list | None = None) -> dict:
    return {"metadata": {"name": name, "labels": {"pool": pool}}, "spec": {"taints": taints or []},
            "status": {"allocatable": {GPU: "8", "cpu": "256", "memory": "2Ti"},
                       "conditions": [{"type": "Ready", "status": "True"}]}}


def raw_pod(name: str, node: str, gpus_: int, phase: str = "Running") -> dict:
    return {"metadata": {"name": name, "namespace": "other", "labels": {}},
            "spec": {"nodeName": node, "containers": [{"name": "x", "resources": {"requests": {GPU: str(gpus_)}}}]},
            "status": {"phase": phase}}


def two_pools() -> dict:
    """gpu2 (2-GPU pods, anywhere it tolerates) and gpu8 (8-GPU pods, nodeSelector pool=big)."""
    raw = (cluster("c").worker("gpu2", gpus=2, cpus=16, memory="128Gi")
           .worker("gpu8", gpus=8, cpus=64, memory="512Gi")).raw()
    raw["spec"]["workerGroupSpecs"][1]["template"]["spec"]["nodeSelector"] = {"pool": "big"}
    return raw


def test_each_template_gets_only_the_nodes_its_pods_may_use():
    from raygpu.model.raycluster import RayClusterView
    raw = two_pools()
    raw["spec"]["workerGroupSpecs"][0]["template"]["spec"]["tolerations"] += ["junk", {"operator": 7}]
    nodes = [node_view(raw_node("small", "small")), node_view(raw_node("big", "big")),
             node_view(raw_node("tainted", "small", [{"key": "dedicated", "value": "x", "effect": "NoSchedule"}])),
             node_view(raw_node("gpu-tainted", "big", [{"key": GPU, "effect": "NoSchedule"}]))]
    pods = [K8sPodView(name="t", namespace="o", node_name="small", phase="Running", requests={GPU: 6})]
    free = free_by_template(RayClusterView.from_k8s(raw), nodes, pods)
    assert {g: [(f.name, f.free[GPU]) for f in fs] for g, fs in free.items()} == {
        "gpu2": [("small", 2.0), ("big", 8.0), ("gpu-tainted", 8.0)],  # tolerates nvidia.com/gpu, not dedicated
        "gpu8": [("big", 8.0), ("gpu-tainted", 8.0)]}  # pool=big only (not small, not tainted dedicated=x)


def world(allowed: bool) -> tuple[FakeKube, list[str]]:
    kube = FakeKube(two_pools(), kuberay=True)
    if allowed:
        kube.allowed = {("list", "nodes"), ("list", "pods")}
    for i in range(4):  # four nodes of pool small with 2 GPUs free each; no node of pool big at all
        kube.put(raw_node(f"n{i}", "small"), "Node")
        kube.put(raw_pod(f"t{i}", f"n{i}", 6), "Pod")  # in namespace "other": free capacity counts every namespace
        kube.put(raw_pod(f"done{i}", f"n{i}", 2, phase="Succeeded"), "Pod")
    return kube, []


def test_reserve_plans_pods_that_fit_the_free_fragments_its_template_may_use():
    kube, said = world(allowed=True)
    rsv = reserve(kube, gang(gpus(2, 4), backend="none"), time.time(), progress=said.append)
    assert (rsv.plan.need.template_group, rsv.plan.pod_count) == ("gpu2", 4)
    assert "all 4 pod(s) fit the free nodes now, in existing fragments" in rsv.plan.reason
    pod_lists = [a for m, a in kube.calls if m == "list" and a[1] == "Pod"]
    assert pod_lists and all(a[4] == BOUND_AND_RUNNING for a in pod_lists)  # ended pods are not transferred


def test_without_permission_nothing_is_listed_and_the_plan_is_todays():
    kube, said = world(allowed=False)
    rsv = reserve(kube, gang(gpus(2, 4), backend="none"), time.time(), progress=said.append)
    assert "free capacity not given" in rsv.plan.reason
    assert any("free capacity not read (this identity may not list nodes" in s for s in said)
    assert not [a for m, a in kube.calls if m == "list" and a[1] in ("Node", "Pod")]  # no refused request
    assert [m for m, _ in kube.calls].count("access_review") >= 1


def test_a_failed_read_means_not_known_not_a_failed_reservation():
    from raygpu.errors import TransientError
    kube, said = world(allowed=True)
    kube.fail("list", TransientError("503"), when=lambda *a: a[1] == "Node")
    rsv = reserve(kube, gang(gpus(2, 4), backend="none"), time.time(), progress=said.append)
    assert "free capacity not given" in rsv.plan.reason and any("free capacity not read (" in s for s in said)
