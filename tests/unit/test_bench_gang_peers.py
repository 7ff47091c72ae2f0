"""The gang-admission benchmark's reserving peers (benchmarks/_gang_admission_peers.py) on a one-node trace
whose wait order tells them apart: EASY backfill lets a short gang in ahead of the head without delaying it
and keeps a long one out, reserve-and-elect lets nobody in, StrictFIFO lets singles in and blocks gangs."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks._gang_admission_peers import EasySim, KueueSim, VolcanoSim
from benchmarks._gang_admission_sim import Job, Sim, fit_all


def trace() -> list[Job]:
    """One 8-GPU node. t=1: gang A 2 x 2 GPUs (ends 101); t=2: gang B 2 x 4 GPUs (50 s; does not fit: the head);
    t=3: gang C 2 x 1 (50 s: would end at 53, before A ends); t=4: gang D 2 x 1 (200 s: would delay B);
    t=5: single S (1 GPU, 10 s)."""
    return [Job(0, "A", 1.0, 100.0, 2, 2, gang=True, queued=1.0), Job(1, "B", 2.0, 50.0, 2, 4, gang=True, queued=2.0),
            Job(2, "C", 3.0, 50.0, 2, 1, gang=True, queued=3.0), Job(3, "D", 4.0, 200.0, 2, 1, gang=True, queued=4.0),
            Job(4, "S", 5.0, 10.0, 1, 1, gang=False, queued=5.0)]


def starts(sim: Sim) -> dict[str, float]:
    result = sim.run()
    assert result["unfinished"] == 0 and (sim.policy == "pods" or result["partial_gpu_h"] == 0)
    return {j.name: j.start for j in sim.jobs}


def test_easy_backfill_lets_in_only_jobs_that_do_not_delay_the_head():
    got = starts(EasySim(np.array([8]), trace(), give_up_s=3600.0))
    # B's shadow time is 101 (A ends); C and S end before it: backfilled; D would not: it waits until B is done
    # (without the reservation D would start at 4 and delay B; without backfill C would wait until 151)
    assert got == {"A": 1.0, "B": 101.0, "C": 3.0, "D": 151.0, "S": 5.0}


def test_volcano_reserve_locks_the_elected_gangs_nodes_without_backfill():
    got = starts(VolcanoSim(np.array([8]), trace(), give_up_s=3600.0))
    # B is elected and locks the node: nothing else starts there before it; then C, D and S together
    assert got == {"A": 1.0, "B": 101.0, "C": 151.0, "D": 151.0, "S": 151.0}


def test_kueue_strict_fifo_blocks_later_gangs_of_the_pool_but_not_singles():
    got = starts(KueueSim(np.array([8]), trace(), give_up_s=3600.0))
    # B heads the queue: C and D wait behind it though they fit; the single is not Kueue's and takes a GPU
    assert got == {"A": 1.0, "B": 101.0, "C": 151.0, "D": 151.0, "S": 5.0}


def test_kueue_strict_fifo_is_per_pool():
    """Two pools (one node each): B heads pool 0's queue; a gang of pool 1 is not blocked by it."""
    jobs = trace()[:2] + [Job(2, "E", 3.0, 50.0, 2, 1, gang=True, queued=3.0, pool=1)]
    for j in jobs[:2]:
        j.pool = 0
    got = starts(KueueSim(np.array([8, 8]), jobs, give_up_s=3600.0, pools=np.array([0, 1])))
    assert got == {"A": 1.0, "B": 101.0, "E": 3.0}


def test_most_allocated_packs_onto_the_fullest_node():
    free, cap = np.array([8, 5, 6]), np.array([8, 8, 8])
    assert fit_all(free, [2]) == [0]  # first fit: node order
    assert fit_all(free, [2], cap) == [1]  # MostAllocated: the most allocated fraction that fits
    assert fit_all(free, [2, 2, 2], cap) == [1, 1, 2]  # node 1 is left with 1 GPU: then node 2 (6 free)


@pytest.mark.parametrize("cls", [EasySim, VolcanoSim, KueueSim])
def test_peers_take_the_packing_profile(cls):
    assert cls(np.array([8]), trace(), give_up_s=3600.0, packing="most-allocated").score() is not None
    assert cls(np.array([8]), trace(), give_up_s=3600.0).score() is None  # first fit by default
    with pytest.raises(ValueError):
        cls(np.array([8]), trace(), give_up_s=3600.0, packing="spread")
