"""The gang-admission benchmark's guard model (benchmarks/_gang_admission_guard.py) on a one-node cluster:
a stream of single-GPU pods starves a whole-node gang without it; with it the gang starts when the GPUs it
needs are free, and nothing stays held."""

from __future__ import annotations

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
