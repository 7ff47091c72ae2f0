"""The idle-reclaim benchmark's keep-warm policies: ``auto`` (raygpu.plan.reclaim.warm, the sidecar's code) and the
perfect-foresight ``oracle``, both applied through ``plan_reclaim``'s ``warm_targets``; and ``oracle-pg``, the
foresight that the PG-wait frontier sweeps.

``auto`` learns what the sidecar would see each step (``demand_by_group`` on the snapshot, which carries
Ray's pending task demand; pod start-ups as the step that sees the Ray node up) and keeps warm what
``plan_warm`` says (the fixed timeout of the run, 300 s by default, until enough samples). ``oracle`` keeps
warm exactly the rise of the *future* demand over the next start-up window: busy streams plus the workers
of the placement groups alive at each step (arrival to arrival + life, a PG's workers as
``demand_by_group`` counts them), read from the inputs, so it bounds what any keep-warm policy of this form
can gain. ``oracle-pg`` keeps warm, at each step, the rise of that demand at the placement groups' arrivals
within a look-ahead ``oracle_horizon_s`` (no stream is served ahead): swept over the horizon it is the
PG-wait frontier, how much idle a policy that knows when every PG comes must spend for a PG-wait p95.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from typing import TYPE_CHECKING

from raygpu.model.reclaim import ReclaimPolicy
from raygpu.plan.reclaim.warm import demand_by_group, plan_warm, record

if TYPE_CHECKING:
    from benchmarks._idle_reclaim_sim import Sim
    from benchmarks._idle_reclaim_trace import PG

GROUP = "gpu"


def keep_warm_policy(sim: "Sim", now: float, base: ReclaimPolicy) -> ReclaimPolicy:
    """The ReclaimPolicy of this step: ``base`` (raygpu), plus the keep-warm target (auto, oracle)."""
    if sim.policy == "auto":
        demand = demand_by_group(sim.snapshot(now), sim.cluster_view())
        sim.warm_history = record(sim.warm_history, now, {GROUP: demand[GROUP]}, sim.warm, {GROUP: sim.startups})
        sim.startups = []
        t = plan_warm(sim.warm_history, [GROUP], now, sim.warm)[GROUP]
        if t.warm is None:
            return base.model_copy(update={"group_idle_timeout_s": {GROUP: t.fallback_timeout_s}})
        if sim.first_warm_s is None:
            sim.first_warm_s = now  # the first step with a learned target: the end of the fallback
        sim.warm_targets.append(t.warm)
        return base.model_copy(update={"warm_targets": {GROUP: t.warm}, "warm_reasons": {GROUP: t.reason},
                                       "warm_hold_s": {GROUP: t.hold_s} if t.hold_s > 0 else {}})
    if sim.policy in ("oracle", "oracle-pg"):
        d = sim.p.oracle or []
        i = int(round(now / sim.p.step_s))
        k = max(1, math.ceil((sim.p.oracle_horizon_s or sim.p.startup_s) / sim.p.step_s))
        if sim.policy == "oracle":
            ahead = d[i + 1:i + 1 + k]
        else:  # only the PG arrivals within the horizon: the demand then, each
            lo, hi = bisect_right(sim.p.oracle_pg_steps, i), bisect_right(sim.p.oracle_pg_steps, i + k)
            ahead = [d[j] for j in sim.p.oracle_pg_steps[lo:hi] if j < len(d)]
        warm = max(0, max(ahead) - d[i]) if ahead and i < len(d) else 0
        sim.warm_targets.append(warm)
        return base.model_copy(update={"warm_targets": {GROUP: warm}})
    return base


def oracle_demand(streams: list[list[int]], pgs: list["PG"], steps: int, step_s: float, gpus_per_pod: float) -> list[int]:
    """Per step, the workers the inputs will need: busy streams + workers of the PGs alive then."""
    out = [sum(1 for s in streams if s[i] == 1) for i in range(steps)]
    for pg in pgs:
        need = math.ceil(sum(pg.bundles) / gpus_per_pod - 1e-9)
        need = max(need, len(pg.bundles)) if pg.strategy == "STRICT_SPREAD" else max(need, 1)
        first = math.ceil(pg.arrive_s / step_s)
        for i in range(first, min(steps, math.ceil((pg.arrive_s + pg.life_s) / step_s))):
            out[i] += need
    return out
