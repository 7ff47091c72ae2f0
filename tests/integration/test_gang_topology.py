"""Issue 13 item 4 on a real scheduler: a required topology reaches kube-scheduler's topology-aware workload
scheduling (Kubernetes 1.37, gates GenericWorkload and TopologyAwareWorkloadScheduling on the testbed's API
server and scheduler, components.FEATURE_GATES) and decides where the gang goes.

Three free 8-GPU nodes: one in zone ``a``, two in zone ``b``. A gang of 3 x 8 GPUs (one pod per node) fits
the cluster but no zone: with the constraint no pod binds, and the reservation is rolled back at its timeout
(without it the three pods would bind at once). A gang of 2 x 8 GPUs fits zone ``b`` only: both pods bind
there. Runs in the 1.37 pass of .ci/run (the 1.34 pass ignores this file: no Workload API there).
"""

from __future__ import annotations

import pytest
import ray

import raygpu
from raygpu.adapters.kube import KubeAdapter
from raygpu.commands.demo import install_workload_policy
from raygpu.model.labels import LABEL_RESERVATION
from raygpu.testing import manifests as m
from raygpu.testing.kube import apply
from tests.integration.gang_helpers import nothing_left
from tests.integration.util import holds_for, pods, ray_address, wait_for

pytestmark = pytest.mark.k137  # the Workload API's topology constraint: 1.37 only

ZONE = "topology.kubernetes.io/zone"
ZONES = {"a1": "a", "b1": "b", "b2": "b"}


def _bound(core, ns: str, group: str) -> list[str]:
    return sorted(p["spec"].get("nodeName") or "" for p in pods(core, ns, f"{LABEL_RESERVATION}={group}")
                  if p["spec"].get("nodeName"))


def _gang(testbed, ns: str, n: int, name: str, timeout_s: float):
    return raygpu.placement_group([{"GPU": 8}] * n, cluster="c", namespace=ns, backend="workload",
                                  timeout_s=timeout_s, name=name, kubeconfig=str(testbed.kubeconfig),
                                  topology_strategy={"ray.io/node-id": "STRICT_SPREAD", ZONE: "STRICT_PACK"})


def test_a_required_zone_keeps_the_gang_in_one_zone_or_unplaced(testbed, ns, pool, kube, core):
    assert testbed.kubernetes == "1.37", "the Workload API's topology constraint needs the 1.37 testbed"
    install_workload_policy(kube, ns)
    names = pool.add({"cpu": "cpu16", **{k: "h100x8" for k in ZONES}})
    nodes = kube.resources.get(api_version="v1", kind="Node")
    for short, zone in ZONES.items():
        nodes.patch(name=pool.node(short), body={"metadata": {"labels": {ZONE: zone}}},
                    content_type="application/merge-patch+json")
    assert len(names) == 4
    apply(kube, m.raycluster("c", ns, [m.worker_group("gpu", replicas=0, pool=pool.name)], pool=pool.name))
    ray.init(address=ray_address(testbed, ns, "c"), logging_level="ERROR", log_to_driver=False)
    admin = KubeAdapter(str(testbed.kubeconfig))
    try:
        # 3 pods fit the cluster, not a zone: none binds, then the timeout rolls it back
        wide = _gang(testbed, ns, 3, "wide", timeout_s=40)
        try:
            group = wide.plan.reservation_group
            wait_for("the 3 reserved pods exist", lambda: len(pods(core, ns, f"{LABEL_RESERVATION}={group}")) == 3, 60)
            holds_for("no pod of the 3-pod gang binds (no zone holds it)", lambda: _bound(core, ns, group) == [], 20)
            assert not wide.wait(60) and wide.state.value == "rolled_back", (wide.state, wide.error)
        finally:
            raygpu.remove_placement_group(wide)
        wait_for("the rolled-back gang leaves nothing", lambda: nothing_left(admin, ns, "c"), 90)

        # 2 pods fit zone b only
        narrow = _gang(testbed, ns, 2, "narrow", timeout_s=150)
        try:
            assert narrow.wait(170), f"not ready: {narrow.state} {narrow.error}"
            bound = _bound(core, ns, narrow.plan.reservation_group)
            assert bound == sorted(pool.node(s) for s in ("b1", "b2")), bound
        finally:
            raygpu.remove_placement_group(narrow)
        wait_for("released", lambda: nothing_left(admin, ns, "c"), 90)
    finally:
        ray.shutdown()
