"""The gang-admission benchmark's guard (benchmarks/_gang_admission_guard.py: the product's plan.guard and
plan.backfill functions on the simulator's state) on a one-node cluster: a stream of single-GPU pods starves
a whole-node gang without it; with it the gang starts when the GPUs it needs are free, nothing stays
blocked, and max-hold bounds a gang's blocked time in all."""

from __future__ import annotations

import math

import numpy as np
import pytest

from benchmarks._gang_admission_guard import GuardSim
from benchmarks._gang_admission_sim import Job, Sim


def stream() -> list[Job]:
    """t=1: one single (100 s); t=2: a gang of 2 x 4 GPUs; then a single every 10 s (100 s each) until t=500."""
    jobs = [Job(0, "a", 1.0, 100.0, 1, 1, gang=False, queued=1.0), Job(1, "gang", 2.0, 50.0, 2, 4, gang=True, queued=2.0)]
    for i, t in enumerate(range(3, 500, 10), start=2):
        jobs.append(Job(i, f"s{i}", float(t), 100.0, 1, 1, gang=False, queued=float(t)))
    return jobs


def test_without_guard_the_gang_waits_for_the_stream_to_end():
    sim = Sim("raygpu", np.array([8]), stream(), give_up_s=3600.0)
    sim.run()
    assert sim.jobs[1].start > 500  # every freed GPU went to a single


@pytest.mark.parametrize("hints", [True, False])
def test_guard_holds_freed_gpus_for_the_oldest_gang(hints):
    sim = GuardSim(np.array([8]), stream(), give_up_s=3600.0, max_hold_s=900.0, hints=hints)
    result = sim.run()
    assert sim.jobs[1].start == 101.0  # when the first single ended: 7 GPUs held from t=2, the 8th then
    assert result["partial_gpu_h"] == 0 and result["reservations"] == result["started_by_reservation"] == 1
    assert result["held_idle_gpu_h"] == pytest.approx(7 * 99 / 3600, abs=0.05)  # 7 GPUs held 99 s
    assert not sim.blocked.any() and sim.free.tolist() == [8]  # everything given back


def test_backfill_only_for_jobs_that_end_before_the_reservation_starts():
    jobs = stream()
    jobs[2].dur = 50.0  # t=3, ends at 53 < 101: may use a held GPU
    sim = GuardSim(np.array([8]), jobs, give_up_s=3600.0)
    result = sim.run()
    assert (jobs[2].start, jobs[3].start > 101, result["backfilled"]) == (3.0, True, 1)
    assert jobs[1].start == 101.0  # the backfill did not delay the gang


def mixed() -> list[Job]:
    """One 8-GPU node. t=1, 1.1: gangs of 4 and 2 GPUs (end 101, 201.1); t=2: an 8-GPU gang (waits, elected,
    holds the 2 free GPUs; every GPU it waits for is a gang's, so its start is known: 201.1); t=3: a single
    (10 s); t=4: a 2-GPU gang (50 s). Both would end before 201.1, but a guarded gang waits gated in line:
    it never backfills."""
    return [Job(0, "g1", 1.0, 100.0, 2, 2, gang=True, queued=1.0), Job(1, "g0", 1.1, 200.0, 2, 1, gang=True, queued=1.1),
            Job(2, "big", 2.0, 50.0, 2, 4, gang=True, queued=2.0), Job(3, "single", 3.0, 10.0, 1, 1, gang=False, queued=3.0),
            Job(4, "small", 4.0, 50.0, 2, 1, gang=True, queued=4.0)]


@pytest.mark.parametrize(("backfill", "single", "small", "backfilled"), [
    ("all", 3.0, 251.1, 1),  # the single takes a held GPU at once (its pass); the small gang waits in line
    ("gangs", 251.1, 251.1, 0),  # the product's rule: the single has no hint, the small gang is in line
    ("none", 251.1, 251.1, 0),  # nobody backfills
])
def test_backfill_modes_decide_who_may_use_held_gpus(backfill, single, small, backfilled):
    jobs = mixed()
    result = GuardSim(np.array([8]), jobs, give_up_s=3600.0, backfill=backfill).run()
    assert (jobs[3].start, jobs[4].start, result["backfilled"]) == pytest.approx((single, small, backfilled))
    assert jobs[2].start == pytest.approx(201.1) and result["backfill"] == backfill  # the big gang is not delayed


def test_max_hold_bounds_a_gangs_blocked_time_in_all_then_it_is_rolled_back():
    """An 8-GPU gang behind a stream of singles of 1,000 s each: it holds 100 s (max-hold), times out once, and
    never holds again (plan.guard.plan_hold counts every hold of the gang together)."""
    jobs = [Job(0, "a", 1.0, 1000.0, 1, 1, gang=False, queued=1.0), Job(1, "gang", 2.0, 50.0, 2, 4, gang=True, queued=2.0)]
    sim = GuardSim(np.array([8]), jobs, give_up_s=3600.0, max_hold_s=100.0)
    result = sim.run()
    assert (result["hold_timeouts"], result["reservations"], result["started_by_reservation"]) == (1, 1, 0)
    assert result["max_blocked_s"] == pytest.approx(100.0, abs=0.01)
    assert jobs[1].start == 1001.0  # rolled back, it starts unguarded when it fits
    assert not sim.blocked.any()


def test_one_holder_per_scope():
    jobs = stream()
    jobs.append(Job(len(jobs), "gang2", 2.5, 50.0, 2, 4, gang=True, queued=2.5))
    sim = GuardSim(np.array([8, 8]), jobs, give_up_s=3600.0)
    result = sim.run()
    assert result["max_reservations_at_once"] == 1 and result["partial_gpu_h"] == 0
    assert jobs[1].start <= jobs[-1].start  # oldest first


def test_no_hints_is_backfill_none_and_modes_are_checked():
    assert GuardSim(np.array([8]), stream(), 3600.0, hints=False).backfill == "none"
    assert GuardSim(np.array([8]), stream(), 3600.0).backfill == "all"
    with pytest.raises(ValueError):
        GuardSim(np.array([8]), stream(), 3600.0, backfill="singles")
    from benchmarks.bench_gang_admission import main
    with pytest.raises(SystemExit):
        main(["--no-hints", "--backfill", "gangs"])


def line() -> list[Job]:
    """Nodes of 8 and 2 GPUs. t=1: a single (100 s) on the 8-GPU node; t=2: an 8-GPU gang (waits: holds that
    node); t=3: a 2-GPU gang (10 s) that would fit on the 2-GPU node at once."""
    return [Job(0, "a", 1.0, 100.0, 1, 1, gang=False, queued=1.0), Job(1, "big", 2.0, 50.0, 2, 4, gang=True, queued=2.0),
            Job(2, "small", 3.0, 10.0, 2, 1, gang=True, queued=3.0)]


def test_a_guarded_gang_waits_gated_in_line_even_where_it_would_fit():
    jobs = line()
    Sim("raygpu", np.array([8, 2]), jobs, give_up_s=3600.0).run()
    assert jobs[2].start == 3.0  # unguarded: it fits at once
    jobs = line()
    result = GuardSim(np.array([8, 2]), jobs, give_up_s=3600.0).run()
    assert jobs[1].start == 101.0 and jobs[2].start == 101.0  # behind the holder, then swapped in at once
    assert result["reservations"] == result["started_by_reservation"] == 2


def test_the_product_plan_functions_decide(monkeypatch):
    """The benchmark calls raygpu.plan.guard / raygpu.plan.backfill, not a model of them."""
    import benchmarks._gang_admission_guard as bench_guard
    from raygpu.plan import backfill, guard

    calls: dict[str, int] = {}
    for mod, name in [(guard, "choose_nodes"), (guard, "plan_hold"), (guard, "decide_lease"),
                      (backfill, "decide_backfill")]:
        real = getattr(mod, name)
        assert getattr(bench_guard, name) is real

        def counting(*a, _real=real, _name=name, **k):
            calls[_name] = calls.get(_name, 0) + 1
            return _real(*a, **k)

        monkeypatch.setattr(bench_guard, name, counting)
    jobs = stream()
    jobs[2].dur = 50.0  # backfills (decide_backfill gives it the pass)
    GuardSim(np.array([8]), jobs, give_up_s=3600.0).run()
    assert set(calls) == {"choose_nodes", "plan_hold", "decide_lease", "decide_backfill"}


def test_the_proposal_starts_a_gang_in_line_that_fits_on_open_nodes_at_once():
    """``guard-proposal`` (``--guard-patience``, not the product): the 2-GPU gang that the product keeps
    gated behind the holder starts at once on the node no blocker stands on; the holder still swaps in."""
    from benchmarks._gang_admission_guard import GuardProposalSim

    jobs = line()
    result = GuardProposalSim(np.array([8, 2]), jobs, give_up_s=3600.0, patience_s=0.0).run()
    assert result["policy"] == "guard-proposal" and result["patience_s"] == 0.0
    assert jobs[2].start == 3.0
    assert jobs[1].start == 101.0 and result["reservations"] == result["started_by_reservation"] == 1


def test_the_proposal_joins_the_line_only_after_its_patience():
    """With patience 200 s the gang waits as an ordinary raygpu gang (the stream takes every freed GPU) and
    holds only from t = 202; it still starts long before the stream ends (t = 500)."""
    from benchmarks._gang_admission_guard import GuardProposalSim

    jobs = stream()
    sim = GuardProposalSim(np.array([8]), jobs, give_up_s=3600.0, patience_s=200.0)
    result = sim.run()
    assert 202.0 < jobs[1].start < 500.0
    assert result["reservations"] == 1
    product = stream()
    GuardSim(np.array([8]), product, give_up_s=3600.0).run()
    assert product[1].start < jobs[1].start  # the product holds from t = 2
    with pytest.raises(ValueError):
        GuardProposalSim(np.array([8]), stream(), 3600.0, patience_s=-1.0)
    from benchmarks.bench_gang_admission import main
    with pytest.raises(SystemExit) as bad:
        main(["--guard-patience", "-5"])
    assert bad.value.code == 2
