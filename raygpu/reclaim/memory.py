"""What the sidecar remembers between cycles about reservations, on its own clock.

The garbage collector never compares the driver's clock with the sidecar's
(issue 14 item 11): it measures how long a state ConfigMap has existed and how
long its heartbeat has not changed from when this process saw them, and how
long a reservation-looking worker group has had no proven state ConfigMap. A
restart forgets, so after one the collector waits the full timeouts again.
"""

from __future__ import annotations

from raygpu.model.gc import OrphanGroup, ReservationRecord, SeenAt, is_reservation_group
from raygpu.model.labels import RESERVATION_GROUP_PREFIX
from raygpu.model.raycluster import RayClusterView


class GcMemory:
    def __init__(self) -> None:
        self._seen: dict[str, tuple[str, float | None, SeenAt]] = {}  # ConfigMap -> (uid, heartbeat, seen at)
        self._orphan_since: dict[str, float] = {}  # group without a proven state ConfigMap -> first seen so
        self._state_seen: set[str] = set()  # groups of which a proven state ConfigMap was seen

    @property
    def seen(self) -> dict[str, tuple[str, float | None, SeenAt]]:
        """ConfigMap name -> (uid, heartbeat, SeenAt): ``reclaim.confirm`` updates it when a live read finds
        a heartbeat the cache missed."""
        return self._seen

    def first_seen_s(self) -> dict[str, float]:
        """State ConfigMap name -> when this process first saw it (as of the last ``seen_at``)."""
        return {name: at.first_s for name, (_, _, at) in self._seen.items()}

    def seen_at(self, reservations: tuple[ReservationRecord, ...], now_s: float) -> dict[str, SeenAt]:
        """When this process first saw each state ConfigMap, and saw its heartbeat take its current value."""
        seen = {}
        for r in reservations:
            uid, beat, at = self._seen.get(r.name, (None, None, None))
            if at is None or uid != r.uid:
                at = SeenAt(first_s=now_s, heartbeat_s=now_s)
            elif beat != r.heartbeat_at_s:
                at = at.model_copy(update={"heartbeat_s": now_s})
            seen[r.name] = (r.uid, r.heartbeat_at_s, at)
        self._seen = seen
        return {name: at for name, (_, _, at) in seen.items()}

    def orphan_groups(self, cluster: RayClusterView, reservations: tuple[ReservationRecord, ...],
                       now_s: float) -> dict[str, OrphanGroup]:
        """Worker groups without a proven state ConfigMap that look like reservations (``rg-*`` or raygpu's
        label), with when first seen so and whether a proven state ConfigMap of theirs was seen before."""
        proven = {r.group for r in reservations if r.owned_by(cluster.name, cluster.uid)}
        groups = {g.group_name for g in cluster.worker_groups}
        self._state_seen = (self._state_seen | proven) & groups
        now = {g.group_name for g in cluster.worker_groups if g.group_name not in proven
               and (g.group_name.startswith(RESERVATION_GROUP_PREFIX) or is_reservation_group(g))}
        self._orphan_since = {g: self._orphan_since.get(g, now_s) for g in now}
        return {g: OrphanGroup(since_s=t, state_seen=g in self._state_seen) for g, t in self._orphan_since.items()}
