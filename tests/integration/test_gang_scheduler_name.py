"""Issue 26 item 4: the coscheduling scheduler name is configurable, on the testbed with a second name.

The testbed's scheduler-plugins scheduler serves two profiles that both run Coscheduling,
``scheduler-plugins-scheduler`` and ``second-coscheduling`` (raygpu.testing.addons). A gang sent to the second
is all-or-nothing there, and that profile binds its pods: kube-scheduler records each profile's Events under its
own name (``reportingController``), so the Scheduled / FailedScheduling Events say which profile decided.
"""

from __future__ import annotations

import pytest

import raygpu
from raygpu.adapters.kube import KubeAdapter
from raygpu.cli import main
from raygpu.model.labels import KEY_GANG_BACKEND, KEY_GANG_SCHEDULER_NAME, LABEL_RESERVATION
from raygpu.testing.addons import SP_SCHEDULER_NAME, SP_SECOND_SCHEDULER_NAME
from tests.integration.gang_helpers import nothing_left
from tests.integration.util import pods, wait_for

pytestmark = pytest.mark.k137  # version skew: coscheduling built for 1.34 against the 1.37 API server


def annotate(kube, ns: str, cluster: str, annotations: dict[str, str]) -> None:
    kube.resources.get(api_version="ray.io/v1", kind="RayCluster").patch(
        name=cluster, namespace=ns, content_type="application/merge-patch+json",
        body={"metadata": {"annotations": annotations}})


def deciders(kube, ns: str, reason: str) -> dict[str, set[str]]:
    """Pod name -> the schedulers (profiles) that recorded an Event ``reason`` about it."""
    out: dict[str, set[str]] = {}
    for e in kube.resources.get(api_version="events.k8s.io/v1", kind="Event").get(namespace=ns).to_dict()["items"]:
        if e.get("reason") == reason and (e.get("regarding") or {}).get("kind") == "Pod":
            who = e.get("reportingController") or (e.get("deprecatedSource") or {}).get("component")
            out.setdefault(e["regarding"]["name"], set()).add(who)
    return out


def reserved_pods(core, ns: str, group: str) -> list[dict]:
    return pods(core, ns, f"{LABEL_RESERVATION}={group}")


def unschedulable(p: dict) -> bool:
    return any(c["type"] == "PodScheduled" and c["status"] == "False"
               for c in p.get("status", {}).get("conditions") or [])


def test_a_gang_sent_to_the_second_profile_is_all_or_nothing_there(testbed, ns, pool, cluster, kube, core):
    # 3 x 8 GPUs on a pool of 2 GPU nodes: two pods would fit, the gang must not start.
    pg = raygpu.placement_group([{"GPU": 8}] * 3, strategy="STRICT_SPREAD", cluster=cluster, namespace=ns,
                                backend="coscheduling", scheduler_name=SP_SECOND_SCHEDULER_NAME, timeout_s=240,
                                name="second", kubeconfig=str(testbed.kubeconfig))
    try:
        assert pg.plan.scheduler_name == SP_SECOND_SCHEDULER_NAME
        group = pg.plan.reservation_group
        refused = wait_for("3 reserved pods, each refused by the second profile",
                           lambda: len(ps := reserved_pods(core, ns, group)) == 3 and all(map(unschedulable, ps))
                           and set(deciders(kube, ns, "FailedScheduling")) >= {p["metadata"]["name"] for p in ps}
                           and ps, 120, log=testbed.logs / "sp-scheduler.log")
        assert {p["spec"]["schedulerName"] for p in refused} == {SP_SECOND_SCHEDULER_NAME}
        assert [p["spec"].get("nodeName") for p in refused] == [None, None, None], "none bound though 2 fit"
        refusers = deciders(kube, ns, "FailedScheduling")
        assert all(refusers[p["metadata"]["name"]] == {SP_SECOND_SCHEDULER_NAME} for p in refused), refusers

        pool.add({"g3": "h100x8"})  # room for the whole gang; raygpu's heartbeat makes the plugin look again
        assert pg.wait(200), f"not ready: {pg.state} {pg.error}"
        bound = reserved_pods(core, ns, group)
        assert len({p["spec"]["nodeName"] for p in bound}) == 3
        binders = deciders(kube, ns, "Scheduled")
        assert {n: binders.get(n) for n in (p["metadata"]["name"] for p in bound)} == \
            {p["metadata"]["name"]: {SP_SECOND_SCHEDULER_NAME} for p in bound}
        views = [p for p in KubeAdapter(str(testbed.kubeconfig)).ray_pods(ns, cluster)
                 if p.labels.get(LABEL_RESERVATION) == group]
        assert {p.scheduler_name for p in views} == {SP_SECOND_SCHEDULER_NAME}  # the pod view says it too
    finally:
        raygpu.remove_placement_group(pg)
    wait_for("reservation released", lambda: nothing_left(KubeAdapter(str(testbed.kubeconfig)), ns, cluster), 90)


def test_the_cluster_annotation_chooses_the_profile(testbed, ns, cluster, kube, core, capsys):
    annotate(kube, ns, cluster, {KEY_GANG_BACKEND: "coscheduling", KEY_GANG_SCHEDULER_NAME: SP_SECOND_SCHEDULER_NAME})
    assert main(["plan", "--cluster", cluster, "-n", ns, "--bundle", "GPU=8", "--count", "2",
                 "--kubeconfig", str(testbed.kubeconfig)]) == 0
    assert f"backend coscheduling, scheduler {SP_SECOND_SCHEDULER_NAME}" in capsys.readouterr().out
    pg = raygpu.placement_group([{"GPU": 8}] * 2, strategy="STRICT_SPREAD", cluster=cluster, namespace=ns,
                                timeout_s=180, name="annotated", kubeconfig=str(testbed.kubeconfig))
    try:
        assert pg.wait(200), f"not ready: {pg.state} {pg.error}"
        bound = reserved_pods(core, ns, pg.plan.reservation_group)
        assert len(bound) == 2 and {p["spec"]["schedulerName"] for p in bound} == {SP_SECOND_SCHEDULER_NAME}
        binders = deciders(kube, ns, "Scheduled")
        assert all(binders.get(p["metadata"]["name"]) == {SP_SECOND_SCHEDULER_NAME} for p in bound), binders
    finally:
        raygpu.remove_placement_group(pg)
    wait_for("reservation released", lambda: nothing_left(KubeAdapter(str(testbed.kubeconfig)), ns, cluster), 90)


def test_a_malformed_annotation_is_an_event_and_the_default_profile(testbed, ns, cluster, kube, core):
    annotate(kube, ns, cluster, {KEY_GANG_SCHEDULER_NAME: "Second_Coscheduling"})
    said: list[str] = []
    pg = raygpu.placement_group([{"GPU": 8}], cluster=cluster, namespace=ns, backend="coscheduling", timeout_s=180,
                                name="fallback", kubeconfig=str(testbed.kubeconfig), progress=said.append)
    try:
        assert pg.plan.scheduler_name == SP_SCHEDULER_NAME
        assert any(KEY_GANG_SCHEDULER_NAME in m and "ignored" in m for m in said), said
        events = [e for e in core.list_namespaced_event(ns).items
                  if e.reason == "InvalidAnnotation" and e.involved_object.kind == "RayCluster"]
        assert events and KEY_GANG_SCHEDULER_NAME in events[0].message and events[0].type == "Warning"
        assert pg.wait(200), f"not ready: {pg.state} {pg.error}"
        [bound] = reserved_pods(core, ns, pg.plan.reservation_group)
        assert bound["spec"]["schedulerName"] == SP_SCHEDULER_NAME
        assert deciders(kube, ns, "Scheduled").get(bound["metadata"]["name"]) == {SP_SCHEDULER_NAME}
    finally:
        raygpu.remove_placement_group(pg)
    wait_for("reservation released", lambda: nothing_left(KubeAdapter(str(testbed.kubeconfig)), ns, cluster), 90)
