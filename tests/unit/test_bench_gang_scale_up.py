"""The gang-admission benchmark's ``scale-up`` policy (benchmarks/_gang_admission_scale_up.py): unmodified jobs,
the sidecar reserves for pending gang PGs after grace and cycle, at most ``in_flight`` per pool, oldest first,
rolling back and retrying after a back-off. Half-placed GPU-h stay 0; it reacts later than ``raygpu``."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks._gang_admission_pools import gang_pool, node_pools
from benchmarks._gang_admission_scale_up import TRANSITIONS, ScaleUpSim, backoff_s
from benchmarks._gang_admission_sim import POLICIES, Job, Sim
from benchmarks.bench_gang_admission import make_sim
from tests.unit.test_bench_gang_pools import CAPS, POOL_CAPS, synthetic


def gang(jid: int, t: float, k: int = 2, g: int = 4, dur: float = 100.0, pool: int = -1) -> Job:
    return Job(jid, f"g{jid}", t, dur, k, g, gang=True, queued=t, pool=pool)


def single(jid: int, t: float, dur: float = 100.0) -> Job:
    return Job(jid, f"s{jid}", t, dur, 1, 1, gang=False, queued=t)


def last(jobs: list[Job], t: float = 4000.0) -> list[Job]:
    """``jobs`` and a 1-GPU single at ``t``, after all else: the replay samples GPU use every (last arrival /
    400) s, so a stream that ends at t=1 would be sampled every 2.5 ms."""
    return jobs + [single(len(jobs), t, dur=60.0)]


def waits(jobs: list[Job]) -> dict[str, float]:
    return {j.name: j.start - j.arrive for j in jobs if j.gang}


def test_policy_is_listed_and_built_by_the_benchmark():
    assert "scale-up" in POLICIES
    sim = make_sim("scale-up", np.array([8]), [gang(0, 1.0)], 3600.0, None, scale_up={"in_flight": 2})
    assert isinstance(sim, ScaleUpSim) and sim.in_flight == 2 and sim.interval_s == 10.0 and sim.grace_s == 10.0
    assert TRANSITIONS["reserved"] == {"bound", "pending"} and TRANSITIONS["bound"] == set()


# submitted at -> started: seen at the first 10 s cycle at or after it, reserved a cycle (10 s grace) later,
# and bound at once (the cluster is empty); raygpu starts each at submission
@pytest.mark.parametrize(("arrive", "start"), [(1.0, 20.0), (10.0, 20.0), (10.5, 30.0), (19.999, 30.0)])
def test_an_uncontended_gang_waits_the_reaction_delay(arrive, start):
    jobs = last([gang(0, arrive)])
    ScaleUpSim(np.array([8, 8]), jobs, 3600.0).run()
    assert jobs[0].start == pytest.approx(start)
    raygpu_jobs = last([gang(0, arrive)])
    Sim("raygpu", np.array([8, 8]), raygpu_jobs, 3600.0).run()
    assert raygpu_jobs[0].start == arrive


def test_waits_are_at_least_raygpus_on_the_same_jobs():
    """A light stream (mean gap 200 s) over 16 nodes: every gang waits at least as long as under ``raygpu``
    (a recorded property of this deterministic stream). Under overload the cap's oldest-first order can give
    a *lower* p95 than raygpu's (docs/benchmarks.md); the per-gang claim is made where it holds."""
    def stream():
        jobs = synthetic(n=200)
        for j in jobs:
            j.arrive = j.queued = j.arrive * 5
        return jobs
    ours, theirs = stream(), stream()
    mine = ScaleUpSim(np.array(CAPS), ours, 3600.0).run()
    ref = Sim("raygpu", np.array(CAPS), theirs, 3600.0).run()
    w, ref_w = waits(ours), waits(theirs)
    assert len(w) == 54 and all(w[name] >= ref_w[name] for name in w)
    assert all(w[name] >= 10.0 for name in w)  # never before a cycle 10 s after the first sight
    assert mine["gang_wait_p50_s"] >= ref["gang_wait_p50_s"] and mine["gang_wait_p95_s"] >= ref["gang_wait_p95_s"]


def test_no_half_placed_gpu_hours_under_overload():
    jobs = synthetic(n=200)  # mean gap 40 s on 16 nodes: gangs queue for hours
    sim = ScaleUpSim(np.array(CAPS), jobs, 3600.0)
    result = sim.run()
    assert result["unfinished"] == 0 and result["rolled_back"] > 0 and result["max_in_flight"] == 4
    assert sim.partial_gpu_s == 0.0 and result["partial_gpu_h"] == 0.0
    assert result["deadlocks"] == result["gave_up"] == 0 and result["held_idle_gpu_h"] == 0.0
    assert result["plan_gang_calls"] == result["reservations"] >= result["gangs"]  # one plan per reservation
    assert sim.free.tolist() == CAPS and not sim.pending and not sim.reserved  # everything given back
    again = synthetic(n=200)
    timing = "plan_gang_ms_mean"  # wall time, the one field that is not simulated
    assert {k: v for k, v in ScaleUpSim(np.array(CAPS), again, 3600.0).run().items() if k != timing} == \
        {k: v for k, v in result.items() if k != timing}  # deterministic


def blocked(n_gangs: int) -> list[Job]:
    """One 8-GPU node; t=0.5: a 1-GPU single for 3000 s, so no 8-GPU gang binds before 3000.5;
    t=1, 2, ...: ``n_gangs`` gangs of 2 x 4 GPUs (100 s each); a last single long after."""
    jobs = [single(0, 0.5, dur=3000.0)] + [gang(i, float(i), dur=100.0) for i in range(1, n_gangs + 1)]
    return last(jobs, t=3000.0 + 200.0 * n_gangs)


def test_in_flight_cap_is_respected_and_slots_go_oldest_first():
    jobs = blocked(5)
    sim = ScaleUpSim(np.array([8]), jobs, 3600.0, in_flight=2)
    made: list[tuple[float, str]] = []
    reserve = sim._reserve_oldest

    def checking_reserve():
        before = set(sim.reserved)
        changed = reserve()
        made.extend((sim.now, sim.jobs[jid].name) for jid in sorted(set(sim.reserved) - before))
        assert len(sim.reserved) == sim.in_flight_of.get(0, 0) <= 2
        ripe = [pg for pg in sim.pending if sim.now >= max(pg.seen_s + sim.grace_s, pg.retry_s)]
        assert not ripe or len(sim.reserved) == 2  # a PG that may have one waits only for a slot
        return changed

    sim._reserve_oldest = checking_reserve
    result = sim.run()
    assert result["max_in_flight"] == 2 and result["partial_gpu_h"] == 0
    # 20: the two oldest; 620: they time out (back-off to 650), the next two oldest get the slots
    assert made[:4] == [(20.0, "g1"), (20.0, "g2"), (620.0, "g3"), (620.0, "g4")]
    assert all(j.start >= 3000.5 for j in jobs[1:] if j.gang)  # nothing bound before the single ended


def test_a_timed_out_reservation_is_rolled_back_and_retried_after_the_back_off():
    jobs = blocked(1)  # the single ends at 3000.5
    sim = ScaleUpSim(np.array([8]), jobs, 3600.0)
    sim.run()
    assert sim.history == [  # made at, ended at: 600 s each, then 30, 60, 120, 240 s back-off
        ("g1", 20.0, 620.0, "rolled back"), ("g1", 650.0, 1250.0, "rolled back"),
        ("g1", 1310.0, 1910.0, "rolled back"), ("g1", 2030.0, 2630.0, "rolled back"),
        ("g1", 2870.0, 3000.5, "bound")]
    assert jobs[1].start == 3000.5 and sim.rollbacks == 4 and sim.reservations == 5
    raygpu_jobs = blocked(1)
    Sim("raygpu", np.array([8]), raygpu_jobs, 3600.0).run()
    assert raygpu_jobs[1].start == 3000.5  # here the retry was in flight when the single ended


def test_a_gang_in_back_off_misses_capacity_that_frees_meanwhile():
    jobs = last([single(0, 0.5, dur=1949.5), gang(1, 1.0)])  # the single ends at 1950: in the back-off 1910-2030
    sim = ScaleUpSim(np.array([8]), jobs, 3600.0)
    sim.run()
    assert sim.history[-2:] == [("g1", 1310.0, 1910.0, "rolled back"), ("g1", 2030.0, 2030.0, "bound")]
    assert jobs[1].start == 2030.0
    raygpu_jobs = last([single(0, 0.5, dur=1949.5), gang(1, 1.0)])
    Sim("raygpu", np.array([8]), raygpu_jobs, 3600.0).run()
    assert raygpu_jobs[1].start == 1950.0  # its reservation never lapses


def test_back_off_doubles_up_to_its_cap():
    assert [backoff_s(n) for n in range(1, 8)] == [30.0, 60.0, 120.0, 240.0, 480.0, 600.0, 600.0]


def test_cap_is_per_pool_and_gangs_stay_in_their_pool():
    pools = node_pools(len(POOL_CAPS), 4)
    jobs = synthetic(seed=3, n=300, n_pools=4, sizes=(2, 4))
    sim = ScaleUpSim(np.array(POOL_CAPS), jobs, 3600.0, pools, in_flight=1)
    most_at_once = []
    reserve = sim._reserve_oldest

    def counting():
        changed = reserve()
        by_pool = [sum(1 for pg in sim.reserved.values() if pg.job.pool == p) for p in range(4)]
        assert max(by_pool) <= 1
        most_at_once.append(sum(by_pool))
        return changed

    sim._reserve_oldest = counting
    result = sim.run()
    assert result["unfinished"] == 0 and result["max_in_flight"] == 1 and max(most_at_once) > 1  # pools in parallel
    assert all({int(pools[n]) for n, _ in j.placed} == {gang_pool(j.name, 4)} for j in jobs if j.gang)


def test_knobs_are_checked():
    with pytest.raises(ValueError):
        ScaleUpSim(np.array([8]), [gang(0, 1.0)], 3600.0, in_flight=0)
    from benchmarks.bench_gang_admission import main
    with pytest.raises(SystemExit):
        main(["--scale-up-in-flight", "0"])
