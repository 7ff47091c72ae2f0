"""The sidecar's first watch sync and one cycle, measured, in a process of its own (testing only).

    python -m raygpu.testing.scale_sidecar --kubeconfig K --namespace NS --cluster C --result OUT.json

It assembles the sidecar as ``raygpu sidecar`` does (``raygpu.commands.sidecar.run``): JSON logs on stdout,
``KubeAdapter``, the watch cache (``ClusterCache``) with the sidecar's ``InvalidSpec`` reporter,
``SidecarMetrics`` and a ``Reclaimer``, against the real API server. One thing differs: no raylet runs, so
Ray's view comes from the pods in the cache (``raygpu.testing.synthetic_ray.PodsRayView``, passed as the
Reclaimer's ``read_ray``) and the job table is empty. No metrics server is started (``--metrics-port 0``).
So that the process's memory holds what the real Ray read loads, it first imports the modules
``read_ray_view`` imports (``--no-ray-imports`` skips them). ``--startup-grace-s`` defaults to 0: the pods of a
scale test are minutes old.

Steps, each timed: imports; start the cache and wait until every kind is listed (the full sync, no event
replayed: a LIST each); one ``Reclaimer.cycle()`` (wall time, CPU of the cycle's thread, CPU of the whole
process meanwhile, which includes the watch threads). Memory is the kernel's own count for this process:
VmRSS after each step and VmHWM (peak RSS) at the end, from ``/proc/self/status``. (A parent's
``wait4`` ru_maxrss would be no better: it also counts the parent's pages the child had before ``exec``.)

Writes one JSON object to ``--result``; exits 0 when the cycle planned (``nothing-to-do`` or ``dry-run``),
1 when it did not (not synced, error, ...), 2 on bad usage.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import Counter
from pathlib import Path


def proc_status_kib(field: str, pid: int | str = "self") -> int | None:
    """``field`` (e.g. ``VmHWM``, ``VmRSS``) of ``/proc/<pid>/status`` in KiB; None where there is no /proc."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def import_ray_read() -> None:
    """Import what ``raygpu.adapters.ray_gcs.read_ray_view`` and ``read_job_liveness`` import on first use."""
    import ray  # noqa: F401
    from google.protobuf.json_format import MessageToDict  # noqa: F401
    from ray._private.services import canonicalize_bootstrap_address  # noqa: F401
    from ray._raylet import GcsClientOptions, GlobalStateAccessor  # noqa: F401
    from ray.autoscaler.v2.sdk import get_cluster_status  # noqa: F401
    from ray.core.generated.gcs_pb2 import JobTableData, PlacementGroupTableData  # noqa: F401


def measure(kubeconfig: str, namespace: str, cluster: str, *, ray_imports: bool = True,
            startup_grace_s: float = 0.0, sync_timeout_s: float = 300.0) -> dict:
    """Run the steps above in this process and return the measurements (see the module docstring)."""
    from raygpu.adapters.kube import KubeAdapter
    from raygpu.adapters.kube_watch import ClusterCache
    from raygpu.reclaim import logs
    from raygpu.reclaim.loop import Reclaimer, SidecarConfig, problem_reporter
    from raygpu.reclaim.metrics import SidecarMetrics
    from raygpu.testing.synthetic_ray import PodsRayView, no_jobs

    rss = {"start": proc_status_kib("VmRSS")}
    t = time.monotonic()
    if ray_imports:
        import_ray_read()
    import_s, rss["imported"] = time.monotonic() - t, proc_status_kib("VmRSS")

    logs.setup(json_logs=True)
    kube = KubeAdapter(kubeconfig)
    cache = ClusterCache(kube.api, namespace, cluster, on_problem=problem_reporter(kube, namespace, cluster))
    ray = PodsRayView(lambda: cache.view().pods)
    config = SidecarConfig(namespace=namespace, cluster=cluster, ray_address="synthetic-from-pods",
                           startup_grace_s=startup_grace_s)
    reclaimer = Reclaimer(kube, cache, config, SidecarMetrics(), read_ray=ray, read_jobs=no_jobs)
    t = time.monotonic()
    cache.start()
    try:
        synced = cache.wait_synced(timeout_s=sync_timeout_s)
        sync_s, rss["synced"] = time.monotonic() - t, proc_status_kib("VmRSS")
        wall0, cpu0, proc0 = time.monotonic(), time.thread_time(), time.process_time()
        report = reclaimer.cycle()
        wall_s, cpu_s, proc_s = time.monotonic() - wall0, time.thread_time() - cpu0, time.process_time() - proc0
        rss["cycle"] = proc_status_kib("VmRSS")
        view = cache.view()
        lists = cache.list_calls()
    finally:
        cache.stop()
    plan = report.plan
    return {
        "pid": os.getpid(), "ray_imports": ray_imports, "import_s": round(import_s, 3),
        "synced": synced, "sync_s": round(sync_s, 3), "list_calls": lists,
        "pods_in_cache": len(view.pods), "ray_nodes": ray.last_nodes,
        "cycle": {
            "outcome": report.outcome.value, "mode": report.mode.value if report.mode else None,
            "error": report.error, "wall_s": round(wall_s, 3), "cpu_s": round(cpu_s, 3),
            "process_cpu_s": round(proc_s, 3),
            "decisions": dict(sorted(Counter(f"{d.action.value}/{d.reason.value}"
                                             for d in plan.decisions).items())) if plan else {},
            "to_delete": list(plan.deleted_pods) if plan else [],
            "freed_k8s_nodes": len(plan.freed_k8s_nodes) if plan else 0,
            "reclaimable_gpus": plan.reclaimed_gpus if plan else 0.0},
        "rss_kib": rss, "peak_rss_kib": proc_status_kib("VmHWM"),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m raygpu.testing.scale_sidecar", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kubeconfig", required=True)
    ap.add_argument("--namespace", required=True)
    ap.add_argument("--cluster", required=True)
    ap.add_argument("--result", required=True, type=Path, help="write the measurements here (JSON)")
    ap.add_argument("--no-ray-imports", action="store_true", help="do not import Ray's GCS client modules")
    ap.add_argument("--startup-grace-s", type=float, default=0.0)
    ap.add_argument("--sync-timeout-s", type=float, default=300.0)
    args = ap.parse_args(argv)
    result = measure(args.kubeconfig, args.namespace, args.cluster, ray_imports=not args.no_ray_imports,
                     startup_grace_s=args.startup_grace_s, sync_timeout_s=args.sync_timeout_s)
    args.result.write_text(json.dumps(result))
    return 0 if result["cycle"]["outcome"] in ("nothing-to-do", "dry-run") else 1


if __name__ == "__main__":
    sys.exit(main())
