"""plan_reserve and replan_reserve (plan/gang/reserve.py) on snapshots: pure, no Kubernetes.

What a reservation writes, in which order, what it refuses before any write, and how a conflict re-plans.
"""

from __future__ import annotations

import copy

import pytest

from raygpu.errors import InfeasibleError, PermanentError
from raygpu.gang.backends import get_backend
from raygpu.model.annotations import parse_cluster_policy
from raygpu.model.gang import Backend
from raygpu.model.guard import GuardWiring, parse_guard_policy
from raygpu.model.labels import (ANNOTATION_DEADLINE, ANNOTATION_EXPECTED_RUNTIME, ANNOTATION_HEARTBEAT,
                                 ANNOTATION_REQUEST_ID, ANNOTATION_RESERVATION_STATE, BACKFILL_GATE, GUARD_GATE,
                                 KEY_GUARD, KEY_GUARD_SCOPE, LABEL_CLUSTER, LABEL_OWNER_JOB, LABEL_RESERVATION)
from raygpu.model.raycluster import RayClusterView
from raygpu.plan.gang.reserve import (ReservePlan, ReserveSnapshot, backfill_applies, chosen_backend, is_guarded,
                                      plan_reserve, replan_reserve)
from raygpu.testing.builders.clusters import ClusterBuilder, cluster, gang, gpus

NOW_S = 1000.0
BASE = cluster("c").worker("gpu", gpus=8)


def snap(request=None, c: ClusterBuilder = BASE, *, blocker_class: bool | None = None, may_backfill: bool = False,
         served=None) -> ReserveSnapshot:
    """What observe_reserve would have read: cluster ``c``, its annotations, the backend's builder."""
    view = c.obj()
    request = request or gang(gpus(8, 2), backend="coscheduling", timeout_s=60)
    policy = parse_cluster_policy(view.annotations)[0]
    return ReserveSnapshot(request=request, cluster=view, policy=policy, free=None,
                           guard_policy=parse_guard_policy(view.annotations)[0],
                           backend=get_backend(chosen_backend(request, policy), served=served), now_s=NOW_S,
                           request_id="rid-1", blocker_class=blocker_class, may_backfill=may_backfill)


def gates(plan: ReservePlan) -> list[str]:
    return [g["name"] for g in plan.worker_group["template"]["spec"].get("schedulingGates") or []]


def test_the_writes_are_laid_out_in_order_state_configmap_gang_objects_then_one_tested_patch():
    plan = plan_reserve(snap(gang(gpus(8, 2), backend="coscheduling", timeout_s=60, owner_job="02000000")))
    cm = plan.state_configmap
    assert (cm["kind"], cm["metadata"]["name"], cm["metadata"]["namespace"]) == ("ConfigMap", "c-rg-job1", "default")
    assert cm["metadata"]["labels"] == {LABEL_RESERVATION: "rg-job1", LABEL_CLUSTER: "c", LABEL_OWNER_JOB: "02000000"}
    assert cm["metadata"]["ownerReferences"] == [{"apiVersion": "ray.io/v1", "kind": "RayCluster", "name": "c",
                                                  "uid": "uid-c", "blockOwnerDeletion": False}]
    ann = cm["metadata"]["annotations"]
    assert (ann[ANNOTATION_RESERVATION_STATE], ann[ANNOTATION_HEARTBEAT], ann[ANNOTATION_DEADLINE],
            ann[ANNOTATION_REQUEST_ID]) == ("planned", "1000", "1060", "rid-1")
    assert ANNOTATION_EXPECTED_RUNTIME not in ann
    assert cm["data"] == {"plan.json": plan.gang.model_dump_json(), "history": "planned"}
    # the gang objects: laid out unowned; owned by the state ConfigMap once its uid is known
    assert [(o["kind"], o["metadata"]["name"], o["spec"]["minMember"]) for o in plan.gang_objects] == [
        ("PodGroup", "c-rg-job1", 2)]
    assert "ownerReferences" not in plan.gang_objects[0]["metadata"]
    owned = plan.gang_objects_owned_by("uid-cm")
    assert owned[0]["metadata"]["ownerReferences"] == [{"apiVersion": "v1", "kind": "ConfigMap", "name": "c-rg-job1",
                                                        "uid": "uid-cm", "blockOwnerDeletion": False}]
    assert "ownerReferences" not in plan.gang_objects[0]["metadata"], "the plan itself is not changed"
    # one RayCluster patch: test the resourceVersion read, then append the worker group
    assert list(plan.patch) == [{"op": "test", "path": "/metadata/resourceVersion", "value": "1001"},
                                {"op": "add", "path": "/spec/workerGroupSpecs/-", "value": plan.worker_group}]
    g = plan.worker_group
    assert (g["groupName"], g["replicas"], g["minReplicas"], g["maxReplicas"]) == ("rg-job1", 2, 2, 2)
    assert g["template"]["metadata"]["labels"]["scheduling.x-k8s.io/pod-group"] == "c-rg-job1"
    assert gates(plan) == [] and plan.wiring == GuardWiring()


@pytest.mark.parametrize("backend, kw, kinds", [
    ("coscheduling", {}, ["PodGroup"]),
    ("volcano", {}, ["PodGroup"]),
    ("kueue", {"queue": "q"}, []),
    ("none", {}, []),
    ("workload", {}, ["Workload", "PodGroup"]),  # created in that order: the PodGroup names its Workload
])
def test_each_backend_lays_out_its_gang_objects_in_creation_order(backend, kw, kinds):
    plan = plan_reserve(snap(gang(gpus(8, 2), backend=backend, **kw)))
    assert [o["kind"] for o in plan.gang_objects] == kinds
    assert plan.gang.backend is Backend(backend)


def test_the_workload_objects_use_the_version_the_server_serves():
    s = snap(gang(gpus(8, 2), backend="workload"), served={"v1alpha2": frozenset({"Workload", "PodGroup"})})
    assert {o["apiVersion"] for o in plan_reserve(s).gang_objects} == {"scheduling.k8s.io/v1alpha2"}


TAKEN = BASE.worker("rg-job1", gpus=8)  # a worker group of the request's name is already there


@pytest.mark.parametrize("case, request_kw, c, blocker_class, error, match", [
    ("cannot ever fit", dict(bundles=gpus(16)), BASE, None, InfeasibleError, "GPU"),
    ("kueue without a queue", dict(backend="kueue"), BASE, None, PermanentError, "LocalQueue"),
    ("guarded on another backend", dict(guard=True, backend="coscheduling"), BASE, True, PermanentError,
     "needs backend none"),
    ("guarded without the blocker PriorityClass", dict(guard=True, backend="none"), BASE, False, PermanentError,
     "PriorityClass"),
    ("the cluster's guard annotation, no PriorityClass", dict(backend="none"), BASE.annotate(KEY_GUARD, "on"), False,
     PermanentError, "PriorityClass"),
    ("the name is taken", dict(backend="none"), TAKEN, None, PermanentError, "already exists"),
    # the refusals come in this order: the plan itself, then the guard's backend, then its PriorityClass
    ("infeasible and guarded wrong", dict(bundles=gpus(16), guard=True, backend="coscheduling"), BASE, False,
     InfeasibleError, "GPU"),
    ("guarded on another backend and no PriorityClass", dict(guard=True, backend="volcano"), BASE, False,
     PermanentError, "needs backend none"),
    ("guarded, no PriorityClass, name taken", dict(guard=True, backend="none"), TAKEN, False, PermanentError,
     "PriorityClass"),
])
def test_a_request_that_cannot_work_is_refused_by_the_plan(case, request_kw, c, blocker_class, error, match):
    request = gang(request_kw.pop("bundles", gpus(8, 2)), **request_kw)
    with pytest.raises(error, match=match):
        plan_reserve(snap(request, c, blocker_class=blocker_class))


def test_a_guarded_gang_gets_the_guard_gate_its_scope_and_its_wiring():
    s = snap(gang(gpus(8, 2), backend="none", guard=True, expected_runtime_s=120), blocker_class=True,
             may_backfill=True)
    plan = plan_reserve(s)
    assert gates(plan) == [GUARD_GATE], "guarded: the guard's gate only, never the backfill's"
    assert plan.state_configmap["metadata"]["labels"][KEY_GUARD_SCOPE] == "default"
    assert plan.state_configmap["metadata"]["annotations"][ANNOTATION_EXPECTED_RUNTIME] == "120"
    assert plan.worker_group["template"]["metadata"]["annotations"][ANNOTATION_EXPECTED_RUNTIME] == "120"
    w = plan.wiring
    assert w.guard is not None and w.guard.enabled and w.guard.max_hold_s == 900.0
    assert (w.cluster_uid, w.scope_lease) == ("uid-c", "")
    assert w.template_spec == plan.worker_group["template"]["spec"]
    assert "schedulingGates" not in s.cluster.group("gpu").template["spec"], "the snapshot's template is unchanged"


def test_the_requests_guard_false_wins_over_the_clusters_annotation():
    c = BASE.annotate(KEY_GUARD, "on")
    plan = plan_reserve(snap(gang(gpus(8, 2), backend="none", guard=False), c))
    assert gates(plan) == [] and plan.wiring.guard is None
    assert KEY_GUARD_SCOPE not in plan.state_configmap["metadata"]["labels"]


@pytest.mark.parametrize("may_backfill, want_gates, want_lease", [
    (True, [BACKFILL_GATE], "raygpu-guard-pool-a"),  # gated until its first backfill step; reads the scope's Lease
    (False, [], ""),  # this identity may not backfill: the gang is made as usual, hint on its pods
])
def test_an_unguarded_gang_with_a_hint_backfills_only_where_it_may(may_backfill, want_gates, want_lease):
    c = BASE.annotate("raygpu.io/guard-scope", "pool-a")
    plan = plan_reserve(snap(gang(gpus(8, 1), backend="none", expected_runtime_s=90.5), c, may_backfill=may_backfill))
    assert gates(plan) == want_gates
    assert plan.worker_group["template"]["metadata"]["annotations"][ANNOTATION_EXPECTED_RUNTIME] == "90.5"
    assert plan.wiring == GuardWiring(scope_lease=want_lease)


@pytest.mark.parametrize("request_guard, annotation, hint, guarded, backfills", [
    (None, None, None, False, False),
    (None, "on", None, True, False),
    (False, "on", 60.0, False, True),
    (True, "off", 60.0, True, False),
    (None, None, 60.0, False, True),
])
def test_who_is_guarded_and_who_may_backfill(request_guard, annotation, hint, guarded, backfills):
    view = (BASE.annotate(KEY_GUARD, annotation) if annotation else BASE).obj()
    request = gang(gpus(8), backend="none", guard=request_guard, expected_runtime_s=hint)
    policy = parse_guard_policy(view.annotations)[0]
    assert (is_guarded(request, policy), backfill_applies(request, policy)) == (guarded, backfills)


def test_the_backend_is_the_requests_else_the_clusters():
    policy = parse_cluster_policy(BASE.annotate("raygpu.io/gang-backend", "volcano").obj().annotations)[0]
    assert chosen_backend(gang(gpus(8)), policy) is Backend.VOLCANO
    assert chosen_backend(gang(gpus(8), backend="none"), policy) is Backend.NONE


def test_the_same_snapshot_gives_the_same_plan():
    s = snap(gang(gpus(8, 2), backend="workload", expected_runtime_s=30), may_backfill=True)
    assert plan_reserve(s) == plan_reserve(s)


def moved(c: ClusterBuilder, mutate=lambda raw: None, version: str = "1002") -> RayClusterView:
    """``c`` as read again after someone else wrote it."""
    raw = c.raw()
    mutate(raw)
    raw["metadata"]["resourceVersion"] = version
    return RayClusterView.from_k8s(raw)


def test_after_a_conflict_the_patch_is_laid_out_again_on_the_cluster_read_again():
    s = snap()
    plan = plan_reserve(s)

    def relabel(raw):  # an unrelated edit of the template: the new worker group copies it as it is now
        raw["spec"]["workerGroupSpecs"][0]["template"]["metadata"]["labels"]["team"] = "research"
    again = replan_reserve(s, plan, moved(BASE, relabel))
    assert again is not None and again.patch[0]["value"] == "1002"
    assert again.worker_group["template"]["metadata"]["labels"]["team"] == "research"
    assert again.patch[1]["value"] == again.worker_group
    assert (again.gang, again.state_configmap, again.gang_objects) == (plan.gang, plan.state_configmap,
                                                                       plan.gang_objects)


def test_after_a_conflict_a_patch_that_landed_is_not_sent_again():
    s = snap()
    plan = plan_reserve(s)
    ours = moved(BASE, lambda raw: raw["spec"]["workerGroupSpecs"].append(copy.deepcopy(plan.worker_group)))
    assert replan_reserve(s, plan, ours) is None


def test_after_a_conflict_other_templates_refuse_the_reservation():
    s = snap()
    plan = plan_reserve(s)
    with pytest.raises(PermanentError, match="templates changed"):  # the pods would ask for other resources now
        replan_reserve(s, plan, moved(cluster("c").worker("gpu", gpus=8, memory="128Gi")))


def test_a_guarded_replan_keeps_its_gate_and_rewires_to_the_new_template():
    s = snap(gang(gpus(8, 2), backend="none", guard=True), blocker_class=True)
    plan = plan_reserve(s)

    def taint(raw):
        raw["spec"]["workerGroupSpecs"][0]["template"]["spec"]["nodeSelector"] = {"pool": "a"}
    again = replan_reserve(s, plan, moved(BASE, taint))
    assert again is not None and gates(again) == [GUARD_GATE]
    assert again.wiring.guard == plan.wiring.guard and again.wiring.template_spec["nodeSelector"] == {"pool": "a"}
