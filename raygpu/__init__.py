"""raygpu: make Ray and Kubernetes agree about GPUs.

* ``placement_group`` / ``remove_placement_group`` / ``gang_placement_group``:
  a Ray placement group with its own all-or-nothing Kubernetes gang reservation.
* ``plan_placement_group``: the same plan as a dry run, with no side effects.
* ``placement_group_async`` / ``gang_placement_group_async`` and ``await pg.ready_async()``: the same
  for asyncio drivers, never blocking the event loop (raygpu.gang.api).
* Without Ray installed (the ``ray`` extra), ``import raygpu`` and the dry run still work; the calls that
  make a Ray placement group raise ``MissingExtraError``, naming ``pip install "raygpu[ray]"``.
* ``__version__``: the installed distribution's version, from its package metadata.
"""

from importlib import metadata as _metadata

from raygpu.errors import (ConflictError, ForbiddenError, InfeasibleError, InvalidError, MissingExtraError,
                           NotFoundError, PermanentError, RayGpuError, TransientError)
from raygpu.gang.api import (GangPlacementGroup, gang_placement_group, gang_placement_group_async, placement_group,
                             placement_group_async, remove_placement_group)
from raygpu.gang.requests import plan_placement_group

VERSION_UNKNOWN = "0+unknown"  # PEP 440, lower than any release: a source tree that was never installed

try:
    __version__ = _metadata.version("raygpu")
except _metadata.PackageNotFoundError:  # imported from a source tree on sys.path: no metadata to read
    __version__ = VERSION_UNKNOWN

__all__ = [
    "placement_group", "remove_placement_group", "gang_placement_group", "plan_placement_group",
    "placement_group_async", "gang_placement_group_async",
    "GangPlacementGroup", "RayGpuError", "TransientError", "PermanentError", "InfeasibleError", "ConflictError",
    "NotFoundError", "ForbiddenError", "InvalidError", "MissingExtraError",
]
