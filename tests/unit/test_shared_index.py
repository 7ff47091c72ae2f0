"""One index per snapshot (``plan.doctor.checks_index.index_snapshot``), shared by reconcile and plan_reclaim, decides as each
building its own: same reports, same plans, whichever reads the index first."""

from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from golden_decisions import canon, decode_args, load  # noqa: E402
from test_reconcile_random import NOW_S, random_snapshot  # noqa: E402

from raygpu.model.reclaim import ReclaimPolicy  # noqa: E402
from raygpu.plan.doctor.reconcile import reconcile  # noqa: E402
from raygpu.plan.common.index import join_ray
from raygpu.plan.doctor.checks_index import index_snapshot  # noqa: E402
from raygpu.plan.reclaim.scale_down import plan_reclaim  # noqa: E402
from raygpu.testing.builders import cluster_view  # noqa: E402


def _both(snapshot, cluster, policy, now_s, reclaim_first: bool) -> tuple:
    """(report, plan) from one shared index, read by both in the given order."""
    ix = index_snapshot(snapshot)
    if reclaim_first:
        plan = plan_reclaim(snapshot, cluster, policy, now_s, index=ix)
        return reconcile(snapshot, now_s, index=ix), plan
    report = reconcile(snapshot, now_s, index=ix)
    return report, plan_reclaim(snapshot, cluster, policy, now_s, index=ix)


def _alone(snapshot, cluster, policy, now_s) -> tuple:
    return reconcile(snapshot, now_s), plan_reclaim(snapshot, cluster, policy, now_s)


@pytest.mark.parametrize("reclaim_first", [False, True])
def test_golden_reclaim_worlds_give_the_same_plan_and_report_from_one_index(reclaim_first):
    cases = load("plan_reclaim")
    assert len(cases) > 100
    for case in cases:
        args = decode_args("plan_reclaim", case["input"])
        snapshot, cluster, policy, now_s = args["snapshot"], args["cluster"], args["policy"], args["now_s"]
        report, plan = _both(snapshot, cluster, policy, now_s, reclaim_first)
        assert canon(plan) == case["output"], case["name"]
        want_report, want_plan = _alone(snapshot, cluster, policy, now_s)
        assert canon(report) == canon(want_report), case["name"]
        assert canon(plan) == canon(want_plan), case["name"]


def _random_cluster(seed: int):
    r = random.Random(seed)
    view = cluster_view("rc", namespace="ns", resource_version="7")
    for name in ("gpu", "small")[: r.choice((1, 2))]:
        view.group(name, replicas=r.choice((0, 3, 10)), min_replicas=r.choice((0, 1)), max_replicas=20,
                   workers_to_delete=("p1",) if r.random() < 0.3 else ())
    return view.obj()


@pytest.mark.parametrize("seed", range(300))
def test_random_snapshots_give_the_same_plan_and_report_from_one_index(seed):
    """Irregular snapshots: duplicate pod names, live Ray nodes sharing an instance id, dead and ghost nodes."""
    snapshot = random_snapshot(seed)
    cluster = _random_cluster(seed)
    policy = ReclaimPolicy(idle_timeout_s=30.0, startup_grace_s=(0.0, 90.0)[seed % 2])
    want = tuple(canon(x) for x in _alone(snapshot, cluster, policy, NOW_S))
    for reclaim_first in (False, True):
        assert tuple(canon(x) for x in _both(snapshot, cluster, policy, NOW_S, reclaim_first)) == want


def test_the_random_snapshots_include_shared_instance_ids():
    joins = [join_ray(random_snapshot(seed).ray.nodes) for seed in range(300)]
    assert any(not j.unique for j in joins) and any(j.unique and j.by_instance for j in joins)


def test_an_index_of_another_snapshot_is_refused():
    a, b = random_snapshot(1), random_snapshot(2)
    ix = index_snapshot(a)
    with pytest.raises(ValueError):
        reconcile(b, NOW_S, index=ix)
    with pytest.raises(ValueError):
        plan_reclaim(b, _random_cluster(2), ReclaimPolicy(idle_timeout_s=30.0), NOW_S, index=ix)


def test_two_live_ray_nodes_of_one_pod_keep_the_larger_node_id_with_a_shared_index():
    """The index's join keeps the last node of an instance id (the doctor's rule); plan_reclaim keeps the
    larger node id: given the shared index it still does (a busy 'n-w1' listed after an idle 'n-w1-z')."""
    from raygpu.testing.builders.reclaim import NOW_S as T, world

    snapshot, cluster = world().worker("w1", idle_for_s=900).obj()
    nodes = snapshot.ray.nodes
    (w1,) = [n for n in nodes if n.instance_id == "w1"]
    busy = w1.model_copy(update={"idle_since_s": None})
    twin = w1.model_copy(update={"node_id": "n-w1-z"})  # larger id, idle: the one plan_reclaim judges
    snapshot = snapshot.model_copy(update={"ray": snapshot.ray.model_copy(update={
        "nodes": tuple(n for n in nodes if n is not w1) + (twin, busy)})})
    policy = ReclaimPolicy(idle_timeout_s=600.0)
    ix = index_snapshot(snapshot)
    assert not ix.ray.unique and ix.ray.by_instance["w1"].node_id == "n-w1"
    plan = plan_reclaim(snapshot, cluster, policy, T, index=ix)
    assert canon(plan) == canon(plan_reclaim(snapshot, cluster, policy, T))
    assert [d.ray_node_id for d in plan.decisions if d.pod_name == "w1"] == ["n-w1-z"]
    assert canon(reconcile(snapshot, T, index=ix)) == canon(reconcile(snapshot, T))
