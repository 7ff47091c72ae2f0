"""The sidecar at scale against the testbed's real API server: memory, watch-sync time, cycle time.

``--nodes`` kwok GPU nodes (8 GPUs each, default 2,000) plus one CPU node for the head, and ``--pods`` Ray
worker pods of one RayCluster (4 GPUs each, default 4,000: two per node) plus its head, as KubeRay would make
them. No raylets run: Ray's view is synthesized from the pods (``raygpu.testing.synthetic_ray``), every
other worker idle for 1 h, the rest busy. The sidecar, in a process of its own assembled as ``raygpu
sidecar`` is (``raygpu.testing.scale_sidecar``), does its first full watch sync (one LIST per kind, then
watches) and one dry-run cycle. Reported: the peak RSS of that process (VmHWM; the issue's bound is 500 MiB),
the time to sync, the cycle's wall and CPU time, and the plan (it must be exactly the idle workers).
Steps and cleanup: ``raygpu.testing.scale.run_scale``.

    python -m benchmarks.bench_sidecar_scale                        # 2,000 nodes, 4,000 pods (~5-10 min here)
    python -m benchmarks.bench_sidecar_scale --quick                # 200 nodes, 400 pods
    python -m benchmarks.bench_sidecar_scale --json

The testbed is used as ``bench_api_load`` uses it: a running one is reused, else started (and stopped at the
end). It is shared: run this under the testbed lock (``flock /tmp/raygpu-testbed.lock python -m ...``).
Everything it creates (a namespace, its nodes) is deleted, also when it fails.
"""

from __future__ import annotations

import argparse
import json
import sys

from benchmarks._common import machine, machine_line
from raygpu.testing.controlplane import Testbed
from raygpu.testing.scale import ScaleSpec, run_scale

BOUND_MIB = 500  # issue 10 (5): the sidecar process at 2,000 nodes / 4,000 pods


def _log(msg: str) -> None:
    print(f"[bench_sidecar_scale] {msg}", file=sys.stderr, flush=True)


def summarize(r: dict) -> dict:
    """The run's numbers without the name lists, and whether the plan was the expected one."""
    side, cycle, exp = r["sidecar"], r["sidecar"]["cycle"], r["expected"]
    peak_mib = side["peak_rss_kib"] / 1024 if side.get("peak_rss_kib") else None
    return {
        "benchmark": "sidecar_scale", "machine": machine(), "params": r["params"], "load_avg": r["load_avg"],
        "setup_s": r["setup"], "sidecar_exit_code": side["exit_code"], "synced": side["synced"],
        "import_s": side["import_s"], "sync_s": side["sync_s"], "list_calls": side["list_calls"],
        "pods_in_cache": side["pods_in_cache"], "ray_nodes": side["ray_nodes"],
        "cycle": {k: v for k, v in cycle.items() if k != "to_delete"},
        "planned_deletions": len(cycle["to_delete"]),
        "plan_as_expected": sorted(cycle["to_delete"]) == sorted(exp["idle"]),
        "idle_workers": len(exp["idle"]), "busy_workers": len(exp["busy"]),
        "rss_mib": {k: round(v / 1024, 1) for k, v in side["rss_kib"].items() if v},
        "peak_rss_mib": round(peak_mib, 1) if peak_mib else None,
        "within_bound": peak_mib is not None and peak_mib <= BOUND_MIB, "bound_mib": BOUND_MIB,
        "after": r["after"], "sidecar_log": side["log"],
    }


def render(s: dict, note: str | None) -> str:
    p, c, setup = s["params"], s["cycle"], s["setup_s"]
    rss = s["rss_mib"]
    lists = ", ".join(f"{k} {v}" for k, v in s["list_calls"].items())
    lines = [
        "sidecar at scale: first watch sync + one dry-run cycle against the testbed's API server "
        "(Ray's view synthesized from the pods, no raylets)",
        machine_line(s["machine"]),
        f"load avg (1 min) at start / before the sidecar / at the end: {' / '.join(map(str, s['load_avg']))}",
    ]
    if note:
        lines.append(f"note: {note}")
    lines += [
        f"{p['nodes']} kwok GPU nodes (h100x8) + 1 CPU node for the head; {p['pods']} worker pods "
        f"({p['gpus_per_pod']} GPUs each) + the head; {s['idle_workers']} workers idle {p['idle_s']:g} s, "
        f"{s['busy_workers']} busy",
        f"setup: nodes created in {setup['create_nodes_s']:.1f} s (all Ready at {setup['nodes_ready_s']:.1f} s), "
        f"pods created in {setup['create_pods_s']:.1f} s (all Running at {setup['pods_running_s']:.1f} s); "
        f"{p['threads']} threads",
        f"sidecar process (Ray's GCS client modules imported: {'yes' if p['ray_imports'] else 'no'}):",
        f"  imports      {s['import_s']:7.2f} s wall                        RSS {rss.get('imported', 0):7.1f} MiB",
        f"  watch sync   {s['sync_s']:7.2f} s wall                        RSS {rss.get('synced', 0):7.1f} MiB"
        f"   LISTs: {lists}; {s['pods_in_cache']} pods cached",
        f"  one cycle    {c['wall_s']:7.2f} s wall, {c['cpu_s']:.2f} s CPU (process {c['process_cpu_s']:.2f} s)"
        f"   RSS {rss.get('cycle', 0):7.1f} MiB   {s['ray_nodes']} Ray nodes synthesized",
        f"  peak RSS (VmHWM) {s['peak_rss_mib']} MiB: "
        f"{'within' if s['within_bound'] else 'OVER'} the issue's {s['bound_mib']} MiB",
        f"plan: {c['outcome']}; " + ", ".join(f"{k} {v}" for k, v in c["decisions"].items())
        + f"; exactly the idle workers: {'yes' if s['plan_as_expected'] else 'NO'}; frees {c['freed_k8s_nodes']} "
        f"nodes, {c['reclaimable_gpus']:g} GPUs",
        f"after: RayCluster resourceVersion unchanged (no patch): {s['after']['raycluster_resource_version_unchanged']}"
        f", {s['after']['pods']} pods, Events: {', '.join(s['after']['events']) or '-'}",
    ]
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=2000, help="kwok GPU nodes (default 2,000)")
    ap.add_argument("--pods", type=int, default=4000, help="Ray worker pods of the one RayCluster (default 4,000)")
    ap.add_argument("--quick", action="store_true", help="200 nodes, 400 pods")
    ap.add_argument("--threads", type=int, default=8, help="parallel creates (default 8)")
    ap.add_argument("--no-ray-imports", action="store_true",
                    help="do not import Ray's GCS client modules into the sidecar process")
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of the report")
    ap.add_argument("--note", help="a line for the report (e.g. what else ran on the box)")
    ap.add_argument("--keep-testbed", action="store_true", help="leave a testbed this run started running")
    args = ap.parse_args()
    if args.quick:
        args.nodes, args.pods = 200, 400
    try:
        spec = ScaleSpec(nodes=args.nodes, pods=args.pods, threads=args.threads, ray_imports=not args.no_ray_imports)
    except ValueError as e:
        ap.error(str(e))
    tb, started = Testbed(), False
    if not tb.is_up():
        _log("starting the testbed")
        tb.up(progress=_log)
        started = True
    try:
        result = summarize(run_scale(tb, spec, progress=_log))
    finally:
        if started and not args.keep_testbed:
            tb.down(quiet=True)
    print(json.dumps(result) if args.json else render(result, args.note))
    return 0 if result["sidecar_exit_code"] == 0 and result["plan_as_expected"] else 1


if __name__ == "__main__":
    sys.exit(main())
