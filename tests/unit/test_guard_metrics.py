"""The starvation guard's gauges: computed purely (plan.guard.guard_gauges) and exported by the sidecar each cycle."""

from __future__ import annotations

from test_reclaim_cycle import FakeCache, fake_kube, raw_cm, reclaimer, with_reservation_group

from raygpu.model.gc import ReservationRecord
from raygpu.model.labels import ANNOTATION_GUARD_TIMEOUTS, KEY_GUARD_SCOPE
from raygpu.plan.guard import ScopeGauges, guard_gauges
from raygpu.testing.builders.recorded import NOW_S


def guarded(name: str, scope: str | None, state: str = "reserved", timeouts: str | None = None) -> ReservationRecord:
    raw = raw_cm(name, f"rg-{name}", state=state)
    if scope is not None:
        raw["metadata"]["labels"][KEY_GUARD_SCOPE] = scope
    if timeouts is not None:
        raw["metadata"]["annotations"][ANNOTATION_GUARD_TIMEOUTS] = timeouts
    return ReservationRecord.from_configmap(raw)


def test_gauges_count_only_guarded_gangs_that_still_wait_per_scope():
    rs = [guarded("a", "team-a", timeouts="2"), guarded("b", "team-a", state="planned", timeouts="bad"),
          guarded("c", "team-a", state="ready", timeouts="5"), guarded("d", None), guarded("e", "team-b")]
    assert rs[1].guard_timeouts == 0  # a bad annotation counts as none, it does not fail the cycle
    got = guard_gauges(rs, {"a": 100.0, "b": 250.0, "e": 290.0}, now_s=300.0)
    assert got == (ScopeGauges(scope="team-a", waiting=2, timeouts=2, longest_wait_s=200.0),
                   ScopeGauges(scope="team-b", waiting=1, timeouts=0, longest_wait_s=10.0))
    assert guard_gauges(rs, {}, now_s=300.0)[0].longest_wait_s == 0.0  # never seen before: seen now
    assert guard_gauges(rs, {"a": 400.0}, now_s=300.0)[0].longest_wait_s == 0.0  # never negative


def test_the_sidecar_exports_them_and_drops_a_scope_once_nobody_waits_there():
    kube = fake_kube(with_reservation_group("rg-a", replicas=0))
    cache = FakeCache(kube, [guarded("a", "team-a", timeouts="1")])
    now = [NOW_S]
    r = reclaimer(kube, cache)
    r.clock = lambda: now[0]
    r.cycle()
    now[0] += 30
    r.cycle()

    def sample(name: str) -> float | None:
        return r.metrics.registry.get_sample_value(name, {"scope": "team-a"})
    assert (sample("raygpu_guard_waiting_gangs"), sample("raygpu_guard_timeouts"),
            sample("raygpu_guard_longest_wait_seconds")) == (1.0, 1.0, 30.0)
    cache.reservations = (guarded("a", "team-a", state="ready"),)
    r.cycle()
    assert sample("raygpu_guard_waiting_gangs") is None and sample("raygpu_guard_longest_wait_seconds") is None
