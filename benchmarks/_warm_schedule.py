"""The keep-warm testbed benchmark's pure parts: the bursty schedule, the prior history, the per-arm numbers.

``schedule(seed, minutes, every_s, max_burst)``: bursts of 1..``max_burst``
placement groups of one 1-GPU bundle each, one burst every ``every_s`` ± 20 %
(the first at 5 % of ``every_s``), each PG held for 20-50 % of ``every_s`` after
it is ready (so bursts never overlap). The same seed gives the same schedule to every arm.

``prior_demand``: the demand history the sidecar would have recorded running
the same kind of schedule (another seed) for ``hours`` before the run: per
``step_s`` bucket the most PGs alive (each needs one worker), as
``plan.warm.demand_by_group`` counts them. No start-up durations: the sidecar
measures those live.

``summarize``: from the pods seen (creation, deletion) and the driver's PG
records, per arm: worker pod launches, PG wait (creation -> ready), worker
pod-seconds and the idle part of them (pod-seconds not holding a PG).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from benchmarks._common import percentile


@dataclass(frozen=True)
class Burst:
    at_s: float  # seconds after the run's start
    holds_s: tuple[float, ...]  # one PG each, held this long once ready


def schedule(seed: int, minutes: float, every_s: float, max_burst: int = 3) -> list[Burst]:
    """Bursts until ``minutes`` minus one burst interval (so the last one ends inside the run)."""
    rng = random.Random(seed)
    out, k = [], 0
    while True:
        at = k * every_s + (0.05 * every_s if k == 0 else rng.uniform(-0.2, 0.2) * every_s)
        if at > minutes * 60 - every_s:
            return out
        n = rng.randint(1, max_burst)
        out.append(Burst(at_s=round(at, 1), holds_s=tuple(round(rng.uniform(0.2, 0.5) * every_s, 1)
                                                          for _ in range(n))))
        k += 1


def prior_demand(seed: int, hours: float, every_s: float, end_s: float, step_s: float = 60.0,
                 max_burst: int = 3, ready_s: float = 0.0) -> tuple[tuple[float, int], ...]:
    """(bucket start, PGs alive at most in it) per ``step_s`` bucket over ``hours`` before ``end_s``
    (an epoch time); ``ready_s``: assumed creation -> ready of each PG."""
    span = hours * 3600
    bursts = schedule(seed, span / 60 + every_s / 60, every_s, max_burst)
    first = math.floor((end_s - span) / step_s) * step_s
    steps = int(span // step_s)
    alive = [(first + b.at_s, first + b.at_s + ready_s + hold) for b in bursts for hold in b.holds_s]
    demand = [0] * steps
    for i in range(steps):  # the most alive at once in the bucket, looked at every 5 s as the sidecar would
        looks = [first + i * step_s + k * 5.0 for k in range(int(step_s // 5))]
        demand[i] = max(sum(1 for a, z in alive if a <= t < z) for t in looks)
    return tuple((first + i * step_s, n) for i, n in enumerate(demand) if first + i * step_s < end_s - step_s)


def summarize(pods: dict[str, tuple[float, float | None]], pgs: list[dict], t0: float, t_end: float) -> dict:
    """``pods``: worker pod uid -> (created, deleted or None), epoch seconds; ``pgs``: the driver's records
    (``created``, ``ready`` or None, ``removed`` or None)."""
    launched = [u for u, (c, _) in pods.items() if c >= t0 - 1]
    pod_s = sum(max(0.0, min(d if d is not None else t_end, t_end) - max(c, t0)) for c, d in pods.values())
    held_s = sum(max(0.0, min(p["removed"] or t_end, t_end) - p["ready"]) for p in pgs if p.get("ready"))
    waits = [p["ready"] - p["created"] for p in pgs if p.get("ready")]
    return {"pod_launches": len(launched), "pgs": len(pgs), "pgs_ready": len(waits),
            "wait_p50_s": percentile(waits, 50), "wait_p90_s": percentile(waits, 90),
            "wait_max_s": max(waits) if waits else None,
            "waits_over_10s": sum(1 for w in waits if w > 10),
            "worker_pod_s": pod_s, "held_s": held_s, "idle_worker_s": max(0.0, pod_s - held_s)}
