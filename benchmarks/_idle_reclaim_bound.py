"""The idle-reclaim benchmark's perfect-foresight lower bound: fewest launches for an idle GPU-h budget, and the reverse.

With foresight a worker is launched one start-up ahead of need (no waiting; a starting pod is provisioned,
not idle, as the simulation counts it) and deleted the moment it is not needed again soon enough. The
demand is a per-step *floor* on the workers the inputs need: busy streams (one whole pod each) plus, for
the placement groups alive (arrival to arrival + life, placed at once), max(ceil(their GPUs / GPUs per
pod), the largest STRICT_SPREAD PG's bundles). No placement needs fewer workers, so the bound holds for
every policy of the simulation.

The demand curve is split into levels (worker k is needed while demand >= k); a level that falls at e and
rises again at u leaves a gap u - e. Keeping the worker idle across the gap costs (u - e) x GPUs per pod
of idle GPU-time and saves one launch; a level that starts at step 0 is an initial pod (free, as in the
simulation). The offline optimum for a budget bridges the shortest gaps first (ski rental with
foresight: keep a worker across a gap iff it is shorter than a threshold that meets the budget), pooled
over the clusters.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from dataclasses import dataclass
from itertools import accumulate
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from benchmarks._idle_reclaim_trace import PG


def demand_floor(streams: list[list[int]], pgs: list["PG"], steps: int, step_s: float, gpus_per_pod: float) -> list[int]:
    """Per step, a lower bound on the workers the inputs need (see the module docstring)."""
    busy = [sum(1 for s in streams if s[i] == 1) for i in range(steps)]
    gpus = [0.0] * steps
    spread = [0] * steps
    for pg in pgs:
        first = math.ceil(pg.arrive_s / step_s)
        for i in range(first, min(steps, math.ceil((pg.arrive_s + pg.life_s) / step_s))):
            gpus[i] += sum(pg.bundles)
            if pg.strategy == "STRICT_SPREAD":
                spread[i] = max(spread[i], len(pg.bundles))
    return [b + max(math.ceil(g / gpus_per_pod - 1e-9), sp) for b, g, sp in zip(busy, gpus, spread)]


def level_gaps(demand: list[int]) -> tuple[int, list[int]]:
    """(launches with no gap bridged, the gaps in steps) of one cluster's demand curve, by levels."""
    ended: dict[int, int] = {}  # level -> step it last fell
    launches, gaps, prev = 0, [], demand[0] if demand else 0
    for i, d in enumerate(demand[1:], start=1):
        for k in range(prev + 1, d + 1):  # levels rising at i
            if k in ended:
                gaps.append(i - ended.pop(k))
            launches += 1
        for k in range(d + 1, prev + 1):  # levels falling at i
            ended[k] = i
        prev = d
    return launches, gaps


@dataclass(frozen=True)
class Bound:
    launches0: int  # launches when no gap is bridged (zero idle)
    gap_gpu_h: tuple[float, ...]  # each gap's idle GPU-h, shortest first
    cum_gpu_h: tuple[float, ...]  # idle GPU-h after bridging the first j+1 gaps

    def min_launches(self, idle_gpu_h: float) -> int:
        """Fewest launches within ``idle_gpu_h`` of idle: bridge the shortest gaps that fit."""
        return self.launches0 - bisect_right(self.cum_gpu_h, idle_gpu_h + 1e-9)

    def min_idle(self, launches: int) -> float | None:
        """Least idle GPU-h for at most ``launches`` launches; None when no idle budget gets that few."""
        j = self.launches0 - launches
        if j <= 0:
            return 0.0
        return self.cum_gpu_h[j - 1] if j <= len(self.cum_gpu_h) else None

    def curve(self, max_idle_gpu_h: float, points: int = 200) -> list[tuple[float, int]]:
        """(idle GPU-h, launches) along the frontier, up to ``max_idle_gpu_h``."""
        out = [(0.0, self.launches0)]
        for j, c in enumerate(self.cum_gpu_h):
            if c > max_idle_gpu_h:
                break
            out.append((c, self.launches0 - j - 1))
        stride = max(1, len(out) // points)
        return out[::stride] + ([out[-1]] if (len(out) - 1) % stride else [])


def bound(demands: list[list[int]], step_s: float, gpus_per_pod: float) -> Bound:
    launches0, gaps = 0, []
    for d in demands:
        n, g = level_gaps(d)
        launches0 += n
        gaps += g
    gpu_h = sorted(g * step_s * gpus_per_pod / 3600.0 for g in gaps)
    return Bound(launches0=launches0, gap_gpu_h=tuple(gpu_h), cum_gpu_h=tuple(accumulate(gpu_h)))


def place(b: Bound, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Where each row sits against the bound: the bound's launches at its idle, and idle at its launches."""
    out = []
    for r in rows:
        lo = b.min_launches(r["idle_gpu_h"])
        out.append({"policy": r["policy"], "idle_timeout_s": r["idle_timeout_s"], "idle_gpu_h": r["idle_gpu_h"],
                    "launches": r["launches"], "bound_launches_at_idle": lo,
                    "launches_over_bound": round(r["launches"] / lo, 3) if lo else None,
                    "bound_idle_gpu_h_at_launches": None if (x := b.min_idle(r["launches"])) is None else round(x, 2)})
    return out
