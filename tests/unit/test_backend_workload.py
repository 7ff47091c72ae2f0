"""Backend ``workload``: API discovery, the Workload/PodGroup shapes per version (read from the Kubernetes
1.36/1.37 source), the pod wiring, and a reserve/rollback that touches exactly what it created."""

from __future__ import annotations

import time

import pytest
from raygpu.testing.builders.clusters import cluster, gang, gpus
from raygpu.testing.fake_kube import FakeKube

from raygpu.errors import ConflictError, PermanentError, TransientError
from raygpu.gang.backends import WorkloadBackend, get_backend
from raygpu.gang.backends.workload import choose_api_version
from raygpu.gang.reservation import reserve
from raygpu.model.gang import ReservationState
from raygpu.plan.gang.reservation import plan_gang

W, PG, PC = "Workload", "PodGroup", "PriorityClass"
BASE = cluster("c").worker("gpu", gpus=8)


def setup(n: int = 4):
    view = BASE.obj()
    req = gang(gpus(8, n), "STRICT_SPREAD", backend="workload")
    plan = plan_gang(req, view)
    return plan, view.group(plan.need.template_group), req


@pytest.mark.parametrize("served,expected", [
    ({"v1": {PC}, "v1beta1": {W, PG}, "v1alpha3": {W, PG}}, "scheduling.k8s.io/v1beta1"),  # 1.37, both on
    ({"v1alpha2": {W, PG}, "v1beta1": {W, PG}}, "scheduling.k8s.io/v1beta1"),  # beta wins over any alpha
    ({"v1": {PC}, "v1alpha3": {W, PG, "CompositePodGroup"}}, "scheduling.k8s.io/v1alpha3"),  # 1.37, alpha only
    ({"v1": {PC}, "v1alpha2": {W, PG}}, "scheduling.k8s.io/v1alpha2"),  # 1.36
    ({"v1beta1": {W}, "v1alpha2": {W, PG}}, "scheduling.k8s.io/v1alpha2"),  # a version without PodGroup is no use
])
def test_discovery_prefers_v1beta1_and_accepts_the_alphas(served, expected):
    assert choose_api_version(served) == expected
    assert get_backend("workload", served=served).api_version == expected


@pytest.mark.parametrize("served,says", [
    ({"v1": {PC}}, "scheduling.k8s.io/v1: PriorityClass"),  # 1.34, or a newer server without the gate
    ({}, "no scheduling.k8s.io API at all"),
    ({"v1": {PC}, "v1alpha1": {W}}, "scheduling.k8s.io/v1alpha1: Workload"),  # 1.35: no PodGroup object yet
])
def test_a_server_without_the_workload_api_gets_an_error_naming_it(served, says):
    with pytest.raises(PermanentError) as err:
        choose_api_version(served)
    msg = str(err.value)
    assert "Workload API" in msg and "GenericWorkload" in msg and "scheduling.k8s.io v1beta1" in msg
    assert says in msg and "--runtime-config" in msg


def test_an_unknown_api_version_is_refused():
    with pytest.raises(PermanentError, match="unsupported API version 'scheduling.k8s.io/v1alpha1'"):
        WorkloadBackend("scheduling.k8s.io/v1alpha1")


def test_pods_join_through_the_label_the_policy_copies_and_the_field_itself():
    plan, group, req = setup()
    spec = get_backend("workload").worker_group_spec(plan, group, req)["template"]
    assert spec["metadata"]["labels"]["raygpu.io/scheduling-group"] == plan.gang_name == "c-rg-job1"
    assert spec["spec"]["schedulingGroup"] == {"podGroupName": "c-rg-job1"}
    assert spec["spec"]["schedulerName"] == "default-scheduler"


def test_foreign_scheduling_group_is_stripped_by_every_backend():
    raw = BASE.raw()
    tmpl = raw["spec"]["workerGroupSpecs"][0]["template"]
    tmpl["spec"]["schedulingGroup"] = {"podGroupName": "someone-else"}
    tmpl["metadata"].setdefault("labels", {})["raygpu.io/scheduling-group"] = "someone-else"
    from raygpu.model.raycluster import RayClusterView
    view = RayClusterView.from_k8s(raw)
    for backend in ("none", "coscheduling", "volcano"):
        req = gang(gpus(8, 2), "SPREAD", backend=backend)
        out = get_backend(backend).worker_group_spec(plan_gang(req, view), view.group("gpu"), req)["template"]
        assert "schedulingGroup" not in out["spec"] and "raygpu.io/scheduling-group" not in out["metadata"]["labels"]


def test_v1beta1_objects():
    plan, _, req = setup(n=4)
    owner = {"apiVersion": "v1", "kind": "ConfigMap", "name": "c-rg-job1", "uid": "u1", "blockOwnerDeletion": False}
    wl, pg = WorkloadBackend().gang_objects(plan, req, owner)
    meta = {"name": "c-rg-job1", "namespace": "default", "ownerReferences": [owner],
            "labels": {"raygpu.io/reservation": "rg-job1", "raygpu.io/cluster": "c"},
            "annotations": {"raygpu.io/plan-reason": plan.reason}}
    assert wl == {"apiVersion": "scheduling.k8s.io/v1beta1", "kind": "Workload", "metadata": meta, "spec": {
        "controllerRef": {"apiGroup": "ray.io", "kind": "RayCluster", "name": "c"},
        "podGroupTemplates": [{"name": "workers", "schedulingPolicy": {"gang": {"minCount": 4}}}]}}
    assert pg == {"apiVersion": "scheduling.k8s.io/v1beta1", "kind": "PodGroup", "metadata": meta, "spec": {
        "workloadRef": {"workloadName": "c-rg-job1", "templateName": "workers"},
        "schedulingPolicy": {"gang": {"minCount": 4}}}}


def test_v1alpha2_links_the_pod_group_its_own_way():
    plan, _, req = setup(n=3)
    _, pg = WorkloadBackend("scheduling.k8s.io/v1alpha2").gang_objects(plan, req, None)
    assert pg["apiVersion"] == "scheduling.k8s.io/v1alpha2"
    assert pg["spec"] == {"podGroupTemplateRef": {"workload": {"workloadName": "c-rg-job1",
                                                               "podGroupTemplateName": "workers"}},
                          "schedulingPolicy": {"gang": {"minCount": 3}}}
    _, pg3 = WorkloadBackend("scheduling.k8s.io/v1alpha3").gang_objects(plan, req, None)
    assert "workloadRef" in pg3["spec"] and "podGroupTemplateRef" not in pg3["spec"]


# ------------------------------------------------------------------------------- reserve and rollback
def fake() -> FakeKube:
    return FakeKube(BASE.raw(), kuberay=True)


def writes(kube: FakeKube) -> list[tuple[str, str]]:
    """(method, kind) of every write the code made, in order."""
    kind = {"create": lambda a: a[0]["kind"], "delete": lambda a: a[1], "patch_raycluster": lambda a: "RayCluster"}
    return [(m, kind[m](a)) for m, a in kube.calls if m in kind]


def test_reserve_creates_workload_then_pod_group_of_the_discovered_version_owned_by_the_state():
    kube = fake()
    kube.served["scheduling.k8s.io"] = {"v1": frozenset({PC}), "v1alpha2": frozenset({W, PG})}  # a 1.36 server
    rsv = reserve(kube, gang(gpus(8, 2), backend="workload", timeout_s=60), time.time())
    assert rsv.state is ReservationState.RESERVED
    assert [k for k, _ in kube.calls if k in ("api_group_kinds", "create")][:2] == ["api_group_kinds", "create"]
    assert [c[1] for c in writes(kube) if c[0] == "create"] == ["ConfigMap", W, PG]
    cm_uid = kube.objects[("ConfigMap", "default", "c-rg-job1")]["metadata"]["uid"]
    for kind in (W, PG):
        obj = kube.objects[(kind, "default", "c-rg-job1")]
        assert obj["apiVersion"] == "scheduling.k8s.io/v1alpha2"
        assert obj["metadata"]["ownerReferences"][0]["uid"] == cm_uid
    assert kube.objects[(PG, "default", "c-rg-job1")]["spec"]["schedulingPolicy"] == {"gang": {"minCount": 2}}
    uid = {kind: kube.objects[(kind, "default", "c-rg-job1")]["metadata"]["uid"] for kind in (W, PG)}
    assert len({cm_uid, *uid.values()}) == 3  # every object its own uid, as the API server gives
    assert rsv.created == [("scheduling.k8s.io/v1alpha2", W, "c-rg-job1", uid[W]),
                           ("scheduling.k8s.io/v1alpha2", PG, "c-rg-job1", uid[PG])]


def test_on_a_server_without_the_api_nothing_is_created():
    kube = fake()
    kube.served["scheduling.k8s.io"] = {"v1": frozenset({PC})}
    with pytest.raises(PermanentError, match="Workload API.*GenericWorkload"):
        reserve(kube, gang(gpus(8, 2), backend="workload"), time.time())
    assert writes(kube) == [] and kube.objects == {}
    assert [g["groupName"] for g in kube.raw["spec"]["workerGroupSpecs"]] == ["gpu"]


def test_rollback_removes_exactly_what_was_created():
    """The PodGroup's create fails: the Workload (by its uid), the state ConfigMap go; nothing else is deleted."""
    kube = fake()
    kube.fail("create", TransientError("server error 503"), when=lambda obj: obj["kind"] == PG)
    with pytest.raises(TransientError):
        reserve(kube, gang(gpus(8, 2), backend="workload"), time.time())
    assert sorted(kube.deleted) == [("ConfigMap", "c-rg-job1"), (W, "c-rg-job1")]
    assert ("delete", ("scheduling.k8s.io/v1beta1", W, "c-rg-job1", "default")) in kube.calls
    assert kube.objects == {} and [g["groupName"] for g in kube.raw["spec"]["workerGroupSpecs"]] == ["gpu"]


def test_a_users_pod_group_that_looks_like_ours_is_never_touched():
    """Same name, same raygpu labels, even a ConfigMap-style owner: not created by this reservation, so the
    failed create rolls back our Workload only, and the user's PodGroup stays as it was."""
    kube = fake()
    theirs = {"apiVersion": "scheduling.k8s.io/v1beta1", "kind": PG, "metadata": {
        "name": "c-rg-job1", "namespace": "default", "uid": "user-uid", "resourceVersion": "7",
        "labels": {"raygpu.io/reservation": "rg-job1", "raygpu.io/cluster": "c"}},
        "spec": {"schedulingPolicy": {"gang": {"minCount": 9}}}}
    kube.objects[(PG, "default", "c-rg-job1")] = dict(theirs)
    with pytest.raises(ConflictError):
        reserve(kube, gang(gpus(8, 2), backend="workload"), time.time())
    assert kube.objects == {(PG, "default", "c-rg-job1"): theirs}
    assert (PG, "c-rg-job1") not in kube.deleted


def test_release_leaves_a_same_named_object_that_replaced_ours():
    kube = fake()
    rsv = reserve(kube, gang(gpus(8, 2), backend="workload", timeout_s=60), time.time())
    replaced = {"apiVersion": "scheduling.k8s.io/v1beta1", "kind": W,
                "metadata": {"name": "c-rg-job1", "namespace": "default", "uid": "someone-else"}}
    kube.objects[(W, "default", "c-rg-job1")] = replaced
    rsv.release(drain_timeout_s=0)
    assert rsv.state is ReservationState.RELEASED
    assert kube.objects == {(W, "default", "c-rg-job1"): replaced}  # our PodGroup and ConfigMap gone, their Workload kept


# ------------------------------------------------------------------------------- pods outside the gang
def reserved_pods(group: str, scheduling_group: str | None) -> list:
    from raygpu.model.views import K8sPodView
    return [K8sPodView(name=f"{group}-{i}", namespace="default", node_name=f"k{i}", phase="Running",
                       labels={"raygpu.io/reservation": group}, ray_cluster="c", ray_group=group,
                       ray_node_type="worker", scheduling_group=scheduling_group) for i in range(2)]


def test_pods_in_the_pod_group_are_admitted():
    kube = fake()
    rsv = reserve(kube, gang(gpus(8, 2), backend="workload", timeout_s=60), time.time())
    kube.extra_pods = reserved_pods(rsv.plan.reservation_group, "c-rg-job1")
    assert rsv.observe() is ReservationState.BOUND


def test_pods_that_lost_their_scheduling_group_fail_the_reservation_and_the_watchdog_rolls_it_back():
    """KubeRay < 1.7 without deploy/workload's policy: the pods would bind one by one. The watchdog's next step
    fails the reservation naming the policy and rolls everything back, long before the deadline."""
    from tests.unit.test_gang_lifecycle import Clock, FakeRay
    from raygpu.gang.api import GangPlacementGroup
    kube = fake()
    rsv = reserve(kube, gang(gpus(8, 2), backend="workload", timeout_s=600), time.time())
    kube.extra_pods = reserved_pods(rsv.plan.reservation_group, None)
    said: list[str] = []
    pg = GangPlacementGroup(rsv, said.append, ray_calls=FakeRay().calls(), clock=Clock(), start_watchdog=False)
    assert pg.watchdog.step() == "done"
    assert rsv.state is ReservationState.ROLLED_BACK
    assert any("raygpu-scheduling-group" in h and "spec.schedulingGroup unset" in h for h in rsv.history)
    assert kube.objects == {} and [g["groupName"] for g in kube.raw["spec"]["workerGroupSpecs"]] == ["gpu"]


def test_other_backends_do_not_look_at_the_scheduling_group():
    kube = fake()
    rsv = reserve(kube, gang(gpus(8, 2), backend="none", timeout_s=60), time.time())
    kube.extra_pods = reserved_pods(rsv.plan.reservation_group, None)
    assert rsv.observe() is ReservationState.BOUND
