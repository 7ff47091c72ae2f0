"""The decision cycle's work is linear in the cluster's size: counted in executed Python lines, not timed.

Time on a shared 2-core box varies with load and with the machine's caches; the number of Python lines a
cycle executes does not. A step that walks every node for every pending bundle (the quadratic pending-PG
simulation this project once had) more than doubles the count when the cluster doubles, and fails here.
The states are ``bench_decision_cost``'s own (N nodes, 2 Ray workers each, every third idle, N/10 pending
placement groups with label selectors, N/10 gang requests).
"""

from __future__ import annotations

import pytest

from benchmarks._decision_reference import executed_lines, reference_pass
from benchmarks.bench_decision_cost import (NOW_S, cycle, cycle_pgs, gang_cluster, reclaim_cluster, state_pgs,
                                            synthetic_snapshot, with_idle_workers, with_pending)
from raygpu.model.gang import GangRequest
from raygpu.model.reclaim import ReclaimPolicy
from raygpu.plan.reclaim.scale_down import plan_reclaim

POLICY = ReclaimPolicy(idle_timeout_s=600.0, startup_grace_s=0.0)
SIZES = (100, 200, 400)
# doubling the cluster may at most double the lines, and a little more: the states' patterns (every third
# worker idle, strategies in turn) do not divide evenly at every size (measured 1.82-2.02 for linear work);
# work that grows with nodes x bundles gives 3 and more
MAX_RATIO = 2.1


def _cycle_lines(n: int) -> int:
    snap = with_pending(with_idle_workers(synthetic_snapshot(n)), cycle_pgs(n))
    reqs = [GangRequest(name=f"pg-{i}", cluster="rc", bundles=[{"GPU": 1.0}] * 4) for i in range(n // 10)]
    return executed_lines(lambda: cycle(snap, reclaim_cluster(n), POLICY, gang_cluster(), reqs))


def _reclaim_lines(n: int, state: str) -> int:
    snap = with_pending(with_idle_workers(synthetic_snapshot(n)), state_pgs(n, state))
    return executed_lines(lambda: plan_reclaim(snap, reclaim_cluster(n), POLICY, NOW_S))


def _ratios(counts: list[int]) -> list[float]:
    return [b / a for a, b in zip(counts, counts[1:])]


def test_the_whole_cycle_executes_lines_linear_in_nodes():
    counts = [_cycle_lines(n) for n in SIZES]
    assert counts[0] > 100 * SIZES[0]  # it counted the cycle's work (about 450 lines per node)
    assert all(r <= MAX_RATIO for r in _ratios(counts)), (SIZES, counts)


@pytest.mark.parametrize("state", ["scale-up", "worst"])
def test_plan_reclaim_with_pending_demand_executes_lines_linear_in_nodes(state):
    """N/10 pending PGs: ``scale-up`` fits no idle worker, ``worst`` fits exactly on them (the state that
    was quadratic: each unplaced bundle re-sorted and scanned every staying node)."""
    counts = [_reclaim_lines(n, state) for n in SIZES]
    assert all(r <= MAX_RATIO for r in _ratios(counts)), (state, SIZES, counts)


def test_the_yardstick_sees_quadratic_work():
    """executed_lines tells a quadratic loop from a linear one (else the tests above could not fail)."""
    def quadratic(n: int) -> None:
        for i in range(n):
            for j in range(n):
                _ = i + j

    def linear(n: int) -> None:
        for i in range(n):
            _ = i

    q = [executed_lines(lambda n=n: quadratic(n)) for n in SIZES]
    lin = [executed_lines(lambda n=n: linear(n)) for n in SIZES]
    assert all(r > 3.5 for r in _ratios(q))
    assert all(r <= MAX_RATIO for r in _ratios(lin))


def test_reference_pass_reads_every_running_paired_pod():
    snap = with_idle_workers(synthetic_snapshot(100))
    # every busy worker's GPUs are all in use, plus each paired Running pod's CPU request: a positive sum
    assert reference_pass(snap) > 0
    empty = snap.model_copy(update={"k8s": snap.k8s.model_copy(update={"pods": ()})})
    assert reference_pass(empty) == 0.0
