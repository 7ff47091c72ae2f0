"""Idle reclaim on real GPU traces: Ray autoscaler v2's idle termination vs raygpu's reclaimer.

Every trace it can replay, each in turn (``--trace``, default all): ``genai`` (below) and ``openb``: the GPU
tasks of ``alibaba-gpu-v2023/openb_pod_list_default.csv`` in one 24 h window (``--openb-day``, default day
138, a median day): each task (never-scheduled ones left out) is a stream busy from its creation to its
deletion, one whole worker, sampled once a minute (10 s steps). ``alibaba-spot-v2026`` is not replayed: it
is a node table only, nothing in it says when a worker is needed. ``auto`` starts cold (no history: its
fallback until it has learned); on ``openb`` an ``auto-warm`` row also starts with the history ``auto``
learned over the ``--warm-prior-h`` (6) hours before the window. The cold-start table says when ``auto``
first had a target and from when on its cumulative launches and idle GPU-h stay at or below its reference
fixed row's (``_idle_reclaim_pareto.cold_match``).

A discrete-time simulation, ``--substeps`` (6) steps per trace sample (9.5 s steps), of ``--clusters``
RayClusters with one worker group ``gpu`` of ``--gpus-per-pod`` GPUs per pod.
What is real and what is synthesized:

* **Idle and busy periods (real)**: the per-pod GPU duty-cycle series of
  ``alibaba-genai-v2026/pod_gpu_duty_cycle_anon.csv`` (Alibaba clusterdata,
  read from the tar.gz without extracting it): 143 pods, one sample per 57 s,
  22.8 h. Each trace pod is a *stream*: a serving replica that is busy at a
  step when its utilisation is above ``--busy-threshold`` (5%), idle
  otherwise. A stream exists from its first to its last sample (a gap of up to
  5 samples holds the last value; a longer one is idle). Streams go to the
  clusters round-robin in pod-id order. A busy stream needs a whole worker pod
  (a Ray task ``{"GPU": G}``): it keeps the pod it runs on while busy, releases
  it when idle, and when busy again takes its previous pod if free, else the
  first free pod (creation order), else it waits (a pending resource request)
  for the autoscaler. Demand follows the trace: work that waits is not made up
  later.
* **Placement groups (synthesized)**: Poisson arrivals, ``--pg-rate`` per hour
  per cluster (seeded); 1 to ``--pg-max-bundles`` (4) bundles ``{"GPU": g}``,
  g in {1, 2, 4} (at most G); ``STRICT_SPREAD`` with probability ``--spread-share`` (when >1 bundle),
  else ``PACK``; held for an exponential time (mean ``--pg-life-min``) once
  placed. The GCS places a pending PG atomically (all bundles or none), first
  fit over live workers in creation order (STRICT_SPREAD: distinct workers).
  A worker hosting a bundle is not idle, as in Ray (a bundle allocates the
  node's resources).
* **Scale-up (identical for both)**: each step Ray's own
  ``ray.autoscaler.v2.scheduler.ResourceDemandScheduler.schedule`` is called
  with a real ``SchedulingRequest`` (RAY_RUNNING instances with ``NodeState``
  and idle durations, ALLOCATED instances for pods still starting, one
  ``ResourceRequestByCount`` for the waiting streams, one
  ``GangResourceRequest`` per pending PG, with the ``_PG_<id>`` anti-affinity
  of STRICT_SPREAD), and its ``to_launch`` creates pods, whose Ray node comes
  up ``--startup-s`` later. Deletions take effect at once (KubeRay deletes a
  listed pod within seconds) and never race with new work.

Policies (scale-down only), run side by side in one run: ``ray-v2`` at each fixed
``--idle-timeout`` (30/60/120/180/300/600 s), ``auto`` and ``oracle``
(``_idle_reclaim_warm.py``), and with ``--with-raygpu`` ``raygpu`` at each timeout:

* ``ray-v2``: the same ``schedule`` call with ``idle_timeout_s`` set; every
  ``to_terminate`` with cause ``IDLE`` is deleted (Ray skips an idle node that
  its own placement of the pending demands uses).
* ``raygpu``: ``raygpu.plan.reclaim.scale_down.plan_reclaim`` on a ``Snapshot`` (Ray nodes
  with ``idle_since_s``, the PG table, the pods) and a ``RayClusterView``;
  its ``deleted_pods`` are deleted. Ray's scheduler is then called with
  ``idle_timeout_s=None`` for the launches (the docs' setup: autoscaler
  scales up, raygpu scales down).
* ``auto``: ``plan_reclaim`` with the keep-warm targets of ``raygpu.plan.reclaim.warm``
  (the sidecar's code, fed what the sidecar would see; ``--quantile``, fallback
  ``--auto-fallback`` until enough history).
* ``oracle``: the same, keeping warm the exact rise of future demand over the next
  start-up window (perfect foresight; the bound of a keep-warm policy).

Every fixed row is a real run: the sweep, then a bisection of the timeout (``--match-tolerance``, 2%;
``--max-probes``) until one row's idle GPU-h is that close to ``auto``'s; nothing is interpolated. The
goal check (``_idle_reclaim_pareto.py``) compares ``auto`` with the real row of the nearest idle GPU-h not
above its own: launches <= 0.85x, PG wait p95 <= 0.5x, waiting GPU-h <= 1.0x, said plainly when not met.
The perfect-foresight bound (``_idle_reclaim_bound.py``: fewest launches with zero waiting for an idle
GPU-h budget, and the reverse) is printed with where every row sits against it, and drawn on the Pareto
plot (``idle_reclaim_pareto.png``: left idle GPU-h vs waiting GPU-h, marker area ~ launches; right idle
GPU-h vs launches with the bound). ``--auto-hold`` sets ``auto``'s hold (``WarmSettings.hold_startups``).

Metrics (summed over clusters): idle GPU-h (GPUs of live workers with no task
and no bundle), provisioned GPU-h (all pods, starting ones included), waiting
GPU-h (busy streams without a pod), PGs broken (a removed worker held one of
their bundles), PGs delayed (a worker was removed while the PG was pending and
that worker, at removal, had free GPUs for one of the PG's unplaced bundles),
PG wait p50/p95 (arrival to placement; still pending at the end counts to the
end), churn (pods removed that never ran a task nor held a bundle),
scale-downs and launches. Two diagnostics say whether the policies *could*
differ: ``contested`` counts cluster-steps with a pending PG and a live
worker idle past the timeout (the only moments where the pending-PG
protections of either policy matter), and ``disagree`` counts the steps of
the ``ray-v2`` run where ``plan_reclaim``, called on the very same state (not
applied), would have deleted a different set of pods than Ray did.

Ray's ``SchedulingRequest`` is built in ``_idle_reclaim_sim.py``, not imported from
``bench_decision_cost.py``: that one builds a fixed synthetic state
(``ray_request(n)``), while this one mirrors an evolving cluster; both use the
same classes and conventions (``AutoscalerInstance`` = IM ``Instance`` + GCS
``NodeState``, instance id = pod name).

    python -m benchmarks.bench_idle_reclaim            # genai (143 streams, 22.8 h) and openb (24 h), 2 clusters
    python -m benchmarks.bench_idle_reclaim --quick    # genai 24 streams, openb its window's; 3 h, 1 cluster
    python -m benchmarks.bench_idle_reclaim --trace openb --openb-day 140
    python -m benchmarks.bench_idle_reclaim --idle-timeout 300 --max-replicas 24   # quota-capped clusters
    python -m benchmarks.bench_idle_reclaim --json --no-plot
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import time
from collections import Counter
from typing import Any

from benchmarks._common import machine, machine_line, need_traces, percentile, print_table, save_plot
from benchmarks._idle_reclaim_sim import Params, Sim
from benchmarks._idle_reclaim_trace import (MEMBER, OPENB_DAY, OPENB_TASKS, PG, TRACE, Trace, busy_series, load_openb,
                                            load_trace, make_pgs)
from benchmarks._idle_reclaim_bound import bound, demand_floor, place
from benchmarks._idle_reclaim_pareto import cold_match, goal_check, pareto_plot, pg_frontier_lines
from benchmarks._idle_reclaim_warm import oracle_demand
from raygpu.model.reclaim import ReclaimReason
from raygpu.model.warm import DEFAULT_HOLD_STARTUPS, DEFAULT_QUANTILE, GroupHistory, WarmHistory

FIXED_TIMEOUTS_S = (30.0, 60.0, 120.0, 180.0, 300.0, 600.0)


def run_policy(policy: str, trace: Trace, args, timeout_s: float, cap: int, steps: int,
               histories: list[WarmHistory] | None = None, keep_sims: bool = False,
               horizon_s: float | None = None) -> dict[str, Any]:
    """Simulate every cluster under one policy; cap 0 = each cluster's streams + 8 (never binding in practice).
    ``auto`` uses ``timeout_s`` as its fallback and starts from ``histories`` (one per cluster; None: cold);
    ``oracle`` is told the future demand; ``oracle-pg`` the future demand and when each PG arrives, and looks
    ``horizon_s`` ahead."""
    step_s = trace.step_s / args.substeps
    per_cluster, all_pgs = cluster_inputs(trace, args, steps)
    sims: list[Sim] = []
    arrived: list[list[PG]] = []
    for c, (streams, pgs) in enumerate(zip(per_cluster, all_pgs)):
        arrived.append(list(pgs))
        foresight = policy in ("oracle", "oracle-pg")
        oracle = oracle_demand(streams, pgs, steps, step_s, args.gpus_per_pod) if foresight else None
        pg_steps = tuple(sorted({math.ceil(pg.arrive_s / step_s) for pg in pgs})) if policy == "oracle-pg" else ()
        p = Params(gpus_per_pod=args.gpus_per_pod, idle_timeout_s=timeout_s, startup_s=args.startup_s,
                   min_replicas=args.min_replicas, max_replicas=cap or (len(streams) + 8), step_s=step_s,
                   quantile=args.quantile, oracle=oracle, oracle_pg_steps=pg_steps, oracle_horizon_s=horizon_s,
                   warm_step_s=trace.step_s,
                   hold_startups=args.auto_hold, warm_history=histories[c] if histories else None)
        sims.append(Sim(c, policy, streams, pgs, p, shadow=not args.no_shadow))
    for i in range(steps):
        for sim in sims:
            sim.step(i)
    end_s = steps * step_s
    m: Counter = Counter()
    waits: list[float] = []
    reasons: Counter = Counter()
    for sim, pgs in zip(sims, arrived):
        m.update(sim.m)
        reasons.update(sim.raygpu_reasons)
        for pg in pgs:
            waits.append((pg.placed_s if pg.placed_s is not None else end_s) - pg.arrive_s)
        m["pgs_unplaced"] += sum(1 for pg in pgs if pg.placed_s is None)
        m["decision_s"] += sim.decision_s
    m["max_pods"] = sum(sim.m["max_pods"] for sim in sims)
    series = [tuple(sum(col) for col in zip(*rows)) for rows in zip(*(sim.series for sim in sims))]
    series = [(r[0] / len(sims), *r[1:]) for r in series]
    h = 3600.0
    row = {
        "policy": policy,
        "idle_timeout_s": timeout_s,
        "max_replicas": cap or None,
        "clusters": args.clusters,
        "streams": sum(len(s.streams) for s in sims),
        "steps": steps,
        "demand_gpu_h": round(m["demand_gpu_s"] / h, 2),
        "provisioned_gpu_h": round(m["provisioned_gpu_s"] / h, 2),
        "alive_gpu_h": round(m["alive_gpu_s"] / h, 2),
        "idle_gpu_h": round(m["idle_gpu_s"] / h, 2),
        "task_gpu_h": round(m["task_gpu_s"] / h, 2),
        "bundle_gpu_h": round(m["bundle_gpu_s"] / h, 2),
        "waiting_gpu_h": round(m["waiting_gpu_s"] / h, 2),
        "pgs": m["pgs"],
        "pgs_unplaced": m["pgs_unplaced"],
        "pg_broken": m["pg_broken"],
        "pg_delayed": m["pg_delayed"],
        "pg_wait_p50_s": round(percentile(waits, 50), 1),
        "pg_wait_p95_s": round(percentile(waits, 95), 1),
        "pg_wait_mean_s": round(sum(waits) / len(waits), 1) if waits else 0.0,
        # the PGs that waited more than half a start-up: a PG-wait p95 <= 0.5x one start-up needs <= 5% of them
        "pg_waited_over_half_startup": sum(1 for w in waits if w > args.startup_s / 2),
        "initial_pods": m["initial_pods"],
        "launches": m["launches"],
        "scale_downs": m["scale_downs"],
        "churn": m["churn"],
        "work_killed": m["work_killed"],
        "other_terminations": m["other_terminations"],
        "kept_idle_past_timeout": m["kept_idle_past_timeout"],
        "at_cap_steps": m["at_cap_steps"],
        "pending_pg_steps": m["pending_pg_steps"],
        "contested_steps": m["contested_steps"],
        "max_pods": m["max_pods"],
        "decision_calls": m["decision_calls"],
        "decision_skipped": m["decision_skipped"],
        "decision_ms_mean": round(m["decision_s"] * 1e3 / m["decision_calls"], 2) if m["decision_calls"] else None,
    }
    if policy == "ray-v2":
        row["shadow_disagree_steps"] = m["shadow_disagree_steps"]
        row["shadow_only_ray"] = m["shadow_only_ray"]
        row["shadow_only_raygpu"] = m["shadow_only_raygpu"]
    targets = [t for sim in sims for t in sim.warm_targets]
    if policy in ("auto", "oracle", "oracle-pg"):
        row["warm_target_mean"] = round(sum(targets) / len(targets), 2) if targets else None
        row["warm_steps"] = len(targets)  # cluster-steps past the fallback
        firsts = [sim.first_warm_s for sim in sims]
        row["first_warm_s"] = None if None in firsts else max(firsts)  # every cluster past its fallback
    if policy != "ray-v2":  # every policy that runs plan_reclaim
        row["raygpu_needed_by_pending_pg"] = reasons.get(ReclaimReason.NEEDED_BY_PENDING_PG.value, 0)
        row["raygpu_holds_bundle"] = reasons.get(ReclaimReason.HOLDS_BUNDLE.value, 0)
    return {"row": row, "series": series, **({"sims": sims} if keep_sims else {})}


def cluster_inputs(trace: Trace, args, steps: int) -> tuple[list[list[list[int]]], list[list[PG]]]:
    """Per cluster: its streams' busy series (each trace sample held for ``--substeps`` steps) and its PGs."""
    k = args.substeps
    streams_all = [[b for b in busy_series(trace.samples[p], trace.n_steps, args.busy_threshold) for _ in range(k)]
                   for p in stream_ids(trace, args)]
    per_cluster: list[list[list[int]]] = [[] for _ in range(args.clusters)]
    for i, s in enumerate(streams_all):
        per_cluster[i % args.clusters].append(s)
    pgs = [make_pgs(c, args.seed, steps * trace.step_s / k, args.pg_rate, args.spread_share, args.pg_life_min,
                    args.gpus_per_pod, args.pg_max_bundles) for c in range(args.clusters)]
    return per_cluster, pgs


def probe_timeouts(group: list[dict[str, Any]], target: float, tol: float, max_probes: int, run) -> list[float]:
    """Bisect the fixed timeout, one real ``ray-v2`` run per probe (``run(t)`` returns its row, appended to
    ``group``), until a row's idle GPU-h is within ``tol`` (relative) of ``target`` or ``max_probes`` ran or
    the bracket is under one second. Idle GPU-h grows with the timeout; nothing is interpolated."""
    probed: list[float] = []
    for _ in range(max_probes):
        fixed = [r for r in group if r["policy"] == "ray-v2"]
        if any(abs(r["idle_gpu_h"] - target) <= tol * target for r in fixed):
            break
        lo = max((r["idle_timeout_s"] for r in fixed if r["idle_gpu_h"] < target), default=None)
        hi = min((r["idle_timeout_s"] for r in fixed if r["idle_gpu_h"] > target), default=None)
        if lo is None or hi is None or hi - lo < 1.0:
            break
        t = round((lo + hi) / 2, 1)
        group.append(run(t))
        probed.append(t)
    return probed


def stream_ids(trace: Trace, args) -> tuple[str, ...]:
    return trace.pods[: args.streams] if args.streams else trace.pods


def plot(series: dict[str, list[tuple[float, ...]]], name: str, title: str) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(series), 1, figsize=(10, 3.2 * len(series)), sharex=True, sharey=True)
    for ax, (pol, s) in zip(axes, series.items()):
        t = [(x[0] - s[0][0]) / 3600 for x in s]
        ax.plot(t, [x[2] for x in s], lw=0.8, label="alive Ray workers", color="tab:blue")
        ax.plot(t, [x[1] for x in s], lw=0.6, ls="--", label="provisioned (pods, incl. starting)", color="black")
        ax.plot(t, [x[4] for x in s], lw=0.8, label="used (tasks + PG bundles)", color="tab:green")
        ax.fill_between(t, 0, [x[3] for x in s], step=None, alpha=0.35, color="tab:red", label="idle workers")
        ax.set_ylabel(f"{pol}\nGPUs")
        ax.grid(alpha=0.3)
    axes[0].legend(loc="upper left", fontsize=7, ncol=2)
    axes[0].set_title(title, fontsize=9)
    axes[-1].set_xlabel("hours")
    return save_plot(fig, name)


COLUMNS = [("idle_timeout_s", "timeout s", ".0f"), ("max_replicas", "cap", "d"), ("policy", "policy", ""),
           ("demand_gpu_h", "demand GPU-h", ".1f"), ("provisioned_gpu_h", "provisioned GPU-h", ".1f"),
           ("idle_gpu_h", "idle GPU-h", ".1f"), ("waiting_gpu_h", "waiting GPU-h", ".1f"),
           ("pgs", "PGs", "d"), ("pg_broken", "broken", "d"), ("pg_delayed", "delayed", "d"),
           ("pg_wait_p50_s", "PG wait p50 s", ".0f"), ("pg_wait_p95_s", "PG wait p95 s", ".0f"),
           ("launches", "launches", "d"), ("scale_downs", "scale-downs", "d"), ("churn", "churn", "d"),
           ("contested_steps", "contested", "d"), ("shadow_disagree_steps", "disagree", "d"),
           ("warm_target_mean", "warm mean", ".2f"),
           ("decision_ms_mean", "decide ms", ".1f")]


BOUND_COLUMNS = [("policy", "policy", ""), ("idle_timeout_s", "timeout s", ".1f"), ("idle_gpu_h", "idle GPU-h", ".2f"),
                 ("launches", "launches", "d"), ("bound_launches_at_idle", "bound launches @idle", "d"),
                 ("launches_over_bound", "launches / bound", ".2f"),
                 ("bound_idle_gpu_h_at_launches", "bound idle GPU-h @launches", ".2f")]


TRACE_KEYS = ("genai", "openb")
TRACE_TITLES = {"genai": "alibaba-genai-v2026 duty cycles", "openb": "alibaba-gpu-v2023 openb tasks"}
# alibaba-spot-v2026 is not replayed: it holds a node table only (gpu_model, gpu_capacity_num, cpu_num,
# node_name), no job or usage table, so nothing in it says when a worker is needed.
NOT_REPLAYED = {"alibaba-spot-v2026": "node_info_df.csv only (a node table): no job or usage table, so nothing "
                                      "says when a worker is needed"}


def load(key: str, args) -> tuple[Trace, str, float | None]:
    """The trace ``key`` as the benchmark replays it, its source, and the prior window's start (openb)."""
    if key == "genai":
        return load_trace(), f"alibaba-genai-v2026/{TRACE.name}:{MEMBER}", None
    hours = args.hours or (3.0 if args.quick else 24.0)
    return (load_openb(args.openb_day, hours), f"alibaba-gpu-v2023/{OPENB_TASKS.name}, day {args.openb_day:g}, "
            f"{hours:g} h", args.openb_day - args.warm_prior_h / 24.0)


def prior_histories(args, prior_day: float, cap: int) -> list[WarmHistory]:
    """``auto``'s history at the window's start when it ran through the ``--warm-prior-h`` before it (cold
    there): one ``auto`` run per cluster over the prior window, its history moved back by that window."""
    prior = load_openb(prior_day, args.warm_prior_h)
    steps = prior.n_steps * args.substeps
    out = run_policy("auto", prior, args, args.auto_fallback, cap, steps, keep_sims=True)["sims"]
    shift = steps * prior.step_s / args.substeps
    return [WarmHistory(groups={g: GroupHistory(demand=tuple((t - shift, n) for t, n in h.demand),
                                                startup_s=h.startup_s)
                                for g, h in sim.warm_history.groups.items()}) for sim in out]


def run_trace(key: str, args, timeouts: list[float], caps: list[int]) -> dict[str, Any]:
    """Every policy on one trace, each cap: the sweep, auto (cold; warm where the trace has a prior window),
    the oracle, the bisection probes (real runs), the bound, the goal check and the cold-start match."""
    t_start = time.perf_counter()
    targs = argparse.Namespace(**vars(args))
    if key == "openb":
        targs.streams = None  # the window's tasks, all of them
    trace, source, prior_day = load(key, targs)
    load_s = time.perf_counter() - t_start
    hours = targs.hours or (3.0 if targs.quick else None) if key == "genai" else None
    steps = (min(trace.n_steps, int(round(hours * 3600 / trace.step_s))) if hours else trace.n_steps) * targs.substeps
    step_s = trace.step_s / targs.substeps
    rows, plots, goals, bounds, colds = [], [], [], [], []
    suffix = ("" if key == "genai" else f"_{key}") + ("_quick" if targs.quick else "")
    for cap in caps:
        series: dict[str, Any] = {}
        runs = [("ray-v2", float(t)) for t in timeouts]
        runs += [("raygpu", float(t)) for t in timeouts if targs.with_raygpu]
        runs += [("auto", targs.auto_fallback), ("oracle", targs.auto_fallback)]
        group = []
        for pol, timeout in runs:
            out = run_policy(pol, trace, targs, timeout, cap, steps)
            group.append(out["row"])
            series[series_name(pol, timeout)] = out["series"]
        if prior_day is not None and targs.warm_prior_h > 0:
            out = run_policy("auto", trace, targs, targs.auto_fallback, cap, steps,
                             histories=prior_histories(targs, prior_day, cap))
            out["row"]["policy"] = "auto-warm"
            group.append(out["row"])
            series["auto-warm"] = out["series"]
        run_fixed = lambda t: run_policy("ray-v2", trace, targs, t, cap, steps)  # noqa: E731
        for pol in ("auto", "auto-warm"):
            row = next((r for r in group if r["policy"] == pol), None)
            if row is not None:  # real runs, into group (and their series, for the cold-start match)
                probe_timeouts(group, row["idle_gpu_h"], targs.match_tolerance, targs.max_probes,
                               lambda t: _keep(series, series_name("ray-v2", t), run_fixed(t)))
        group.sort(key=lambda r: (r["policy"] != "ray-v2", POLICY_ORDER.get(r["policy"], 9), r["idle_timeout_s"]))
        rows.extend(group)
        per_cluster, all_pgs = cluster_inputs(trace, targs, steps)
        b = bound([demand_floor(st, pg, steps, step_s, targs.gpus_per_pod) for st, pg in zip(per_cluster, all_pgs)],
                  step_s, targs.gpus_per_pod)
        top = max(r["idle_gpu_h"] for r in group)
        bounds.append({"max_replicas": cap or None, "launches_at_zero_idle": b.launches0, "gaps": len(b.gap_gpu_h),
                       "frontier": [(round(x, 3), n) for x, n in b.curve(top, points=60)],
                       "rows": place(b, group)})
        goal = goal_check(group, targs.match_tolerance)
        goal["max_replicas"] = cap or None
        goal["pg_frontier"] = [pg_frontier_point(run_policy("oracle-pg", trace, targs, targs.auto_fallback, cap, steps,
                                                            horizon_s=h)["row"], h) for h in targs.pg_frontier]
        goal["lines"] += pg_frontier_lines(goal, goal["pg_frontier"])
        goals.append(goal)
        for pol in ("auto", "auto-warm"):
            g = goal.get(pol)
            if g and g.get("in_range"):
                ref = series[series_name("ray-v2", g["fixed_timeout_s"])]
                cold = cold_match(series[pol], ref, targs.match_tolerance)
                first = next(r for r in group if r["policy"] == pol)["first_warm_s"]
                cold.update({"first_warm_h": None if first is None else round(first / 3600.0, 2), "policy": pol, "max_replicas": cap or None, "fixed_timeout_s": g["fixed_timeout_s"],
                             "ratios": g["ratios"], "met": g["met"]})
                colds.append(cold)
        if not targs.no_plot:
            cap_s = f"max {cap} pods/cluster" if cap else "no cap"
            title = (f"{TRACE_TITLES[key]}, {group[0]['streams']} streams in {targs.clusters} RayCluster(s), "
                     f"{cap_s}, start-up {targs.startup_s:.0f}s, {targs.pg_rate:g} PGs/h/cluster, "
                     f"auto q={targs.quantile:g}, step {step_s:.1f}s")
            tag = f"{f'_cap{cap}' if cap else ''}{suffix}"
            plots.append(pareto_plot(group, f"idle_reclaim_pareto{tag}.png", title, b.curve(top * 1.05)))
            shown = {k: v for k, v in series.items()
                     if k in (series_name("ray-v2", 300.0), "auto", "auto-warm", "oracle")}
            plots.append(plot(shown, f"idle_reclaim_timeline{tag}.png", title))
    params = {"streams": rows[0]["streams"], "steps": steps, "step_s": round(step_s, 3),
              "trace_step_s": trace.step_s, "hours": round(steps * step_s / 3600, 2),
              "probed_timeouts_s": sorted({r["idle_timeout_s"] for r in rows if r["policy"] == "ray-v2"}
                                          - {float(t) for t in timeouts})}
    if key == "openb":
        params.update({"openb_day": targs.openb_day, "warm_prior_h": targs.warm_prior_h})
    return {"trace": key, "data": {"trace": source, "trace_pods": len(trace.pods), "trace_steps": trace.n_steps},
            "params": params, "elapsed_s": round(time.perf_counter() - t_start, 2), "trace_load_s": round(load_s, 2),
            "plots": plots, "rows": rows, "goal": goals, "bound": bounds, "cold": colds}


POLICY_ORDER = {"auto": 0, "auto-warm": 1, "oracle": 2}


def pg_frontier_point(row: dict[str, Any], horizon_s: float) -> dict[str, Any]:
    return {"horizon_s": horizon_s, **{k: row[k] for k in ("idle_gpu_h", "launches", "pgs", "pg_wait_p50_s",
                                                            "pg_wait_p95_s", "pg_waited_over_half_startup",
                                                            "waiting_gpu_h")}}


PG_FRONTIER_COLUMNS = [("horizon_s", "look-ahead s", ".0f"), ("idle_gpu_h", "idle GPU-h", ".2f"),
                       ("launches", "launches", "d"), ("pg_wait_p50_s", "PG wait p50 s", ".1f"),
                       ("pg_wait_p95_s", "PG wait p95 s", ".1f"),
                       ("pg_waited_over_half_startup", "PGs waiting > start-up/2", "d"), ("pgs", "PGs", "d")]
PG_FRONTIER_S = (600.0, 1800.0, 3600.0, 7200.0, 14400.0, 28800.0)
PG_FRONTIER_QUICK_S = (600.0, 1800.0)


def series_name(policy: str, timeout_s: float) -> str:
    """A run's name among the series (and in the timeline plot): a fixed-timeout policy with its timeout, sweep
    and bisection probes alike ("ray-v2 300s", "ray-v2 157.5s"); auto and the oracles by name."""
    return f"{policy} {timeout_s:g}s" if policy in ("ray-v2", "raygpu") else policy


def _keep(series: dict[str, Any], name: str, out: dict[str, Any]) -> dict[str, Any]:
    series[name] = out["series"]
    return out["row"]


COLD_COLUMNS = [("policy", "policy", ""), ("fixed_timeout_s", "vs fixed s", ".1f"),
                ("first_warm_h", "learned at h", ".2f"), ("match_h", "matched from h", ".2f"),
                ("launches_at_1h", "launches ratio @1h", ".2f"), ("idle_at_1h", "idle ratio @1h", ".2f"),
                ("launches_at_end", "launches ratio @end", ".2f"), ("idle_at_end", "idle ratio @end", ".3f")]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="24 streams (openb: its window's), 3 h, 1 cluster")
    ap.add_argument("--trace", choices=(*TRACE_KEYS, "all"), default="all",
                    help="genai (duty cycles), openb (task arrivals, one day) or all (default)")
    ap.add_argument("--openb-day", type=float, default=OPENB_DAY,
                    help=f"openb: the window's first day in the trace's time (default {OPENB_DAY})")
    ap.add_argument("--warm-prior-h", type=float, default=6.0,
                    help="openb: auto-warm starts with the history auto learned over this many hours before the "
                         "window (default 6, the history it keeps; 0: no auto-warm row)")
    ap.add_argument("--idle-timeout", type=float, nargs="+", default=None,
                    help="Ray v2's fixed idle timeouts in seconds, one run each (default 30 60 120 180 300 600)")
    ap.add_argument("--quantile", type=float, default=DEFAULT_QUANTILE,
                    help=f"auto: the keep-warm quantile (default {DEFAULT_QUANTILE:g}, the product's)")
    ap.add_argument("--auto-fallback", type=float, default=300.0,
                    help="auto: the fixed idle timeout until enough history (default 300 s)")
    ap.add_argument("--auto-hold", type=float, default=DEFAULT_HOLD_STARTUPS,
                    help="auto: raygpu.io/warm-hold, idle start-ups before a worker beyond the target goes "
                         f"(default {DEFAULT_HOLD_STARTUPS:g}, the product's)")
    ap.add_argument("--with-raygpu", action="store_true",
                    help="also run raygpu's plan_reclaim with each fixed timeout (it matched ray-v2 at every step)")
    ap.add_argument("--no-shadow", action="store_true",
                    help="skip the shadow plan_reclaim call of the ray-v2 runs (the 'disagree' column)")
    ap.add_argument("--clusters", type=int, default=None, help="RayClusters (default 2; quick 1)")
    ap.add_argument("--streams", type=int, default=None, help="trace pods used (default all 143; quick 24)")
    ap.add_argument("--hours", type=float, default=None, help="simulated hours (default the whole trace; quick 3)")
    ap.add_argument("--busy-threshold", type=float, default=5.0, help="a pod is busy when its GPU utilisation %% > this")
    ap.add_argument("--gpus-per-pod", type=float, default=4.0)
    ap.add_argument("--startup-s", type=float, default=180.0, help="pod creation to Ray node up")
    ap.add_argument("--min-replicas", type=int, default=0)
    ap.add_argument("--max-replicas", type=int, nargs="+", default=None,
                    help="maxReplicas per cluster, one run each; 0 (default) = its streams + 8, never binding")
    ap.add_argument("--pg-rate", type=float, default=6.0, help="placement groups per hour per cluster")
    ap.add_argument("--spread-share", type=float, default=0.3, help="share of multi-bundle PGs that are STRICT_SPREAD")
    ap.add_argument("--pg-max-bundles", type=int, default=4, help="bundles per PG: uniform 1..this")
    ap.add_argument("--pg-life-min", type=float, default=20.0, help="mean PG lifetime once placed, minutes")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--substeps", type=int, default=6,
                    help="simulation steps per trace sample (default 6: 9.5 s steps on the 57 s trace)")
    ap.add_argument("--match-tolerance", type=float, default=0.02,
                    help="bisect the fixed timeout (real runs) until one row's idle GPU-h is this close to auto's")
    ap.add_argument("--max-probes", type=int, default=8, help="at most this many bisection runs per cap")
    ap.add_argument("--pg-frontier", type=float, nargs="*", default=None, metavar="S",
                    help="the PG-wait frontier's look-aheads in seconds, one foresight run each (default "
                         f"{' '.join(f'{x:.0f}' for x in PG_FRONTIER_S)}; quick {' '.join(f'{x:.0f}' for x in PG_FRONTIER_QUICK_S)}; "
                         "none: no frontier)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--save-json", default=None, metavar="PATH", help="also write the JSON result to PATH")
    ap.add_argument("--no-plot", action="store_true")
    args = ap.parse_args(argv)
    keys = TRACE_KEYS if args.trace == "all" else (args.trace,)
    paths = {"genai": TRACE, "openb": OPENB_TASKS}
    keys = tuple(k for k in keys if need_traces(paths[k]))
    if not keys:
        return 0
    logging.getLogger("ray").setLevel(logging.ERROR)
    args.clusters = args.clusters or (1 if args.quick else 2)
    if args.streams is None and args.quick:
        args.streams = 24
    timeouts = args.idle_timeout or list(FIXED_TIMEOUTS_S)
    if args.pg_frontier is None:
        args.pg_frontier = list(PG_FRONTIER_QUICK_S if args.quick else PG_FRONTIER_S)
    caps = args.max_replicas or [0]
    t_start = time.perf_counter()
    traces = [run_trace(k, args, timeouts, caps) for k in keys]
    elapsed = time.perf_counter() - t_start
    params = {"idle_timeouts_s": [float(t) for t in timeouts], "auto_quantile": args.quantile,
              "auto_fallback_s": args.auto_fallback, "pg_frontier_s": args.pg_frontier, "auto_hold_startups": args.auto_hold, "clusters": args.clusters,
              "substeps": args.substeps, "match_tolerance": args.match_tolerance,
              "busy_threshold_pct": args.busy_threshold,
              "gpus_per_pod": args.gpus_per_pod, "startup_s": args.startup_s, "min_replicas": args.min_replicas,
              "max_replicas": caps, "pg_rate_per_h": args.pg_rate, "spread_share": args.spread_share,
              "pg_life_min": args.pg_life_min, "seed": args.seed, "quick": args.quick}
    result = {"benchmark": "idle_reclaim", "machine": machine(), "params": params,
              "synthesized": "placement groups, pods, scale-up timing", "not_replayed": NOT_REPLAYED,
              "elapsed_s": round(elapsed, 2), "traces": traces}
    if args.save_json:
        with open(args.save_json, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=1)
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(machine_line(result["machine"]) + f"; simulated in {elapsed:.1f}s")
    for tr in traces:
        tp = tr["params"]
        print(f"\n== {tr['trace']}: {tp['streams']} streams ({tr['data']['trace']}) in {args.clusters} RayCluster(s), "
              f"{tp['hours']} h in {tp['step_s']:.1f}s steps ({args.substeps} per {tp['trace_step_s']:.0f}s trace "
              f"sample), {args.gpus_per_pod:g} GPUs/pod, busy > {args.busy_threshold:g}%, start-up "
              f"{args.startup_s:.0f}s, {args.pg_rate:g} PGs/h/cluster, seed {args.seed}; {tr['elapsed_s']:.1f}s")
        print_table(tr["rows"], COLUMNS)
        for bd in tr["bound"]:
            print(f"perfect-foresight bound (zero waiting): {bd['launches_at_zero_idle']} launches at 0 idle GPU-h, "
                  f"{bd['gaps']} bridgeable gaps; frontier (idle GPU-h -> fewest launches):")
            fr = bd["frontier"]
            picks = [fr[round(j * (len(fr) - 1) / 8)] for j in range(9)] if len(fr) > 9 else fr
            print("  " + ", ".join(f"{x:.1f} -> {n}" for x, n in picks))
            print_table(bd["rows"], BOUND_COLUMNS)
        for g in tr["goal"]:
            if g["pg_frontier"]:
                print("PG-wait frontier: foresight keep-warm for the PG arrivals within a look-ahead (it knows when "
                      "every PG comes and keeps warm the rise of demand then; no stream is served ahead):")
                print_table(g["pg_frontier"], PG_FRONTIER_COLUMNS)
        for g in tr["goal"]:
            for line in g["lines"]:
                print(line)
        if tr["cold"]:
            print("cold start (auto: no history at t=0, the fallback until it learns; auto-warm: the history of the "
                  "hours before): cumulative launches and idle GPU-h against the fixed row; matched from = the "
                  f"first time after which auto's launches <= the row's and its idle <= max(1 + {args.match_tolerance:g}"
                  ", idle ratio @end) x the row's, at every step to the end")
            print_table(tr["cold"], COLD_COLUMNS)
        for p in tr["plots"]:
            print(f"plot: {p}")
    for name, why in NOT_REPLAYED.items():
        print(f"not replayed: {name}: {why}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
