"""The Ray calls a gang placement group makes on the driver's connection (injectable for tests)."""

from __future__ import annotations

from dataclasses import dataclass
from functools import wraps
from typing import Any, Callable


class RayDisconnected(RuntimeError):
    """This process's Ray driver is not connected (the user called ``ray.shutdown()``, or the interpreter is
    exiting and Ray's own atexit hook ran first). Ray's placement-group calls would then ``ray.init()`` a new
    local Ray instance on their own (``auto_init_ray``), from our watchdog thread: never call them then. A
    driver's placement groups are not detached, so Ray removed them with the job."""


def _connected(call: Callable[..., Any]) -> Callable[..., Any]:
    @wraps(call)
    def guarded(*args: Any, **kwargs: Any) -> Any:
        import ray
        if not ray.is_initialized():
            raise RayDisconnected("this driver is no longer connected to Ray (ray.shutdown() or exit)")
        return call(*args, **kwargs)
    return guarded


@dataclass(frozen=True)
class RayCalls:
    """The Ray calls a GangPlacementGroup makes on the driver's connection: ``real()`` Ray's, or a test's fakes.
    Each raises RayDisconnected once the driver is disconnected."""

    placement_group: Callable[..., Any]  # ray.util.placement_group
    placement_group_table: Callable[[Any], dict]  # ray.util.placement_group.placement_group_table
    remove_placement_group: Callable[[Any], None]  # ray.util.remove_placement_group
    nodes: Callable[[], list[dict]]  # ray.nodes
    connected: Callable[[], bool] = lambda: True  # ray.is_initialized

    @classmethod
    def real(cls) -> "RayCalls":
        import ray
        from ray.util import placement_group as ray_pg
        from ray.util import remove_placement_group
        from ray.util.placement_group import placement_group_table
        return cls(_connected(ray_pg), _connected(placement_group_table), _connected(remove_placement_group),
                   _connected(ray.nodes), ray.is_initialized)
