"""The joins of one snapshot that every step of a decision cycle reads, built once per snapshot (pure, no I/O).

A decision cycle runs several pure functions on one :class:`Snapshot`: the doctor's ``reconcile``
(``plan.doctor``), ``plan_reclaim``. Each used to join the views on its own; what they share is built
here, once, and passed to each explicitly:

* :class:`RayJoin` (``join_ray``): the live Ray nodes and the pod each one runs in
  (``RayNodeView.instance_id`` == pod name, as KubeRay sets ``RAY_CLOUD_INSTANCE_ID``; a pod whose Ray
  restarted inside it while the old node is still reported alive has several, all in ``RayJoin.shared``) and, for the doctor,
  the NVML view of each pod, its units and MIG flag, worked out in the same visit. ``plan_reclaim`` needs only the join; it builds it itself when not given one.
* ``plan.doctor.checks_index.index_snapshot(snapshot)`` (built on this join, below the doctor): the doctor's
  :class:`SnapshotIndex`, which holds that ``RayJoin`` (``.ray``) and the rest every doctor check reads. Give it to ``reconcile(..., index=ix)`` and
  ``plan_reclaim(..., index=ix)`` and the Ray nodes are joined once for both. Each still walks the pods
  for its own decisions (the doctor per node, plan_reclaim per pod of its cluster, with its policy and clock).

There is no cache: an index belongs to the snapshot it was built from (``index.snapshot``), and a caller
that has a new snapshot builds a new index.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import filterfalse
from operator import attrgetter

from raygpu.model.views import NvmlView, RayNodeView

_INSTANCE_ID = attrgetter("instance_id")
_MIG_ENABLED = attrgetter("mig_enabled")


@dataclass(frozen=True)
class RayJoin:
    """Ray's live nodes, joined to pod names (and to NVML views). Read-only: shared by every reader of one snapshot."""

    live: list[RayNodeView]  # alive, in snapshot order
    by_instance: dict[str, RayNodeView]  # instance id -> the last live node of that id (snapshot order)
    unique: bool  # no two live nodes share an instance id: by_instance holds every live node that has one
    with_instance_count: int  # live nodes with an instance id
    # NVML's view by pod name (instance id), of the live nodes with both, in the same visit; all empty when
    # the join was not given the NVML views. Of two nodes of one instance id the last view wins, and the
    # units of the last available one (no pairs kept: every container that outlives a collection is one more
    # object for the next full one)
    nvml_by_pod: dict[str, NvmlView]
    nvml_units_by_pod: dict[str, int]  # NvmlView.gpu_units of the available views
    nvml_mig_pods: set[str]  # pods whose available NVML view has MIG on
    # instance id -> every live node of that id, in snapshot order, for the ids two or more live nodes share
    # (Ray restarted inside the pod while its old node is still reported alive); empty when ``unique``
    shared: dict[str, tuple[RayNodeView, ...]]

    def with_instance(self) -> list[RayNodeView]:
        """The live nodes with an instance id, in snapshot order."""
        return list(filter(_INSTANCE_ID, self.live))

    def without_instance(self) -> list[RayNodeView]:
        """The live nodes with no instance id, in snapshot order."""
        if self.with_instance_count == len(self.live):
            return []
        return list(filterfalse(_INSTANCE_ID, self.live))


def join_ray(nodes: tuple[RayNodeView, ...], nvml: dict[str, NvmlView] | None = None) -> RayJoin:
    """The :class:`RayJoin` of a snapshot's Ray nodes (and its NVML views by Ray node id, when given).

    One visit per node: at 20,000 Ray nodes reading a node is mostly waiting for memory, so one loop that
    reads what it needs of each node beats several C loops that each read one attribute of every node."""
    live: list[RayNodeView] = []
    by_instance: dict[str, RayNodeView] = {}
    views: dict[str, NvmlView] = {}
    units: dict[str, int] = {}
    mig: set[str] = set()
    count = 0
    get = nvml.get if nvml else None
    for n in nodes:
        if not n.alive:
            continue
        live.append(n)
        instance = n.instance_id
        if not instance:
            continue
        count += 1
        by_instance[instance] = n
        if get is not None and (view := get(n.node_id)) is not None:
            views[instance] = view
            if view.available:
                devices = view.devices
                if any(map(_MIG_ENABLED, devices)):  # MIG instances count; the usual view (no MIG) in one C loop
                    units[instance] = view.gpu_units
                    mig.add(instance)
                else:
                    units[instance] = len(devices)
    shared: dict[str, tuple[RayNodeView, ...]] = {}
    if len(by_instance) != count:  # rare: a second pass, only then
        all_of: dict[str, list[RayNodeView]] = {}
        for n in live:
            if n.instance_id:
                all_of.setdefault(n.instance_id, []).append(n)
        shared = {i: tuple(ns) for i, ns in all_of.items() if len(ns) > 1}
    return RayJoin(live, by_instance, len(by_instance) == count, count, views, units, mig, shared)
