"""Gang admission on the openb cluster shape: pods one by one vs a gang per RayCluster vs raygpu's gang per PG.

raygpu's gang per PG comes three ways: called by the job (``raygpu``), with the starvation guard
(``raygpu+guard``), or made by the sidecar's gang scale-up for unmodified jobs (``scale-up``).

A discrete-event replay; everything but the cluster shape and the task list is
synthesized here, and said so:

* Cluster: the 1,213 GPU nodes of ``openb_node_list_gpu_node.csv`` (Alibaba
  clusterdata, openb, USENIX ATC '23), GPU count only. GPU models are treated
  as interchangeable (``gpu_spec`` is ignored), CPU and memory are not
  modelled, the CPU-only nodes of ``openb_node_list_all_node.csv`` are left out.
  ``--quick`` keeps every 8th node.
* Jobs: the GPU tasks of ``openb_pod_list_default.csv`` that ran (have
  ``scheduled_time`` and ``deletion_time``), in ``creation_time`` order. Each
  job is, with probability ``--gang-share`` (seeded), the next multi-GPU task
  (74 in the trace, cycled), else the next single-GPU task (cycled): the trace
  has too few multi-GPU tasks (1%) to contend. Duration = deletion - scheduled, clamped to
  [60 s, 4 h]. Arrivals are Poisson (seed ``--seed``) at the rate that offers
  ``--load`` x the cluster's GPUs (the trace's own arrivals span 150 days and
  would never contend).
* A task with ``num_gpu`` = 1 (whole or fractional: a fractional task asks one
  whole ``nvidia.com/gpu``) is a single pod, placed one by one in every policy.
* A task with ``num_gpu`` = g > 1 is a gang of k pods of g GPUs each: a Ray job
  with a placement group of k bundles ``{"GPU": g}`` (PACK) that starts only
  when all k are placed. k = 2, 4 or 8, from the task's name (crc32 % 3), so
  gangs ask 4..64 GPUs.

Policies (placement is first-fit over nodes in trace order, FIFO over jobs):

* ``pods``: plain KubeRay + kube-scheduler: each of the k pods is placed as
  soon as it fits and holds its GPUs while the rest wait.
* ``raycluster-gang``: KubeRay's batch-scheduler integrations (Volcano /
  scheduler-plugins / Kueue) gang the RayCluster's min size: ceil(k/2) pods
  (minReplicas) admitted all-or-nothing; the other pods come from the Ray
  autoscaler and are placed one by one.
* ``raygpu``: ``raygpu.plan.gang.reservation.plan_gang`` turns each PG, when it arrives,
  into pods of a RayCluster with 1/2/4/8-GPU worker groups (its own choice of
  template and packing, given the free GPUs per node at that moment), and the
  pods are admitted all-or-nothing.
* ``raygpu+guard``: ``raygpu`` plus the starvation guard as the product decides it: the product's
  ``raygpu.plan.guard`` / ``raygpu.plan.backfill`` functions run on the simulator's state (see
  ``benchmarks/_gang_admission_guard.py``): guarded gangs wait gated in one line per scope (node pool), one
  holder per scope, blockers hold whole nodes, max-hold bounds a gang's blocked time in all, then it is rolled
  back (ASSUMPTION: it retries at once, unguarded). ``--backfill all`` (default): every job has a hint (its
  exact duration) and may backfill if not in line; ``gangs``: the product's rule, only raygpu gangs have
  hints, singles' ends are unknown; ``none`` (alias ``--no-hints``).
* ``scale-up``: unmodified jobs plus the sidecar's gang scale-up (see
  ``benchmarks/_gang_admission_scale_up.py``): jobs do not call raygpu; each
  gang's PG waits in Ray until a sidecar cycle (every 10 s) that comes at least
  10 s (grace) after the cycle that first saw it, then gets the same
  all-or-nothing reservation as ``raygpu`` (plan_gang on the free GPUs of that
  cycle), oldest PG first, at most 4 reservations in flight (not yet bound) per
  pool (one RayCluster and sidecar per pool); one not bound after 600 s is
  rolled back and retried after a back-off (30 s doubling, at most 600 s).
  ``--scale-up-interval-s``, ``--scale-up-grace-s``, ``--scale-up-in-flight``
  and ``--scale-up-timeout-s`` change them, to tell apart what each costs.

``--guard-patience S`` adds ``guard-proposal``, NOT the product: the guard with two rules changed (a guarded
gang joins the line only after waiting S seconds as an ordinary raygpu gang; a gang in line that fits on open
nodes starts at once), a design measured against the goal (``GuardProposalSim``); it is never a peer.

The peers that reserve (``benchmarks/_gang_admission_peers.py``, on the trace's shapes, all-or-nothing):
``easy-backfill`` (Slurm-like EASY backfill, exact runtimes, one reservation per pool), ``volcano-reserve``
(Volcano's elect + reserve: the elected gang locks nodes, no backfill), ``kueue-strictfifo`` (one StrictFIFO
queue per pool, admission by fit). ``--packing most-allocated`` runs every policy with kube-scheduler's
``MostAllocated`` on GPUs as the node choice (``first-fit``: node order, the default).

Node pools (``--pools P``; default full 8, quick 1): nodes round-robin into P
pools, each gang pinned to pool crc32(name) % P in every policy (a RayCluster
with a nodeSelector), singles anywhere; the guard's scope is a pool
(``benchmarks/_gang_admission_pools.py``). Full 8 makes pools of ~152 nodes,
the size of the quick cluster; P = 1 is the whole cluster as one scope.

A gang that has held pods for ``--give-up-s`` (1 h) without starting gives
them back and is resubmitted at the back of the queue (a RayJob deadline plus
a retry); without it the ``pods`` policy would stay deadlocked for ever.
Deadlock: a moment where some waiting gang holds pods and no waiting job
could complete even if every running job finished (only preemption helps).
Metrics: GPU-hours held by partially placed gangs, GPU-hours held idle by
the guard's reservations, deadlock episodes and hours, gang wait p50/p95 and
single-pod wait p95 (arrival to start), gang wait p99, hold time-outs, GPU busy (mean fraction of GPUs used
by running jobs), GPU allocation over time (plot). Goal (issue 29): the
guard's p95 gang wait <= 1.0 x the best reserving peer's and <= 0.8 x the best non-reserving policy's,
with 0 GPU-h half-placed, per run.

    python -m benchmarks.bench_gang_admission            # 1,213 nodes, 6,000 jobs, 20% gangs
    python -m benchmarks.bench_gang_admission --quick    # 152 nodes, 1,200 jobs, 20% gangs
    python -m benchmarks.bench_gang_admission --sizes full quick --seeds 1 2 3   # the table of docs/benchmarks.md
    python -m benchmarks.bench_gang_admission --sizes full quick --seeds 1 2 3 --backfill gangs   # the product's rule
    python -m benchmarks.bench_gang_admission --packing first-fit most-allocated   # issue 29's table
    python -m benchmarks.bench_gang_admission --seeds 1 2 3 --guard-patience 1200   # the proposal beside them
    python -m benchmarks.bench_gang_admission --json
"""

from __future__ import annotations

import argparse
import json
import time

from benchmarks._common import machine, machine_line, need_traces, print_table, save_plot
from benchmarks._gang_admission_guard import BACKFILL, GuardProposalSim, GuardSim
from benchmarks._gang_admission_peers import PEERS
from benchmarks._gang_admission_pools import node_pools
from benchmarks._gang_admission_scale_up import GRACE_S, IN_FLIGHT, INTERVAL_S, TIMEOUT_S, ScaleUpSim
from benchmarks._gang_admission_sim import (NODES_CSV, PACKING, POLICIES, RESERVING, TASKS_CSV, Job, Sim, load_cluster,
                                            make_jobs)


def plot(samples: dict[str, list[tuple[float, float, float]]], path_name: str, title: str) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 1, figsize=(9, 6), sharex=True)
    for pol, s in samples.items():
        t = [x[0] / 3600 for x in s]
        axes[0].plot(t, [x[1] for x in s], label=pol, lw=1)
        axes[1].plot(t, [x[2] for x in s], label=pol, lw=1)
    axes[0].set_ylabel("GPUs allocated to pods")
    axes[1].set_ylabel("GPUs used by running jobs")
    axes[1].set_xlabel("hours")
    for a in axes:
        a.set_ylim(0, 1.02)
        a.grid(alpha=0.3)
    axes[0].legend(loc="lower right")
    axes[0].set_title(title, fontsize=9)
    return save_plot(fig, path_name)


PROPOSAL = "guard-proposal"  # --guard-patience: benchmarks._gang_admission_guard.GuardProposalSim, not the product
GOAL = 0.8  # x the best non-reserving policy's p95 gang wait
GOAL_RESERVING = 1.0  # x the best reserving peer's
ASSUMPTIONS = {
    "all": "raygpu+guard: every job's runtime hint is its exact trace duration; every job may backfill",
    "gangs": ("raygpu+guard: only raygpu gangs have runtime hints (exact) and backfill; singles' ends are unknown "
              "and singles never use held GPUs (the product's rule)"),
    "none": "raygpu+guard: no runtime hints, no backfill",
}
COLUMNS = [("size", "size", ""), ("pools", "pools", "d"), ("seed", "seed", "d"), ("packing", "packing", ""),
           ("policy", "policy", ""),
           ("gang_wait_p50_s", "gang p50 s", ".0f"), ("gang_wait_p95_s", "gang p95 s", ".0f"),
           ("gang_wait_p99_s", "gang p99 s", ".0f"), ("hold_timeouts", "hold time-outs", "d"),
           ("single_wait_p95_s", "single p95 s", ".0f"), ("mean_running_gpu_frac", "GPU busy", ".3f"),
           ("partial_gpu_h", "half-placed GPU-h", ".1f"), ("held_idle_gpu_h", "held idle GPU-h", ".1f"),
           ("deadlocks", "deadlocks", "d"), ("gave_up", "gave up", "d"), ("makespan_h", "makespan h", ".1f")]

SCALE_UP_COLUMNS = [("size", "size", ""), ("pools", "pools", "d"), ("seed", "seed", "d"),
                    ("reaction_p50_s", "first reservation p50 s", ".0f"),
                    ("reaction_p95_s", "first reservation p95 s", ".0f"), ("reservations", "reservations", "d"),
                    ("max_in_flight", "most in flight", "d"), ("rolled_back", "rolled back", "d"),
                    ("gang_wait_p95_s", "gang p95 s", ".0f"), ("raygpu_p95_s", "raygpu p95 s", ".0f")]

GUARD_COLUMNS = [("policy", "policy", ""), ("size", "size", ""), ("pools", "pools", "d"), ("seed", "seed", "d"), ("packing", "packing", ""),
                 ("reservations", "reservations", "d"), ("max_reservations_at_once", "most at once", "d"),
                 ("started_by_reservation", "started by one", "d"), ("reservation_timeouts", "timed out", "d"),
                 ("backfilled", "backfilled jobs", "d"), ("held_idle_gpu_h", "held idle GPU-h", ".1f"),
                 ("max_blocked_s", "most blocked s", ".0f")]


def make_sim(policy: str, free, jobs: list[Job], give_up_s: float, pools, *, max_hold_s: float = 900.0,
             backfill: str = "all", scale_up: dict | None = None, packing: str = "first-fit",
             patience_s: float = 1200.0) -> Sim:
    """The simulation of ``policy`` (one of POLICIES, or PROPOSAL) on ``free`` GPUs per node; ``scale_up``:
    ScaleUpSim's knobs; ``packing``: the node choice of the simulated kube-scheduler (first fit, or MostAllocated
    on GPUs); ``patience_s``: PROPOSAL's."""
    if policy == PROPOSAL:
        return GuardProposalSim(free, jobs, give_up_s, max_hold_s, backfill=backfill, pools=pools, packing=packing,
                                patience_s=patience_s)
    if policy == "raygpu+guard":
        return GuardSim(free, jobs, give_up_s, max_hold_s, backfill=backfill, pools=pools, packing=packing)
    if policy == "scale-up":
        return ScaleUpSim(free, jobs, give_up_s, pools, **(scale_up or {}), packing=packing)
    if policy in PEERS:
        return PEERS[policy](free, jobs, give_up_s, pools, packing)
    return Sim(policy, free, jobs, give_up_s, pools, packing=packing)


def verdicts(rows: list[dict], guard_policy: str = "raygpu+guard") -> list[dict]:
    """Per (size, seed, share, packing): ``guard_policy``'s p95 gang wait over the best reserving peer's
    (goal <= 1.0) and over the best non-reserving policy's (goal <= 0.8), with 0 half-placed GPU-h. The peers
    are POLICIES' (never PROPOSAL)."""
    out = []
    keys = dict.fromkeys((r["size"], r["seed"], r["gang_share"], r["packing"]) for r in rows)
    for size, seed, share, packing in keys:
        run = {r["policy"]: r for r in rows if (r["size"], r["seed"], r["gang_share"], r["packing"]) == (size, seed, share, packing)
               and r["policy"] in (*POLICIES, guard_policy)}
        guard = run[guard_policy]

        def best(policies):
            pol = min(policies, key=lambda p: run[p]["gang_wait_p95_s"])
            p95 = run[pol]["gang_wait_p95_s"]
            return pol, p95, round(guard["gang_wait_p95_s"] / p95, 3) if p95 > 0 else float("inf")

        res_pol, res_p95, res_ratio = best([p for p in run if p in RESERVING and p != "raygpu+guard"])
        oth_pol, oth_p95, oth_ratio = best([p for p in run if p not in RESERVING and p != guard_policy])
        out.append({"policy": guard_policy, "size": size, "seed": seed, "gang_share": share, "packing": packing,
                    "best_reserving": res_pol, "best_reserving_p95_s": res_p95, "ratio_reserving": res_ratio,
                    "best_other": oth_pol, "best_other_p95_s": oth_p95, "ratio": oth_ratio,
                    "guard_p95_s": guard["gang_wait_p95_s"], "pools": guard["pools"],
                    "held_idle_gpu_h": guard["held_idle_gpu_h"], "hold_timeouts": guard["hold_timeouts"],
                    "goal_met": (res_ratio <= GOAL_RESERVING and oth_ratio <= GOAL and guard["partial_gpu_h"] == 0)})
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="every 8th node, 1,200 jobs (same as --sizes quick)")
    ap.add_argument("--sizes", nargs="+", choices=("full", "quick"), default=None,
                    help="cluster sizes to run, side by side (default: full, or quick with --quick)")
    ap.add_argument("--seeds", type=int, nargs="+", default=None, help="seeds to run (default: --seed)")
    ap.add_argument("--jobs", type=int, default=None, help="jobs to replay per run (default 6,000; quick 1,200)")
    ap.add_argument("--load", type=float, default=1.1, help="offered GPU load as a fraction of the cluster")
    ap.add_argument("--give-up-s", type=float, default=3600.0, help="a gang holding pods this long without starting gives up")
    ap.add_argument("--max-hold-s", type=float, default=900.0, help="the guard's raygpu.io/max-hold")
    ap.add_argument("--backfill", choices=BACKFILL, default=None,
                    help="who may use held GPUs: all (every job has an exact hint; default), gangs (the product's "
                         "rule: raygpu gangs with expected_runtime_s only), none")
    ap.add_argument("--no-hints", action="store_true", help="the guard without runtime hints (= --backfill none)")
    ap.add_argument("--pools", type=int, default=None,
                    help="node pools = guard scopes; gangs pinned to one in every policy (default full 8, quick 1)")
    ap.add_argument("--scale-up-interval-s", type=float, default=INTERVAL_S,
                    help=f"scale-up: the sidecar's cycle (default {INTERVAL_S:g}, raygpu sidecar --interval-s)")
    ap.add_argument("--scale-up-grace-s", type=float, default=GRACE_S,
                    help=f"scale-up: a PG is reserved for no sooner than this after first seen (default {GRACE_S:g})")
    ap.add_argument("--scale-up-in-flight", type=int, default=IN_FLIGHT,
                    help=f"scale-up: reservations not yet bound per cluster (pool) at once (default {IN_FLIGHT})")
    ap.add_argument("--scale-up-timeout-s", type=float, default=TIMEOUT_S,
                    help=f"scale-up: a reservation not bound after this is rolled back (default {TIMEOUT_S:g})")
    ap.add_argument("--gang-share", type=float, nargs="+", default=None,
                    help="fraction(s) of jobs drawn from the multi-GPU tasks (default 0.2)")
    ap.add_argument("--packing", nargs="+", choices=PACKING, default=None,
                    help="the simulated kube-scheduler's node choice: first-fit (node order; default) and/or "
                         "most-allocated (MostAllocated on GPUs: tight packing); each runs every policy")
    ap.add_argument("--guard-patience", type=float, default=None, metavar="S",
                    help=f"also run {PROPOSAL} (NOT the product: a guard design measured against the goal): a "
                         "guarded gang joins the line only after waiting S seconds as an ordinary raygpu gang, and a "
                         "gang in line that fits on open nodes starts at once")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--no-plot", action="store_true")
    args = ap.parse_args(argv)
    if args.no_hints and args.backfill not in (None, "none"):
        ap.error("--no-hints is --backfill none")
    backfill = "none" if args.no_hints else (args.backfill or "all")
    if (args.scale_up_interval_s <= 0 or args.scale_up_grace_s < 0 or args.scale_up_in_flight < 1
            or args.scale_up_timeout_s <= 0):
        ap.error("--scale-up-interval-s > 0, --scale-up-grace-s >= 0, --scale-up-in-flight >= 1, "
                 "--scale-up-timeout-s > 0")
    scale_up = {"interval_s": args.scale_up_interval_s, "grace_s": args.scale_up_grace_s,
                "in_flight": args.scale_up_in_flight, "timeout_s": args.scale_up_timeout_s}
    if args.guard_patience is not None and not args.guard_patience >= 0:
        ap.error("--guard-patience must be >= 0 seconds")
    policies = (*POLICIES, PROPOSAL) if args.guard_patience is not None else POLICIES
    if not need_traces(NODES_CSV, TASKS_CSV):
        return 0
    sizes = args.sizes or (["quick"] if args.quick else ["full"])
    seeds = args.seeds or [args.seed]
    shares = args.gang_share or ([0.2])
    packings = args.packing or ["first-fit"]
    rows, plots, clusters = [], [], {}
    t0 = time.perf_counter()
    for size in sizes:
        free = load_cluster(size == "quick")
        n_pools = args.pools or (1 if size == "quick" else 8)
        pools = node_pools(len(free), n_pools)
        clusters[size] = {"nodes": int(len(free)), "gpus": int(free.sum()), "pools": n_pools}
        n_jobs = args.jobs or (1200 if size == "quick" else 6_000)
        for seed in seeds:
            for share in shares:
                for packing in packings:
                    samples = {}
                    for pol in policies:
                        jobs = make_jobs(n_jobs, int(free.sum()), args.load, seed, share, n_pools)
                        sim = make_sim(pol, free, jobs, args.give_up_s, pools, max_hold_s=args.max_hold_s,
                                       backfill=backfill, scale_up=scale_up, packing=packing,
                                       patience_s=args.guard_patience or 0.0)
                        t1 = time.perf_counter()
                        rows.append({"size": size, "pools": n_pools, "seed": seed, "gang_share": share, "hold_timeouts": 0,
                                     "packing": packing, **sim.run(), "wall_s": 0.0})
                        rows[-1]["wall_s"] = round(time.perf_counter() - t1, 1)
                        samples[pol] = sim.alloc_samples
                    run = {r["policy"]: r for r in rows[-len(policies):]}
                    run["scale-up"]["raygpu_p95_s"] = run["raygpu"]["gang_wait_p95_s"]  # same jobs, same run
                    if not args.no_plot and seed == seeds[0] and packing == packings[0]:
                        suffix = "_quick" if size == "quick" else ""
                        plots.append(plot(samples, f"gang_admission_allocation_share{int(share * 100)}{suffix}.png",
                                          f"openb cluster ({len(free)} nodes, {int(free.sum())} GPUs, {n_pools} pools), "
                                          f"{n_jobs} jobs, {share:.0%} gangs, offered load {args.load}, seed {seed}"))
    elapsed = time.perf_counter() - t0
    goal = verdicts(rows) + (verdicts(rows, PROPOSAL) if args.guard_patience is not None else [])
    result = {"benchmark": "gang_admission", "machine": machine(), "quick": sizes == ["quick"],
              "data": {"nodes": str(NODES_CSV.name), "tasks": str(TASKS_CSV.name), "synthesized": "gangs, arrivals"},
              "cluster": clusters[sizes[0]], "clusters": clusters,
              "params": {"jobs": args.jobs or (1200 if sizes[0] == "quick" else 6_000), "load": args.load,
                         "gang_shares": shares, "give_up_s": args.give_up_s, "seeds": seeds, "sizes": sizes,
                         "max_hold_s": args.max_hold_s, "hints": backfill != "none", "backfill": backfill,
                         "pools": {k: v["pools"] for k, v in clusters.items()}, "scale_up": scale_up,
                         "packing": packings, "guard_patience_s": args.guard_patience},
              "assumption": ASSUMPTIONS[backfill],
              "elapsed_s": round(elapsed, 2), "plots": plots, "rows": rows, "goal": goal}
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    where = ", ".join(f"{k} {v['nodes']} nodes / {v['gpus']} GPUs / {v['pools']} pools" for k, v in clusters.items())
    print(f"gang admission replay (simulated seconds): {where}; jobs per run: full 6,000, quick 1,200; "
          f"offered load {args.load}, give-up {args.give_up_s:.0f}s, seeds {seeds}, gang share {shares}, "
          f"max-hold {args.max_hold_s:.0f}s")
    print(f"ASSUMPTION: {result['assumption']}")
    print(machine_line(result["machine"]) + f"; simulated in {elapsed:.1f}s")
    print_table(rows, COLUMNS)
    reserving = ", ".join(p for p in RESERVING if p != "raygpu+guard")
    others = ", ".join(p for p in POLICIES if p not in RESERVING)
    print(f"\ngoal: raygpu+guard p95 gang wait <= {GOAL_RESERVING} x the best reserving peer's ({reserving}) and "
          f"<= {GOAL} x the best other policy's ({others}), 0 half-placed GPU-h")
    print_table(goal, [("policy", "policy", ""), ("size", "size", ""), ("pools", "pools", "d"), ("seed", "seed", "d"), ("packing", "packing", ""),
                       ("guard_p95_s", "guard p95 s", ".0f"),
                       ("best_reserving", "best reserving", ""), ("best_reserving_p95_s", "its p95 s", ".0f"),
                       ("ratio_reserving", "ratio", ".2f"),
                       ("best_other", "best other", ""), ("best_other_p95_s", "its p95 s", ".0f"),
                       ("ratio", "ratio", ".2f"), ("hold_timeouts", "hold time-outs", "d"),
                       ("held_idle_gpu_h", "held idle GPU-h", ".1f"), ("goal_met", "met", "")])
    print("\nthe guard's reservations (at most one per pool at a time)")
    print_table([r for r in rows if r["policy"] in ("raygpu+guard", PROPOSAL)], GUARD_COLUMNS)
    print(f"\nthe sidecar's scale-up (cycle {args.scale_up_interval_s:g} s, grace {args.scale_up_grace_s:g} s, "
          f"at most {args.scale_up_in_flight} reservations in flight per pool, timeout {args.scale_up_timeout_s:g} s; "
          "first reservation: from submission)")
    print_table([r for r in rows if r["policy"] == "scale-up"], SCALE_UP_COLUMNS)
    met = sum(g["goal_met"] for g in goal)
    print(f"goal met in {met} of {len(goal)} runs")
    for p in plots:
        print(f"plot: {p}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
