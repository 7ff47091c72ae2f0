"""The doctor's pure function: one Snapshot in, one DoctorReport out.

Steps of a cycle:

1. index the snapshot in one pass per view (``SnapshotIndex``: Ray node <-> pod by instance id,
   pod -> node, NVML by Ray node; per node a tally of what its pods add up to; per check the
   list of objects it could find something about), so that no later step walks the pods again;
2. run the checks bottom-up, in the order that isolates a fault fastest:
   GPU hardware (NVML's XIDs and memory errors, health agents' node marks) -> kernel driver -> container toolkit -> device plugin -> kubelet (allocatable,
   taints) -> Ray (membership, num-gpus). A view that could not be read skips
   the checks that need it;
3. sort findings by (layer, severity, kind, subject);
4. do the stranded-GPU arithmetic and build one row per GPU node, from the node tallies;
5. name the blast radius of every unhealthy GPU or node (its Ray nodes, placement groups, jobs, reservations).

No I/O, no clock: ``now_s`` is an argument (it ages pods for the orphan grace).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from raygpu.model.findings import DoctorReport, Finding, Layer, NodeRow
from raygpu.model.raycluster import GroupTemplate
from raygpu.model.views import Snapshot
from raygpu.plan.doctor import checks_dra, checks_health, checks_node, checks_ray
from raygpu.plan.doctor.checks_index import SnapshotIndex
from raygpu.plan.doctor.stranded import stranded_gpus

DEFAULT_ORPHAN_GRACE_S = 120.0


@dataclass(frozen=True)
class Check:
    """One named check, the layer it inspects, and whether it needs Ray's view."""

    name: str
    layer: Layer
    needs_ray: bool
    run: Callable[[SnapshotIndex], list[Finding]]
    applies: Callable[[SnapshotIndex], bool] = lambda ix: True  # False: not run, not listed in checks_run


def checks(now_s: float, orphan_grace_s: float = DEFAULT_ORPHAN_GRACE_S) -> tuple[Check, ...]:
    """The checks in the order they run (lowest layer first)."""
    return (
        Check("gpu-health", Layer.GPU_HARDWARE, False, checks_health.check_gpu_health, lambda ix: bool(ix.snapshot.nvml)),
        Check("node-health", Layer.GPU_HARDWARE, False, checks_health.check_node_health),
        Check("nvml-driver", Layer.KERNEL_DRIVER, False, checks_node.check_driver),
        Check("nvml-container", Layer.CONTAINER_TOOLKIT, False, checks_node.check_container),
        Check("gpu-capacity", Layer.DEVICE_PLUGIN, False, checks_node.check_capacity),
        Check("gpu-allocatable", Layer.DEVICE_PLUGIN, False, checks_node.check_allocatable),
        Check("mig-strategy", Layer.DEVICE_PLUGIN, False, checks_node.check_mig_strategy),
        Check("dra-devices", Layer.DEVICE_PLUGIN, False, checks_dra.check_dra, checks_dra.applies),
        Check("gpu-taints", Layer.KUBELET, False, checks_node.check_taints),
        Check(
            "ray-membership",
            Layer.RAY_CONFIG,
            True,
            lambda ix: checks_ray.check_membership(ix, now_s, orphan_grace_s),
        ),
        Check("ray-gpu-count", Layer.RAY_CONFIG, True, checks_ray.check_gpu_count),
    )


def reconcile(
    snapshot: Snapshot,
    now_s: float,
    *,
    orphan_grace_s: float = DEFAULT_ORPHAN_GRACE_S,
    templates: Iterable[GroupTemplate] = (),
    include_pending_pgs: bool = True,
    index: SnapshotIndex | None = None,
) -> DoctorReport:
    """Turn a snapshot of Ray's, kubelet's and NVML's views into typed findings.

    Promises: pure and deterministic (same snapshot and ``now_s``, same report);
    never raises on a well-typed snapshot; a healthy cluster gives no finding;
    findings come sorted lowest layer first. When Kubernetes could not be read
    nothing is checked and ``exit_code`` is 2; when Ray could not be read, the
    Ray checks are skipped and ``exit_code`` is 2 as well.

    ``orphan_grace_s``: a Running pod younger than this is not an orphan yet.
    ``templates``: worker groups of the RayCluster, for the CPU/memory part of
    the stranded arithmetic (else the shapes of the Ray pods in the snapshot).
    ``index``: ``plan.doctor.checks_index.index_snapshot(snapshot)`` when the caller has it already (a cycle that also
    runs ``plan_reclaim`` on this snapshot builds it once for both); built here when not given.
    """
    unreachable = []
    if not snapshot.k8s.reachable:
        unreachable.append(f"kubernetes: {snapshot.k8s.reason or 'unreachable'}")
    if not snapshot.ray.reachable:
        unreachable.append(f"ray: {snapshot.ray.reason or 'unreachable'}")
    base = dict(
        taken_at_s=snapshot.taken_at_s,
        now_s=now_s,
        cluster=snapshot.cluster,
        namespace=snapshot.namespace,
        unreachable=tuple(unreachable),
    )
    if not snapshot.k8s.reachable:
        return DoctorReport(**base)

    ix = SnapshotIndex.build(snapshot) if index is None else _of(index, snapshot)
    found: list[Finding] = []
    ran: list[str] = []
    for check in checks(now_s, orphan_grace_s):
        if (check.needs_ray and not snapshot.ray.reachable) or not check.applies(ix):
            continue
        ran.append(check.name)
        found.extend(check.run(ix))
    found.sort(key=lambda f: f.sort_key)
    return DoctorReport(
        **base,
        checks_run=tuple(ran),
        rows=checks_dra.with_dra_rows(node_rows(ix, found), ix),
        findings=tuple(found),
        stranded=stranded_gpus(snapshot, templates=templates, include_pending_pgs=include_pending_pgs, index=ix),
        blast_radius=checks_health.blast_radius(ix, found),
    )


def _of(index: SnapshotIndex, snapshot: Snapshot) -> SnapshotIndex:
    """``index`` if it is the index of this very snapshot (an index of another one would mislead every check)."""
    if index.snapshot is not snapshot:
        raise ValueError("index was built from another snapshot")
    return index


def node_rows(ix: SnapshotIndex, findings: Iterable[Finding] = ()) -> tuple[NodeRow, ...]:
    """One row per GPU node, sorted by name: Ray, pod, kubelet and NVML counts side by side.

    The counts are the ones the index added up per node (``NodeTally``) in its one pass over the pods.
    """
    per_node: dict[str, int] = {}
    for f in findings:
        if f.node:
            per_node[f.node] = per_node.get(f.node, 0) + 1
    rows = []
    tallies, is_gpu_node = ix.tallies, ix.is_gpu_node
    for name in ix.sorted_node_names():
        tally = tallies[name]
        if not (tally.capacity_units > 0 or tally.product is not None) and not is_gpu_node(tally.node):
            continue
        rows.append((name, tally.product, tally.ray_gpus, tally.pod_gpus, tally.capacity_units, tally.allocatable_units,
                     tally.nvml_units, tally.nvml_unavailable, per_node.get(name, 0)))
    return NodeRow.typed_many(rows)
