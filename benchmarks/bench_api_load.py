"""Kubernetes API load at steady state: raygpu's sidecar vs Ray's autoscaler (KubeRay node provider).

Both run for real against the testbed (``raygpu testbed up``), side by side on
the same RayCluster (a CPU head and ``--workers`` 8-GPU workers, real Ray nodes
started by the bridge), each under its own identity, and the API server's
audit log counts every request each one makes (``raygpu.testing.audit``):

* ``raygpu sidecar`` under the ServiceAccount of ``deploy/sidecar`` (a minted
  token), mode ``on``, ``--interval-s`` 5 (a cycle every 5 s), idle timeout 1 h
  (steady state: nothing to reclaim).
* Ray's KubeRay autoscaler, exactly what KubeRay's ``autoscaler`` container runs
  (``ray.autoscaler._private.kuberay.run_autoscaler.run_kuberay_autoscaler``),
  version v2 (``autoscalerOptions.version: v2``; ``--autoscaler v1`` for the
  old one), with a client certificate for user ``ray-autoscaler`` and KubeRay's
  autoscaler permissions. Its update interval is Ray's default (5 s).

After ``--warmup-s`` (start-up LISTs and WATCHes are reported apart), requests
are counted over ``--window-s``. A WATCH is one request however long it stays
open. Nothing else of either process is changed.

    python -m benchmarks.bench_api_load            # 4 workers, 6 min window (~9 min in all)
    python -m benchmarks.bench_api_load --quick    # 1 worker, 60 s window
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import sys
import time
from collections import Counter
from pathlib import Path

from benchmarks._common import machine, machine_line, print_table, save_plot
from raygpu.testing.rayprocs import RAY_USER, Proc, ray_autoscaler_role, start_ray_autoscaler, start_sidecar
from raygpu.model.labels import LABEL_POOL
from raygpu.testing import addons
from raygpu.testing import manifests as m
from raygpu.testing.audit import Request, read_requests
from raygpu.testing.bridge import head_address
from raygpu.testing.controlplane import Testbed
from raygpu.testing.kube import api_client, apply, dynamic
from raygpu.testing.procs import wait_for

SIDECAR_USER_FMT = "system:serviceaccount:{ns}:raygpu-sidecar"
CLUSTER = "rc"


def _log(msg: str) -> None:
    print(f"[bench_api_load] {msg}", file=sys.stderr, flush=True)


def run(args) -> dict:
    tb = Testbed()
    started = False
    if not tb.is_up():
        _log("starting the testbed (raygpu testbed up)")
        tb.up(progress=_log)
        started = True
    if not tb.audit_log.exists():
        raise SystemExit(f"no audit log at {tb.audit_log}: this testbed was started by an older raygpu; "
                         "restart it (raygpu testbed down && raygpu testbed up)")
    from kubernetes import client

    admin = api_client(tb.kubeconfig)
    core, kube = client.CoreV1Api(admin), dynamic(admin)
    ns = f"bench-api-{secrets.token_hex(3)}"
    core.create_namespace({"metadata": {"name": ns}})
    work = Path(os.environ.get("RAYGPU_BENCH_DIR", Path.home() / ".cache" / "raygpu" / "bench")) / ns
    work.mkdir(parents=True, exist_ok=True)
    procs: list[Proc] = []
    nodes = {f"{ns}-cpu": "cpu16", **{f"{ns}-g{i}": "h100x8" for i in range(args.workers)}}
    try:
        addons.add_nodes(tb, nodes, labels={LABEL_POOL: ns})
        rc = m.raycluster(CLUSTER, ns, [m.worker_group("gpu", replicas=args.workers, min_replicas=0,
                                                       max_replicas=args.workers, pool=ns)],
                          pool=ns, annotations={"raygpu.io/reclaim": "on", "raygpu.io/idle-timeout": "1h"})
        rc["spec"]["enableInTreeAutoscaling"] = True
        rc["spec"]["autoscalerOptions"] = {"version": args.autoscaler, "idleTimeoutSeconds": 3600}
        apply(kube, rc)

        def running() -> bool:
            ps = core.list_namespaced_pod(ns, label_selector=f"ray.io/cluster={CLUSTER}").items
            return len([p for p in ps if p.status.phase == "Running"]) == args.workers + 1
        wait_for("head and workers Running", running, 120, log=tb.logs / "ray-operator.log")

        gcs = wait_for("the Ray head started by the bridge", lambda: head_address(tb.root / "ray", ns, CLUSTER), 240,
                       log=tb.logs / "bridge.log")
        from ray.autoscaler.v2.sdk import get_cluster_status

        wait_for(f"{args.workers} Ray workers alive", lambda: len(get_cluster_status(gcs).active_nodes)
                 + len(get_cluster_status(gcs).idle_nodes) == args.workers + 1, 60 + 60 * args.workers,
                 log=tb.logs / "bridge.log")
        _log(f"cluster {ns}/{CLUSTER} up: head + {args.workers} x 8-GPU workers, GCS {gcs}")

        # identities
        for obj in [*m.sidecar_deploy_objects(ns, CLUSTER), *ray_autoscaler_role(ns)]:
            apply(kube, obj)
        tok = core.create_namespaced_service_account_token("raygpu-sidecar", ns,
                                                           {"spec": {"expirationSeconds": 3600}})
        side_kc = tb.kubeconfig_for_token(tok.status.token, "raygpu-sidecar", work / "sidecar.kubeconfig")
        _, crt, key = tb.kubeconfig_for_client_cert(RAY_USER, work / "ray.kubeconfig")
        sidecar_user = SIDECAR_USER_FMT.format(ns=ns)

        t_start = time.time()
        procs.append(start_sidecar(CLUSTER, ns, gcs, side_kc, work / "sidecar.log",
                                   "--interval-s", str(args.interval_s)))
        procs.append(start_ray_autoscaler(tb, CLUSTER, ns, gcs, crt, key, work / "ray-autoscaler.log"))
        users = {"raygpu sidecar": sidecar_user, "Ray autoscaler": RAY_USER}

        deadline = time.monotonic() + 120
        while {r.user for r in read_requests(tb.audit_log, users.values(), since_s=t_start)} != set(users.values()):
            for p in procs:
                if not p.alive():
                    raise RuntimeError(f"{p.name} exited: {p.log.read_text()[-2000:]}")
            if time.monotonic() > deadline:
                raise RuntimeError("after 120 s the audit log still lacks a client; logs under " + str(work))
            time.sleep(1)
        t_warm = time.time() + args.warmup_s
        t_end = t_warm + args.window_s
        _log(f"warm-up {args.warmup_s:.0f}s, then counting for {args.window_s:.0f}s")
        next_note = time.time() + 60
        while time.time() < t_end + 2:  # + audit flush
            for p in procs:
                if not p.alive():
                    raise RuntimeError(f"{p.name} exited: {p.log.read_text()[-2000:]}")
            if time.time() >= next_note:
                _log(f"{max(0.0, time.time() - t_warm):.0f}/{args.window_s:.0f}s counted")
                next_note += 60
            time.sleep(1)
        reqs = read_requests(tb.audit_log, users.values(), since_s=t_start)
    finally:
        for p in procs:
            p.stop()
        try:
            core.delete_namespace(ns)
            addons.remove_nodes(tb, list(nodes))
        except Exception as e:  # noqa: BLE001 - best effort; the testbed is shared
            _log(f"cleanup: {e}")
        if started and not args.keep_testbed:
            tb.down(quiet=True)
    return summarize(reqs, users, t_start, t_warm, t_end, args)


def summarize(reqs: list[Request], users: dict[str, str], t_start: float, t_warm: float, t_end: float,
              args) -> dict:
    minutes = (t_end - t_warm) / 60
    rows = []
    for label, user in users.items():
        mine = [r for r in reqs if r.user == user]
        startup = [r for r in mine if r.at_s < t_warm]
        steady = [r for r in mine if t_warm <= r.at_s < t_end]
        by_kind = Counter(f"{r.verb} {r.resource}" for r in steady)
        rows.append({"client": label, "user": user, "startup_requests": len(startup),
                     "requests": len(steady), "per_min": len(steady) / minutes,
                     "reads_per_min": sum(1 for r in steady if r.verb in ("get", "list")) / minutes,
                     "watches": sum(1 for r in steady if r.verb == "watch"),
                     "writes": sum(1 for r in steady if r.verb in ("create", "update", "patch", "delete")),
                     "denied": sum(1 for r in steady if r.code == 403),
                     "by_kind": dict(by_kind.most_common())})
    side, ray = rows
    result = {"benchmark": "api_load", "machine": machine(),
              "params": {"workers": args.workers, "window_s": args.window_s, "warmup_s": args.warmup_s,
                         "sidecar_interval_s": args.interval_s, "autoscaler": args.autoscaler},
              "rows": rows,
              "ray_over_raygpu": (ray["per_min"] / side["per_min"]) if side["per_min"] else None,
              "timeline": {row["client"]: [round(r.at_s - t_start, 2) for r in reqs if r.user == row["user"]]
                           for row in rows},
              "t_warm_s": t_warm - t_start, "t_end_s": t_end - t_start}
    return result


def plot(result: dict) -> str:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for client_name, ts in result["timeline"].items():
        ax.step([0.0, *ts, result["t_end_s"]], [0, *range(1, len(ts) + 1), len(ts)], where="post",
                label=client_name)
    ax.axvspan(result["t_warm_s"], result["t_end_s"], color="0.92", label="counted window")
    ax.set_xlabel("seconds since both started")
    ax.set_ylabel("API requests (cumulative)")
    ax.set_title(f"API requests at steady state, {result['params']['workers']} GPU workers")
    ax.legend()
    return save_plot(fig, "api_load_requests.png")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="1 worker, 20 s warm-up, 60 s window")
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of tables")
    ap.add_argument("--no-plot", action="store_true", help="do not write benchmarks/results/api_load_requests.png")
    ap.add_argument("--workers", type=int, default=4, help="8-GPU Ray workers (default 4)")
    ap.add_argument("--window-s", type=float, default=360, help="counted window (default 360 s: the whole run "
                    "stays under 10 min on 2 cores)")
    ap.add_argument("--warmup-s", type=float, default=60, help="not counted, after both first talk (default 60 s)")
    ap.add_argument("--interval-s", type=float, default=5, help="sidecar cycle interval (default 5 s)")
    ap.add_argument("--autoscaler", choices=["v1", "v2"], default="v2", help="Ray autoscaler version (default v2)")
    ap.add_argument("--keep-testbed", action="store_true", help="leave a testbed this run started running")
    args = ap.parse_args()
    if args.quick:
        args.workers, args.window_s, args.warmup_s = 1, 60, 20
    result = run(args)
    if not args.no_plot:
        result["plot"] = plot(result)
    if args.json:
        print(json.dumps({k: v for k, v in result.items() if k != "timeline"}))
        return 0
    print(machine_line(result["machine"]))
    print(f"{result['params']['workers']} x 8-GPU workers, counted {result['params']['window_s']:.0f} s after "
          f"{result['params']['warmup_s']:.0f} s warm-up; sidecar cycle {result['params']['sidecar_interval_s']:g} s, "
          f"Ray autoscaler {result['params']['autoscaler']}")
    print_table(result["rows"], [("client", "client", "s"), ("startup_requests", "start-up req", "d"),
                                 ("requests", "requests", "d"), ("per_min", "req/min", ".1f"),
                                 ("reads_per_min", "reads/min", ".1f"), ("watches", "watches", "d"),
                                 ("writes", "writes", "d"), ("denied", "403s", "d")])
    for row in result["rows"]:
        print(f"  {row['client']}: " + ", ".join(f"{k} x{v}" for k, v in row["by_kind"].items()) or "-")
    if result["ray_over_raygpu"] is not None:
        print(f"Ray autoscaler / raygpu sidecar requests per minute: {result['ray_over_raygpu']:.1f}x")
    if "plot" in result:
        print(f"plot: {result['plot']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
