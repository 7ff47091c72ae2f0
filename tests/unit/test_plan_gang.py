"""plan_gang: template choice, packing, shapes and errors, as tables of one-line cases."""

from __future__ import annotations

import math
import re

import pytest
from raygpu.testing.builders.clusters import cluster, gang, gpus
from raygpu.testing.builders.patch import PatchTestFailed, apply_json_patch

from raygpu.errors import InfeasibleError, PermanentError
from raygpu.model.annotations import ClusterPolicy
from raygpu.model.gang import ALLOWED_TRANSITIONS, Backend, GangRequest, ReservationState, Strategy, check_transition, \
    is_terminal
from raygpu.model.shapes import GpuKind
from raygpu.model.labels import reservation_group_name
from raygpu.plan.gang.reservation import plan_gang
from raygpu.plan.common.patch import add_worker_group, raycluster_patch, remove_worker_group, set_replicas, \
    set_workers_to_delete

GPU8 = cluster().worker("gpu", gpus=8, cpus=96, max_replicas=8)
TWO = cluster().worker("small", gpus=2, cpus=16).worker("gpu", gpus=8, cpus=96)
MIG = cluster().mig_worker("mig", profile="3g.40gb", slices=1)
MIXED = cluster().mig_worker("mig", slices=1).worker("gpu", gpus=8, cpus=96)
SHARE = cluster().share_worker("share", num_gpus=1).worker("gpu", gpus=8)
CPU_AND_GPU = cluster().worker("gpu", gpus=8, cpus=96).worker("cpu", cpus=256, memory="1Ti")


@pytest.mark.parametrize("builder,bundles,strategy,template,pods,assign,kind", [
    pytest.param(GPU8, gpus(8, 6), "STRICT_SPREAD", "gpu", 6, (0, 1, 2, 3, 4, 5), GpuKind.WHOLE, id="6x8-strict-spread"),
    pytest.param(GPU8, gpus(8, 6), "SPREAD", "gpu", 6, (0, 1, 2, 3, 4, 5), GpuKind.WHOLE, id="6x8-spread"),
    pytest.param(GPU8, gpus(1, 3), "SPREAD", "gpu", 3, (0, 1, 2), GpuKind.WHOLE, id="spread-small-one-per-pod"),
    pytest.param(GPU8, gpus(1, 8), "PACK", "gpu", 1, (0,) * 8, GpuKind.WHOLE, id="pack-8x1-one-pod"),
    pytest.param(GPU8, gpus(1, 9), "PACK", "gpu", 2, (0,) * 8 + (1,), GpuKind.WHOLE, id="pack-9x1-two-pods"),
    pytest.param(GPU8, [{"GPU": 3}, {"GPU": 4}, {"GPU": 5}, {"GPU": 4}], "PACK", "gpu", 2, (0, 1, 0, 1),
                 GpuKind.WHOLE, id="pack-first-fit-decreasing"),
    pytest.param(GPU8, gpus(2, 4), "STRICT_PACK", "gpu", 1, (0, 0, 0, 0), GpuKind.WHOLE, id="strict-pack-fits"),
    pytest.param(TWO, gpus(1, 2), "PACK", "small", 1, (0, 0), GpuKind.WHOLE, id="least-gpu-waste"),
    pytest.param(TWO, gpus(4, 2), "PACK", "gpu", 1, (0, 0), GpuKind.WHOLE, id="only-big-fits"),
    pytest.param(CPU_AND_GPU, [{"CPU": 64}] * 3, "PACK", "cpu", 1, (0, 0, 0), None, id="cpu-gang-avoids-gpus"),
    pytest.param(MIG, gpus(1, 2), "PACK", "mig", 2, (0, 1), GpuKind.MIG, id="mig-slices"),
    pytest.param(MIXED, gpus(1, 1), "PACK", "gpu", 1, (0,), GpuKind.WHOLE, id="whole-preferred-over-mig"),
    pytest.param(SHARE, gpus(0.5, 3), "PACK", "share", 2, (0, 0, 1), GpuKind.SHARE, id="half-gpu-on-share"),
])
def test_plan_places_bundles(builder, bundles, strategy, template, pods, assign, kind):
    plan = plan_gang(gang(bundles, strategy), builder.obj())
    assert (plan.need.template_group, plan.pod_count, plan.bundle_to_pod) == (template, pods, assign)
    assert (plan.need.gpu_shape.kind if plan.need.gpu_shape else None) is kind
    for p in range(plan.pod_count):  # every pod holds what is planned on it
        for r, cap in plan.need.ray_resources.items():
            assert sum(plan.bundle_to_pod[i] == p and b.get(r) or 0 for i, b in enumerate(bundles)) <= cap
    assert plan.reason.startswith(f"{strategy}: {len(bundles)} bundle(s) -> {pods} pod(s) of group '{template}'")


def test_mig_plan_records_resource_and_explains():
    plan = plan_gang(gang(gpus(1), "PACK"), MIG.obj())
    assert plan.need.gpu_shape.resource == "nvidia.com/mig-3g.40gb"
    assert plan.need.k8s_requests["nvidia.com/mig-3g.40gb"] == 1
    assert "1 GPU = one mig-3g.40gb slice" in plan.reason


def test_plan_counts_sidecars_in_pod_requests():
    c = cluster().worker("gpu", gpus=8, cpus=96, sidecar={"cpu": "500m", "memory": "1Gi"}).obj()
    need = plan_gang(gang(gpus(8)), c).need
    assert need.k8s_requests["cpu"] == 96.5 and need.k8s_requests["memory"] == 65 * 2**30
    assert need.ray_resources["CPU"] == 96  # Ray sees the Ray container only


def test_max_replicas_exceeded_is_a_note_not_an_error():
    plan = plan_gang(gang(gpus(8, 12), "STRICT_SPREAD"), GPU8.obj())
    assert plan.pod_count == 12
    assert len(plan.notes) == 1 and "maxReplicas=8" in plan.notes[0] and "maxReplicas=8" in plan.reason


def test_named_template_wins_over_least_waste():
    c = TWO.annotate("raygpu.io/gang-template", "gpu").obj()
    plan = plan_gang(gang(gpus(1, 2)), c)
    assert plan.need.template_group == "gpu" and "raygpu.io/gang-template" in plan.reason


@pytest.mark.parametrize("params,bundle,fits", [
    ({"resources": '"{\\"TPU\\": 4}"'}, {"TPU": 2}, True),
    ({"resources": '{"TPU": 4}'}, {"TPU": 5}, False),
    ({"memory": str(8 * 2**30)}, {"memory": 9 * 2**30}, False),
    ({}, {"memory": 60 * 2**30}, True),  # the 64Gi memory limit is Ray's memory
])
def test_custom_and_memory_capacity(params, bundle, fits):
    c = cluster().worker("w", cpus=8, memory="64Gi", params=params).obj()
    if fits:
        assert plan_gang(gang([bundle]), c).pod_count == 1
    else:
        with pytest.raises(InfeasibleError) as err:
            plan_gang(gang([bundle]), c)
        assert (err.value.bundle_index, err.value.resource) == (0, next(iter(bundle)))


@pytest.mark.parametrize("builder,bundles,strategy,index,resource,requested,limit,template,words", [
    pytest.param(GPU8, gpus(16), "PACK", 0, "GPU", 16, 8, "gpu", ["bundle 0 asks GPU=16", "group 'gpu'"], id="too-big"),
    pytest.param(GPU8, gpus(8) + gpus(9), "SPREAD", 1, "GPU", 9, 8, "gpu", ["bundle 1 asks GPU=9"], id="second-too-big"),
    pytest.param(GPU8, gpus(0.5), "PACK", 0, "GPU", 0.5, 0, "gpu",
                 ["bundle 0 asks GPU=0.5", "only whole-GPU templates (largest: group 'gpu' (8 x nvidia.com/gpu",
                  "shared-GPU template", "not round"], id="half-gpu-whole-only"),
    pytest.param(MIG, gpus(1.5), "PACK", 0, "GPU", 1.5, 0, "mig", ["only MIG templates"], id="fraction-mig-only"),
    pytest.param(cluster().share_worker("share", num_gpus=4), gpus(1), "PACK", 0, "GPU", 1, 0, "share",
                 ["only shared-GPU templates", "not an isolated GPU"], id="whole-on-share-only"),
    pytest.param(cluster().share_worker("share", num_gpus=None), gpus(0.5), "PACK", 0, "GPU", 0.5, 0, None,
                 ["no worker group offers"], id="share-without-num-gpus"),
    pytest.param(GPU8, gpus(8, 3), "STRICT_PACK", 1, "GPU", 24, 8, "gpu",
                 ["STRICT_PACK", "GPU=24", "bundle 1"], id="strict-pack-over"),
    pytest.param(GPU8, [{"TPU": 1}], "PACK", 0, "TPU", 1, 0, None, ["no worker group offers Ray resource 'TPU'"],
                 id="unknown-resource"),
    pytest.param(CPU_AND_GPU, [{"GPU": 8, "CPU": 200}], "PACK", 0, "CPU", 200, 96, "gpu",
                 ["the largest whole-GPU/MIG template has CPU=96"], id="cpu-too-big-for-gpu-templates"),
    pytest.param(cluster().worker("gpu", gpus=8, cpus=96).worker("wide", gpus=4, cpus=256), [{"GPU": 8, "CPU": 200}],
                 "PACK", 0, "CPU", 200, 96, "gpu", ["no single template holds all of it", "group 'wide' has GPU=4"],
                 id="no-single-template"),
    pytest.param(CPU_AND_GPU, [{"GPU": 8}, {"CPU": 200}], "PACK", 1, "CPU", 200, 96, "gpu",
                 ["no single worker group fits every bundle"], id="bundles-need-different-templates"),
    pytest.param(TWO.annotate("raygpu.io/gang-template", "small"), gpus(4), "PACK", 0, "GPU", 4, 2, "small",
                 ["raygpu.io/gang-template names group 'small'"], id="named-template-too-small"),
    pytest.param(cluster(), gpus(1), "PACK", None, None, None, None, None, ["no worker groups"], id="no-workers"),
])
def test_infeasible(builder, bundles, strategy, index, resource, requested, limit, template, words):
    with pytest.raises(InfeasibleError) as err:
        plan_gang(gang(bundles, strategy), builder.obj())
    e = err.value
    assert (e.bundle_index, e.resource, e.requested, e.limit, e.template) == (index, resource, requested, limit, template)
    for w in words:
        assert w in str(e)


@pytest.mark.parametrize("kwargs,words", [
    (dict(bundles=[{"GPU": 1}, {"GPU": 0}]), ["bundle 1 asks GPU=0"]),
    (dict(bundles=[{"GPU": -2}]), ["bundle 0 asks GPU=-2"]),
    (dict(bundles=[{"GPU": math.nan}]), ["bundle 0 asks GPU=nan"]),
    (dict(bundles=[{"CPU": math.inf}]), ["bundle 0 asks CPU=inf"]),
    (dict(bundles=[{"GPU": "8"}]), ["amounts must be numbers"]),
    (dict(bundles=[{"GPU": True}]), ["amounts must be numbers"]),
    (dict(bundles=[]), ["non-empty list of bundles"]),
    (dict(bundles=[{}]), ["bundle 0 must be a non-empty dict"]),
    (dict(bundles=gpus(1), strategy="PACKED"), ["unknown placement strategy 'PACKED'", "STRICT_SPREAD"]),
    (dict(bundles=gpus(1), backend="slurm"), ["unknown gang backend 'slurm'", "coscheduling"]),
    (dict(bundles=gpus(1), timeout_s=0), ["timeout_s"]),
    (dict(bundles=gpus(1), name=""), ["non-empty"]),
])
def test_bad_requests_raise_permanent_error(kwargs, words):
    with pytest.raises(PermanentError) as err:
        GangRequest(**{"name": "j", "cluster": "c", **kwargs})
    assert not isinstance(err.value, InfeasibleError)
    for w in words:
        assert w in str(err.value)


@pytest.mark.parametrize("request_kw,policy,words", [
    (dict(backend="kueue"), ClusterPolicy(), ["kueue needs a LocalQueue"]),
    ({}, ClusterPolicy(gang_template="nope"), ["names group 'nope'", "gpu"]),
    (dict(cluster_name="other"), ClusterPolicy(), ["default/other"]),
])
def test_plan_permanent_errors(request_kw, policy, words):
    with pytest.raises(PermanentError) as err:
        plan_gang(gang(gpus(1), **request_kw), GPU8.obj(), policy)
    for w in words:
        assert w in str(err.value)


@pytest.mark.parametrize("annotations,request_kw,backend,queue", [
    ({}, {}, Backend.NONE, None),
    ({"raygpu.io/gang-backend": "kueue", "raygpu.io/queue": "team-a"}, {}, Backend.KUEUE, "team-a"),
    ({"raygpu.io/gang-backend": "kueue", "raygpu.io/queue": "team-a"}, dict(backend="volcano", queue="q2"),
     Backend.VOLCANO, "q2"),
    ({"raygpu.io/gang-backend": "bogus"}, {}, Backend.NONE, None),  # bad annotation: safe default
])
def test_backend_and_queue_resolution(annotations, request_kw, backend, queue):
    b = GPU8
    for k, v in annotations.items():
        b = b.annotate(k, v)
    plan = plan_gang(gang(gpus(8), **request_kw), b.obj())
    assert (plan.backend, plan.queue) == (backend, queue)


def test_plan_is_deterministic_and_strategy_is_kept():
    req, c = gang([{"GPU": g} for g in (3, 1, 4, 1, 5, 2)], "PACK"), GPU8.obj()
    assert plan_gang(req, c) == plan_gang(req, c)
    assert plan_gang(req, c).strategy is Strategy.PACK


@pytest.mark.parametrize("name,expected", [
    ("job1", "rg-job1"),
    ("My_Job.v2", None),
    ("x" * 100, None),
    ("___", None),
])
def test_reservation_group_name_is_a_dns_label(name, expected):
    rg = reservation_group_name(name)
    assert re.fullmatch(r"[a-z0-9]([a-z0-9-]*[a-z0-9])?", rg) and len(rg) <= 63
    assert rg == reservation_group_name(name)
    if expected is not None:
        assert rg == expected
    else:
        assert re.search(r"-[0-9a-f]{8}$", rg)


def test_long_names_stay_distinct():
    assert reservation_group_name("x" * 100 + "a") != reservation_group_name("x" * 100 + "b")


# --- the reservation state machine -------------------------------------------------------------------------

P, RS, AD, BO, RE, REL, F, RB = (ReservationState.PLANNED, ReservationState.RESERVED, ReservationState.ADMITTED,
                                 ReservationState.BOUND, ReservationState.READY, ReservationState.RELEASED,
                                 ReservationState.FAILED, ReservationState.ROLLED_BACK)
LEGAL = {(P, RS), (P, F), (RS, AD), (RS, F), (RS, REL), (AD, BO), (AD, F), (AD, REL), (BO, RE), (BO, F), (BO, REL),
         (RE, REL), (RE, F), (F, RB)}


def test_table_has_exactly_the_reviewed_edges():
    assert {(a, b) for a, nxt in ALLOWED_TRANSITIONS.items() for b in nxt} == LEGAL
    assert set(ALLOWED_TRANSITIONS) == set(ReservationState)


@pytest.mark.parametrize("a,b", sorted(LEGAL))
def test_legal_edges(a, b):
    assert check_transition(a, b) is b
    assert check_transition(a.value, b.value.upper()) is b  # annotation strings work too


@pytest.mark.parametrize("a,b", [(RE, P), (REL, RE), (RB, P), (P, RE), (BO, AD), (F, REL), (RS, RS), (REL, F),
                                 ("planned", "bogus"), ("gone", "planned")])
def test_illegal_edges_raise(a, b):
    with pytest.raises(PermanentError):
        check_transition(a, b)


def test_every_state_reaches_a_terminal_state():
    for start in ReservationState:
        seen, todo = set(), [start]
        while todo:
            s = todo.pop()
            seen.add(s)
            todo.extend(ALLOWED_TRANSITIONS[s] - seen)
        assert seen & {REL, RB}, start
    assert {s for s in ReservationState if is_terminal(s)} == {REL, RB}


# --- RayCluster JSON patches ---------------------------------------------------------------------------------

RC = cluster().worker("cpu", cpus=8).worker("gpu", gpus=8, cpus=96).raw()


@pytest.mark.parametrize("ops,check", [
    (add_worker_group({"groupName": "rg-j", "replicas": 2}),
     lambda o: [g["groupName"] for g in o["spec"]["workerGroupSpecs"]] == ["cpu", "gpu", "rg-j"]),
    (remove_worker_group(1, "gpu"), lambda o: [g["groupName"] for g in o["spec"]["workerGroupSpecs"]] == ["cpu"]),
    (set_replicas(1, 3, group_name="gpu"), lambda o: o["spec"]["workerGroupSpecs"][1]["replicas"] == 3),
    (set_workers_to_delete(0, ["c-cpu-worker-abc"], group_name="cpu"),
     lambda o: o["spec"]["workerGroupSpecs"][0]["scaleStrategy"] == {"workersToDelete": ["c-cpu-worker-abc"]}),
    (set_replicas(0, 0) + set_workers_to_delete(0, ["p1", "p2"]),
     lambda o: o["spec"]["workerGroupSpecs"][0]["replicas"] == 0),
])
def test_patch_starts_with_resource_version_test_and_applies(ops, check):
    patch = raycluster_patch("1001", ops)
    assert patch[0] == {"op": "test", "path": "/metadata/resourceVersion", "value": "1001"}
    assert patch[1:] == ops
    assert check(apply_json_patch(RC, patch))
    with pytest.raises(PatchTestFailed):  # someone else wrote in between: nothing applies
        apply_json_patch(RC, raycluster_patch("1000", ops))


def test_index_ops_catch_a_reorder():
    ops = remove_worker_group(0, "gpu")  # planned when 'gpu' was first; now it is second
    assert ops[0] == {"op": "test", "path": "/spec/workerGroupSpecs/0/groupName", "value": "gpu"}
    with pytest.raises(PatchTestFailed):
        apply_json_patch(RC, raycluster_patch("1001", ops))


@pytest.mark.parametrize("build", [
    lambda: raycluster_patch("", set_replicas(0, 1)),
    lambda: raycluster_patch("1", []),
    lambda: set_replicas(-1, 1),
    lambda: set_replicas(0, -1),
    lambda: set_replicas(True, 1),
    lambda: set_workers_to_delete(0, "pod-a"),
    lambda: add_worker_group({"replicas": 1}),
])
def test_bad_patch_input_raises(build):
    with pytest.raises(PermanentError):
        build()


def test_gang_templates_parse_the_cluster_policy_once_for_every_request():
    """gang_templates carries the cluster's annotations parsed; plan_gang with it decides as without it
    (the golden comparison in test_decision_equivalence.py covers every case)."""
    from raygpu.model.annotations import parse_cluster_policy
    from raygpu.model.labels import KEY_GANG_BACKEND
    from raygpu.plan.gang.reservation import gang_templates

    view = cluster().worker("gpu", gpus=8).obj().model_copy(update={"annotations": {KEY_GANG_BACKEND: "volcano"}})
    t = gang_templates(view)
    assert t.policy == parse_cluster_policy(view.annotations)[0] and t.policy.gang_backend is Backend.VOLCANO
    req = GangRequest(name="g", cluster=view.name, namespace=view.namespace, bundles=[{"GPU": 1}] * 3)
    assert plan_gang(req, view, templates=t) == plan_gang(req, view)
    assert plan_gang(req, view, templates=t).backend is Backend.VOLCANO


def test_one_templates_object_reuses_a_choice_only_for_an_equal_request():
    """gang_templates caches plan_gang's choice per (gang-template, strategy, bundles, free): many requests
    of one cycle, of different shapes and free capacity, interleaved, each plan as plan_gang alone makes it
    (names, reasons and notes are the request's own); an infeasible request still raises every time."""
    from raygpu.model.gang import NodeFree
    from raygpu.plan.gang.reservation import gang_templates

    view = cluster().worker("small", gpus=2, cpus=16, max_replicas=1).worker("gpu", gpus=8, cpus=96).obj()
    t = gang_templates(view)
    tight = (NodeFree(free={"nvidia.com/gpu": 2, "cpu": 64}, allocatable={"nvidia.com/gpu": 8, "cpu": 64}),)
    roomy = (NodeFree(free={"nvidia.com/gpu": 8, "cpu": 128}, allocatable={"nvidia.com/gpu": 8, "cpu": 128}),)
    cases = [(gpus(1, 4), "PACK", None), (gpus(1, 4), "SPREAD", None), (gpus(1, 4), "PACK", tight),
             (gpus(1, 4), "PACK", roomy), (gpus(2, 3), "PACK", None), (gpus(1, 4, CPU=1), "PACK", None)]
    for i in range(3):
        for j, (bundles, strategy, free) in enumerate(cases):
            req = gang(bundles, strategy, name=f"job-{i}-{j}", cluster_name=view.name)
            assert plan_gang(req, view, free=free, templates=t) == plan_gang(req, view, free=free), (i, j)
        with pytest.raises(InfeasibleError):
            plan_gang(gang(gpus(16), cluster_name=view.name), view, templates=t)
    assert len(t.choices) == len(cases)  # one choice per distinct request shape, reused by the later rounds
