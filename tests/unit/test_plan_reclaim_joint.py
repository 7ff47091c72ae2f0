"""plan_reclaim with several pending PGs competing for the same idle workers (issue 14 item 7, PGs together).

Each case is a shrunk counterexample of tests/unit/test_reclaim_properties_joint.py: on the planner before
``plan.together`` (f12d2a9) every PG fit on its own after the plan, but not all of them together, and the
plan deleted a worker that is marked NeededByPendingPG here.
"""

from __future__ import annotations

import pytest

from raygpu.model.reclaim import ReclaimPolicy, ReclaimReason
from raygpu.plan.reclaim.scale_down import plan_reclaim
from raygpu.testing.builders.reclaim import NOW_S, world

R = ReclaimReason
IDLE = 900  # seconds, past the default 600 s timeout
NEEDED = R.NEEDED_BY_PENDING_PG


def plan(w):
    snapshot, cluster = w.obj()
    return plan_reclaim(snapshot, cluster, ReclaimPolicy(), NOW_S)


def _at_max(n: int, gpus: float = 8):
    return world().group("gpu", max_replicas=n, gpus=gpus)  # no new worker can come


TOGETHER = [
    ("the first PG takes the bigger worker, which the second needs: {GPU:1} then {GPU:2} on 2- and 1-GPU workers",
     _at_max(2).worker("w0", gpus=2, idle_for_s=IDLE).worker("w1", gpus=1, idle_for_s=IDLE)
     .pg_pending([{"GPU": 1}]).pg_pending([{"GPU": 2}]),
     {"w0": NEEDED, "w1": NEEDED}, ()),
    ("the first PG takes the only zone-a worker, which the second's selector needs",
     _at_max(2).worker("w0", gpus=1, idle_for_s=IDLE, ray_labels={"zone": "a"}).worker("w1", gpus=1, idle_for_s=IDLE)
     .pg_pending([{"GPU": 1}]).pg_pending([{"GPU": 1}], selectors=[{"zone": "a"}]),
     {"w0": NEEDED, "w1": NEEDED}, ()),
    ("the first PG fits on a busy worker that stays, which only the second can use: it moves to an idle one",
     _at_max(3).worker("busy", free_gpus=2, ray_labels={"zone": "a"}).worker("w0", gpus=2, idle_for_s=IDLE)
     .worker("w1", gpus=1, idle_for_s=IDLE)
     .pg_pending([{"GPU": 2}]).pg_pending([{"GPU": 2}], selectors=[{"zone": "a"}]),
     {"w0": NEEDED}, ("w1",)),
    ("STRICT_SPREAD pair and a PACK PG share two workers: three bundles need all three workers",
     _at_max(3).worker("w0", gpus=2, idle_for_s=IDLE).worker("w1", gpus=2, idle_for_s=IDLE)
     .worker("w2", gpus=1, idle_for_s=IDLE)
     .pg_pending([{"GPU": 1}, {"GPU": 1}], strategy="STRICT_SPREAD").pg_pending([{"GPU": 2}]),
     {"w0": NEEDED, "w1": NEEDED, "w2": NEEDED}, ()),
]


@pytest.mark.parametrize("case,w,expected,deleted", TOGETHER, ids=[c[0] for c in TOGETHER])
def test_pending_pgs_that_fit_together_keep_what_they_need_together(case, w, expected, deleted):
    p = plan(w)
    assert {name: p.decision(name).reason for name in expected} == expected, [p.decision(n).detail for n in expected]
    assert p.deleted_pods == deleted


def test_pgs_that_cannot_fit_together_keep_only_what_the_first_needs():
    """Two {GPU:8} PGs and one 8-GPU worker: the first fits, the second only on its own (the same worker);
    the {GPU:4} PG after them keeps the 4-GPU worker, and the 1-GPU worker no PG can use goes."""
    p = plan(_at_max(3).worker("w0", idle_for_s=IDLE).worker("w1", gpus=4, idle_for_s=IDLE)
             .worker("w2", gpus=1, idle_for_s=IDLE)
             .pg_pending([{"GPU": 8}]).pg_pending([{"GPU": 8}]).pg_pending([{"GPU": 4}]))
    assert p.decision("w0").reason is NEEDED and p.decision("w1").reason is NEEDED
    assert p.deleted_pods == ("w2",)


def test_a_joint_placement_the_planner_cannot_prove_keeps_every_candidate_the_pgs_could_use(monkeypatch):
    """Out of search budget for the joint search (no step beyond one per bundle: enough for each PG alone, not
    for the joint search, which must move the first PG off the busy worker): neither a placement nor a proof,
    so every candidate that could host a bundle of a PG that fits alone stays, and the plan says why."""
    import raygpu.plan.reclaim.placement as placement

    monkeypatch.setattr(placement, "BUDGET", 0)
    p = plan(_at_max(3).worker("busy", free_gpus=2, ray_labels={"zone": "a"}).worker("w0", gpus=2, idle_for_s=IDLE)
             .worker("w1", gpus=1, idle_for_s=IDLE)
             .pg_pending([{"GPU": 2}]).pg_pending([{"GPU": 2}], selectors=[{"zone": "a"}]))
    assert p.decision("w0").reason is NEEDED and "cannot prove" in p.decision("w0").detail
    assert p.deleted_pods == ("w1",)
    assert p.search_budget_spent == "a search of 2 bundles ran past its 2 steps"
