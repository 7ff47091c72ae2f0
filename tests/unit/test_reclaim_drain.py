"""Drain before delete (issue 14): Ray drains each worker the sidecar deletes, between the plan and the patch.

A refused drain (work landed after the plan) keeps the worker; an accepted drain whose patch does not land is
remembered, and the next plan deletes that pod without waiting for the idle timeout again. A Ray node in
DRAINING state counts no capacity and needs no idle timeout; every other protection holds.
"""

from __future__ import annotations

from raygpu.model.reclaim import DecisionAction
from raygpu.model.views import PgState, PlacementGroupView, RayView
from raygpu.plan.reclaim.drain import keep_workers
from raygpu.reclaim.drain import DrainMemory, drain_workers
from raygpu.reclaim.loop import CycleOutcome
from raygpu.testing.builders.recorded import ALL_IDLE, PODS, R, RECORDED, plan_on, ray_node, ray_view
from test_reclaim_cycle import FakeCache, counter, fake_kube, reclaimer

A, B, C, D = "rc-gpu-worker-a", "rc-gpu-worker-b", "rc-gpu-worker-c", "rc-small-worker-d"


def _without_nodes(view: RayView, *pods: str) -> RayView:
    return view.model_copy(update={"nodes": tuple(n for n in view.nodes if n.instance_id not in pods)})


def _draining(view: RayView, *pods: str, idle: bool = True) -> RayView:
    return view.model_copy(update={"nodes": tuple(
        n.model_copy(update={"draining": True, **({} if idle else {"idle_since_s": None})})
        if n.instance_id in pods else n for n in view.nodes)})


# ----------------------------------------------------------------- the cycle
def test_every_deleted_worker_is_drained_before_the_patch():
    kube = fake_kube(RECORDED)
    r = reclaimer(kube)
    report = r.cycle()
    assert report.outcome is CycleOutcome.APPLIED and report.deleted_pods == (A, B, D)
    assert sorted(r.drains) == [(f"n-{A}", 0), (f"n-{B}", 0), (f"n-{D}", 0)]  # all before the one patch
    assert counter(r, "raygpu_reclaim_drains_total", result="accepted") == 3


def test_a_worker_ray_refuses_to_drain_is_kept_and_the_rest_is_deleted():
    """Work landed on b after the plan: Ray refuses its idle drain; the patch deletes a and d only."""
    kube = fake_kube(RECORDED)
    r = reclaimer(kube, drain=lambda node_id, msg: (node_id != f"n-{B}", "The node to be idle terminated is "
                                                    "no longer idle."))
    report = r.cycle()
    assert report.outcome is CycleOutcome.APPLIED and report.deleted_pods == (A, D)
    gpu = next(g for g in report.plan.to_delete if g.group_name == "gpu")
    assert gpu.added == (A,) and gpu.replicas == 2 and B not in gpu.workers_to_delete
    assert report.plan.decision(B).reason is R.DRAIN_REJECTED and "no longer idle" in report.plan.decision(B).detail
    ops = kube.patches[0]
    assert {"op": "add", "path": "/spec/workerGroupSpecs/0/replicas", "value": 2} in ops
    assert {"op": "add", "path": "/spec/workerGroupSpecs/0/scaleStrategy", "value": {"workersToDelete": [A]}} in ops
    assert counter(r, "raygpu_reclaim_drains_total", result="rejected") == 1
    assert "rc-gpu-worker-b" not in str(kube.with_reason("ScaledDown"))


def test_when_ray_refuses_every_drain_nothing_is_patched():
    kube = fake_kube(RECORDED)
    r = reclaimer(kube, drain=lambda node_id, msg: (False, "drain failed: ConnectionError"))
    report = r.cycle()
    assert report.outcome is CycleOutcome.IDLE and kube.patches == [] and report.plan.to_delete == ()
    assert {d.reason for d in report.plan.decisions if d.pod_name in (A, B, D)} == {R.DRAIN_REJECTED}


def test_a_drained_worker_whose_patch_conflicted_is_deleted_next_cycle_without_the_timeout():
    """The drain is accepted (the raylet exits), then a concurrent write makes the patch conflict and sets a
    one-hour idle timeout. The re-plan deletes the drained pods (reason Drained) though their Ray nodes are
    gone and the timeout is not reached; the pod never drained (c, busy) stays."""
    kube = fake_kube(RECORDED, bare_422=False)
    views = [ray_view(ALL_IDLE)]
    r = reclaimer(kube)
    r.read_ray = lambda address, timeout_s, now_s: views[-1]

    def writer(plan):
        kube.bump(lambda raw: raw["metadata"]["annotations"].update({"raygpu.io/idle-timeout": "1h"}))
        views.append(_without_nodes(views[0], A, B, D))  # drained: the raylets exited
    assert r.cycle(before_apply=writer).outcome is CycleOutcome.CONFLICT
    assert kube.patches == [] and len(r.drains) == 3
    again = r.cycle()
    assert again.outcome is CycleOutcome.APPLIED and again.deleted_pods == (A, B, D)
    assert {again.plan.decision(p).reason for p in (A, B, D)} == {R.DRAINED}
    assert again.plan.decision(C).action is DecisionAction.KEEP


def test_without_the_memory_a_drained_pod_waits_like_any_other():
    """Control for the test above: a fresh sidecar (no memory) keeps the pods whose Ray nodes are gone."""
    kube = fake_kube(RECORDED)
    kube.bump(lambda raw: raw["metadata"]["annotations"].update({"raygpu.io/idle-timeout": "1h"}))
    report = reclaimer(kube, ray=_without_nodes(ray_view(ALL_IDLE), A, B, D)).cycle()
    assert report.outcome is CycleOutcome.IDLE and kube.patches == []
    assert report.plan.decision(A).reason is R.NOT_IDLE_LONG_ENOUGH


# ------------------------------------------------------------------ planning
def test_a_draining_node_needs_no_timeout_and_counts_no_capacity():
    """b is DRAINING (someone drained it): deleted at once though idle only 1 s; a pending 8-GPU PG cannot
    count on it, so it protects the idle worker a (which the timeout alone would delete)."""
    idle = {**ALL_IDLE, B: 1}
    pending = PlacementGroupView(pg_id="p1", state=PgState.PENDING, bundles=({"GPU": 8},),
                                 bundle_node_ids=(None,))
    plan = plan_on(RECORDED, _draining(ray_view(idle, [pending]), B))
    assert plan.decision(B).reason is R.DRAINED and plan.decision(B).action is DecisionAction.DELETE
    assert plan.decision(A).reason is R.NEEDED_BY_PENDING_PG


def test_a_draining_node_that_holds_a_bundle_or_is_busy_keeps_its_protections():
    held = PlacementGroupView(pg_id="p1", state=PgState.CREATED, bundles=({"GPU": 8},), bundle_node_ids=(f"n-{A}",))
    plan = plan_on(RECORDED, _draining(ray_view(ALL_IDLE, [held]), A))
    assert plan.decision(A).reason is R.HOLDS_BUNDLE
    plan = plan_on(RECORDED, _draining(ray_view(ALL_IDLE), C, idle=False))  # draining a busy node: Ray's call
    assert plan.decision(C).reason is R.DRAINED  # it takes no new work; deleting it is what the drain is for


def test_keep_workers_recomputes_the_groups_and_totals():
    plan = plan_on(RECORDED, ray_view(ALL_IDLE))
    kept = keep_workers(plan, {B: "refused", "not-deleted": "ignored"})
    gpu = next(g for g in kept.to_delete if g.group_name == "gpu")
    assert (gpu.added, gpu.replicas, gpu.old_replicas) == ((A,), 2, 3)
    assert kept.deleted_pods == (A, D) and kept.decision(B).reason is R.DRAIN_REJECTED
    assert "k2" not in kept.freed_k8s_nodes and kept.reclaimed_gpus == plan.reclaimed_gpus - 8
    only_small = keep_workers(plan, {A: "x", B: "y"})
    assert [g.group_name for g in only_small.to_delete] == ["small"]
    assert keep_workers(plan, {}) is plan


# -------------------------------------------------------- drain_workers, memory
def test_a_pod_without_a_ray_node_at_the_snapshot_gets_its_current_node_drained():
    """The pod's Ray node was gone (drained before) when planned; its container restarted it since: that
    new node is drained too, and refused if busy."""
    kube = fake_kube(RECORDED)
    plan = reclaimer(kube).cycle().plan  # a, b, d to delete
    plan = plan.model_copy(update={"decisions": tuple(d.model_copy(update={"ray_node_id": None})
                                                      if d.pod_name == A else d for d in plan.decisions)})
    restarted = RayView(nodes=(ray_node(A, 8, None).model_copy(update={"node_id": "n-new"}),))
    asked = []
    result = drain_workers(plan, lambda n, m: (asked.append(n), (n != "n-new", "no longer idle"))[1],
                           lambda: restarted)
    assert "n-new" in asked and A in result.rejected and A not in result.plan.deleted_pods
    unreachable = drain_workers(plan, lambda n, m: (True, ""), lambda: RayView(reachable=False, reason="down"))
    assert "Ray unreachable" in unreachable.rejected[A] and unreachable.plan.deleted_pods == (B, D)


def test_the_memory_forgets_replaced_pods_and_restarted_nodes_that_took_work():
    mem = DrainMemory()
    mem.current(PODS, ray_view(ALL_IDLE))
    mem.remember({A: "n-a", B: "n-b", D: "n-d"})
    assert mem.current(PODS, _without_nodes(ray_view(ALL_IDLE), A, B, D)) == {A, B, D}
    replaced = tuple(p.model_copy(update={"uid": "new"}) if p.name == D else p for p in PODS)
    busy_again = ray_view({**ALL_IDLE, B: None})  # b's restarted Ray node is running a task
    assert mem.current(replaced, busy_again) == {A}
    assert mem.current(tuple(p for p in PODS if p.name != A), busy_again) == frozenset()
