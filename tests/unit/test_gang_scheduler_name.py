"""The coscheduling scheduler name is configurable (issue 26 item 4): ``scheduler_name=``, the RayCluster
annotation ``raygpu.io/gang-scheduler-name``, ``raygpu plan --scheduler-name`` and the chart's
``gangSchedulerName``; the plan carries it to the reserved pods."""

from __future__ import annotations

import time

import pytest

from raygpu.adapters.kube_views import pod_view
from raygpu.cli import main
from raygpu.errors import PermanentError
from raygpu.gang.backends import get_backend
from raygpu.gang.requests import load_plan
from raygpu.gang.reservation import reserve
from raygpu.model.annotations import parse_cluster_policy
from raygpu.model.gang import DEFAULT_GANG_SCHEDULER_NAME, GangPlan, ReservationState
from raygpu.model.guard import GuardPolicy
from raygpu.model.labels import KEY_GANG_BACKEND, KEY_GANG_SCHEDULER_NAME, LABEL_RESERVATION
from raygpu.model.views import K8sPodView, PgState, PlacementGroupView
from raygpu.plan.gang.reservation import plan_gang
from raygpu.plan.gang.reserve import ReserveSnapshot, plan_reserve
from raygpu.plan.scale_up import request_for
from raygpu.testing.builders.clusters import cluster, gang, gpus
from raygpu.testing.fake_kube import FakeKube
from tests.unit.test_deploy_helm import helm_refuses, helm_template

SECOND = "second-coscheduling"
BASE = cluster("c").worker("gpu", gpus=8)
BAD = [("Bad_Name", "DNS-1123"), ("", "empty"), ("-x", "DNS-1123"), ("x.", "DNS-1123"), ("a" * 254, "253"),
       ("UPPER", "DNS-1123")]


def scheduler_of(spec: dict) -> str | None:
    return spec["template"]["spec"].get("schedulerName")


# ------------------------------------------------------------- the annotation
def test_no_annotation_is_the_upstream_charts_profile():
    policy, problems = parse_cluster_policy({})
    assert policy.gang_scheduler_name == DEFAULT_GANG_SCHEDULER_NAME == "scheduler-plugins-scheduler"
    assert problems == []


@pytest.mark.parametrize("value", [SECOND, "default-scheduler", "sched.example.com", " padded-name "])
def test_a_dns_1123_name_is_taken(value):
    policy, problems = parse_cluster_policy({KEY_GANG_SCHEDULER_NAME: value})
    assert policy.gang_scheduler_name == value.strip() and problems == []


@pytest.mark.parametrize("value, says", BAD)
def test_a_malformed_name_is_a_problem_and_the_default(value, says):
    policy, [problem] = parse_cluster_policy({KEY_GANG_SCHEDULER_NAME: value})
    assert policy.gang_scheduler_name == DEFAULT_GANG_SCHEDULER_NAME
    assert problem.key == KEY_GANG_SCHEDULER_NAME and says in problem.reason
    assert problem.default_used == repr(DEFAULT_GANG_SCHEDULER_NAME)


def test_a_misspelt_key_is_reported():
    _, [problem] = parse_cluster_policy({"raygpu.io/gang-scheduler-nam": SECOND})
    assert "did you mean raygpu.io/gang-scheduler-name" in problem.reason


# ------------------------------------------------------------- the keyword
@pytest.mark.parametrize("value, says", BAD + [(7, "a string")])
def test_a_bad_keyword_is_refused_naming_it(value, says):
    with pytest.raises(PermanentError, match="scheduler_name=") as exc:
        gang(gpus(8, 2), backend="coscheduling", scheduler_name=value)
    assert says in str(exc.value)


# ------------------------------------------------------------- the plan carries it
@pytest.mark.parametrize("annotation, keyword, expected", [
    (None, None, DEFAULT_GANG_SCHEDULER_NAME),
    (SECOND, None, SECOND),
    (SECOND, "third", "third"),  # the keyword wins over the annotation, as backend= and queue= do
    (None, "default-scheduler", "default-scheduler"),
    ("Bad_Name", None, DEFAULT_GANG_SCHEDULER_NAME),
])
def test_the_coscheduling_plan_names_the_scheduler_and_its_pods_ask_for_it(annotation, keyword, expected):
    builder = BASE.annotate(KEY_GANG_SCHEDULER_NAME, annotation) if annotation else BASE
    view = builder.obj()
    req = gang(gpus(8, 2), "STRICT_SPREAD", backend="coscheduling", scheduler_name=keyword)
    plan = plan_gang(req, view)
    assert plan.scheduler_name == expected
    spec = get_backend("coscheduling").worker_group_spec(plan, view.group("gpu"), req)
    assert scheduler_of(spec) == expected
    assert load_plan({"data": {"plan.json": plan.model_dump_json()}}).scheduler_name == expected  # state ConfigMap


@pytest.mark.parametrize("backend, pods_ask", [("volcano", "volcano"), ("workload", "default-scheduler"),
                                               ("none", None)])
def test_other_backends_keep_their_own_scheduler_and_ignore_the_annotation(backend, pods_ask):
    view = BASE.annotate(KEY_GANG_SCHEDULER_NAME, SECOND).obj()
    req = gang(gpus(8, 2), backend=backend)
    plan = plan_gang(req, view)
    assert plan.scheduler_name is None
    assert scheduler_of(get_backend(backend).worker_group_spec(plan, view.group("gpu"), req)) == pods_ask


def test_the_keyword_with_another_backend_is_refused():
    with pytest.raises(PermanentError, match="names the scheduler of backend coscheduling; .* volcano"):
        plan_gang(gang(gpus(8, 2), backend="volcano", scheduler_name=SECOND), BASE.obj())


def test_a_plan_stored_before_plans_carried_it_is_wired_with_the_default():
    view = BASE.obj()
    req = gang(gpus(8, 2), backend="coscheduling")
    stored = plan_gang(req, view).model_dump(mode="json")
    del stored["scheduler_name"]
    old = GangPlan.model_validate(stored)
    assert old.scheduler_name is None
    assert scheduler_of(get_backend("coscheduling").worker_group_spec(old, view.group("gpu"), req)) \
        == DEFAULT_GANG_SCHEDULER_NAME


def test_the_sidecars_gang_scale_up_sends_its_pods_to_the_annotations_scheduler():
    view = BASE.annotate(KEY_GANG_BACKEND, "coscheduling").annotate(KEY_GANG_SCHEDULER_NAME, SECOND).obj()
    policy = parse_cluster_policy(view.annotations)[0]
    pg = PlacementGroupView(pg_id="ab" * 14, state=PgState.PENDING, strategy="STRICT_SPREAD", bundles=({"GPU": 8},) * 2)
    request = request_for(pg, view, policy)  # as reclaim/scale_up.py reserves it: the snapshot's policy decides
    plan = plan_reserve(ReserveSnapshot(request=request, cluster=view, policy=policy, free=None,
                                        guard_policy=GuardPolicy(), backend=get_backend("coscheduling"), now_s=1.0,
                                        request_id="rid", scale_up_pg=pg.pg_id))
    assert plan.gang.scheduler_name == SECOND and scheduler_of(plan.worker_group) == SECOND


# ------------------------------------------------------------- reserve: the Event, the patch
def test_reserve_with_a_bad_annotation_says_so_in_an_event_and_uses_the_default():
    kube = FakeKube(BASE.annotate(KEY_GANG_SCHEDULER_NAME, "Not A Name").raw())
    said: list[str] = []
    rsv = reserve(kube, gang(gpus(8, 2), backend="coscheduling"), time.time(), progress=said.append)
    assert [(e.reason, e.type) for e in kube.events] == [("InvalidAnnotation", "Warning")]
    assert KEY_GANG_SCHEDULER_NAME in kube.events[0].message
    assert rsv.plan.scheduler_name == DEFAULT_GANG_SCHEDULER_NAME
    assert scheduler_of(kube.raw["spec"]["workerGroupSpecs"][-1]) == DEFAULT_GANG_SCHEDULER_NAME


def test_reserve_writes_the_annotations_scheduler_into_the_patched_group():
    kube = FakeKube(BASE.annotate(KEY_GANG_SCHEDULER_NAME, SECOND).raw())
    rsv = reserve(kube, gang(gpus(8, 2), backend="coscheduling"), time.time())
    assert kube.events == [] and rsv.plan.scheduler_name == SECOND
    assert scheduler_of(kube.raw["spec"]["workerGroupSpecs"][-1]) == SECOND


def pod(name: str, group: str, scheduler: str | None) -> K8sPodView:
    return K8sPodView(name=name, namespace="default", node_name=None, phase="Pending", ray_cluster="c",
                      ray_group=group, ray_node_type="worker", labels={LABEL_RESERVATION: group},
                      scheduler_name=scheduler)


def test_pods_whose_scheduler_was_rewritten_fail_the_reservation():
    kube = FakeKube(BASE.annotate(KEY_GANG_SCHEDULER_NAME, SECOND).raw())
    rsv = reserve(kube, gang(gpus(8, 2), backend="coscheduling"), time.time())
    group = rsv.plan.reservation_group
    kube.extra_pods = [pod(f"{group}-0", group, SECOND), pod(f"{group}-1", group, SECOND)]
    assert rsv.observe() is ReservationState.RESERVED  # waiting for its own scheduler: fine
    kube.extra_pods = [pod(f"{group}-0", group, SECOND), pod(f"{group}-1", group, "default-scheduler")]
    assert rsv.observe() is ReservationState.FAILED
    assert f"{group}-1 ask for scheduler 'default-scheduler', not '{SECOND}'" in rsv.history[-1]


# ------------------------------------------------------------- the pod view
def test_the_pod_view_says_which_scheduler_the_pod_asked_for():
    raw = {"metadata": {"name": "p", "namespace": "ns", "creationTimestamp": "2026-01-01T00:00:00Z"},
           "spec": {"schedulerName": SECOND, "containers": []}}
    assert pod_view(raw).scheduler_name == SECOND
    del raw["spec"]["schedulerName"]
    assert pod_view(raw).scheduler_name is None


# ------------------------------------------------------------- raygpu plan --scheduler-name
@pytest.mark.parametrize("argv, says", [
    (["--scheduler-name", "Bad_Name"], "--scheduler-name 'Bad_Name': not a DNS-1123 subdomain name"),
    (["--scheduler-name", ""], "--scheduler-name '': empty scheduler name"),
    (["--scheduler-name", SECOND, "--backend", "kueue"], "names the scheduler of backend coscheduling, not of "
                                                         "backend kueue"),
])
def test_plan_bad_scheduler_name_exits_2_before_connecting(argv, says, capsys, no_contact):
    assert main(["plan", "--cluster", "rc", "--bundle", "GPU=1", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("raygpu plan: ") and says in err and err.count("\n") == 1, err
    assert no_contact == []


# ------------------------------------------------------------- the chart value
def rendered_annotations(*args: str) -> dict[str, str]:
    [rc] = [o for o in helm_template("--set", "cluster=gpu", "--set", "rayCluster.create=true", *args)
            if o["kind"] == "RayCluster"]
    return rc["metadata"]["annotations"]


def test_the_chart_value_becomes_the_annotation():
    assert KEY_GANG_SCHEDULER_NAME not in rendered_annotations()  # "": the default, nothing rendered
    assert rendered_annotations("--set", f"gangSchedulerName={SECOND}")[KEY_GANG_SCHEDULER_NAME] == SECOND
    policy, problems = parse_cluster_policy(rendered_annotations("--set", f"gangSchedulerName={SECOND}"))
    assert policy.gang_scheduler_name == SECOND and problems == []


@pytest.mark.parametrize("value", ["Bad_Name", "-x", "a" * 254])
def test_the_chart_refuses_a_malformed_value(value):
    assert "gangSchedulerName" in helm_refuses("--set", "cluster=gpu", "--set", f"gangSchedulerName={value}")
