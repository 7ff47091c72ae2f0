"""The pending-PG proof is iterative, linear and bounded per cycle (issue 24 item 2; docs/reliability.md,
"The budget rule").

A backlog (pending placement groups beyond what the idle workers can hold) used to make the joint search
recurse once per bundle: ``RecursionError`` from about 1,000 bundles, the cycle failed, and the sidecar did no
scale-down and no garbage collection while the backlog lasted. When the search budget runs out, every idle
worker a pending bundle could use stays, the plan says why, and the sidecar counts it.
"""

from __future__ import annotations

import logging

import pytest

import raygpu.plan.reclaim.placement as placement
from raygpu.model.reclaim import ReclaimPolicy, ReclaimReason
from raygpu.plan.common.free_index import CAND, FREE, FreeIndex
from raygpu.plan.reclaim.placement import UNKNOWN, Steps, Unit, find_placement
from raygpu.plan.reclaim.scale_down import plan_reclaim
from raygpu.testing.builders.reclaim import NOW_S, world

NEEDED = ReclaimReason.NEEDED_BY_PENDING_PG
IDLE = 900  # seconds, past the default 600 s timeout


def backlog(workers: int, pgs: int):
    """``workers`` idle 1-GPU workers, four busy ones with half a GPU free each (room by the GPU sum, none by
    the bundle), and ``pgs`` pending PGs of 2 x {GPU: 1}; no group can grow."""
    w = world().group("gpu", max_replicas=workers + 4, gpus=1)
    for i in range(workers):
        w.worker(f"w{i:04d}", gpus=1, idle_for_s=IDLE)
    for i in range(4):
        w.worker(f"busy{i}", gpus=1, free_gpus=0.5)
    for _ in range(pgs):
        w.pg_pending([{"GPU": 1}] * 2)
    return w.obj()


def test_a_backlog_twice_the_idle_room_is_planned_not_raised():
    """1,000 idle workers hold 500 of the 1,000 pending PGs. The GPU sum has room for a 501st, so it was
    searched together with the 500 before it, 1,002 bundles deep; the room test (no node holds two of its
    bundles) now proves it cannot join without a search. Every idle worker is needed, none goes, and nothing
    ran out of budget."""
    snapshot, cluster = backlog(1000, 1000)
    p = plan_reclaim(snapshot, cluster, ReclaimPolicy(), NOW_S)
    assert {d.reason for d in p.decisions if d.pod_name.startswith("w")} == {NEEDED}
    assert p.deleted_pods == () and p.search_budget_spent == ""


def _index(nodes: int, gpus: float = 1.0) -> FreeIndex:
    ix = FreeIndex()
    for i in range(nodes):
        ix.add(f"n{i:05d}", {}, {"GPU": gpus}, CAND if i % 2 else FREE, "g", (i,))
    return ix


def test_a_search_deeper_than_the_interpreters_stack_finds_its_placement():
    """3,000 units of one PG on 3,000 one-GPU nodes: one node each, found in one try per unit (a step each,
    and a step each to set out)."""
    ix = _index(3000)
    steps = Steps(6000)
    found = find_placement([Unit({"GPU": 1.0}, [{}], None, set()) for _ in range(3000)], ix, {"g": 0},
                           candidates_too=True, steps=steps)
    assert isinstance(found, list) and len(set(found)) == 3000
    assert steps.taken == 6000 and not steps.exhausted


@pytest.mark.parametrize("want, demand, budget", [("found", 1.0, 10), ("none", 2.0, 10), ("unknown", 1.0, 2)])
def test_the_search_leaves_the_index_as_it_found_it(want, demand, budget):
    """The search moves the nodes it places units on; found, proved impossible or out of budget, the index
    answers every query as before, with the same free-resource objects."""
    ix = _index(6)
    before = dict(ix.free)
    us = [Unit({"GPU": demand}, [{}], None, set()) for _ in range(4)]
    got = find_placement(us, ix, {"g": 0}, candidates_too=True, steps=Steps(budget))
    assert {"found": isinstance(got, list), "none": got is None, "unknown": got is UNKNOWN}[want]
    assert all(ix.free[n] is f for n, f in before.items())
    (bucket,) = ix.buckets({"GPU": 1.0}, [{}])
    assert ix.best_free(bucket, set()) == "n00000" and ix.cands(bucket) == ["n00001", "n00003", "n00005"]


def test_a_pg_that_fits_only_if_800_before_it_move_is_found_1201_bundles_deep():
    """1,600 idle 1-GPU workers, zones a and b in turn; 800 PGs of {GPU: 1} anywhere, then 401 that want
    zone a. In Ray's order the first 800 take 400 workers of each zone, and the 401st zone-a PG fits only when
    one of them moves to zone b: the joint search of all 1,201 bundles finds that, so 1,201 workers stay (the
    moved one "together"), 399 go, and the budget suffices."""
    m = 800
    w = world().group("gpu", max_replicas=2 * m, gpus=1)
    for i in range(2 * m):
        w.worker(f"w{i:04d}", gpus=1, idle_for_s=IDLE, ray_labels={"zone": "ab"[i % 2]})
    for _ in range(m):
        w.pg_pending([{"GPU": 1}])
    for _ in range(m // 2 + 1):
        w.pg_pending([{"GPU": 1}], selectors=[{"zone": "a"}])
    snapshot, cluster = w.obj()
    pgs = tuple(pg.model_copy(update={"pg_id": f"pg{i:05d}"}) for i, pg in enumerate(snapshot.ray.placement_groups))
    snapshot = snapshot.model_copy(update={"ray": snapshot.ray.model_copy(update={"placement_groups": pgs})})
    p = plan_reclaim(snapshot, cluster, ReclaimPolicy(), NOW_S)
    assert len(p.deleted_pods) == m // 2 - 1 and p.search_budget_spent == ""
    (moved,) = [d for d in p.decisions if d.detail.endswith("together")]
    assert moved.detail == "placement groups pg00000, pg00001, pg00002, pg00003, pg00004 and 1,196 more need it" \
                           " to fit together"


def _some_unusable():
    """Two idle 8-GPU workers and an idle 1-GPU one; a pending PACK PG of [4, 3, 3, 2, 2, 2] GPUs, which the
    greedy simulation does not place (only the search finds the two workers filled exactly)."""
    return (world().group("gpu", max_replicas=3).worker("w1", idle_for_s=IDLE).worker("w2", idle_for_s=IDLE)
            .worker("small", gpus=1, idle_for_s=IDLE).pg_pending([{"GPU": g} for g in (4, 3, 3, 2, 2, 2)]).obj())


def test_when_the_cycles_budget_runs_out_every_worker_a_pending_bundle_could_use_stays():
    """With no steps left nothing is proved: both 8-GPU workers stay and say why; the 1-GPU worker, which
    no bundle could use, goes. The plan reports the budget spent."""
    snapshot, cluster = _some_unusable()
    p = plan_reclaim(snapshot, cluster, ReclaimPolicy(), NOW_S, search_steps=0)
    for name in ("w1", "w2"):
        assert p.decision(name).reason is NEEDED
        assert "cannot prove" in p.decision(name).detail
    assert p.deleted_pods == ("small",)
    assert p.search_budget_spent == "the cycle's 0 placement steps ran out"
    enough = plan_reclaim(snapshot, cluster, ReclaimPolicy(), NOW_S)  # the default budget proves it
    assert enough.search_budget_spent == "" and "budget" not in enough.decision("w1").detail


@pytest.mark.parametrize("bad", [-1, 1.5, "10", True])
def test_a_budget_that_is_not_a_count_is_refused(bad):
    snapshot, cluster = _some_unusable()
    with pytest.raises(ValueError, match="a step budget is a count of placement steps, an int >= 0"):
        plan_reclaim(snapshot, cluster, ReclaimPolicy(), NOW_S, search_steps=bad)


def test_the_sidecar_reports_a_spent_budget_in_its_cycle_line_and_counts_it(monkeypatch, caplog):
    """The recorded cluster with a pending PG only the search places: out of steps, the cycle line and a
    warning say why, raygpu_reclaim_search_budget_spent_total counts the cycle, and the workers stay."""
    from test_reclaim_cycle import counter, fake_kube, reclaimer

    from raygpu.model.views import PgState, PlacementGroupView
    from raygpu.testing.builders.recorded import ALL_IDLE, RECORDED, ray_view

    monkeypatch.setattr(placement, "CYCLE_STEPS", 0)
    pg = PlacementGroupView(pg_id="p1", state=PgState.PENDING, bundles=tuple({"GPU": g} for g in (4, 3, 3, 2, 2, 2)))
    kube = fake_kube(RECORDED)
    r = reclaimer(kube, ray=ray_view(ALL_IDLE, pgs=[pg]))
    with caplog.at_level(logging.INFO, logger="raygpu"):
        rep = r.cycle()
    assert rep.plan.search_budget_spent == "the cycle's 0 placement steps ran out"
    assert rep.plan.decision("rc-gpu-worker-a").reason is NEEDED
    assert counter(r, "raygpu_reclaim_search_budget_spent_total") == 1
    lines = {rec.getMessage(): getattr(rec, "fields", {}) for rec in caplog.records}
    assert lines["cycle"]["search_budget_spent"] == rep.plan.search_budget_spent
    assert lines["search-budget-spent"]["detail"] == rep.plan.search_budget_spent
    monkeypatch.setattr(placement, "CYCLE_STEPS", 200_000)
    r.cycle()
    assert counter(r, "raygpu_reclaim_search_budget_spent_total") == 1  # a cycle with enough steps adds none
