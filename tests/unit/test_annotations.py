"""parse_cluster_policy: good values parse, bad ones give a problem and the safe default, nothing raises."""

from __future__ import annotations

import pytest

from raygpu.model.annotations import ClusterPolicy, ReclaimMode, ReconcileMode, parse_cluster_policy, parse_duration_s
from raygpu.model.gang import Backend

DEFAULTS = ClusterPolicy()


def test_no_annotations_give_safe_defaults():
    policy, problems = parse_cluster_policy({})
    assert problems == []
    assert (policy.gang_backend, policy.queue, policy.gang_template, policy.idle_timeout_s, policy.reclaim,
            policy.reconcile) == (Backend.NONE, None, None, 600.0, ReclaimMode.DRY_RUN, ReconcileMode.REPORT)
    assert parse_cluster_policy(None) == (policy, [])


@pytest.mark.parametrize("key,value,field,expected", [
    ("raygpu.io/gang-backend", "coscheduling", "gang_backend", Backend.COSCHEDULING),
    ("raygpu.io/gang-backend", " Kueue ", "gang_backend", Backend.KUEUE),
    ("raygpu.io/gang-backend", "volcano", "gang_backend", Backend.VOLCANO),
    ("raygpu.io/queue", "team-a", "queue", "team-a"),
    ("raygpu.io/gang-template", "gpu-a100", "gang_template", "gpu-a100"),
    ("raygpu.io/idle-timeout", "300s", "idle_timeout_s", 300.0),
    ("raygpu.io/idle-timeout", "5m", "idle_timeout_s", 300.0),
    ("raygpu.io/idle-timeout", "1h", "idle_timeout_s", 3600.0),
    ("raygpu.io/idle-timeout", "1h30m", "idle_timeout_s", 5400.0),
    ("raygpu.io/idle-timeout", "90", "idle_timeout_s", 90.0),
    ("raygpu.io/idle-timeout", "2.5", "idle_timeout_s", 2.5),
    ("raygpu.io/reclaim", "on", "reclaim", ReclaimMode.ON),
    ("raygpu.io/reclaim", "OFF", "reclaim", ReclaimMode.OFF),
    ("raygpu.io/reconcile", "repair", "reconcile", ReconcileMode.REPAIR),
])
def test_good_values(key, value, field, expected):
    policy, problems = parse_cluster_policy({key: value})
    assert problems == []
    assert getattr(policy, field) == expected


@pytest.mark.parametrize("key,value,field,words", [
    ("raygpu.io/gang-backend", "slurm", "gang_backend", "coscheduling|kueue|volcano|workload|none"),
    ("raygpu.io/gang-backend", "", "gang_backend", "expected one of"),
    ("raygpu.io/queue", "   ", "queue", "empty"),
    ("raygpu.io/gang-template", "", "gang_template", "empty"),
    ("raygpu.io/gang-template", "gpu workers", "gang_template", "not a worker group name"),
    ("raygpu.io/queue", "Team_A", "queue", "not a Kubernetes object name"),
    ("raygpu.io/idle-timeout", "soon", "idle_timeout_s", "not a duration"),
    ("raygpu.io/idle-timeout", "-5m", "idle_timeout_s", "not a duration"),
    ("raygpu.io/idle-timeout", "0", "idle_timeout_s", "> 0"),
    ("raygpu.io/idle-timeout", "nan", "idle_timeout_s", "finite"),
    ("raygpu.io/idle-timeout", "inf", "idle_timeout_s", "finite"),
    ("raygpu.io/idle-timeout", "5d", "idle_timeout_s", "not a duration"),
    ("raygpu.io/idle-timeout", "1e-300", "idle_timeout_s", "between 1 s and"),
    ("raygpu.io/idle-timeout", "0.5", "idle_timeout_s", "between 1 s and"),
    ("raygpu.io/idle-timeout", "10000h", "idle_timeout_s", "between 1 s and"),
    ("raygpu.io/reclaim", "yes", "reclaim", "off|dry-run|on"),
    ("raygpu.io/reconcile", "fix", "reconcile", "report|repair"),
])
def test_bad_values_give_a_problem_and_the_default(key, value, field, words):
    policy, problems = parse_cluster_policy({key: value})
    assert getattr(policy, field) == getattr(DEFAULTS, field)
    assert len(problems) == 1
    p = problems[0]
    assert (p.key, p.value) == (key, value)
    assert words in p.reason
    default = getattr(DEFAULTS, field)
    assert p.default_used == repr(getattr(default, "value", default))


def test_one_bad_value_keeps_the_good_ones():
    policy, problems = parse_cluster_policy({
        "raygpu.io/gang-backend": "kueue", "raygpu.io/queue": "q", "raygpu.io/reclaim": "maybe",
        "raygpu.io/idle-timeout": "2m"})
    assert [p.key for p in problems] == ["raygpu.io/reclaim"]
    assert (policy.gang_backend, policy.queue, policy.reclaim, policy.idle_timeout_s) == (
        Backend.KUEUE, "q", ReclaimMode.DRY_RUN, 120.0)


@pytest.mark.parametrize("annotations,group,expected,problem_keys", [
    ({"raygpu.io/idle-timeout.gpu": "30m"}, "gpu", 1800.0, []),
    ({"raygpu.io/idle-timeout.gpu": "30m"}, "cpu", 600.0, []),
    ({"raygpu.io/idle-timeout": "2m", "raygpu.io/idle-timeout.gpu": "1h"}, "gpu", 3600.0, []),
    ({"raygpu.io/idle-timeout": "2m", "raygpu.io/idle-timeout.gpu": "later"}, "gpu", 120.0,
     ["raygpu.io/idle-timeout.gpu"]),
    ({"raygpu.io/idle-timeout.": "1m"}, "gpu", 600.0, ["raygpu.io/idle-timeout."]),
    ({"raygpu.io/idle-timeout.gpu": "1e-300"}, "gpu", 600.0, ["raygpu.io/idle-timeout.gpu"]),
])
def test_group_idle_timeout_override(annotations, group, expected, problem_keys):
    policy, problems = parse_cluster_policy(annotations)
    assert policy.idle_timeout_for(group) == expected
    assert [p.key for p in problems] == problem_keys


def test_bad_group_override_names_the_cluster_default_used():
    _, problems = parse_cluster_policy({"raygpu.io/idle-timeout": "2m", "raygpu.io/idle-timeout.gpu": "x"})
    assert problems[0].default_used == "cluster idle timeout 120s"


@pytest.mark.parametrize("key,flagged", [
    ("raygpu.io/gang-backed", True),  # typo of gang-backend
    ("raygpu.io/reclaimm", True),
    ("raygpu.io/reservation-state", False),  # raygpu's own bookkeeping keys are not typos
    ("raygpu.io/reservation", False),
    ("raygpu.io/owner-job", False),
    ("ray.io/overwrite-container-cmd", False),
])
def test_misspelt_keys_are_reported(key, flagged):
    _, problems = parse_cluster_policy({key: "x"})
    assert bool(problems) is flagged
    if flagged:
        assert "did you mean" in problems[0].reason and problems[0].default_used == "ignored"


@pytest.mark.parametrize("value", [None, 5, {"a": 1}, "\x00", "9" * 400])
def test_never_raises(value):
    annotations = {k: value for k in ("raygpu.io/gang-backend", "raygpu.io/queue", "raygpu.io/idle-timeout",
                                      "raygpu.io/reclaim", "raygpu.io/reconcile", "raygpu.io/idle-timeout.g")}
    policy, problems = parse_cluster_policy(annotations)  # must not raise whatever arrives
    assert isinstance(policy, ClusterPolicy)
    assert {p.key for p in problems} >= {"raygpu.io/gang-backend", "raygpu.io/queue", "raygpu.io/reclaim",
                                         "raygpu.io/reconcile"}


@pytest.mark.parametrize("text,seconds", [("250ms", 0.25), ("1h0m1s", 3601.0), (" 10S ", 10.0), ("1e3", 1000.0)])
def test_parse_duration(text, seconds):
    assert parse_duration_s(text) == seconds
