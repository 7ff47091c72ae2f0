"""One-line worlds for reclaimer tests: ``world().worker("w1", idle_for_s=900).obj()``.

Every worker is a pod of RayCluster ``rc`` with a live Ray node ``n-<pod>``
(unless ``ray=False``), on its own Kubernetes node ``k-<pod>`` unless
``k8s_node`` says otherwise. A group's replicas default to its pods minus its
workersToDelete (as KubeRay's autoscaler writes them). Time is ``NOW_S``.
"""

from __future__ import annotations

from raygpu.model.raycluster import RayClusterView
from raygpu.testing.builders.clusters import cluster_view
from raygpu.model.views import (
    K8sNodeView,
    K8sPodView,
    K8sView,
    PgState,
    PlacementGroupView,
    RayNodeView,
    RayView,
    Snapshot,
)

NOW_S = 100_000.0
CLUSTER, NAMESPACE = "rc", "default"


class World:
    def __init__(self) -> None:
        self._k8s_nodes: dict[str, dict[str, str]] = {"k-head": {}}
        self._groups: dict[str, dict] = {}
        self._pods = [K8sPodView(name="rc-head", namespace=NAMESPACE, node_name="k-head", phase="Running",
                                 ray_cluster=CLUSTER, ray_group="headgroup", ray_node_type="head")]
        self._nodes = [RayNodeView(node_id="n-head", alive=True, is_head=True, instance_id="rc-head",
                                   total={"CPU": 4}, available={"CPU": 4}, idle_since_s=0.0)]
        self._pgs: list[PlacementGroupView] = []
        self._ray_reachable = True

    def node(self, name: str, **labels: str) -> "World":
        """A Kubernetes node."""
        self._k8s_nodes[name] = labels
        return self

    def group(self, name: str, *, replicas: int | None = None, min_replicas: int = 0,
              workers_to_delete: tuple[str, ...] = (), max_replicas: int = 100, gpus: float = 8) -> "World":
        self._groups[name] = dict(replicas=replicas, min_replicas=min_replicas,
                                  workers_to_delete=tuple(workers_to_delete), max_replicas=max_replicas, gpus=gpus)
        return self

    def worker(self, name: str, *, group: str = "gpu", k8s_node: str | None = None, gpus: float = 8,
               idle_for_s: float | None = None, free_gpus: float | None = None, age_s: float = 3600,
               ray: bool = True, labels: dict[str, str] | None = None,
               ray_labels: dict[str, str] | None = None, deleting: bool = False, pod: bool = True,
               cpus: float = 16) -> "World":
        """A worker pod; idle_for_s=None means busy (no free GPUs unless free_gpus).

        ``pod=False``: only its Ray node, still reported alive, while the pod is gone (a stale GCS).
        """
        k8s_node = k8s_node or f"k-{name}"
        self._groups.setdefault(group, dict(replicas=None, min_replicas=0, workers_to_delete=(), max_replicas=100,
                                            gpus=gpus))
        if pod:
            self._k8s_nodes.setdefault(k8s_node, {})
            self._pods.append(K8sPodView(
                name=name, namespace=NAMESPACE, node_name=k8s_node, phase="Running", deleting=deleting,
                labels=labels or {}, created_at_s=NOW_S - age_s, ray_cluster=CLUSTER, ray_group=group,
                ray_node_type="worker", requests={"nvidia.com/gpu": gpus}))
        if ray:
            free = free_gpus if free_gpus is not None else (gpus if idle_for_s is not None else 0.0)
            self._nodes.append(RayNodeView(
                node_id=f"n-{name}", alive=True, instance_id=name, node_type=group,
                labels=ray_labels or {}, total={"GPU": gpus, "CPU": cpus}, available={"GPU": free, "CPU": cpus},
                idle_since_s=None if idle_for_s is None else NOW_S - idle_for_s))
        return self

    def ray_node(self, pod: str, node_id: str, *, idle_for_s: float | None = None, gpus: float = 8,
                 group: str = "gpu") -> "World":
        """One more live Ray node of pod ``pod``, id ``node_id`` (Ray restarted inside the pod while its old
        node is still reported alive); ``idle_for_s=None``: busy."""
        self._nodes.append(RayNodeView(
            node_id=node_id, alive=True, instance_id=pod, node_type=group, total={"GPU": gpus, "CPU": 16},
            available={"GPU": gpus if idle_for_s is not None else 0.0, "CPU": 16},
            idle_since_s=None if idle_for_s is None else NOW_S - idle_for_s))
        return self

    def busy_pod(self, name: str, *, k8s_node: str) -> "World":
        """A running pod of another workload on ``k8s_node``."""
        self._k8s_nodes.setdefault(k8s_node, {})
        self._pods.append(K8sPodView(name=name, namespace=NAMESPACE, node_name=k8s_node, phase="Running"))
        return self

    def pg(self, bundles: list[dict[str, float]], *, state: str = "PENDING", strategy: str = "PACK",
           selectors: list[dict[str, str]] | None = None, on: list[str | None] | None = None) -> "World":
        """A placement group; ``on`` names the pod hosting each bundle (None: unplaced)."""
        node_ids = tuple(f"n-{p}" if p else None for p in (on or [None] * len(bundles)))
        self._pgs.append(PlacementGroupView(
            pg_id=f"pg{len(self._pgs)}", state=PgState(state), strategy=strategy, bundles=tuple(bundles),
            bundle_node_ids=node_ids, bundle_label_selectors=tuple(selectors or ())))
        return self

    def pg_pending(self, bundles: list[dict[str, float]], **kw) -> "World":
        return self.pg(bundles, state="PENDING", **kw)

    def ray_down(self) -> "World":
        self._ray_reachable = False
        return self

    def obj(self) -> tuple[Snapshot, RayClusterView]:
        view = cluster_view(CLUSTER, NAMESPACE, resource_version="42").head(replicas=1)
        for name, g in self._groups.items():
            pods = [p for p in self._pods if p.ray_group == name]
            replicas = g["replicas"] if g["replicas"] is not None else len(
                [p for p in pods if p.name not in g["workers_to_delete"]])
            view.group(name, replicas=replicas, min_replicas=g["min_replicas"], max_replicas=g["max_replicas"],
                       workers_to_delete=g["workers_to_delete"],
                       limits={"nvidia.com/gpu": g["gpus"]} if g["gpus"] else {})
        cluster = view.obj()
        snapshot = Snapshot(
            taken_at_s=NOW_S, cluster=CLUSTER, namespace=NAMESPACE,
            ray=RayView(reachable=self._ray_reachable, nodes=tuple(self._nodes),
                        placement_groups=tuple(self._pgs)),
            k8s=K8sView(nodes=tuple(K8sNodeView(name=n, labels=lb) for n, lb in self._k8s_nodes.items()),
                        pods=tuple(self._pods)))
        return snapshot, cluster


def world() -> World:
    return World()
