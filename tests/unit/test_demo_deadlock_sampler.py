"""The deadlock demo's sampler: a gang caught while its admitted pods bind is not half-placed; one that stays
partial is, for all of its time."""

from __future__ import annotations

from types import SimpleNamespace

from raygpu.demo.deadlock import BINDING_GRACE_S, RunResult, _Sampler


def _pods(tenant: str, bound: int, total: int = 6) -> list:
    return [SimpleNamespace(ray_cluster=tenant, node_name=f"n{i}" if i < bound else "",
                            limits={"nvidia.com/gpu": 8}) for i in range(total)]


def _sampler() -> tuple[_Sampler, RunResult]:
    result = RunResult(mode="raygpu", backend="workload")
    s = _Sampler(kube=None, ns="ns", result=result, sample_s=0.5, gang_size=6)
    return s, result


def test_a_gang_seen_while_its_pods_bind_is_not_half_placed() -> None:
    s, r = _sampler()
    s.last = 0.0
    for t, bound in ((0.5, 0), (1.0, 1), (1.5, 4), (2.0, 6), (2.5, 6)):  # admitted at once, bound over 1 s
        s.sample(_pods("tenant-b", bound), t)
    assert r.max_gpus_held_by_partial_gangs == 0 and r.partial_gang_gpu_s == 0
    assert r.idle_gpu_s > 0  # its bound pods are idle until its placement group is ready


def test_a_gang_that_stays_partial_is_half_placed_from_the_first_sample_that_saw_it() -> None:
    s, r = _sampler()
    s.last = 0.0
    t = 0.5
    while t <= 10.0 + 1e-9:  # 4 of 6 bound from 0.5 s to 10 s
        s.sample(_pods("tenant-a", 4) + _pods("tenant-b", 0), t)
        t += 0.5
    assert r.max_gpus_held_by_partial_gangs == 32
    assert abs(r.partial_gang_gpu_s - 32 * 9.5) < 1e-6  # all of its partial time, the grace included
    # it binds the rest: no longer partial, and a later short partial run starts a new grace
    s.sample(_pods("tenant-a", 6), 10.5)
    before = r.partial_gang_gpu_s
    s.sample(_pods("tenant-a", 5), 11.0)
    s.sample(_pods("tenant-a", 5), 11.0 + BINDING_GRACE_S - 0.5)
    assert r.partial_gang_gpu_s == before
