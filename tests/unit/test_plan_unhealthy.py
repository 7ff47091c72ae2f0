"""The planners steer around unhealthy GPUs (issue 28 item 5): no reservation planned onto a node a health
agent marked, and idle workers there reclaimed first, never kept warm nor for a pending placement group."""

from __future__ import annotations

import time

from raygpu.adapters.kube import node_view
from raygpu.gang.reservation import reserve
from raygpu.model.raycluster import RayClusterView
from raygpu.model.reclaim import DecisionAction, ReclaimPolicy, ReclaimReason
from raygpu.model.views import K8sPodView
from raygpu.plan.gang.free import free_by_template, unhealthy_node_names
from raygpu.plan.gang.reserve import avoid_nodes
from raygpu.plan.reclaim.scale_down import plan_reclaim
from raygpu.testing.builders.clusters import cluster, gang, gpus
from raygpu.testing.builders.reclaim import NOW_S, world
from raygpu.testing.fake_kube import FakeKube

R = ReclaimReason
GPU = "nvidia.com/gpu"
IDLE = 900


def raw_node(name: str, conditions: list | None = None) -> dict:
    return {"metadata": {"name": name, "labels": {}}, "spec": {},
            "status": {"allocatable": {GPU: "8", "cpu": "256", "memory": "2Ti"}, "capacity": {GPU: "8"},
                       "conditions": [{"type": "Ready", "status": "True"}, *(conditions or [])]}}


XID = {"type": "GpuXidError", "status": "True", "reason": "Xid79", "message": "GPU 3 fell off the bus"}


def test_an_unhealthy_node_is_credited_no_free_capacity():
    view = cluster("c").worker("gpu", gpus=8).obj()
    nodes = [node_view(raw_node("good")), node_view(raw_node("bad", [XID])),
             node_view(raw_node("fine", [{**XID, "status": "False"}]))]  # the condition cleared: healthy again
    assert unhealthy_node_names(nodes) == unhealthy_node_names(nodes, view) == ("bad",)
    pooled = cluster("c").worker("gpu", gpus=8).raw()
    pooled["spec"]["workerGroupSpecs"][0]["template"]["spec"]["nodeSelector"] = {"pool": "mine"}
    from raygpu.model.raycluster import RayClusterView as _V
    assert unhealthy_node_names(nodes, _V.from_k8s(pooled)) == ()  # a node its pods may not use needs no keeping off
    free = free_by_template(view, nodes, [K8sPodView(name="x", namespace="o", node_name="good", phase="Running")])
    assert [f.name for f in free["gpu"]] == ["good", "fine"]


def test_the_reservation_pods_are_kept_off_unhealthy_nodes():
    kube = FakeKube(cluster("c").worker("gpu", gpus=8).raw(), kuberay=True)
    kube.allowed = {("list", "nodes"), ("list", "pods")}
    for n in (raw_node("n0"), raw_node("n1", [XID]), raw_node("n2")):
        kube.put(n, "Node")
    said: list[str] = []
    rsv = reserve(kube, gang(gpus(8, 2), backend="none"), time.time(), progress=said.append)
    group = next(g for g in kube.raw["spec"]["workerGroupSpecs"] if g["groupName"] == rsv.plan.reservation_group)
    terms = group["template"]["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"]
    assert terms == [{"matchFields": [{"key": "metadata.name", "operator": "NotIn", "values": ["n1"]}]}]
    assert any("kept out of the reservation: n1" in s for s in said)


def test_avoid_nodes_keeps_the_templates_own_affinity_in_every_term():
    spec = {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]},
        {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["b"]}]}]}},
        "podAntiAffinity": {"x": 1}}}
    avoid_nodes(spec, ("n9", "n1"))
    terms = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert [t["matchExpressions"][0]["values"] for t in terms] == [["a"], ["b"]]
    assert all(t["matchFields"] == [{"key": "metadata.name", "operator": "NotIn", "values": ["n1", "n9"]}] for t in terms)
    assert spec["affinity"]["podAntiAffinity"] == {"x": 1}


def verdicts(w, **policy):
    snapshot, view = w.obj()
    plan = plan_reclaim(snapshot, view, ReclaimPolicy(**policy), NOW_S)
    return {d.pod_name: (d.action, d.reason) for d in plan.decisions}, plan


SICK = {"k-sick": "condition GpuXidError=True"}


def test_an_idle_worker_on_an_unhealthy_node_goes_without_waiting_for_its_timeout():
    w = world().worker("sick", k8s_node="k-sick", idle_for_s=30).worker("ok", idle_for_s=30)
    got, plan = verdicts(w, unhealthy_nodes=SICK)
    assert got["sick"] == (DecisionAction.DELETE, R.IDLE) and got["ok"][1] is R.NOT_IDLE_LONG_ENOUGH
    d = next(d for d in plan.decisions if d.pod_name == "sick")
    assert "marked unhealthy: condition GpuXidError=True" in d.detail
    # busy there: kept (its tasks run; the doctor names them in the blast radius)
    assert verdicts(world().worker("sick", k8s_node="k-sick"), unhealthy_nodes=SICK)[0]["sick"][1] is R.NOT_IDLE_LONG_ENOUGH


def test_the_group_minimum_keeps_the_healthy_worker_and_removes_the_sick_one():
    w = (world().group("gpu", min_replicas=1).worker("a-ok", idle_for_s=IDLE)
         .worker("z-sick", k8s_node="k-sick", idle_for_s=IDLE))
    got, _ = verdicts(w, unhealthy_nodes=SICK)
    assert got == {**got, "z-sick": (DecisionAction.DELETE, R.IDLE), "a-ok": (DecisionAction.KEEP, R.GROUP_MINIMUM)}
    got, _ = verdicts(w)  # without the mark: defragmentation order, then name: a-ok goes
    assert got["a-ok"] == (DecisionAction.DELETE, R.IDLE)


def test_never_kept_warm_nor_for_a_pending_placement_group():
    w = world().worker("sick", k8s_node="k-sick", idle_for_s=IDLE).worker("ok", idle_for_s=IDLE)
    got, _ = verdicts(w, unhealthy_nodes=SICK, warm_targets={"gpu": 1})
    assert got["sick"] == (DecisionAction.DELETE, R.IDLE) and got["ok"] == (DecisionAction.KEEP, R.KEEP_WARM)
    got, _ = verdicts(w.pg_pending([{"GPU": 8}]), unhealthy_nodes=SICK)
    assert got["sick"] == (DecisionAction.DELETE, R.IDLE) and got["ok"][1] is R.NEEDED_BY_PENDING_PG
