"""Issue 11 item 1 on a real kube-scheduler: a PACK gang split over several pods lands on one Kubernetes node
where one has room (raygpu's preferred pod affinity to the reservation's own pods), as Ray's PACK packs
bundles onto as few nodes as it can.

Three free 8-GPU nodes; a worker group of 2-GPU pods; a PACK gang of 4 x {GPU: 2} is 4 pods. kube-scheduler's
default scoring (least allocated) would spread them over the three nodes; with the affinity all four bind to
the node the first one took.
"""

from __future__ import annotations

import ray

import raygpu
from raygpu.adapters.kube import KubeAdapter
from raygpu.model.labels import LABEL_RESERVATION
from raygpu.testing import manifests as m
from raygpu.testing.kube import apply
from tests.integration.gang_helpers import nothing_left
from tests.integration.util import pods, ray_address, wait_for


def test_a_pack_gang_of_four_pods_binds_on_one_node(testbed, ns, pool, kube, core):
    names = pool.add({"cpu": "cpu16", "g1": "h100x8", "g2": "h100x8", "g3": "h100x8"})
    assert len(names) == 4
    apply(kube, m.raycluster("c", ns, [m.worker_group("small", replicas=0, gpus={"nvidia.com/gpu": 2}, pool=pool.name)],
                             pool=pool.name))
    ray.init(address=ray_address(testbed, ns, "c"), logging_level="ERROR", log_to_driver=False)
    admin = KubeAdapter(str(testbed.kubeconfig))
    try:
        pg = raygpu.placement_group([{"GPU": 2}] * 4, "PACK", cluster="c", namespace=ns, backend="none",
                                    timeout_s=150, name="packed", kubeconfig=str(testbed.kubeconfig))
        try:
            assert pg.plan.pod_count == 4, pg.plan.reason
            assert pg.wait(170), f"not ready: {pg.state} {pg.error}"
            group = pg.plan.reservation_group
            bound = [p["spec"].get("nodeName") for p in pods(core, ns, f"{LABEL_RESERVATION}={group}")]
            assert len(bound) == 4 and all(bound), bound
            assert len(set(bound)) == 1, f"PACK spread its pods over {sorted(set(bound))}"
        finally:
            raygpu.remove_placement_group(pg)
        wait_for("released", lambda: nothing_left(admin, ns, "c"), 90)
    finally:
        ray.shutdown()
