"""plan_gc as a table: one reservation per line, the verdict expected."""

from __future__ import annotations

import pytest

from raygpu.model.gc import GcAction, GcReason, ReservationRecord
from raygpu.model.views import PgState, PlacementGroupView, RayView
from raygpu.plan.gc import plan_gc

NOW_S = 1_000_000.0
G = GcReason


def rsv(name="r1", *, state="ready", pg=None, job=None, beat_ago_s=5.0, deadline_in_s=None, age_s=600.0):
    """A reservation ConfigMap as the sidecar parses it; beat_ago_s=None: no heartbeat annotation."""
    return ReservationRecord(name=name, namespace="ns", group=f"rg-{name}", cluster="rc", state=state,
                             placement_group_id=pg, owner_job=job, created_at_s=NOW_S - age_s,
                             heartbeat_at_s=None if beat_ago_s is None else NOW_S - beat_ago_s,
                             deadline_at_s=None if deadline_in_s is None else NOW_S + deadline_in_s)


def ray(*pgs: tuple[str, str], reachable: bool = True) -> RayView:
    return RayView(reachable=reachable, placement_groups=tuple(
        PlacementGroupView(pg_id=i, state=PgState(s), bundles=({"GPU": 8},)) for i, s in pgs))


CASES = [
    # (case, reservation, ray view, jobs, expected reason)
    ("live: recent heartbeat, PG created", rsv(pg="aa"), ray(("aa", "CREATED")), None, G.LIVE),
    ("live: PG still pending", rsv(pg="aa", state="bound"), ray(("aa", "PENDING")), None, G.LIVE),
    ("live: no PG recorded yet", rsv(state="reserved"), ray(), None, G.LIVE),
    ("released leftovers", rsv(state="released"), ray(), None, G.TERMINAL),
    ("rolled back leftovers", rsv(state="rolled_back"), ray(), None, G.TERMINAL),
    ("state case-insensitive", rsv(state="Released"), ray(), None, G.TERMINAL),
    ("failed, rollback unfinished", rsv(state="failed"), ray(), None, G.FAILED),
    ("PG removed", rsv(pg="aa"), ray(("aa", "REMOVED")), None, G.PLACEMENT_GROUP_GONE),
    ("PG absent from Ray", rsv(pg="aa"), ray(("bb", "CREATED")), None, G.PLACEMENT_GROUP_GONE),
    ("Ray unreachable: PG rule skipped", rsv(pg="aa"), ray(reachable=False), None, G.LIVE),
    ("owner job dead", rsv(pg="aa", job="01000000"), ray(("aa", "CREATED")), {"01000000": False}, G.OWNER_JOB_DEAD),
    ("owner job alive", rsv(pg="aa", job="01000000"), ray(("aa", "CREATED")), {"01000000": True}, G.LIVE),
    ("owner job unknown to Ray: not taken for dead", rsv(job="02000000"), ray(), {"01000000": False}, G.LIVE),
    ("job table unread: rule skipped", rsv(job="01000000"), ray(), None, G.LIVE),
    ("heartbeat lost", rsv(beat_ago_s=61), ray(), None, G.HEARTBEAT_LOST),
    ("heartbeat at the limit is still live", rsv(beat_ago_s=60), ray(), None, G.LIVE),
    ("heartbeat lost even when Ray is down", rsv(beat_ago_s=300), ray(reachable=False), None, G.HEARTBEAT_LOST),
    ("no heartbeat: counted from creation", rsv(beat_ago_s=None, age_s=120), ray(), None, G.HEARTBEAT_LOST),
    ("no heartbeat, just created", rsv(beat_ago_s=None, age_s=10), ray(), None, G.LIVE),
    ("deadline long missed, not ready", rsv(state="reserved", deadline_in_s=-61), ray(), None, G.DEADLINE_MISSED),
    ("deadline just passed: the watchdog's turn", rsv(state="reserved", deadline_in_s=-30), ray(), None, G.LIVE),
    ("deadline missed but ready", rsv(state="ready", deadline_in_s=-600), ray(), None, G.LIVE),
    ("unknown state is judged by the other rules", rsv(state="weird", beat_ago_s=1), ray(), None, G.LIVE),
    # order: the first rule wins
    ("terminal before PG gone", rsv(state="released", pg="aa"), ray(), None, G.TERMINAL),
    ("PG gone before job dead", rsv(pg="aa", job="j"), ray(), {"j": False}, G.PLACEMENT_GROUP_GONE),
    ("job dead before heartbeat", rsv(job="j", beat_ago_s=500), ray(), {"j": False}, G.OWNER_JOB_DEAD),
]


@pytest.mark.parametrize("case, reservation, view, jobs, expected", CASES, ids=[c[0] for c in CASES])
def test_verdict(case, reservation, view, jobs, expected):
    plan = plan_gc([reservation], view, NOW_S, jobs=jobs)
    (d,) = plan.decisions
    assert d.reason is expected, d.detail
    assert d.action is (GcAction.KEEP if expected is G.LIVE else GcAction.RELEASE)
    assert d.detail
    assert plan.to_release == (() if expected is G.LIVE else (d,))


def test_heartbeat_timeout_is_a_parameter():
    assert plan_gc([rsv(beat_ago_s=30)], ray(), NOW_S, heartbeat_timeout_s=20).decisions[0].reason is G.HEARTBEAT_LOST


def test_every_reservation_group_is_left_to_gc_released_or_not():
    plan = plan_gc([rsv("a"), rsv("b", state="released"), rsv("c", beat_ago_s=999)], ray(), NOW_S)
    assert plan.reservation_groups == {"rg-a", "rg-b", "rg-c"}
    assert [d.reservation for d in plan.to_release] == ["b", "c"]


def test_a_reservation_group_without_state_is_released_after_the_timeout():
    orphans = {"rg-lost": ("rc-rg-lost", NOW_S - 61), "rg-new": ("rc-rg-new", NOW_S - 5), "rg-a": ("rc-rg-a", 0.0)}
    plan = plan_gc([rsv("a")], ray(), NOW_S, orphan_groups=orphans)
    by_group = {d.group: d for d in plan.decisions}
    assert by_group["rg-lost"].reason is G.STATE_LOST and by_group["rg-lost"].reservation == "rc-rg-lost"
    assert by_group["rg-new"].reason is G.LIVE  # the watch may show a new group before its ConfigMap
    assert by_group["rg-a"].reservation == "a"  # it has a state object: judged by it, not as an orphan
    assert [d.group for d in plan.to_release] == ["rg-lost"]
    assert plan.reservation_groups == {"rg-a", "rg-lost", "rg-new"}  # the reclaimer leaves all three to the GC


def test_pure_and_sorted():
    rs = [rsv("z", beat_ago_s=999), rsv("a")]
    assert plan_gc(rs, ray(), NOW_S) == plan_gc(list(reversed(rs)), ray(), NOW_S)
    assert [d.reservation for d in plan_gc(rs, ray(), NOW_S).decisions] == ["a", "z"]


def test_parses_the_configmap_the_gang_module_writes():
    cm = {"metadata": {"name": "c-rg-train", "namespace": "ns", "uid": "u1",
                       "creationTimestamp": "2026-01-01T00:00:00Z",
                       "labels": {"raygpu.io/reservation": "rg-train", "raygpu.io/cluster": "c",
                                  "raygpu.io/owner-job": "01000000"},
                       "annotations": {"raygpu.io/reservation-state": "ready", "raygpu.io/placement-group": "ab12",
                                       "raygpu.io/heartbeat-at": "1767225610", "raygpu.io/deadline-at": "oops"}},
          "data": {"plan.json": "{}"}}
    r = ReservationRecord.from_configmap(cm)
    assert (r.name, r.group, r.cluster, r.state, r.placement_group_id, r.owner_job) == (
        "c-rg-train", "rg-train", "c", "ready", "ab12", "01000000")
    assert r.heartbeat_at_s == 1767225610.0 and r.deadline_at_s is None
    assert r.created_at_s == 1767225600.0
