"""The joins of one snapshot that every step of a decision cycle reads, built once per snapshot (pure, no I/O).

A decision cycle runs several pure functions on one :class:`Snapshot`: the doctor's ``reconcile``
(``plan.doctor``), ``plan_reclaim``. Each used to join the views on its own; what they share is built
here, once, and passed to each explicitly:

* :class:`RayJoin` (``join_ray``): the live Ray nodes and the pod each one runs in
  (``RayNodeView.instance_id`` == pod name, as KubeRay sets ``RAY_CLOUD_INSTANCE_ID``). ``plan_reclaim``
  needs only this; it builds it itself when not given one (cheap: C loops over the Ray nodes).
* ``index_snapshot(snapshot)``: the doctor's :class:`SnapshotIndex`, which holds that ``RayJoin``
  (``.ray``) and the rest every doctor check reads. Give it to ``reconcile(..., index=ix)`` and
  ``plan_reclaim(..., index=ix)`` and the snapshot is walked once for both.

There is no cache: an index belongs to the snapshot it was built from (``index.snapshot``), and a caller
that has a new snapshot builds a new index.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import compress, filterfalse
from operator import attrgetter
from typing import TYPE_CHECKING

from raygpu.model.views import RayNodeView, Snapshot

if TYPE_CHECKING:
    from raygpu.plan.doctor.checks_index import SnapshotIndex

_ALIVE, _INSTANCE_ID = attrgetter("alive"), attrgetter("instance_id")


@dataclass(frozen=True)
class RayJoin:
    """Ray's live nodes, joined to pod names. Read-only: shared by every reader of one snapshot."""

    live: list[RayNodeView]  # alive, in snapshot order
    with_instance: list[RayNodeView]  # the live ones with an instance id, in snapshot order
    by_instance: dict[str, RayNodeView]  # instance id -> the last live node of that id (snapshot order)
    unique: bool  # no two live nodes share an instance id (by_instance holds every one of with_instance)

    def without_instance(self) -> list[RayNodeView]:
        """The live nodes with no instance id, in snapshot order."""
        if len(self.with_instance) == len(self.live):
            return []
        return list(filterfalse(_INSTANCE_ID, self.live))


def join_ray(nodes: tuple[RayNodeView, ...]) -> RayJoin:
    """The :class:`RayJoin` of a snapshot's Ray nodes: three C loops over them, no Python loop."""
    live = list(compress(nodes, map(_ALIVE, nodes)))
    with_instance = list(filter(_INSTANCE_ID, live))
    by_instance = dict(zip(map(_INSTANCE_ID, with_instance), with_instance))
    return RayJoin(live, with_instance, by_instance, len(by_instance) == len(with_instance))


def index_snapshot(snapshot: Snapshot) -> "SnapshotIndex":
    """The one index of ``snapshot`` for a whole cycle: read it with ``reconcile`` and ``plan_reclaim``."""
    from raygpu.plan.doctor.checks_index import SnapshotIndex  # the doctor's checks live below plan/doctor

    return SnapshotIndex.build(snapshot)
