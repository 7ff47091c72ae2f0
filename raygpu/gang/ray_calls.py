"""The Ray calls a gang placement group makes on the driver's connection (injectable for tests)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable


@dataclass(frozen=True)
class RayCalls:
    """The Ray calls a GangPlacementGroup makes on the driver's connection: ``real()`` Ray's, or a test's fakes."""

    placement_group: Callable[..., Any]  # ray.util.placement_group
    placement_group_table: Callable[[Any], dict]  # ray.util.placement_group.placement_group_table
    remove_placement_group: Callable[[Any], None]  # ray.util.remove_placement_group
    nodes: Callable[[], list[dict]]  # ray.nodes

    @classmethod
    def real(cls) -> "RayCalls":
        import ray
        from ray.util import placement_group as ray_pg
        from ray.util import remove_placement_group
        from ray.util.placement_group import placement_group_table
        return cls(ray_pg, placement_group_table, remove_placement_group, ray.nodes)
