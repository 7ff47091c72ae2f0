"""Node pools in the gang-admission replay (benchmarks/_gang_admission_pools.py): one pool replays exactly as
before pools existed; with several, every policy keeps each gang on its pool's nodes, singles go anywhere, and
the guard holds at most one reservation per pool, on that pool's nodes."""

from __future__ import annotations

import random

import numpy as np
import pytest

from benchmarks._gang_admission_guard import GuardSim
from benchmarks._gang_admission_peers import PEERS
from benchmarks._gang_admission_pools import ANYWHERE, PoolMasks, gang_pool, node_pools
from benchmarks._gang_admission_scale_up import ScaleUpSim
from benchmarks._gang_admission_sim import POLICIES, Job, Sim

CAPS = [8, 8, 8, 8, 4, 4, 8, 8, 2, 8, 8, 8, 8, 8, 4, 8]


def synthetic(seed: int = 7, n: int = 200, n_pools: int | None = None, sizes=(2, 4, 8)) -> list[Job]:
    """Poisson arrivals (mean 40 s), 25% gangs of k x g GPUs, else 1-GPU singles, 60..3600 s each.
    ``n_pools``: pin each gang as make_jobs does; None: leave every job's pool at ANYWHERE."""
    rnd = random.Random(seed)
    t, jobs = 0.0, []
    for i in range(n):
        t += rnd.expovariate(1 / 40)
        k, g = (rnd.choice(sizes), rnd.choice((2, 4, 8))) if rnd.random() < 0.25 else (1, 1)
        name = f"job{i}"
        pool = gang_pool(name, n_pools) if (n_pools and k > 1) else ANYWHERE
        jobs.append(Job(i, name, t, rnd.uniform(60, 3600), k, g, gang=k > 1, queued=t, pool=pool))
    return jobs


# Recorded from the replay before pools existed (commit 6374387), on synthetic(): a one-pool run must match.
# The guard's rows are not recorded: it now runs the product's plan functions (a one-pool run must match the
# unpinned run instead).
BEFORE = {
    "pods": (10420.8, 18137.3, 8089.2, 0.688, 174.7, 0.0, 2, 8.23),
    "raycluster-gang": (10919.1, 20289.4, 7781.2, 0.647, 221.5, 0.0, 3, 8.84),
    "raygpu": (1769.5, 19123.9, 231.9, 0.909, 0.0, 0.0, 0, 7.8),
    "raygpu+guard": None,
    "no-hints": None,
}
KEYS = ("gang_wait_p50_s", "gang_wait_p95_s", "single_wait_p95_s", "mean_running_gpu_frac", "partial_gpu_h",
        "held_idle_gpu_h", "gave_up", "makespan_h")


def make_sim(policy: str, jobs: list[Job], caps: list[int], pools: np.ndarray | None) -> Sim:
    free = np.array(caps)
    if policy == "raygpu+guard":
        return GuardSim(free, jobs, 3600.0, 900.0, backfill="all", pools=pools)
    if policy == "no-hints":
        return GuardSim(free, jobs, 3600.0, 900.0, hints=False, pools=pools)
    if policy == "scale-up":
        return ScaleUpSim(free, jobs, 3600.0, pools)
    if policy in PEERS:
        return PEERS[policy](free, jobs, 3600.0, pools)
    return Sim(policy, free, jobs, 3600.0, pools)


def test_nodes_round_robin_into_pools():
    assert node_pools(7, 3).tolist() == [0, 1, 2, 0, 1, 2, 0]
    assert node_pools(5, 1).tolist() == [0] * 5
    with pytest.raises(ValueError):
        node_pools(3, 4)
    masks = PoolMasks(node_pools(6, 2))
    assert masks.only(1, np.arange(6)).tolist() == [0, 1, 0, 3, 0, 5] and masks.nodes(ANYWHERE) is None


@pytest.mark.parametrize("pinned", [False, True], ids=["unpinned", "pool0"])
@pytest.mark.parametrize("policy", list(BEFORE))
def test_one_pool_replays_exactly_as_before(policy, pinned):
    jobs = synthetic(n_pools=1 if pinned else None)
    assert all(j.pool == (0 if (pinned and j.gang) else ANYWHERE) for j in jobs)
    pools = node_pools(len(CAPS), 1) if pinned else None
    r = make_sim(policy, jobs, CAPS, pools).run()
    got = tuple(r[k] for k in KEYS)
    if "reservations" in r:
        got += (r["reservations"], r["backfilled"], r["reservation_timeouts"])
    if BEFORE[policy] is None:
        unpinned = make_sim(policy, synthetic(), CAPS, None).run()
        assert r["reservations"] > 0 and got[:8] == tuple(unpinned[k] for k in KEYS)
    else:
        assert got == BEFORE[policy]


POOL_CAPS = [8] * 24 + [4] * 8  # 4 pools of six 8-GPU and two 4-GPU nodes (56 GPUs): every gang fits its pool


def pooled_run(policy: str, n_pools: int = 4):
    pools = node_pools(len(POOL_CAPS), n_pools)
    jobs = synthetic(seed=3, n=300, n_pools=n_pools, sizes=(2, 4))
    sim = make_sim(policy, jobs, POOL_CAPS, pools)
    placed: list[tuple[Job, int]] = []
    place = sim.place

    def recording_place(j, i, n):
        placed.append((j, n))
        place(j, i, n)

    sim.place = recording_place
    return sim, pools, jobs, placed


@pytest.mark.parametrize("policy", POLICIES)
def test_every_policy_keeps_each_gang_on_its_pools_nodes(policy):
    sim, pools, jobs, placed = pooled_run(policy)
    result = sim.run()
    gangs = [j for j in jobs if j.gang]
    assert result["unfinished"] == 0 and len({j.pool for j in gangs}) == 4
    for j in gangs:  # where it ran (the guard's swap sets placed directly) and every pod placed on the way
        assert {int(pools[n]) for n, _ in j.placed} == {j.pool}, j.name
    assert all(int(pools[n]) == j.pool for j, n in placed if j.gang)
    singles_pools = {int(pools[n]) for j in jobs if not j.gang for n, _ in j.placed}
    assert len(singles_pools) > 1  # singles are not pinned (first-fit: which pools they reach depends on the run;
    # under scale-up never pool 3, the last node of each round-robin of four)


def test_guard_holds_at_most_one_reservation_per_pool_on_its_nodes():
    sim, pools, jobs, _ = pooled_run("raygpu+guard")
    seen: list[int] = []
    schedule = sim.schedule

    def checking_schedule():
        schedule()
        seen.append(len(sim.holds))
        blocked = np.zeros(len(POOL_CAPS), dtype=bool)
        for scope, h in sim.holds.items():
            nodes = [int(n) for n in h.nodes]
            assert h.job.pool == scope and {int(pools[n]) for n in nodes} == {scope}
            blocked[nodes] = True
        assert (sim.blocked == blocked).all()  # blockers stand only for a live hold, on its nodes

    sim.schedule = checking_schedule
    result = sim.run()
    assert max(seen) == result["max_reservations_at_once"] > 1  # pools do hold in parallel
    assert max(seen) <= 4 and result["pools"] == 4 and result["partial_gpu_h"] == 0
    assert not sim.blocked.any() and sim.free.tolist() == POOL_CAPS
