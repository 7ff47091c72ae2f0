"""The gang-admission benchmark's guard model (benchmarks/_gang_admission_guard.py) on a one-node cluster:
a stream of single-GPU pods starves a whole-node gang without it; with it the gang starts when the GPUs it
needs are free, and nothing stays held."""

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
    assert sim.held.sum() == 0 and sim.free.tolist() == [8]  # everything given back


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
    (10 s); t=4: a 2-GPU gang (50 s). Both would end before 201.1."""
    return [Job(0, "g1", 1.0, 100.0, 2, 2, gang=True, queued=1.0), Job(1, "g0", 1.1, 200.0, 2, 1, gang=True, queued=1.1),
            Job(2, "big", 2.0, 50.0, 2, 4, gang=True, queued=2.0), Job(3, "single", 3.0, 10.0, 1, 1, gang=False, queued=3.0),
            Job(4, "small", 4.0, 50.0, 2, 1, gang=True, queued=4.0)]


@pytest.mark.parametrize(("backfill", "single", "small", "backfilled"), [
    ("all", 3.0, 13.0, 2),  # the single takes a held GPU at once; the small gang the two when it has ended
    ("gangs", 251.1, 4.0, 1),  # the product's rule: only the gang backfills; the single waits for the big gang
    ("none", 251.1, 251.1, 0),  # nobody backfills
])
def test_backfill_modes_decide_who_may_use_held_gpus(backfill, single, small, backfilled):
    jobs = mixed()
    result = GuardSim(np.array([8]), jobs, give_up_s=3600.0, backfill=backfill).run()
    assert (jobs[3].start, jobs[4].start, result["backfilled"]) == pytest.approx((single, small, backfilled))
    assert jobs[2].start == pytest.approx(201.1) and result["backfill"] == backfill  # the big gang is not delayed


def reservations_made(sim: GuardSim) -> list:
    made = []
    elect = sim._elect

    def recording(pool):
        before = sim.rsv.get(pool)
        elect(pool)
        if sim.rsv.get(pool) is not None and sim.rsv.get(pool) is not before:
            made.append(sim.rsv[pool])

    sim._elect = recording
    return made


@pytest.mark.parametrize(("backfill", "est", "deadline"), [
    ("all", 101.0, 101.0 + 900),  # every end known: the single's end at 101
    ("gangs", math.inf, 2.0 + 900),  # a single's end is unknown to the product: no estimate, max-hold from now
    ("none", math.inf, 2.0 + 900),
])
def test_estimated_start_counts_only_known_ends(backfill, est, deadline):
    sim = GuardSim(np.array([8]), stream(), give_up_s=3600.0, backfill=backfill)
    made = reservations_made(sim)
    sim.run()
    assert [(r.job.name, r.est_start_s, r.deadline_s) for r in made] == [("gang", est, deadline)]
    assert sim.jobs[1].start == 101.0  # the hold itself works the same


def test_no_hints_is_backfill_none_and_modes_are_checked():
    assert GuardSim(np.array([8]), stream(), 3600.0, hints=False).backfill == "none"
    assert GuardSim(np.array([8]), stream(), 3600.0).backfill == "all"
    with pytest.raises(ValueError):
        GuardSim(np.array([8]), stream(), 3600.0, backfill="singles")
    from benchmarks.bench_gang_admission import main
    with pytest.raises(SystemExit):
        main(["--no-hints", "--backfill", "gangs"])
