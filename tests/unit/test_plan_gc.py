"""plan_gc as a table: one reservation per line, the verdict expected."""

from __future__ import annotations

import pytest

from benchmarks._decision_reference import executed_lines
from raygpu.model.gc import GcAction, GcReason, OrphanGroup, ReservationRecord, SeenAt, is_reservation_group
from raygpu.model.labels import LABEL_RESERVATION
from raygpu.model.raycluster import GroupTemplate, RayClusterView
from raygpu.model.views import PgState, PlacementGroupView, RayView
from raygpu.plan.reclaim.gc import plan_gc

NOW_S = 1_000_000.0
RC_UID = "uid-rc"
G = GcReason


def group(name: str, *, label: str | None = "own", replicas: int = 1) -> GroupTemplate:
    """A worker group; label="own": its pod template carries raygpu.io/reservation=<name>, None: no label."""
    labels = {} if label is None else {LABEL_RESERVATION: name if label == "own" else label}
    return GroupTemplate(group_name=name, replicas=replicas, min_replicas=replicas,
                         template={"metadata": {"labels": labels}, "spec": {}})


def cluster(*groups: GroupTemplate) -> RayClusterView:
    return RayClusterView(name="rc", namespace="ns", uid=RC_UID, head=GroupTemplate(group_name="head", is_head=True),
                          worker_groups=groups)


CLUSTER = cluster(*(group(f"rg-{n}") for n in ("r1", "a", "b", "c", "z")))


def rsv(name="r1", *, state="ready", pg=None, job=None, quiet_s=5.0, clock_off_s=0.0, deadline_left_s=None,
        cluster_label="rc", owner_uid=RC_UID, labelled=True) -> tuple[ReservationRecord, SeenAt]:
    """A reservation ConfigMap as the sidecar parses it, and when the sidecar saw it.

    ``quiet_s``: the sidecar saw the heartbeat take its value that long ago (its clock);
    ``clock_off_s``: how far the driver's clock (heartbeat, deadline) is off the sidecar's;
    ``deadline_left_s``: the time left to the deadline when the driver wrote that heartbeat.
    """
    beat_s = NOW_S - quiet_s + clock_off_s
    r = ReservationRecord(name=name, namespace="ns", group=f"rg-{name}" if labelled else "", cluster=cluster_label,
                          state=state, placement_group_id=pg, owner_job=job, created_at_s=NOW_S - 600,
                          uid=f"u-{name}", owner_uids=(owner_uid,) if owner_uid else (), heartbeat_at_s=beat_s,
                          deadline_at_s=None if deadline_left_s is None else beat_s + deadline_left_s)
    return r, SeenAt(first_s=NOW_S - 600, heartbeat_s=NOW_S - quiet_s)


def plan(*rs: tuple[ReservationRecord, SeenAt], view=None, cl=CLUSTER, **kw):
    return plan_gc([r for r, _ in rs], view or ray(), NOW_S, cluster=cl, seen={r.name: s for r, s in rs}, **kw)


def ray(*pgs: tuple[str, str], reachable: bool = True) -> RayView:
    return RayView(reachable=reachable, placement_groups=tuple(
        PlacementGroupView(pg_id=i, state=PgState(s), bundles=({"GPU": 8},)) for i, s in pgs))


KEEPS = {G.LIVE, G.UNPROVEN, G.RAY_SAYS_ALIVE}
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
    ("heartbeat lost", rsv(quiet_s=61), ray(), None, G.HEARTBEAT_LOST),
    ("heartbeat at the limit is still live", rsv(quiet_s=60), ray(), None, G.LIVE),
    ("heartbeat lost even when Ray is down", rsv(quiet_s=300), ray(reachable=False), None, G.HEARTBEAT_LOST),
    # issue 14 item 11: the driver's clock is never compared with the sidecar's
    ("driver clock 61 s behind, heartbeat just changed", rsv(clock_off_s=-61), ray(), None, G.LIVE),
    ("driver clock 1 h behind, heartbeat just changed", rsv(clock_off_s=-3600), ray(), None, G.LIVE),
    ("driver clock 1 h ahead, heartbeat unchanged 61 s", rsv(clock_off_s=3600, quiet_s=61), ray(), None,
     G.HEARTBEAT_LOST),
    ("deadline long missed, not ready", rsv(state="reserved", deadline_left_s=-61), ray(), None, G.DEADLINE_MISSED),
    ("deadline missed, driver clock 1 h ahead", rsv(state="reserved", deadline_left_s=-61, clock_off_s=3600), ray(),
     None, G.DEADLINE_MISSED),
    ("deadline far by the driver, its clock 1 h behind", rsv(state="reserved", deadline_left_s=30,
                                                              clock_off_s=-3600), ray(), None, G.LIVE),
    ("deadline just passed: the watchdog's turn", rsv(state="reserved", deadline_left_s=-30), ray(), None, G.LIVE),
    ("deadline missed but ready", rsv(state="ready", deadline_left_s=-600), ray(), None, G.LIVE),
    ("unknown state is judged by the other rules", rsv(state="weird", quiet_s=1), ray(), None, G.LIVE),
    # issue 14 item 1: a ConfigMap raygpu cannot prove it created is never touched, whatever it says
    ("no ownerReference", rsv(state="released", owner_uid=None), ray(), None, G.UNPROVEN),
    ("ownerReference to another RayCluster", rsv(state="failed", owner_uid="uid-other"), ray(), None, G.UNPROVEN),
    ("another cluster's label", rsv(state="released", cluster_label="other"), ray(), None, G.UNPROVEN),
    ("no reservation label", rsv(state="released", labelled=False), ray(), None, G.UNPROVEN),
    # order: the first rule wins
    ("terminal before PG gone", rsv(state="released", pg="aa"), ray(), None, G.TERMINAL),
    ("PG gone before job dead", rsv(pg="aa", job="j"), ray(), {"j": False}, G.PLACEMENT_GROUP_GONE),
    ("job dead before heartbeat", rsv(job="j", quiet_s=500), ray(), {"j": False}, G.OWNER_JOB_DEAD),
    # issue 24 item 1, the liveness rule: Ray's word first, the heartbeat only where Ray has none
    ("stale heartbeat, Ray: PG CREATED, job alive", rsv(pg="aa", job="j", quiet_s=600), ray(("aa", "CREATED")),
     {"j": True}, G.RAY_SAYS_ALIVE),
    ("stale heartbeat, Ray: PG CREATED, job table unread", rsv(pg="aa", job="j", quiet_s=600),
     ray(("aa", "CREATED")), None, G.RAY_SAYS_ALIVE),
    ("stale heartbeat, Ray: PG RESCHEDULING (held for a live job)", rsv(pg="aa", quiet_s=600),
     ray(("aa", "RESCHEDULING")), None, G.RAY_SAYS_ALIVE),
    ("stale heartbeat, no PG yet, Ray: job alive", rsv(state="reserved", job="j", quiet_s=600), ray(), {"j": True},
     G.RAY_SAYS_ALIVE),
    ("stale heartbeat, Ray: job dead though its PG is CREATED", rsv(pg="aa", job="j", quiet_s=600),
     ray(("aa", "CREATED")), {"j": False}, G.OWNER_JOB_DEAD),
    ("stale heartbeat, Ray: job dead, no PG", rsv(job="j", quiet_s=600), ray(), {"j": False}, G.OWNER_JOB_DEAD),
    ("stale heartbeat, Ray unreachable: heartbeat rules", rsv(pg="aa", job="j", quiet_s=61), ray(reachable=False),
     None, G.HEARTBEAT_LOST),
    ("stale heartbeat, job unknown to Ray, no PG: heartbeat rules", rsv(job="j", quiet_s=61), ray(), {"k": True},
     G.HEARTBEAT_LOST),
    ("Ray's word does not excuse a missed deadline", rsv(state="reserved", job="j", quiet_s=600,
                                                          deadline_left_s=-61), ray(), {"j": True},
     G.DEADLINE_MISSED),
    ("fresh heartbeat and Ray's word: plainly live", rsv(pg="aa", job="j"), ray(("aa", "CREATED")), {"j": True},
     G.LIVE),
]


@pytest.mark.parametrize("case, reservation, view, jobs, expected", CASES, ids=[c[0] for c in CASES])
def test_verdict(case, reservation, view, jobs, expected):
    p = plan(reservation, view=view, jobs=jobs)
    (d,) = p.decisions
    assert d.reason is expected, d.detail
    assert d.action is (GcAction.KEEP if expected in KEEPS else GcAction.RELEASE)
    assert d.detail
    assert p.to_release == (() if expected in KEEPS else (d,))
    assert d.state_uid == ("" if expected is G.UNPROVEN else reservation[0].uid)


def test_heartbeat_timeout_is_a_parameter():
    assert plan(rsv(quiet_s=30), heartbeat_timeout_s=20).decisions[0].reason is G.HEARTBEAT_LOST


def test_a_reservation_the_sidecar_never_saw_waits_the_full_timeout():
    """A restarted sidecar counts from the restart: no ``seen`` entry is first seen now."""
    r, _ = rsv(quiet_s=3600, clock_off_s=0)
    (d,) = plan_gc([r], ray(), NOW_S, cluster=CLUSTER).decisions
    assert d.reason is G.LIVE, d.detail


def test_the_group_is_written_only_when_its_template_proves_it():
    p = plan(rsv(state="released"), cl=cluster(group("rg-r1", label=None)))
    (d,) = p.to_release
    assert d.reason is G.TERMINAL and not d.group_owned and d.state_uid == "u-r1"
    assert "left alone" in d.detail
    assert plan(rsv(state="released")).to_release[0].group_owned
    assert not is_reservation_group(group("rg-r1", label="rg-other"))  # another group's name is no proof


def test_every_judged_group_is_left_to_gc_released_or_not():
    p = plan(rsv("a"), rsv("b", state="released"), rsv("c", quiet_s=999))
    assert p.reservation_groups == {"rg-a", "rg-b", "rg-c"}
    assert [d.reservation for d in p.to_release] == ["b", "c"]


ORPHANS = cluster(group("rg-a"), group("rg-a100", label=None), group("rg-lost"), group("rg-new"),
                  group("rg-never"), group("rg-zero", replicas=0))


def test_a_group_without_state_is_scaled_to_zero_only_with_both_proofs():
    """Issue 14 item 1: a user's rg-a100 (no label) is never touched, even after its 'state' was seen."""
    orphans = {"rg-a100": OrphanGroup(since_s=0.0, state_seen=True),
               "rg-lost": OrphanGroup(since_s=NOW_S - 61, state_seen=True),
               "rg-new": OrphanGroup(since_s=NOW_S - 5, state_seen=True),
               "rg-never": OrphanGroup(since_s=0.0, state_seen=False),
               "rg-zero": OrphanGroup(since_s=0.0, state_seen=True),
               "rg-a": OrphanGroup(since_s=0.0, state_seen=True)}
    p = plan(rsv("a"), cl=ORPHANS, orphan_groups=orphans)
    by_group = {d.group: d for d in p.decisions}
    assert (by_group["rg-a100"].action, by_group["rg-a100"].reason) == (GcAction.KEEP, G.UNPROVEN)
    assert (by_group["rg-never"].action, by_group["rg-never"].reason) == (GcAction.KEEP, G.UNPROVEN)
    assert by_group["rg-new"].reason is G.LIVE  # the watch may lag: wait the timeout
    assert (by_group["rg-zero"].action, by_group["rg-zero"].reason) == (GcAction.KEEP, G.STATE_LOST)
    lost = by_group["rg-lost"]
    assert (lost.action, lost.reason, lost.group_owned, lost.state_uid) == (
        GcAction.SCALE_TO_ZERO, G.STATE_LOST, True, "")  # never a ConfigMap to delete
    assert by_group["rg-a"].reservation == "a"  # it has a state object: judged by it, not as an orphan
    assert [d.group for d in p.to_release] == ["rg-lost"]
    assert p.reservation_groups == {"rg-a", "rg-a100", "rg-lost", "rg-new", "rg-never", "rg-zero"}


def test_pure_and_sorted():
    rs = [rsv("z", quiet_s=999), rsv("a")]
    assert plan(*rs) == plan(*reversed(rs))
    assert [d.reservation for d in plan(*rs).decisions] == ["a", "z"]


def test_parses_the_configmap_the_gang_module_writes():
    cm = {"metadata": {"name": "c-rg-train", "namespace": "ns", "uid": "u1",
                       "creationTimestamp": "2026-01-01T00:00:00Z",
                       "labels": {"raygpu.io/reservation": "rg-train", "raygpu.io/cluster": "c",
                                  "raygpu.io/owner-job": "01000000"},
                       "ownerReferences": [{"apiVersion": "ray.io/v1", "kind": "RayCluster", "name": "c",
                                            "uid": "uid-c"},
                                           {"apiVersion": "v1", "kind": "ConfigMap", "name": "x", "uid": "uid-x"}],
                       "annotations": {"raygpu.io/reservation-state": "ready", "raygpu.io/placement-group": "ab12",
                                       "raygpu.io/heartbeat-at": "1767225610", "raygpu.io/deadline-at": "oops"}},
          "data": {"plan.json": "{}"}}
    r = ReservationRecord.from_configmap(cm)
    assert (r.name, r.group, r.cluster, r.state, r.placement_group_id, r.owner_job) == (
        "c-rg-train", "rg-train", "c", "ready", "ab12", "01000000")
    assert r.heartbeat_at_s == 1767225610.0 and r.deadline_at_s is None
    assert r.created_at_s == 1767225600.0
    assert r.owner_uids == ("uid-c",)
    assert r.owned_by("c", "uid-c") and not r.owned_by("c", "uid-x") and not r.owned_by("d", "uid-c")
    unlabelled = ReservationRecord.from_configmap({"metadata": {"name": "c-rg-x", "uid": "u2"}})
    assert unlabelled.group == "" and "no label" in unlabelled.missing_proof("c", "uid-c")


def _many(n: int):
    """n proven reservations, each with its own group, PG and job, in every verdict in turn; n/10 orphan groups."""
    verdicts = [dict(pg="p{i}", job="j{i}"), dict(pg="p{i}", job="j{i}", quiet_s=600), dict(state="released"),
                dict(job="j{i}", quiet_s=600, state="reserved", deadline_left_s=-61), dict(pg="gone{i}")]
    rs = [rsv(f"n{i}", **{k: v.format(i=i) if isinstance(v, str) and k != "state" else v
                          for k, v in verdicts[i % len(verdicts)].items()}) for i in range(n)]
    orphans = {f"rg-o{i}": OrphanGroup(since_s=0.0, state_seen=True) for i in range(n // 10)}
    cl = cluster(*(group(f"rg-n{i}") for i in range(n)), *(group(g) for g in orphans))
    view = ray(*((f"p{i}", "CREATED") for i in range(n)))
    jobs = {f"j{i}": True for i in range(n)}
    return lambda: plan(*rs, view=view, cl=cl, jobs=jobs, orphan_groups=orphans)


def test_plan_gc_executes_lines_linear_in_reservations():
    """Issue 24 item 3: each reservation's worker group was found by scanning the cluster's groups (23 ms at 1,000
    reservations, 1.42 s at 8,000). Counted in executed Python lines (test_cycle_linear_work.py says why), 8 times
    the reservations may cost at most a little more than 8 times the lines; a scan per reservation costs ~60."""
    small, large = _many(1000), _many(8000)
    p = small()
    assert {d.reason for d in p.decisions} >= {G.LIVE, G.RAY_SAYS_ALIVE, G.TERMINAL, G.DEADLINE_MISSED,
                                               G.PLACEMENT_GROUP_GONE, G.STATE_LOST}  # every path is exercised
    lines = [executed_lines(small), executed_lines(large)]
    assert lines[0] > 10 * 1000  # it counted plan_gc's work
    assert lines[1] <= 8 * 1.1 * lines[0], lines
