"""Gang scale-up's decision as data (``raygpu.plan.scale_up.plan_scale_up`` makes it; docs/gang-scale-up.md)."""

from __future__ import annotations

from raygpu.model.base import Frozen
from raygpu.model.gang import GangRequest


class ScaleUpItem(Frozen):
    """One gang reservation to make: for placement group ``pg_id`` (hex), as ``request``."""

    pg_id: str
    request: GangRequest
    # the worker group to copy when the placement group's bundle label selectors allow only some (None: the
    # planner chooses, as for any gang)
    template: str | None = None


class ScaleUpPlan(Frozen):
    """What one cycle's gang scale-up does, in order: re-target, mark ready, reserve.

    ``retarget``: (reservation, placement group id) whose pods another placement group took, or which now
    waits for the group that lost its pods; ``ready``: (reservation, placement group id) whose placement
    group is CREATED on its pods; ``reserve``: reservations to make, oldest placement group first;
    ``waiting``: (placement group id, why it gets none this cycle); ``budget_spent``: why placement groups
    were left unjudged ('' when none were); ``note``: why nothing was planned at all ('' otherwise).
    """

    reserve: tuple[ScaleUpItem, ...] = ()
    ready: tuple[tuple[str, str], ...] = ()
    retarget: tuple[tuple[str, str], ...] = ()
    waiting: tuple[tuple[str, str], ...] = ()
    budget_spent: str = ""
    note: str = ""
