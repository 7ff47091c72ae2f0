"""``raygpu sidecar``: the idle-node reclaimer loop, run next to the Ray head."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import threading
from pathlib import Path

from raygpu.commands.argtypes import add_request_timeout, port, seconds

log = logging.getLogger("raygpu.sidecar")

SA_NAMESPACE_FILE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
MIN_INTERVAL_S = 1.0  # a cycle reads the GCS and plans: more often than 1 s is load, not freshness
MAX_INTERVAL_S = 3600.0  # rarer than hourly and the garbage collection and scale-down effectively stop
HEARTBEAT_BEATS = 3  # --heartbeat-timeout-s >= this many driver heartbeat periods
MAX_HEARTBEAT_TIMEOUT_S = 86400.0  # a dead driver's gang held longer than a day is a typo's cost
DESCRIPTION = """\
Scale idle Ray workers of one RayCluster down, garbage-collect gang
reservations nobody will release, and (gang scale-up, opt-in) reserve an
all-or-nothing gang for each pending placement group that raygpu did not
create (Ray Train, Tune, Serve, vLLM). Runs as a container next to the Ray head.

Every cycle (--interval-s): read the RayCluster, its pods and its reservation
ConfigMaps from a watch-backed cache, read Ray's nodes, placement groups and
jobs from the GCS (--ray-address), plan, and - only when the RayCluster says
raygpu.io/reclaim: on - apply the plan as ONE JSON patch whose first op tests
metadata.resourceVersion. A conflict re-plans from a new snapshot, it never
overwrites. A worker that holds a placement-group bundle, belongs to a live
reservation, is needed for a pending placement group to fit, or is under its
group's minReplicas is never removed.

RayCluster annotations:
  raygpu.io/reclaim                off | dry-run | on   (default dry-run: plan, report, write nothing)
  raygpu.io/idle-timeout           e.g. 300s, 10m       (default 10m; 1s to 30 days)
  raygpu.io/idle-timeout.<group>   per worker group override
  raygpu.io/gang-scale-up          on | off             (default off; independent of raygpu.io/reclaim)
  raygpu.io/gang-scale-up-in-flight  1 to 64            (default 4: reservations waiting to be used)
  raygpu.io/gang-scale-up-timeout  e.g. 10m             (default 10m; 30s to 24h: unused by then, rolled back)
  raygpu.io/gang-backend           coscheduling | kueue | volcano | workload | none  (default none)
Gang scale-up: a placement group pending for 10 s that fits on no Ray node
that exists gets one reservation (a worker group rg-pg-<id> of n pods, gang-
scheduled by the backend), oldest first; it is released when the placement
group is removed, placed elsewhere, or still pending at the timeout (then
retried after a back-off). docs/gang-scale-up.md has the RayCluster settings
beside Ray's own autoscaler.
A bad value gives a Warning Event InvalidAnnotation on the RayCluster (once
per value) and the safe default; the sidecar keeps running. So does a value
of the RayCluster or its pods that does not parse (rayStartParams num-gpus
"abc", a start command with --num-gpus=$(N)): a Warning Event InvalidSpec
naming the object, and the safe default (the container's limit).

Reports: Prometheus metrics on <--metrics-address>:<--metrics-port>/metrics, Events ScaledDown /
ScaleDownDryRun / ReservationReleased / GangScaleUp on the RayCluster, one log line per
decision that changed and per cycle (JSON with --json-logs).

SIGTERM or SIGINT stop it between cycles. Exit codes: 0 stopped cleanly,
1 the last --once cycle failed, 2 bad usage (checked before anything is
contacted: numbers finite and in range - --interval-s 1 to 3600,
--heartbeat-timeout-s at least three driver heartbeats (30) and at most a
day - the metrics port free) or no access
to the cluster (no kubeconfig, unreachable, credential refused).
"""


def register(subparsers) -> None:
    p = subparsers.add_parser("sidecar", help="the idle-node reclaimer loop (next to the Ray head)",
                              description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cluster", default=os.environ.get("RAYGPU_CLUSTER"),
                   help="RayCluster name (default: $RAYGPU_CLUSTER, else the ray.io/cluster label of this pod)")
    p.add_argument("--namespace", default=os.environ.get("POD_NAMESPACE"),
                   help="its namespace (default: $POD_NAMESPACE, else this pod's ServiceAccount namespace)")
    p.add_argument("--ray-address", default=os.environ.get("RAY_ADDRESS") or "127.0.0.1:6379",
                   help="GCS address host:port (default: $RAY_ADDRESS, else 127.0.0.1:6379)")
    p.add_argument("--kubeconfig", default=None,
                   help="kubeconfig file (default: $KUBECONFIG or ~/.kube/config, else in-cluster)")
    p.add_argument("--interval-s", type=seconds(minimum=MIN_INTERVAL_S, maximum=MAX_INTERVAL_S), default=10.0,
                   help=f"seconds between cycles: {MIN_INTERVAL_S:g} to {MAX_INTERVAL_S:g} (default 10)")
    p.add_argument("--once", action="store_true",
                   help="run one cycle (re-planning at once after a conflict) and exit")
    p.add_argument("--metrics-port", type=port, default=9108, help="Prometheus port; 0 disables (default 9108)")
    p.add_argument("--metrics-address", default="0.0.0.0",
                   help="address the metrics server binds (default 0.0.0.0: every interface)")
    p.add_argument("--json-logs", action="store_true", help="one JSON object per log line")
    p.add_argument("--startup-grace-s", type=_non_negative, default=120.0,
                   help="a worker younger than this is never idle (default 120)")
    p.add_argument("--heartbeat-timeout-s", type=_positive, default=60.0,
                   help=f"release a reservation whose driver has not beaten for this long (default 60): >= "
                        f"{HEARTBEAT_BEATS * 10:g} (three of the drivers' 10 s heartbeats: fewer releases live "
                        f"gangs) and <= {MAX_HEARTBEAT_TIMEOUT_S:g}")
    p.add_argument("--debug-heartbeat-timeout-floor-s", type=_non_negative, default=None,
                   help=argparse.SUPPRESS)  # the testbed's tests age a dead driver in seconds, not in three beats
    p.add_argument("--debug-scale-up-backoff-s", type=_positive, default=30.0,
                   help=argparse.SUPPRESS)  # the testbed's fault tests retry a failed gang scale-up in seconds
    add_request_timeout(p)
    p.add_argument("--debug-pause-before-apply-s", type=_non_negative, default=0.0,
                   help=argparse.SUPPRESS)  # fault injection for tests: widen the plan -> patch window
    p.set_defaults(func=run)


_positive = seconds(minimum=0.0, inclusive=False, maximum=MAX_HEARTBEAT_TIMEOUT_S)
_non_negative = seconds(minimum=0.0)


def heartbeat_timeout_floor_s() -> float:
    """Three of the drivers' heartbeat periods: a shorter timeout releases gangs whose driver is alive."""
    from raygpu.gang.api import HEARTBEAT_EVERY_S  # lazily: parsing flags does not load the gang module
    return HEARTBEAT_BEATS * HEARTBEAT_EVERY_S


def _heartbeat_timeout_problem(args: argparse.Namespace) -> str | None:
    """Why ``--heartbeat-timeout-s`` is refused, or None."""
    floor_s = args.debug_heartbeat_timeout_floor_s
    floor_s = heartbeat_timeout_floor_s() if floor_s is None else floor_s
    if args.heartbeat_timeout_s >= floor_s:
        return None
    return (f"argument --heartbeat-timeout-s: must be >= {floor_s:g} seconds (three of the drivers' heartbeats; "
            f"a shorter timeout releases live gangs), got {args.heartbeat_timeout_s:g}")


def _where(args: argparse.Namespace, kube) -> tuple[str, str]:
    """(namespace, cluster): flags/env first, else this pod's ServiceAccount namespace and ray.io/cluster label."""
    from raygpu.errors import PermanentError
    ns = args.namespace or (SA_NAMESPACE_FILE.read_text().strip() if SA_NAMESPACE_FILE.exists() else None)
    cluster = args.cluster
    if not cluster and ns and os.environ.get("HOSTNAME"):
        pod = kube.get("v1", "Pod", os.environ["HOSTNAME"], ns)
        cluster = ((pod or {}).get("metadata", {}).get("labels") or {}).get("ray.io/cluster")
    if not ns or not cluster:
        raise PermanentError("cannot tell which RayCluster to watch: pass --cluster and --namespace "
                             "(or set RAYGPU_CLUSTER and POD_NAMESPACE)")
    return ns, cluster


def run(args: argparse.Namespace) -> int:
    import sys
    import time

    from raygpu.adapters.kube import KubeAdapter
    from raygpu.adapters.ray_extra import RAY_INSTALL, ray_installed
    from raygpu.errors import RayGpuError
    from raygpu.reclaim import logs
    from raygpu.adapters.kube_watch import ClusterCache
    from raygpu.reclaim.loop import CycleOutcome, Reclaimer, SidecarConfig, problem_reporter
    from raygpu.reclaim.metrics import SidecarMetrics

    problem = _heartbeat_timeout_problem(args)
    if problem is not None:  # bad usage, before anything is served or contacted
        print(f"raygpu sidecar: {problem}", file=sys.stderr)
        return 2
    if not ray_installed():  # every cycle reads Ray's GCS: without Ray it could only report Ray unreachable
        print(f"raygpu sidecar: needs Ray's GCS client, and Ray is not installed: {RAY_INSTALL}", file=sys.stderr)
        return 2
    logs.setup(args.json_logs, level=getattr(args, "log_level", None) or logging.INFO)  # raygpu --log-level
    metrics = SidecarMetrics()
    try:  # before contacting anything: a port in use or a bad address is bad usage
        server = metrics.serve(args.metrics_port, args.metrics_address) if args.metrics_port else None
    except (OSError, ValueError) as e:
        print(f"raygpu sidecar: cannot serve metrics on {args.metrics_address}:{args.metrics_port}: {e}",
              file=sys.stderr)
        return 2
    try:
        kube = KubeAdapter(args.kubeconfig, first_contact_timeout_s=args.request_timeout)
        namespace, cluster = _where(args, kube)
    except Exception as e:  # noqa: BLE001 - e.g. no kubeconfig and not in a pod: bad usage, not a crash
        if server is not None:
            server.shutdown()
        print(f"raygpu sidecar: {e}" if isinstance(e, RayGpuError) else
              f"raygpu sidecar: cannot reach Kubernetes: {type(e).__name__}: {e}", file=sys.stderr)
        return 2
    stop = threading.Event()

    def on_signal(signum, _frame) -> None:
        log.info("stopping", extra={"fields": {"signal": signal.Signals(signum).name}})
        stop.set()
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    config = SidecarConfig(namespace=namespace, cluster=cluster, ray_address=args.ray_address,
                           interval_s=args.interval_s, startup_grace_s=args.startup_grace_s,
                           heartbeat_timeout_s=args.heartbeat_timeout_s,
                           scale_up_backoff_s=args.debug_scale_up_backoff_s)
    cache = ClusterCache(kube.api, namespace, cluster, on_problem=problem_reporter(kube, namespace, cluster)).start()
    pause = args.debug_pause_before_apply_s
    reclaimer = Reclaimer(kube, cache, config, metrics,
                          before_apply=(lambda plan: time.sleep(pause)) if pause else None)
    log.info("started", extra={"fields": {"namespace": namespace, "cluster": cluster, "ray_address": args.ray_address,
                                          "interval_s": args.interval_s, "metrics_port": args.metrics_port,
                                          "pid": os.getpid()}})
    try:
        if not cache.wait_synced(timeout_s=30.0):
            log.warning("cache-not-synced", extra={"fields": {"errors": list(cache.view().errors)}})
        if args.once:
            report = reclaimer.run(stop, once=True)
            return 1 if report is None or report.outcome in (CycleOutcome.ERROR, CycleOutcome.NOT_SYNCED) else 0
        reclaimer.run(stop)
        return 0
    finally:
        cache.stop()
        if server is not None:
            server.shutdown()
        log.info("stopped", extra={"fields": {"namespace": namespace, "cluster": cluster}})
