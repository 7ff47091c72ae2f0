"""Issue 14: a gang's lifecycle through the fault-injecting proxy in front of the real API server.

Each test points raygpu.placement_group at the testbed's kube-apiserver through
raygpu.testing.faultproxy, breaks chosen writes of the reservation lifecycle,
and checks what docs/reliability.md promises: the gang becomes ready (or the
request fails cleanly), the proxy really injected the fault, and nothing is
left after the release: no worker group, state ConfigMap, PodGroup, reserved
pod or Ray placement group.
"""

from __future__ import annotations

import pytest

import raygpu
from raygpu.adapters.kube import KubeAdapter
from raygpu.model.labels import ANNOTATION_HEARTBEAT, ANNOTATION_RESERVATION_STATE
from raygpu.testing.controlplane import ADMIN_TOKEN
from raygpu.testing.faultproxy import Fail, Rule, start_for
from tests.integration.gang_helpers import (CM_PATH, RC_PATH, body_has, leftovers, no_live_ray_pg, nothing_left,
                                           seen_after)
from tests.integration.util import wait_for


@pytest.fixture
def proxied(testbed, tmp_path, keep_on_failure):
    """(proxy, kubeconfig through it): the admin token, since client certificates end at the proxy's TLS. A failed
    test leaves the proxy's log under its tmp_path (keep_on_failure)."""
    with start_for(testbed) as proxy:
        keep_on_failure("proxy.log", proxy.write_log)
        yield proxy, str(proxy.kubeconfig_for_token(ADMIN_TOKEN, tmp_path / "proxied.kubeconfig"))


def test_a_gang_survives_a_failure_on_each_lifecycle_write(testbed, ns, cluster, proxied):
    """503 once on: the transition to admitted, recording the PG id, the transition to ready, a heartbeat (the
    watchdog's first, sent as it starts). Each is retried on a later step: the gang gets ready, and a later
    heartbeat lands."""
    proxy, kubeconfig = proxied
    rules = [proxy.add(Rule(verb="PATCH", path=CM_PATH, action=Fail(503), times=1, when=body_has(*parts)))
             for parts in ((b"reservation-state", b"admitted"), (b"raygpu.io/placement-group",),
                           (b"reservation-state", b'"ready"'))]
    beat = proxy.add(Rule(verb="PATCH", path=CM_PATH, action=Fail(503), times=1, body_contains=ANNOTATION_HEARTBEAT))
    pg = raygpu.placement_group([{"GPU": 8}] * 2, strategy="STRICT_SPREAD", cluster=cluster, namespace=ns,
                                backend="none", timeout_s=150, name="faults", kubeconfig=kubeconfig)
    kube = KubeAdapter(str(testbed.kubeconfig))  # the test's own view: not through the proxy
    try:
        assert pg.wait(170), f"not ready: {pg.state} {pg.error}"
        for rule in [*rules, beat]:
            seen = proxy.wait_seen(lambda s, r=rule: s.rule is r and s.done, timeout_s=10)
            assert seen.status == 503 and seen.upstream_status is None, seen  # the fault was really injected
        failed_beat = next(i for i, s in enumerate(proxy.log) if s.rule is beat)
        seen_after(proxy, failed_beat + 1, lambda s: s.verb == "PATCH" and ANNOTATION_HEARTBEAT.encode() in s.body
                   and s.status == 200, 20)  # the heartbeat after the failed one landed
        state = wait_for("the state ConfigMap says ready", lambda: (kube.get("v1", "ConfigMap", pg.plan.gang_name, ns)
                         or {}).get("metadata", {}).get("annotations", {}).get(ANNOTATION_RESERVATION_STATE)
                         == "ready" or None, 30)
        assert state and len(leftovers(kube, ns, cluster)["reserved_pods"]) == 2
    finally:
        raygpu.remove_placement_group(pg)
    wait_for("nothing left after the release", lambda: nothing_left(kube, ns, cluster), 90)
    assert no_live_ray_pg("faults")


@pytest.mark.parametrize("lost", ["state-configmap", "raycluster-patch"])
def test_a_write_whose_answer_is_lost_leaves_one_reservation_or_none(testbed, ns, cluster, proxied, lost):
    """The write lands on the API server but the driver hears a 500. A lost state-ConfigMap create fails the
    request and the rollback deletes the ConfigMap by its request id. A lost RayCluster patch either fails
    and rolls back, or (the driver sees its own group landed) goes on with exactly one group: never two."""
    proxy, kubeconfig = proxied
    verb, path = ("POST", CM_PATH) if lost == "state-configmap" else ("PATCH", RC_PATH)
    rule = proxy.add(Rule(verb=verb, path=path, action=Fail(500, forward=True), times=1))
    kube = KubeAdapter(str(testbed.kubeconfig))
    pg = None
    try:
        pg = raygpu.placement_group([{"GPU": 8}] * 2, strategy="STRICT_SPREAD", cluster=cluster, namespace=ns,
                                    backend="none", timeout_s=60, name="lost", kubeconfig=kubeconfig)
    except raygpu.RayGpuError as e:
        assert "500" in str(e), e
    seen = proxy.wait_seen(lambda s: s.rule is rule and s.done, timeout_s=10)
    assert seen.upstream_status in (200, 201) and seen.status == 500, seen  # it landed, the answer was lost
    if lost == "state-configmap":
        assert pg is None, "a lost create fails the request"
    if pg is not None:
        groups = [g.group_name for g in kube.get_raycluster(ns, cluster).worker_groups]
        assert groups.count(pg.plan.reservation_group) == 1, groups
        raygpu.remove_placement_group(pg)
    wait_for("nothing left", lambda: nothing_left(kube, ns, cluster), 90)
    assert no_live_ray_pg("lost")
