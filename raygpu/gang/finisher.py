"""Finish a reservation's release after its driver has gone (``python -m raygpu.gang.finisher``).

A driver interrupted with Ctrl-C, or exiting with placement groups still
live, must give the prompt back within seconds, but the reservation's pods
may take far longer to terminate. So the driver releases what it can within
``EXIT_BUDGET_S`` (Ray placement group removed, state made terminal, worker
group scaled to zero) and starts this program, detached in its own session,
to wait for the pods and remove the emptied worker group and the state
ConfigMap. If this program cannot finish either (killed with the driver's
container, API server unreachable), the sidecar's garbage collection does:
the state it left is terminal.

It only touches a reservation it can prove raygpu created and its driver
released: a state ConfigMap with the labels ``raygpu.io/reservation`` and
``raygpu.io/cluster`` of the named cluster, owned by that RayCluster (its
uid), in state failed, released or rolled_back, deleted only while it is
still that object (uid precondition); a worker group only if its pod
template carries the reservation label. Exit codes: 0 finished (or nothing left), 1 pods still there at
the deadline (the sidecar finishes), 2 refused (bad arguments, not ours,
not released by its driver) or an API error. One JSON line on stdout says
what happened.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time

FINISH_DRAIN_S = 300.0  # how long the finisher waits for the reservation's pods to terminate
MAX_DRAIN_S = 86400.0  # --drain-timeout-s: finite, 0..a day (NaN or inf would make its wait loop endless)
_RELEASED_STATES = {"failed", "released", "rolled_back"}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m raygpu.gang.finisher", description=__doc__.split("\n\n")[0])
    ap.add_argument("--namespace", required=True)
    ap.add_argument("--cluster", required=True, help="the RayCluster the reservation belongs to")
    ap.add_argument("--reservation", required=True, help="the reservation's state ConfigMap (its gang name)")
    ap.add_argument("--kubeconfig", default=None, help="default: $KUBECONFIG, ~/.kube/config, then in-cluster")
    ap.add_argument("--drain-timeout-s", type=float, default=FINISH_DRAIN_S,
                    help=f"how long to wait for the pods to terminate: finite, 0 to {MAX_DRAIN_S:g} "
                         f"(default {FINISH_DRAIN_S:g})")
    args = ap.parse_args(argv)
    if not (math.isfinite(args.drain_timeout_s) and 0 <= args.drain_timeout_s <= MAX_DRAIN_S):
        return _say(2, "refused", args, reason=f"--drain-timeout-s must be a finite number of seconds >= 0 and "
                                               f"<= {MAX_DRAIN_S:g}, got {args.drain_timeout_s!r}")

    from raygpu.adapters.kube import KubeAdapter
    from raygpu.errors import RayGpuError
    from raygpu.gang.reservation import GroupOutcome, finish_release
    from raygpu.model.labels import ANNOTATION_RESERVATION_STATE, LABEL_CLUSTER, LABEL_RESERVATION, dns_label

    t0 = time.monotonic()
    try:
        kube = KubeAdapter(args.kubeconfig)
        cm = kube.get("v1", "ConfigMap", args.reservation, args.namespace)
        if cm is None:
            return _say(0, "nothing-left", args)
        md = cm.get("metadata") or {}
        labels, state = md.get("labels") or {}, (md.get("annotations") or {}).get(ANNOTATION_RESERVATION_STATE)
        group = labels.get(LABEL_RESERVATION)
        if not group or labels.get(LABEL_CLUSTER) != dns_label(args.cluster):
            return _say(2, "refused", args, reason="not a raygpu reservation of this cluster (labels "
                        f"{LABEL_RESERVATION}/{LABEL_CLUSTER} missing or different)")
        owner_uid = kube.raw_raycluster(args.namespace, args.cluster)["metadata"]["uid"]
        if not any(o.get("kind") == "RayCluster" and o.get("uid") == owner_uid for o in md.get("ownerReferences") or []):
            return _say(2, "refused", args, reason=f"not owned by RayCluster {args.namespace}/{args.cluster}")
        if state not in _RELEASED_STATES:
            return _say(2, "refused", args, reason=f"state {state!r}: its driver has not released it")
        outcome, deleted = finish_release(kube, args.namespace, args.cluster, args.reservation, group,
                                          drain_timeout_s=args.drain_timeout_s, uid=md.get("uid"))
    except RayGpuError as e:
        return _say(2, "error", args, reason=str(e))
    took_s = round(time.monotonic() - t0, 1)
    if outcome is GroupOutcome.DRAINING:
        return _say(1, "draining", args, group=group, took_s=took_s)
    return _say(0, "finished", args, group=group, group_outcome=outcome.value, configmap_deleted=deleted, took_s=took_s)


def spawn(namespace: str, cluster: str, reservation: str, kubeconfig: str | None = None) -> str:
    """Start this program detached (own session, stdin closed) for one reservation; returns its log's path.

    The log is a new file (mode 0600) in a new private directory (``tempfile.mkdtemp``: mode 0700, a
    name nobody can guess), opened with O_EXCL | O_NOFOLLOW: a shared temporary directory lets any local
    user plant a link at a predictable name, and appending through it would write where they chose.
    Raises OSError when it cannot be started.
    """
    cmd = [sys.executable, "-m", "raygpu.gang.finisher", "--namespace", namespace, "--cluster", cluster,
           "--reservation", reservation] + (["--kubeconfig", kubeconfig] if kubeconfig else [])
    private = tempfile.mkdtemp(prefix="raygpu-finisher-")
    log_path = os.path.join(private, f"{namespace}-{reservation}.log")
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND | getattr(os, "O_NOFOLLOW", 0), 0o600)
    with os.fdopen(fd, "ab") as log:
        subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True,
                         close_fds=True)
    return log_path


def hand_off(plan, kubeconfig: str | None, why: str, progress) -> None:
    """Start the finisher for ``plan``'s reservation (a GangPlan) and say so with ``progress``; never raises."""
    try:
        log_path = spawn(plan.namespace, plan.cluster, plan.gang_name, kubeconfig)
        progress(f"reservation {plan.reservation_group}: {why}; the rest is finished in the background "
                 f"(log {log_path}), else by the sidecar's garbage collection")
    except Exception as e:  # noqa: BLE001 - at exit nothing may raise; the sidecar's GC is the backstop
        progress(f"reservation {plan.reservation_group}: {why}; could not start the finisher ({e}): "
                 "the sidecar's garbage collection finishes the release")


def _say(code: int, event: str, args: argparse.Namespace, **kw) -> int:
    print(json.dumps({"event": event, "namespace": args.namespace, "cluster": args.cluster,
                      "reservation": args.reservation, "t": time.time(), **kw}), flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
