"""What the gang scale-up tests share (test_gang_scale_up, test_gang_scale_up_faults): the RayCluster with gang
scale-up on, and the first lines of an unmodified Ray driver."""

from __future__ import annotations

import textwrap

from raygpu.testing import manifests as m
from raygpu.testing.kube import apply
from tests.integration.sidecar_helpers import BRIDGE_WAIT_S
from tests.integration.util import alive_ray_nodes, ray_address, wait_for

CLUSTER = "c"
SCALE_UP = {"raygpu.io/gang-scale-up": "on", "raygpu.io/gang-backend": "coscheduling",
            "raygpu.io/reclaim": "on", "raygpu.io/idle-timeout": "5s"}
# The first lines of every unmodified driver: no raygpu anywhere (what Ray Train's controller, Tune or a user's
# own script does), the GCS address as argv[1], one JSON object per line on stdout (``Driver.next``).
UNMODIFIED = textwrap.dedent("""
    import json, sys, ray
    from ray.util.placement_group import placement_group, remove_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy
    assert "raygpu" not in sys.modules
    ray.init(address=sys.argv[1], logging_level="ERROR", log_to_driver=False)
    say = lambda **kw: print(json.dumps(kw), flush=True)
""")

# (a) of issue 25: a plain STRICT_SPREAD placement group of four 8-GPU bundles, a task on each, then removed
PLAIN_PG = UNMODIFIED + textwrap.dedent("""
    pg = placement_group([{"GPU": 8}] * 4, strategy="STRICT_SPREAD")
    say(pg=pg.id.hex())
    say(ready=pg.wait(300))

    @ray.remote(num_gpus=8, num_cpus=0)
    def where():
        return ray.get_runtime_context().get_node_id()
    nodes = ray.get([where.options(scheduling_strategy=PlacementGroupSchedulingStrategy(
        pg, placement_group_bundle_index=i)).remote() for i in range(4)], timeout=120)
    say(nodes=nodes)
    say(labels={n["NodeID"]: n.get("Labels") or {} for n in ray.nodes() if n["NodeID"] in nodes})
    remove_placement_group(pg)
    say(done=True)
    assert "raygpu" not in sys.modules
""")


def scale_up_cluster(testbed, ns: str, pool, kube, gpu_nodes: int) -> str:
    """RayCluster ``c`` with gang scale-up on (backend coscheduling) and one 8-GPU template group at 0 replicas,
    on a CPU node and ``gpu_nodes`` 8-GPU nodes of the test's pool; no in-tree autoscaler. Returns the GCS
    address once the head answers."""
    pool.add({"cpu": "cpu16", **{f"g{i}": "h100x8" for i in range(gpu_nodes)}})
    apply(kube, m.raycluster(CLUSTER, ns, [m.worker_group("gpu", replicas=0, pool=pool.name)], pool=pool.name,
                             annotations=SCALE_UP))
    addr = ray_address(testbed, ns, CLUSTER, timeout_s=BRIDGE_WAIT_S)
    wait_for("the Ray head's GCS answers", lambda: bool(alive_ray_nodes(addr)), BRIDGE_WAIT_S,
             log=testbed.logs / "bridge.log")
    return addr
