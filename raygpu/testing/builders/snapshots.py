"""Small builders for Snapshots, so that each test case is one readable line.

    snap().gpu_node("n1", gpus=8).ray_pod("p1", node="n1", gpus=8).ray_node("r1", instance="p1", gpus=8).obj()

Defaults describe a healthy KubeRay cluster: GPU nodes carry the GPU Feature
Discovery labels and a ready device-plugin pod, Ray pods are Running and old
enough to be past the orphan grace, Ray nodes are alive and count what their
pod was given. Every method returns the builder; ``obj()`` freezes it.

The benchmarks build their synthetic and simulated states with the same
methods: ``snap(ids=False)`` leaves out the pod uids and Ray node IPs they
never had, and ``requests=`` / ``total=`` / ``available=`` give a pod's or a
Ray node's resources verbatim where the defaults do not fit.
"""

from __future__ import annotations

from typing import Any

from raygpu.model.views import (
    DevicePluginPod,
    K8sNodeView,
    NodeCondition,
    K8sPodView,
    K8sView,
    MigDeviceView,
    NvmlDeviceView,
    NvmlView,
    PgState,
    PlacementGroupView,
    RayNodeView,
    RayView,
    ResourceSliceView,
    Snapshot,
    Taint,
    Toleration,
)

GiB = 2**30
NOW_S = 10_000.0
H100 = "NVIDIA-H100-80GB-HBM3"


class SnapBuilder:
    def __init__(self, taken_at_s: float = NOW_S, cluster: str | None = "rc", *, namespace: str = "default",
                 ids: bool = True) -> None:
        self.taken_at_s = taken_at_s
        self.cluster = cluster
        self.namespace = namespace
        self.ids = ids  # pods get a uid, Ray nodes an IP
        self.nodes: list[K8sNodeView] = []
        self.pods: list[K8sPodView] = []
        self.dp_pods: list[DevicePluginPod] = []
        self.slices: list[ResourceSliceView] | None = None
        self.ray_nodes: list[RayNodeView] = []
        self.pgs: list[PlacementGroupView] = []
        self.nvml_views: dict[str, NvmlView] = {}
        self.k8s_reason: str | None = None
        self.ray_reason: str | None = None

    # -------------------------------------------------------------- nodes
    def gpu_node(
        self,
        name: str,
        gpus: float = 8,
        *,
        resource: str = "nvidia.com/gpu",
        allocatable: float | None = None,
        capacity: dict[str, float] | None = None,
        product: str = H100,
        labels: dict[str, str] | None = None,
        taints: tuple[tuple[str, str], ...] = (),  # (key, effect) or use taint()
        cpu: float = 96,
        memory_gib: float = 1024,
        device_plugin: str | None = "ready",  # "ready" | "not-ready" | None (no pod)
        device_plugin_pod: str | None = None,  # its pod's name (default nvidia-device-plugin-<node>)
        unschedulable: bool = False,
        conditions: tuple[tuple[str, str], ...] = (),  # (type, reason) of conditions with status True
    ) -> "SnapBuilder":
        cap = {"cpu": cpu, "memory": memory_gib * GiB}
        if gpus:
            cap[resource] = gpus
        cap.update(capacity or {})
        alloc = dict(cap)
        if allocatable is not None:
            alloc[resource] = allocatable
        # GFD labels stay even when gpus=0: that is how a node "should have" GPUs (missing capacity)
        lab = {"nvidia.com/gpu.product": product, "nvidia.com/gpu.count": str(int(gpus) or 8)}
        lab.update(labels or {})
        self.nodes.append(
            K8sNodeView(
                name=name,
                labels=lab,
                capacity=cap,
                allocatable=alloc,
                taints=tuple(Taint(key=k, value=None, effect=e) for k, e in taints),
                unschedulable=unschedulable,
                conditions=tuple(NodeCondition(type=t, reason=r) for t, r in conditions),
            )
        )
        if device_plugin is not None:
            self.dp_pods.append(
                DevicePluginPod(
                    name=device_plugin_pod or f"nvidia-device-plugin-{name}",
                    namespace="gpu-operator",
                    node_name=name,
                    ready=device_plugin == "ready",
                )
            )
        return self

    def cpu_node(self, name: str, cpu: float = 32, memory_gib: float = 128) -> "SnapBuilder":
        return self.node(name, {"cpu": cpu, "memory": memory_gib * GiB})

    def node(self, name: str, capacity: dict[str, float], allocatable: dict[str, float] | None = None,
             labels: dict[str, str] | None = None) -> "SnapBuilder":
        """A bare node: exactly these resources (allocatable = capacity unless given), no GPU labels, no device plugin."""
        self.nodes.append(K8sNodeView(name=name, labels=labels or {}, capacity=capacity,
                                      allocatable=dict(capacity if allocatable is None else allocatable)))
        return self

    def resource_slice(self, node: str, devices: int = 8, driver: str = "gpu.nvidia.com") -> "SnapBuilder":
        self.slices = (self.slices or []) + [
            ResourceSliceView(name=f"{node}-{driver}", node_name=node, driver=driver, device_count=devices)
        ]
        return self

    # --------------------------------------------------------------- pods
    def ray_pod(
        self,
        name: str,
        node: str | None = None,
        gpus: float = 0,
        *,
        resource: str = "nvidia.com/gpu",
        group: str = "gpu-group",
        phase: str | None = None,
        num_gpus: float | None = None,
        cpu: float = 8,
        memory_gib: float = 64,
        tolerations: tuple[Toleration, ...] = (),
        node_selector: dict[str, str] | None = None,
        head: bool = False,
        created_at_s: float = 0.0,
        deleting: bool = False,
        cluster: str = "rc",
        requests: dict[str, float] | None = None,  # verbatim, instead of cpu / memory_gib / gpus
        limits: dict[str, float] | None = None,  # default: the requests
    ) -> "SnapBuilder":
        res: dict[str, float] = {"cpu": cpu, "memory": memory_gib * GiB}
        if gpus:
            res[resource] = gpus
        if requests is not None:
            res = requests
        self.pods.append(
            K8sPodView(
                name=name,
                namespace=self.namespace,
                uid=f"uid-{name}" if self.ids else "",
                node_name=node,
                phase=phase or ("Running" if node else "Pending"),
                deleting=deleting,
                requests=dict(res),
                limits=dict(res if limits is None else limits),
                tolerations=tolerations,
                node_selector=node_selector or {},
                created_at_s=created_at_s,
                ray_cluster=cluster,
                ray_group="headgroup" if head else group,
                ray_node_type="head" if head else "worker",
                ray_start_num_gpus=num_gpus,
            )
        )
        return self

    def other_pod(self, name: str, node: str, *, cpu: float = 0, memory_gib: float = 0, gpus: float = 0) -> "SnapBuilder":
        """A non-Ray pod bound to ``node`` (it uses capacity, it is not checked)."""
        res: dict[str, float] = {"cpu": cpu, "memory": memory_gib * GiB}
        if gpus:
            res["nvidia.com/gpu"] = gpus
        self.pods.append(
            K8sPodView(name=name, namespace="other", node_name=node, phase="Running", requests=res, limits=dict(res))
        )
        return self

    # ---------------------------------------------------------------- Ray
    def ray_node(
        self,
        node_id: str,
        instance: str | None = None,
        gpus: float = 0,
        *,
        available: float | dict[str, float] | None = None,  # GPUs free (default all), or every resource verbatim
        alive: bool = True,
        head: bool = False,
        resources: dict[str, float] | None = None,
        labels: dict[str, str] | None = None,
        total: dict[str, float] | None = None,  # verbatim, instead of CPU 8 + gpus + resources
        node_type: str | None = None,
        idle_since_s: float | None = None,
    ) -> "SnapBuilder":
        if total is None:
            total = {"CPU": 8.0, **({"GPU": float(gpus)} if gpus else {}), **(resources or {})}
        avail = dict(total)
        if isinstance(available, dict):
            avail = dict(available)
        elif available is not None:
            avail["GPU"] = available
        self.ray_nodes.append(
            RayNodeView(
                node_id=node_id,
                alive=alive,
                is_head=head,
                instance_id=instance,
                node_type=node_type,
                ip=f"10.0.0.{len(self.ray_nodes) + 1}" if self.ids else None,
                labels=labels or {},
                total=total,
                available=avail,
                idle_since_s=idle_since_s,
            )
        )
        return self

    def pg(self, pg_id: str, *bundle_gpus: float, state: PgState = PgState.PENDING, name: str = "",
           strategy: str = "PACK", bundles: tuple[dict[str, float], ...] | None = None,
           node_ids: tuple[str | None, ...] | None = None, job_id: str | None = None,
           label_selectors: tuple[dict[str, str], ...] = ()) -> "SnapBuilder":
        """A placement group of bundles ``{"GPU": g, "CPU": 1}`` (or ``bundles`` verbatim), unplaced unless
        ``node_ids`` names the Ray node of each bundle."""
        bundles = tuple({"GPU": g, "CPU": 1.0} for g in bundle_gpus) if bundles is None else tuple(bundles)
        self.pgs.append(
            PlacementGroupView(
                pg_id=pg_id,
                name=name,
                state=state,
                strategy=strategy,
                bundles=bundles,
                bundle_node_ids=tuple(None for _ in bundles) if node_ids is None else tuple(node_ids),
                bundle_label_selectors=tuple(label_selectors),
                creator_job_id=job_id,
            )
        )
        return self

    def nvml_view(self, view: NvmlView) -> "SnapBuilder":
        """An NVML view verbatim (a recording replayed through ``probe_nvml``), for Ray node ``view.node_id``."""
        self.nvml_views[view.node_id] = view
        return self

    # --------------------------------------------------------------- NVML
    def nvml(
        self,
        node_id: str,
        devices: int = 8,
        *,
        name: str = "NVIDIA H100 80GB HBM3",
        mig: tuple[str, ...] = (),  # MIG profiles on device 0, e.g. ("3g.40gb", "3g.40gb")
        unavailable: str | None = None,  # e.g. "Driver Not Loaded"
    ) -> "SnapBuilder":
        if unavailable is not None:
            self.nvml_views[node_id] = NvmlView(node_id=node_id, available=False, reason=f"NVML unavailable: {unavailable}")
            return self
        devs = []
        for i in range(devices):
            migs = tuple(
                MigDeviceView(uuid=f"MIG-{node_id}-{i}-{j}", profile=p, memory_total_bytes=40 * GiB)
                for j, p in enumerate(mig if i == 0 else ())
            )
            devs.append(
                NvmlDeviceView(
                    index=i,
                    uuid=f"GPU-{node_id}-{i}",
                    name=name,
                    memory_total_bytes=80 * GiB,
                    mig_enabled=bool(migs),
                    mig_devices=migs,
                )
            )
        self.nvml_views[node_id] = NvmlView(
            node_id=node_id, available=True, driver_version="550.54.15", cuda_version="12.4", devices=tuple(devs)
        )
        return self

    # --------------------------------------------------------- whole pods
    def worker(self, pod: str, node: str, gpus: float = 4, **pod_kw: Any) -> "SnapBuilder":
        """A healthy GPU worker: pod, its live Ray node (id ``r-<pod>``) and NVML seeing its GPUs."""
        return self.ray_pod(pod, node=node, gpus=gpus, **pod_kw).ray_node(f"r-{pod}", instance=pod, gpus=gpus).nvml(
            f"r-{pod}", devices=int(gpus)
        )

    def head(self, node: str = "cpu-0") -> "SnapBuilder":
        return self.ray_pod("rc-head", node=node, head=True).ray_node("r-head", instance="rc-head", head=True)

    def k8s_unreachable(self, reason: str = "connection refused") -> "SnapBuilder":
        self.k8s_reason = reason
        return self

    def ray_unreachable(self, reason: str = "GCS timeout") -> "SnapBuilder":
        self.ray_reason = reason
        return self

    def obj(self) -> Snapshot:
        return Snapshot(
            taken_at_s=self.taken_at_s,
            cluster=self.cluster,
            namespace=self.namespace,
            ray=RayView(
                reachable=self.ray_reason is None,
                reason=self.ray_reason,
                nodes=tuple(self.ray_nodes),
                placement_groups=tuple(self.pgs),
            ),
            k8s=K8sView(
                reachable=self.k8s_reason is None,
                reason=self.k8s_reason,
                nodes=tuple(self.nodes),
                pods=tuple(self.pods),
                device_plugin_pods=tuple(self.dp_pods),
                resource_slices=tuple(self.slices) if self.slices is not None else None,
            ),
            nvml=dict(self.nvml_views),
        )


def snap(taken_at_s: float = NOW_S, cluster: str | None = "rc", **kw: Any) -> SnapBuilder:
    """``kw``: ``namespace`` (default "default"), ``ids`` (pod uids and Ray node IPs, default True)."""
    return SnapBuilder(taken_at_s, cluster, **kw)


def healthy(nodes: int = 2, pods_per_node: int = 2, gpus_per_node: int = 8) -> SnapBuilder:
    """A head on a CPU node and ``nodes`` GPU nodes, each full of healthy workers."""
    b = snap().cpu_node("cpu-0").head()
    per_pod = gpus_per_node // pods_per_node
    for n in range(nodes):
        b.gpu_node(f"gpu-{n}", gpus=gpus_per_node)
        for p in range(pods_per_node):
            b.worker(f"w-{n}-{p}", f"gpu-{n}", gpus=per_pod)
    return b


def tol(key: str | None = None, effect: str | None = None, operator: str = "Exists") -> Toleration:
    return Toleration(key=key, operator=operator, effect=effect)
