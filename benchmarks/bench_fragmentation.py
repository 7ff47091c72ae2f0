"""Fragmentation on the openb cluster: spread vs best-fit vs best-fit + raygpu's reclaimer, as the cluster fills.

A placement simulation whose stranded-GPU numbers come from the doctor's own
arithmetic (``raygpu.plan.doctor.stranded.stranded_gpus``) and whose raygpu
scale-down choice comes from the reclaimer itself
(``raygpu.plan.reclaim.scale_down.plan_reclaim``, which orders idle workers by
``_defrag_key``: removals that free whole Kubernetes nodes first). Both are
called on ``Snapshot`` / ``RayClusterView`` objects built from the simulated
state; nothing of either is re-implemented here.

What is real and what is synthesized:

* Cluster (real): the 1,213 GPU nodes of ``openb_node_list_gpu_node.csv``
  (Alibaba clusterdata, openb, USENIX ATC '23) with their GPU count, CPU
  (``cpu_milli``) and memory (``memory_mib``) as allocatable. GPU models are
  interchangeable (``model`` / ``gpu_spec`` ignored; ``gpu_spec`` is empty in
  the default list anyway). CPU-only nodes and CPU-only tasks are left out.
  ``--quick`` keeps every 8th node.
* Tasks (real shapes): the GPU tasks of ``openb_pod_list_default.csv``
  (7,064: 3,911 whole 1-GPU, 75 whole 2/4/8-GPU, 3,078 fractional) with their
  own ``num_gpu``, ``gpu_milli``, ``cpu_milli``, ``memory_mib``.
* Mapping to Ray on Kubernetes (synthesized): one RayCluster. A whole task
  (``gpu_milli`` = 1000) runs on its own worker pod of group ``gpu<g>`` whose
  requests are the task's (g ``nvidia.com/gpu``, its CPU and memory). A
  fractional task (``num_gpu`` 1, ``gpu_milli`` < 1000) is a Ray task asking
  ``GPU = gpu_milli / 1000``; Ray packs such tasks onto worker pods of group
  ``share`` that each hold one whole ``nvidia.com/gpu`` and 12 CPUs / 48 GiB
  (1/8 of the commonest 8-GPU node; every fractional task of the trace fits
  it), choosing the share worker whose GPU is tightest after adding the task
  (and whose CPU and memory still fit); only when none fits does it ask for a
  new share pod. Kubernetes never splits a GPU: that is the integer model.
* Fill (synthesized order: the trace's ``creation_time``): the tasks are
  submitted one by one, cycled once the list is used up (only needed above
  98% in the full run), until the offered GPU demand (whole GPUs, plus
  ``gpu_milli`` / 1000 per fractional task) reaches 1.0 x the cluster's
  GPUs; measured every 5 points from 0.3. Nothing leaves while filling; a task whose pod fits no
  node fails and stays Pending (the demand the stranded arithmetic sees).
* Churn (synthesized), ``--rounds`` rounds of one simulated hour from the
  filled state: (1) each running task leaves with probability ``--churn``
  (0.2; a seeded hash of the task name and round, the same draw in every
  policy) at a time spread over the hour; a worker with no task left becomes
  an idle Ray node. (2) The Pending queue is retried in order (it may reuse
  the idle workers). (3) Scale-down: each worker group keeps warm (its
  ``minReplicas``) ``--warm`` (half) of the workers that went idle this round
  and removes every other idle worker, old or new; the policies differ only
  in which idle workers they keep. (4) The queue is retried again. (5)
  Arrivals, a closed loop: as many GPUs as left in (1) arrive as new tasks,
  taken in order from one seeded draw (the same sequence in every policy) of
  the GPU tasks of ``openb_pod_list_multigpu50.csv`` (half of their GPU
  demand is 2/4/8-GPU tasks; 556 are 8-GPU whole-node tasks), so the mix
  shifts towards training-sized tasks. A task first reuses a warm idle worker
  of its own group whose pod covers its CPU and memory, else asks a new pod;
  one that fits nowhere joins the queue.

Policies (kube-scheduler's NodeResourcesFit score over cpu, memory and
``nvidia.com/gpu``, weight 1 each, computed with the incoming pod; ties go to
the lower node index; BalancedAllocation is not modelled):

* ``spread``: LeastAllocated (kube-scheduler's default strategy); scale-down in
  Ray autoscaler v2's termination order (longest idle first, then creation
  order: ``_sort_nodes_for_termination``'s keys, all idle nodes at 0 util).
* ``best-fit``: MostAllocated (bin packing); the same Ray scale-down order.
* ``raygpu``: MostAllocated, and scale-down by ``plan_reclaim`` on a snapshot
  of the cluster with each group's ``minReplicas`` set as above.
  While filling nothing leaves, so raygpu equals best-fit there by design.

Metrics, from ``stranded_gpus(snapshot, templates=...)``: free (unallocated)
GPUs; (a) integer model: the unused rest of share workers' GPUs; (c) free
GPUs on nodes with fewer free GPUs than the smallest Pending request, checked
first; (b) free GPUs on nodes where some Pending shape's GPU count fits but no
such shape fits the free CPU or memory. A free GPU counts once. The
worker shapes given to it are those of the Pending pods; with nothing Pending a
GPU-less placeholder shape is passed (else the function falls back to running
pods' shapes), so (b) and (c) are 0: nothing waits, nothing is stranded.
Also: whole free 8-GPU nodes (no pod at all), failed / Pending tasks.

    python -m benchmarks.bench_fragmentation            # 1,213 nodes, 8 churn rounds
    python -m benchmarks.bench_fragmentation --quick    # 152 nodes, 3 churn rounds
    python -m benchmarks.bench_fragmentation --json
"""

from __future__ import annotations

import argparse
import json
import time

from benchmarks._common import machine, machine_line, need_traces, print_table, read_csv, save_plot
from benchmarks._fragmentation_sim import IDLE_TIMEOUT_S, ROUND_S, run_policy
from benchmarks._fragmentation_tasks import (
    ARRIVALS_CSV,
    NODES_CSV,
    SHARE_CPU_M,
    SHARE_MEM_MIB,
    TASKS_CSV,
    draw_arrivals,
    fill_stream,
    read_tasks,
)

POLICIES = ("spread", "best-fit", "raygpu")
LEVELS = (0.6, 0.8, 0.9, 0.95, 1.0)
SAMPLE_STEP = 0.05


def plot(fill: dict[str, list[dict]], churn: dict[str, list[dict]], name: str, title: str) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    color = {"spread": "tab:blue", "best-fit": "tab:orange", "raygpu": "tab:green"}
    ls = {"spread": "-", "best-fit": "-", "raygpu": "--"}  # raygpu = best-fit while filling: drawn dashed on top
    fig, ax = plt.subplots(2, 3, figsize=(15, 8))
    for row, data, xkey, xlabel in ((0, fill, None, "offered GPU demand / cluster GPUs (fill)"),
                                    (1, churn, "round", "churn round")):
        for pol, rows in data.items():
            x = [r["offered_gpus"] / r["gpus"] for r in rows] if xkey is None else [r[xkey] for r in rows]
            kw = dict(color=color[pol], ls=ls[pol], marker=".")
            ax[row, 0].plot(x, [r["unallocated_gpus"] for r in rows], label=f"{pol}: unallocated", **kw)
            ax[row, 0].plot(x, [r["stranded_cpu_mem"] + r["stranded_fragment"] for r in rows],
                            label=f"{pol}: of which stranded (b)+(c)", color=color[pol], ls=":", marker="x", alpha=0.8)
            ax[row, 1].plot(x, [r["pending_gpus"] for r in rows], label=f"{pol}: GPUs of Pending tasks", **kw)
            ax[row, 1].plot(x, [r["stranded_integer"] for r in rows], label=f"{pol}: (a) integer model",
                            color=color[pol], ls=":", marker="x", alpha=0.8)
            key = "whole_free_8gpu_nodes" if row == 0 else "whole_8gpu_after_reclaim"
            ax[row, 2].plot(x, [r[key] for r in rows], label=pol, **kw)
            if row == 1:
                ax[row, 2].plot(x, [r["nodes_emptied"] for r in rows], label=f"{pol}: nodes emptied by scale-down",
                                color=color[pol], ls=":", marker="x", alpha=0.8)
        for a in ax[row]:
            a.set_xlabel(xlabel)
            a.grid(alpha=0.3)
            a.legend(fontsize=7)
            if row == 1:
                a.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax[row, 0].set_ylabel("GPUs")
        ax[row, 1].set_ylabel("GPUs")
    ax[0, 2].set_ylabel("whole free 8-GPU nodes")
    ax[1, 2].set_ylabel("nodes (free 8-GPU ones: after scale-down)")
    fig.suptitle(title, fontsize=9)
    return save_plot(fig, name)


FILL_COLS = [("policy", "policy", ""), ("level", "fill", ".0%"), ("submitted", "tasks", "d"),
             ("failed", "failed", "d"), ("pending_gpus", "failed GPUs", ".0f"),
             ("pending_8gpu_tasks", "failed 8-GPU", "d"), ("unallocated_gpus", "unalloc GPUs", "d"),
             ("stranded_integer", "(a) integer", ".1f"), ("stranded_cpu_mem", "(b) cpu/mem", ".1f"),
             ("stranded_fragment", "(c) fragment", ".1f"), ("smallest_pending", "min pending", ".0f"),
             ("whole_free_8gpu_nodes", "free 8-GPU nodes", "d"), ("share_pods", "share pods", "d")]
CHURN_COLS = [("policy", "policy", ""), ("round", "round", "d"), ("departed_gpus", "left GPUs", ".0f"),
              ("removed_workers", "removed", "d"), ("nodes_emptied", "nodes emptied", "d"),
              ("whole_8gpu_after_reclaim", "free 8-GPU nodes", "d"), ("retried_placed", "queue placed", "d"),
              ("arrived", "arrived", "d"), ("arrived_8gpu", "arrived 8-GPU", "d"), ("placed_new", "placed", "d"),
              ("pending_tasks", "pending", "d"), ("pending_8gpu_tasks", "pending 8-GPU", "d"),
              ("unallocated_gpus", "unalloc GPUs", "d"), ("idle_worker_gpus", "warm GPUs", "d"),
              ("stranded_integer", "(a)", ".1f"), ("stranded_cpu_mem", "(b)", ".1f"), ("stranded_fragment", "(c)", ".1f"),
              ("smallest_pending", "min pending", ".0f")]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="every 8th node, 3 churn rounds")
    ap.add_argument("--rounds", type=int, default=None, help="churn rounds (default 8; quick 3)")
    ap.add_argument("--churn", type=float, default=0.2,
                    help="per round: probability that a running task leaves (as many GPUs arrive as left)")
    ap.add_argument("--warm", type=float, default=0.5, help="share of each group's idle workers kept warm")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--no-plot", action="store_true")
    args = ap.parse_args(argv)
    if not need_traces(NODES_CSV, TASKS_CSV, ARRIVALS_CSV):
        return 0
    rounds = args.rounds if args.rounds is not None else (3 if args.quick else 8)
    all_nodes = read_csv(NODES_CSV)
    nodes = all_nodes[::8] if args.quick else all_nodes
    gpus = sum(int(r["gpu"]) for r in nodes)
    stream = fill_stream()
    samples = sorted({round(0.3 + SAMPLE_STEP * k, 4) for k in range(int(round(0.7 / SAMPLE_STEP)) + 1)} | set(LEVELS))
    arrivals = draw_arrivals(read_tasks(ARRIVALS_CSV, "m50-"), 20_000, args.seed)
    t0 = time.perf_counter()
    fill, churn = {}, {}
    for pol in POLICIES:
        fill[pol], churn[pol] = run_policy(pol, nodes, stream, arrivals, rounds, samples, args.churn, args.warm, args.seed)
    elapsed = time.perf_counter() - t0
    rows = [r for pol in POLICIES for r in fill[pol] if r["level"] in LEVELS] + \
           [r for pol in POLICIES for r in churn[pol]]
    plots = []
    if not args.no_plot:
        plots.append(plot(fill, churn, "fragmentation_quick.png" if args.quick else "fragmentation.png",
                          f"openb cluster ({len(nodes)} nodes, {gpus} GPUs): fill with openb default tasks, then "
                          f"{rounds} churn rounds ({args.churn:.0%} leave, multigpu50 arrivals, "
                          f"{args.warm:.0%} of idle workers kept warm)"))
    result = {
        "benchmark": "fragmentation", "machine": machine(), "quick": args.quick,
        "data": {"nodes": NODES_CSV.name, "fill_tasks": TASKS_CSV.name, "arrivals": ARRIVALS_CSV.name,
                 "synthesized": "task order (creation_time, cycled), Ray share workers for fractional tasks, "
                                "churn departures, arrival draw, warm pool"},
        "cluster": {"nodes": len(nodes), "gpus": gpus, "nodes_8gpu": sum(1 for r in nodes if int(r["gpu"]) >= 8)},
        "params": {"levels": list(LEVELS), "samples": samples, "rounds": rounds, "churn": args.churn,
                   "warm": args.warm, "seed": args.seed, "share_worker": {"gpu": 1, "cpu": SHARE_CPU_M / 1000,
                                                                           "memory_gib": SHARE_MEM_MIB / 1024},
                   "idle_timeout_s": IDLE_TIMEOUT_S, "round_s": ROUND_S},
        "elapsed_s": round(elapsed, 2), "plots": plots, "rows": rows,
        "samples": {pol: [{k: r[k] for k in ("level", "offered_gpus", "unallocated_gpus", "stranded_gpus",
                                             "whole_free_8gpu_nodes", "failed")} for r in fill[pol]]
                    for pol in POLICIES},
    }
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(f"fragmentation: openb cluster {len(nodes)} nodes / {gpus} GPUs; fill with {TASKS_CSV.name} tasks in "
          f"creation order; {rounds} churn rounds ({args.churn:.0%} leave, {ARRIVALS_CSV.name} arrivals, "
          f"{args.warm:.0%} of idle workers warm), seed {args.seed}")
    print(machine_line(result["machine"]) + f"; simulated in {elapsed:.1f}s")
    print("\nfill (nothing leaves; raygpu = best-fit here by design):")
    print_table([r for r in rows if r["phase"] == "fill"], FILL_COLS)
    print("\nchurn (after each round's departures, scale-down and arrivals):")
    print_table([r for r in rows if r["phase"] == "churn"], CHURN_COLS)
    for p in plots:
        print(f"plot: {p}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
