"""Keep-warm that learns (``raygpu.io/idle-timeout: auto``): how many idle workers each group keeps.

The idea (the hybrid keep-alive of "Serverless in the Wild", ATC '20, applied
to worker pods): an idle worker is worth keeping only for demand that will
arrive before a new pod could start. So per worker group the policy keeps warm
the ``q``-quantile of the *demand rise over one start-up window*: for every
recorded demand sample ``d(t)``, the rise is ``max d(t') - d(t)`` over
``t < t' <= t + W`` (0 when demand falls), ``W`` the median measured pod
start-up (creation -> Ray node joined). Of the rises in the last
``history_s``, the ``q``-quantile (nearest rank, rounded up to whole workers)
is the target. Until a group has ``min_samples`` rises and one measured
start-up, it has no target and its fixed ``fallback_timeout_s`` applies.

Everything here is pure: no clock (``now_s`` is an argument), no I/O, no state
between calls. The sidecar (``raygpu.reclaim.warm``) and the idle-reclaim
benchmark run the same functions: ``demand_by_group`` on what a cycle
observed, ``record`` to fold it into the bounded history, ``plan_warm`` for
the targets, which ``plan_reclaim`` then honours after every protection
(``ReclaimPolicy.warm_targets``).
"""

from __future__ import annotations

import math
from collections import defaultdict, deque

from raygpu.model.raycluster import GroupTemplate, RayClusterView
from raygpu.model.views import PgState, Snapshot
from raygpu.model.warm import (MAX_DEMAND_WORKERS, MAX_STARTUP_S, MAX_STARTUP_SAMPLES, GroupHistory, WarmHistory,
                               WarmSettings, WarmTarget)

_PENDING = (PgState.PENDING, PgState.RESCHEDULING)


def demand_by_group(snapshot: Snapshot, cluster: RayClusterView) -> dict[str, int]:
    """Workers each worker group of ``cluster`` needs now: its busy workers (a pod with a live Ray node that
    is not idle: a task, an actor or a placement-group bundle) plus the workers its share of the waiting demand
    needs (the unplaced bundles of PENDING/RESCHEDULING PGs and Ray's pending tasks/actors).

    A waiting bundle goes to the first group, in spec order, whose worker offers its GPUs and CPUs; the
    workers it needs are its GPUs (else CPUs) over one worker's, rounded up per PG (STRICT_SPREAD: at
    least one worker per bundle) and for all tasks of a group together. Demand no group could host is
    left out (no warm worker helps it). An approximation of Ray's packing, on purpose simple: the target
    is a quantile of rises of this number, so a constant bias cancels out.
    """
    groups = [g for g in cluster.worker_groups]
    out = {g.group_name: 0 for g in groups}
    pods = {p.name: p for p in snapshot.k8s.pods
            if p.ray_cluster == cluster.name and p.namespace == cluster.namespace and not p.is_head}
    busy: set[str] = set()  # pod names: a pod whose Ray restarted inside it has two live nodes, one worker
    for n in snapshot.ray.nodes:
        pod = pods.get(n.instance_id or "")
        group = (pod.ray_group if pod else None) or n.node_type
        if n.alive and not n.is_head and pod is not None and group in out and n.idle_since_s is None \
                and pod.name not in busy:
            busy.add(pod.name)
            out[group] += 1
    tasks: dict[str, float] = defaultdict(float)
    for d in snapshot.ray.resource_demand:
        g = _host_group(groups, d.bundle)
        if g is not None:
            tasks[g.group_name] += _units(g, d.bundle) * d.count
    for name, units in tasks.items():
        out[name] += math.ceil(units - 1e-9)
    for pg in sorted(snapshot.ray.placement_groups, key=lambda p: p.pg_id):
        if pg.state not in _PENDING:
            continue
        per_group: dict[str, list[float]] = defaultdict(list)
        for i, bundle in enumerate(pg.bundles):
            placed = i < len(pg.bundle_node_ids) and pg.bundle_node_ids[i]
            g = None if placed else _host_group(groups, bundle)
            if g is not None:
                per_group[g.group_name].append(_units(cluster.group(g.group_name), bundle))
        for name, units in per_group.items():
            need = math.ceil(sum(units) - 1e-9)
            out[name] += max(need, len(units)) if pg.strategy == "STRICT_SPREAD" else max(need, 1)
    return out


def record(history: WarmHistory, now_s: float, demand: dict[str, int], settings: WarmSettings,
           startups: dict[str, list[float]] | None = None) -> WarmHistory:
    """``history`` with this observation folded in: per group in ``demand``, one sample per ``step_s``
    bucket (the highest demand seen in it, at most MAX_DEMAND_WORKERS), samples older than ``history_s``
    dropped, and so are samples after this bucket (dated in the future: the clock stepped back; kept, they
    would hold every new sample out); new start-up durations within [0, MAX_STARTUP_S] appended (the newest
    MAX_STARTUP_SAMPLES kept). Groups not in ``demand`` are dropped: only the groups in ``auto`` are learned."""
    out = {}
    bucket = math.floor(now_s / settings.step_s) * settings.step_s
    for group, n in sorted(demand.items()):
        h = history.groups.get(group, GroupHistory())
        n = min(n, MAX_DEMAND_WORKERS)
        samples = list(h.demand)
        if samples and samples[-1][0] > bucket:
            samples = [s for s in samples if s[0] <= bucket]
        if samples and samples[-1][0] == bucket:
            samples[-1] = (bucket, max(samples[-1][1], n))
        else:
            samples.append((bucket, n))
        samples = [s for s in samples if s[0] > now_s - settings.history_s]
        new = [s for s in (startups or {}).get(group) or () if 0 <= s <= MAX_STARTUP_S]
        ups = (*h.startup_s, *new)[-MAX_STARTUP_SAMPLES:]
        out[group] = GroupHistory(demand=tuple(samples), startup_s=tuple(ups))
    return WarmHistory(groups=out)


def plan_warm(history: WarmHistory, groups: list[str], now_s: float, settings: WarmSettings) -> dict[str, WarmTarget]:
    """One WarmTarget per group of ``groups``: the warm workers to keep, or None with the fallback timeout
    while the group's history is too short; ``reason`` names the quantile, the window, the horizon and
    the numbers."""
    return {g: _target(g, history.groups.get(g, GroupHistory()), now_s, settings) for g in groups}


def _target(group: str, h: GroupHistory, now_s: float, s: WarmSettings) -> WarmTarget:
    base = dict(group=group, fallback_timeout_s=s.fallback_timeout_s, quantile=s.quantile)
    fallback = f"fallback idle timeout {s.fallback_timeout_s:.0f}s"
    if not h.startup_s:
        return WarmTarget(warm=None, reason=f"no pod start-up measured yet: {fallback}", **base)
    startup_s = _median(h.startup_s)
    # demand is sampled once a step: a start-up shorter than that is measured over one step (the next sample);
    # over less, no sample has a later one in its window and the group would never learn
    window_s = max(startup_s, s.step_s)
    since = now_s - s.history_s
    demand = [x for x in h.demand if since < x[0] <= now_s]  # a sample past now (a clock step) counts for nothing
    rises = rises_over(demand, window_s)
    if len(rises) < s.min_samples:
        return WarmTarget(warm=None, window_s=window_s, samples=len(rises),
                          reason=f"{len(rises)} demand rises over {window_s:.0f}s < {s.min_samples} needed: {fallback}",
                          **base)
    ordered = sorted(rises)
    warm = ordered[max(0, math.ceil(s.quantile * len(ordered)) - 1)]
    now = demand[-1][1] if demand else 0
    over = (f"the {window_s:.0f}s start-up (median of {len(h.startup_s)})" if startup_s >= s.step_s else
            f"one {window_s:.0f}s sample step (start-up {startup_s:.0f}s, median of {len(h.startup_s)})")
    hold_s = s.hold_startups * startup_s
    held = f"; beyond it, idle {hold_s:.0f}s first ({s.hold_startups:g} start-ups)" if hold_s > 0 else ""
    return WarmTarget(warm=warm, window_s=window_s, samples=len(rises), hold_s=hold_s, reason=(
        f"keep {warm} warm = q{s.quantile:g} of the demand rise over {over}, {len(rises)} samples in the last "
        f"{s.history_s / 3600:g}h (rise p50 {ordered[(len(ordered) - 1) // 2]}, max {ordered[-1]}; demand now {now})"
        f"{held}"),
        **base)


def rises_over(demand: list[tuple[float, int]] | tuple[tuple[float, int], ...], window_s: float) -> list[int]:
    """For each sample whose following ``window_s`` the history covers (``t + window_s <=`` the last
    sample's time), the rise ``max(d(t') - d(t), 0)`` over the samples ``t < t' <= t + window_s``. A sample
    with no later sample in its window (a gap: the sidecar was down) gives no rise.

    ``demand`` in time order. Linear in samples however many a window holds: the window slides (both its
    ends only move forward) and its maximum is the front of a deque of indices whose demand decreases."""
    out: list[int] = []
    if not demand:
        return out
    last_t = demand[-1][0]
    size = len(demand)
    window: deque[int] = deque()  # indices in (i, j), demand strictly decreasing: the front is the max
    j = 0
    for i, (t, d) in enumerate(demand):
        if t + window_s > last_t:
            break
        while window and window[0] <= i:
            window.popleft()
        j = max(j, i + 1)
        end = t + window_s
        while j < size and demand[j][0] <= end:
            n = demand[j][1]
            while window and demand[window[-1]][1] <= n:
                window.pop()
            window.append(j)
            j += 1
        if window:
            out.append(max(0, demand[window[0]][1] - d))
    return out


def _median(xs: tuple[float, ...]) -> float:
    s = sorted(xs)
    mid = len(s) // 2
    return s[mid] if len(s) % 2 else (s[mid - 1] + s[mid]) / 2


def _host_group(groups: list[GroupTemplate], bundle: dict[str, float]) -> GroupTemplate | None:
    """The first group whose worker offers the bundle's GPUs and CPUs (other resources are not checked)."""
    for g in groups:
        if bundle.get("GPU", 0.0) <= g.ray_gpus + 1e-9 and bundle.get("CPU", 0.0) <= g.ray_cpus + 1e-9:
            return g
    return None


def _units(g: GroupTemplate | None, bundle: dict[str, float]) -> float:
    """The share of one worker of ``g`` a bundle takes: by GPUs, else by CPUs, else a whole worker."""
    if g is None:
        return 1.0
    if bundle.get("GPU", 0.0) > 0 and g.ray_gpus > 0:
        return bundle["GPU"] / g.ray_gpus
    if bundle.get("CPU", 0.0) > 0 and g.ray_cpus > 0:
        return bundle["CPU"] / g.ray_cpus
    return 1.0
