"""What one sidecar cycle is given and what it returns: ``SidecarConfig``, ``CycleOutcome``, ``CycleReport``
(``raygpu.reclaim.loop`` runs the cycles)."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Callable

from raygpu.model.gc import DEFAULT_HEARTBEAT_TIMEOUT_S, GcPlan
from raygpu.model.reclaim import ReclaimMode, ReclaimPlan


class CycleOutcome(str, Enum):
    NOT_SYNCED = "not-synced"  # the watch cache has not listed everything yet: no plan
    NO_CLUSTER = "no-cluster"  # the RayCluster does not exist (yet, or any more)
    OFF = "off"  # raygpu.io/reclaim: off
    IDLE = "nothing-to-do"  # planned; nothing to delete or release
    DRY_RUN = "dry-run"  # planned and reported, nothing written
    APPLIED = "applied"  # something was written
    CONFLICT = "conflict"  # the RayCluster changed under the plan: re-plan now
    ERROR = "error"  # a write or a read failed; the next cycle re-plans


@dataclass
class SidecarConfig:
    namespace: str
    cluster: str
    ray_address: str
    interval_s: float = 10.0
    startup_grace_s: float = 120.0
    heartbeat_timeout_s: float = DEFAULT_HEARTBEAT_TIMEOUT_S
    ray_timeout_s: float = 10.0
    scale_up_backoff_s: float = 30.0  # gang scale-up: the first back-off after a failure (doubling up to 10 min)


@dataclass
class CycleReport:
    outcome: CycleOutcome
    mode: ReclaimMode | None = None
    plan: ReclaimPlan | None = None
    gc: GcPlan | None = None
    deleted_pods: tuple[str, ...] = ()  # put in workersToDelete by this cycle
    released: tuple[str, ...] = ()  # reservation ConfigMaps released by this cycle
    reserved: tuple[str, ...] = ()  # gang scale-up reservations made by this cycle
    error: str | None = None
    duration_s: float = 0.0
    errors: list[str] = field(default_factory=list)

    @property
    def replan_now(self) -> bool:
        return self.outcome is CycleOutcome.CONFLICT


BeforeApply = Callable[[ReclaimPlan], None]
