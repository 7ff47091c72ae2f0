"""The decision cycle's work is linear in the cluster's size: counted in executed Python lines, not timed.

Time on a shared 2-core box varies with load and with the machine's caches; the number of Python lines a
cycle executes does not. A step that walks every node for every pending bundle (the quadratic pending-PG
simulation this project once had) more than doubles the count when the cluster doubles, and fails here.
The states are ``bench_decision_cost``'s own (N nodes, 2 Ray workers each, every third idle, N/10 pending
placement groups with label selectors, N/10 gang requests), and its worst pending shapes: a backlog of
pending PGs asking twice the idle workers' GPUs (``BACKLOGS``), which used to make the pending-PG proof
search every PG beyond the room together with all before it (issue 24 item 2).
"""

from __future__ import annotations

import pytest

from benchmarks._decision_reference import executed_lines, reference_pass
from benchmarks.bench_decision_cost import (BACKLOGS, NOW_S, backlog_pgs, cycle, cycle_pgs, gang_cluster, gc_state,
                                            reclaim_cluster, state_pgs, synthetic_snapshot, with_idle_workers,
                                            with_pending)
from raygpu.model.gang import GangRequest
from raygpu.model.reclaim import ReclaimPolicy
from raygpu.plan.reclaim.gc import plan_gc
from raygpu.plan.reclaim.scale_down import plan_reclaim

POLICY = ReclaimPolicy(idle_timeout_s=600.0, startup_grace_s=0.0)
SIZES = (100, 200, 400)
# doubling the cluster may at most double the lines, and a little more: the states' patterns (every third
# worker idle, strategies in turn) do not divide evenly at every size (measured 1.82-2.02 for linear work);
# work that grows with nodes x bundles gives 3 and more
MAX_RATIO = 2.1
# the backlogs from 200 nodes: at 100 the phantom workers (1%) are too few for the pattern to settle (472
# lines per node at 100, then 496, 485, 491 at 200, 400, 800 for backlog-2x4)
BACKLOG_SIZES = (200, 400, 800)
MAX_BACKLOG_LINES_PER_NODE = 1_500


def _pending(n: int, state: str):
    """Part 1's N/10 PGs (``cycle``), a like-for-like state, or a backlog shape, pending on the base state."""
    base = with_idle_workers(synthetic_snapshot(n))
    if state in BACKLOGS:
        return with_pending(base, backlog_pgs(base, state))
    return with_pending(base, cycle_pgs(n) if state == "cycle" else state_pgs(n, state))


def _cycle_lines(n: int, state: str = "cycle") -> int:
    snap = _pending(n, state)
    reqs = [GangRequest(name=f"pg-{i}", cluster="rc", bundles=[{"GPU": 1.0}] * 4) for i in range(n // 10)]
    return executed_lines(lambda: cycle(snap, reclaim_cluster(n), POLICY, gang_cluster(), reqs))


def _reclaim_lines(n: int, state: str) -> int:
    snap = _pending(n, state)
    plan = plan_reclaim(snap, reclaim_cluster(n), POLICY, NOW_S)
    assert plan.search_budget_spent == "", (state, n, plan.search_budget_spent)  # judged, not kept for want of steps
    return executed_lines(lambda: plan_reclaim(snap, reclaim_cluster(n), POLICY, NOW_S))


def _ratios(counts: list[int]) -> list[float]:
    return [b / a for a, b in zip(counts, counts[1:])]


def test_the_whole_cycle_executes_lines_linear_in_nodes():
    counts = [_cycle_lines(n) for n in SIZES]
    assert counts[0] > 100 * SIZES[0]  # it counted the cycle's work (about 450 lines per node)
    assert all(r <= MAX_RATIO for r in _ratios(counts)), (SIZES, counts)


@pytest.mark.parametrize("state", ["scale-up", "worst", *BACKLOGS])
def test_plan_reclaim_with_pending_demand_executes_lines_linear_in_nodes(state):
    """N/10 pending PGs: ``scale-up`` fits no idle worker, ``worst`` fits exactly on them (the state that
    was quadratic: each unplaced bundle re-sorted and scanned every staying node). The backlogs ask twice
    the idle room: half of ``backlog-2x4`` fits, each PG on two idle workers; ``backlog-4x8`` fits only the
    phantom workers. Each plan is judged within the search budget."""
    sizes = BACKLOG_SIZES if state in BACKLOGS else SIZES
    counts = [_reclaim_lines(n, state) for n in sizes]
    assert all(r <= MAX_RATIO for r in _ratios(counts)), (state, sizes, counts)
    if state in BACKLOGS:  # about 500 (2x4) and 250 (4x8) lines per node; a search per PG beyond the room made
        # 54,000 (2x4, its searches capped by their budget: a large constant, so the ratios alone did not show it)
        assert counts[-1] < MAX_BACKLOG_LINES_PER_NODE * sizes[-1], (state, sizes, counts)


@pytest.mark.parametrize("state", list(BACKLOGS))
def test_the_whole_cycle_with_a_backlog_executes_lines_linear_in_nodes(state):
    counts = [_cycle_lines(n, state) for n in BACKLOG_SIZES]
    assert counts[0] > 100 * BACKLOG_SIZES[0]
    assert all(r <= MAX_RATIO for r in _ratios(counts)), (state, BACKLOG_SIZES, counts)


def test_plan_gc_executes_lines_linear_in_reservations():
    """Reservations each with their own worker group (``bench_decision_cost.gc_state``): plan_gc finds each
    reservation's group without a walk over the cluster's groups."""
    counts = []
    for r in SIZES:
        args = gc_state(r)
        counts.append(executed_lines(lambda: plan_gc(**args)))
    assert counts[0] > 10 * SIZES[0]  # it counted plan_gc's work
    assert all(ratio <= MAX_RATIO for ratio in _ratios(counts)), (SIZES, counts)


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
