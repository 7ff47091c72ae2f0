"""The one set of builders for tests and benchmarks: each case one readable line, like Kueue's wrappers.

    cluster("c").worker("gpu", gpus=8, cpus=96).obj()                  # a RayClusterView (clusters)
    cluster_view("rc").group("gpu", replicas=2, limits=res).obj()      # one from GroupTemplates (clusters)
    gang(gpus(1, count=4), strategy="SPREAD")                          # a GangRequest (clusters)
    snap().gpu_node("n1", gpus=8).ray_pod("p1", "n1", 8).obj()         # a doctor Snapshot (snapshots)
    world().worker("w1", idle_for_s=900).obj()                         # a reclaimer world (reclaim)
    plan_on(RECORDED, ray_view(ALL_IDLE))                              # a recorded RayCluster (recorded)
    apply_json_patch(doc, ops)                                         # the API server's RFC 6902 (patch)

Each submodule keeps its own clock (``NOW_S``): import it from the submodule
whose builders you use. ``obj()`` always goes through the same parsers
(``RayClusterView.from_k8s``, frozen models) as production code.
"""

from raygpu.testing.builders.clusters import ClusterBuilder, ViewBuilder, cluster, cluster_view, gang, gpus
from raygpu.testing.builders.patch import PatchTestFailed, apply_json_patch
from raygpu.testing.builders.reclaim import World, world
from raygpu.testing.builders.snapshots import SnapBuilder, healthy, snap, tol

__all__ = ["ClusterBuilder", "ViewBuilder", "cluster", "cluster_view", "gang", "gpus", "PatchTestFailed",
           "apply_json_patch", "World", "world", "SnapBuilder", "healthy", "snap", "tol"]
