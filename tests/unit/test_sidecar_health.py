"""The sidecar's health cycle (issue 28 item 4): raygpu.io/doctor-interval, the raygpu_doctor_findings gauge,
deduplicated DoctorFinding Events, and the unhealthy node fed to the reclaimer's plan. On the fakes of
test_reclaim_cycle (a RayCluster store with API-server semantics)."""

from __future__ import annotations

import copy

import pytest

from raygpu.errors import ForbiddenError
from raygpu.model.annotations import parse_cluster_policy
from raygpu.model.labels import KEY_DOCTOR_INTERVAL
from raygpu.model.reclaim import DecisionAction
from raygpu.testing.builders.recorded import NOW_S, RECORDED
from test_reclaim_cycle import fake_kube, reclaimer

INTERVALS = [("5m", 300.0, None), ("1h", 3600.0, None), ("off", None, None), ("OFF", None, None),
             ("10s", None, "between 60 s and 24 h"), ("2d", None, "not a duration"), ("soon", None, "not a duration")]


@pytest.mark.parametrize("raw, seconds, problem", INTERVALS, ids=[c[0] for c in INTERVALS])
def test_doctor_interval_annotation(raw, seconds, problem):
    policy, problems = parse_cluster_policy({KEY_DOCTOR_INTERVAL: raw})
    assert policy.doctor_interval_s == seconds
    if problem is None:
        assert problems == []
    else:
        (p,) = problems
        assert p.key == KEY_DOCTOR_INTERVAL and problem in p.reason and p.default_used == "'off'"
    assert parse_cluster_policy({})[0].doctor_interval_s is None  # off by default


def raw_node(name: str, gpus: int = 8, conditions=()) -> dict:
    pool = "elsewhere" if name == "other" else "record-none"  # the recorded groups' nodeSelector
    return {"metadata": {"name": name, "labels": {"raygpu.io/pool": pool}}, "spec": {},
            "status": {"capacity": {"nvidia.com/gpu": str(gpus), "cpu": "96"},
                       "allocatable": {"nvidia.com/gpu": str(gpus), "cpu": "96"},
                       "conditions": [{"type": "Ready", "status": "True"}, *conditions]}}


XID = {"type": "GpuXidError", "status": "True", "reason": "Xid79", "message": "GPU 3 fell off the bus"}


def world(interval: str | None = "5m", bad: bool = True):
    raw = copy.deepcopy(RECORDED)
    if interval is not None:
        raw["metadata"].setdefault("annotations", {})[KEY_DOCTOR_INTERVAL] = interval
    kube = fake_kube(raw)
    for name in ("k0", "k1", "k2", "k3", "k4", "other"):
        kube.put(raw_node(name, 0 if name == "k0" else 8, [XID] if bad and name in ("k2", "other") else []), "Node")
    return kube


def gauge(r, check, severity):
    return r.metrics.registry.get_sample_value("raygpu_doctor_findings", {"check": check, "severity": severity})


def test_a_marked_node_gives_the_gauge_one_event_and_goes_first_in_the_plan():
    kube = world()
    r = reclaimer(kube)
    report = r.cycle()
    assert gauge(r, "node-health", "critical") == 1  # k2 only: "other" runs no pod of this cluster
    assert gauge(r, "gpu-xid", "critical") == 0  # every kind is exported, 0 when none
    told = [e for e in kube.with_reason("DoctorFinding") if "node-health" in e.message]
    assert len(told) == 1 and told[0].type == "Warning" and "node/k2" in told[0].message
    assert "GpuXidError=True (Xid79: GPU 3 fell off the bus)" in told[0].message and "Fix:" in told[0].message
    assert r.health.unhealthy.keys() == {"k2", "other"}  # the planners steer around both
    # reservations keep off the marked node their pods could use; "other" is in a pool they cannot use
    assert r.health.keep_off == ("k2",) and r._scale_up.unhealthy_nodes == ("k2",)
    d = {x.pod_name: x for x in report.plan.decisions}
    assert d["rc-gpu-worker-b"].action is DecisionAction.DELETE and "marked unhealthy" in d["rc-gpu-worker-b"].detail
    assert "marked unhealthy" not in d["rc-gpu-worker-a"].detail


def test_events_are_deduplicated_and_told_again_when_the_finding_comes_back():
    kube = world()
    clock = [NOW_S]
    r = reclaimer(kube)
    r.clock = lambda: clock[0]
    r.cycle()
    clock[0] += 301  # due again: the same finding is not told twice
    r.cycle()
    assert len([e for e in kube.with_reason("DoctorFinding") if "node/k2" in e.message]) == 1
    kube.put(raw_node("k2"), "Node")  # the agent cleared it
    clock[0] += 301
    r.cycle()
    assert gauge(r, "node-health", "critical") == 0 and "k2" not in r.health.unhealthy
    kube.put(raw_node("k2", conditions=[XID]), "Node")
    clock[0] += 301
    r.cycle()
    assert len([e for e in kube.with_reason("DoctorFinding") if "node/k2" in e.message]) == 2


def test_not_due_before_the_interval_and_off_reads_no_node():
    kube = world()
    clock = [NOW_S]
    r = reclaimer(kube)
    r.clock = lambda: clock[0]
    r.cycle()
    clock[0] += 60
    r.cycle()
    assert len([a for m, a in kube.calls if m == "list" and a[1] == "Node"]) == 1
    kube2 = world(interval=None)
    r2 = reclaimer(kube2)
    r2.cycle()
    assert not [a for m, a in kube2.calls if m == "list" and a[1] == "Node"]
    assert gauge(r2, "node-health", "critical") is None and not kube2.with_reason("DoctorFinding")


def test_a_malformed_interval_is_an_invalid_annotation_event_and_stays_off():
    kube = world(interval="often")
    r = reclaimer(kube)
    r.cycle()
    (e,) = [e for e in kube.with_reason("InvalidAnnotation") if KEY_DOCTOR_INTERVAL in e.message]
    assert "using 'off'" in e.message
    assert not [a for m, a in kube.calls if m == "list" and a[1] == "Node"]


def test_without_permission_to_list_nodes_the_cycle_goes_on():
    kube = world()
    kube.fail("list", ForbiddenError("nodes is forbidden"), times=10, when=lambda *a: a[1] == "Node")
    r = reclaimer(kube)
    report = r.cycle()
    assert report.plan is not None and r.health.unhealthy == {} and gauge(r, "node-health", "critical") is None
