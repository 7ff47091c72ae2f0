"""Issue 3, must-show 1: the gang deadlock counted out, without and with raygpu."""

from __future__ import annotations

import pytest

from raygpu.demo import deadlock
from raygpu.testing import manifests as m
from raygpu.testing.kube import apply


@pytest.fixture
def eight_nodes(pool):
    pool.add({f"g{i}": "h100x8" for i in range(8)} | {"cpu": "cpu16"})
    return pool


def test_plain_ray_deadlocks(testbed, ns, eight_nodes):
    r = deadlock.run(testbed, ns, eight_nodes.name, "plain", plain_deadline_s=30)
    deadlock.teardown(testbed, ns)
    print(f"\nplain Ray: idle GPU-seconds {r.idle_gpu_s:.0f} (half-placed gangs: {r.partial_gang_gpu_s:.0f}) "
          f"over {r.duration_s:.0f} s; "
          f"bound pods {[t.bound_pods_at_deadline for t in r.tenants.values()]}")
    assert r.deadlocked, r
    assert all(t.ready_after_s is None for t in r.tenants.values())
    assert sum(t.bound_pods_at_deadline for t in r.tenants.values()) == 8  # every node taken, nobody running
    assert r.gpus_held_by_partial_gangs_at_deadline == 64
    assert r.idle_gpu_s > 0 and r.partial_gang_gpu_s > 0


@pytest.mark.parametrize("backend", ["coscheduling", "kueue"])
def test_raygpu_gang_per_placement_group_avoids_the_deadlock(testbed, ns, eight_nodes, kube, backend):
    queue = None
    if backend == "kueue":
        apply(kube, m.cluster_queue(f"cq-{ns}", {"cpu": "768", "memory": "8Ti", "nvidia.com/gpu": "64"}))
        apply(kube, m.local_queue("gpus", ns, f"cq-{ns}"))
        queue = "gpus"
    try:
        r = deadlock.run(testbed, ns, eight_nodes.name, "raygpu", backend, queue=queue, timeout_s=300)
    finally:
        deadlock.teardown(testbed, ns)
        if backend == "kueue":
            kube.resources.get(api_version="kueue.x-k8s.io/v1beta2", kind="ClusterQueue").delete(name=f"cq-{ns}")
    print(f"\nraygpu/{backend}: idle GPU-seconds {r.idle_gpu_s:.0f} (half-placed gangs: {r.partial_gang_gpu_s:.0f}) "
          f"over {r.duration_s:.0f} s; "
          f"ready after {[t.ready_after_s for t in r.tenants.values()]}")
    assert not r.deadlocked
    ready = sorted(r.tenants.values(), key=lambda t: t.ready_after_s or 1e9)
    assert all(t.ready_after_s is not None for t in ready), "both tenants eventually get their gang"
    assert ready[1].pods_bound_while_other_ran == 0, "the waiting tenant holds no pod"
