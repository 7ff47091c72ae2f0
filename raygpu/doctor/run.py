"""``raygpu doctor`` as a function: resolve the target, observe, reconcile, maybe repair, print.

``run(args)`` takes the parsed arguments of ``raygpu.commands.doctor`` and
returns the exit code (0 healthy, 1 findings or a failed repair, 2 cannot
reach the cluster or bad usage). It reads only, unless the RayCluster is
annotated ``raygpu.io/reconcile=repair``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any


# ------------------------------------------------------------ resolution
def _testbed():
    """The local testbed when it is up, else None (never raises: it is a convenience)."""
    try:
        from raygpu.testing.controlplane import Testbed
        tb = Testbed()
        return tb if tb.is_up() else None
    except Exception:  # noqa: BLE001
        return None


def resolve_target(args: argparse.Namespace, tb: Any) -> tuple[str, str | None, str | None, str]:
    """(namespace, cluster, Ray address or None, where the address came from)."""
    ns = args.namespace or "default"
    cluster = args.cluster
    if args.ray_address:
        return ns, cluster, args.ray_address, "--ray-address"
    if tb is not None:
        from raygpu.testing.bridge import ray_clusters
        heads = [rc for rc in ray_clusters(tb.root / "ray")
                 if (args.namespace is None or rc["namespace"] == ns) and (cluster is None or rc["cluster"] == cluster)]
        if len(heads) == 1:
            rc = heads[0]
            return rc["namespace"], rc["cluster"], rc["address"], "the testbed's Ray bridge"
        if len(heads) > 1 and cluster is None:
            names = ", ".join(f"{rc['namespace']}/{rc['cluster']}" for rc in heads)
            raise _Usage(f"the testbed runs several RayClusters ({names}); pick one with --cluster / --namespace")
    if os.environ.get("RAY_ADDRESS"):
        return ns, cluster, os.environ["RAY_ADDRESS"], "$RAY_ADDRESS"
    if cluster and os.environ.get("KUBERNETES_SERVICE_HOST"):
        return ns, cluster, f"{cluster}-head-svc.{ns}.svc:6379", "the RayCluster's head service"
    return ns, cluster, None, "nowhere"


class _Usage(Exception):
    pass


def _selector(text: str | None) -> dict[str, str]:
    out: dict[str, str] = {}
    for part in (text or "").split(","):
        if not part.strip():
            continue
        key, eq, val = part.partition("=")
        if not eq or not key.strip():
            raise _Usage(f"--node-selector item {part!r} is not KEY=VALUE")
        out[key.strip()] = val.strip()
    return out


def scope_nodes(snapshot, selector: dict[str, str]):
    """The snapshot with only the nodes whose labels match ``selector`` (pods on other nodes stay)."""
    if not selector or not snapshot.k8s.reachable:
        return snapshot
    nodes = tuple(n for n in snapshot.k8s.nodes if all(n.labels.get(k) == v for k, v in selector.items()))
    return snapshot.model_copy(update={"k8s": snapshot.k8s.model_copy(update={"nodes": nodes})})


# ------------------------------------------------------------------- run
def run(args: argparse.Namespace) -> int:
    from raygpu.doctor.render import render_text, report_dict
    from raygpu.errors import RayGpuError
    from raygpu.model.annotations import ReconcileMode, parse_cluster_policy
    from raygpu.plan.common.collector import collector_paused
    from raygpu.plan.doctor.reconcile import DEFAULT_ORPHAN_GRACE_S, reconcile

    def fail(reason: str, code: int = 2) -> int:
        if args.json:
            print(json.dumps({"exit_code": code, "healthy": False, "error": reason}, indent=2))
        else:
            print(f"raygpu doctor: {reason}", file=sys.stderr)
            print(f"exit {code}: {'cannot reach the cluster' if code == 2 else 'error'}", file=sys.stderr)
        return code

    tb = _testbed()
    if tb is not None and (args.kubeconfig or os.environ.get("KUBECONFIG")) and \
            os.path.abspath(args.kubeconfig or os.environ["KUBECONFIG"]) != os.path.abspath(tb.kubeconfig):
        tb = None  # another cluster was asked for: the testbed is not the one to look at
    try:
        ns, cluster, address, source = resolve_target(args, tb)
        selector = _selector(args.node_selector)
    except _Usage as e:
        return fail(str(e))
    kubeconfig = args.kubeconfig or (str(tb.kubeconfig) if tb is not None else None)
    try:
        from raygpu.adapters.kube import KubeAdapter
        kube = KubeAdapter(kubeconfig, first_contact_timeout_s=args.request_timeout)
    except Exception as e:  # noqa: BLE001 - no kubeconfig, not in a cluster
        return fail(f"cannot reach Kubernetes: {type(e).__name__}: {e}")

    view = None
    templates: tuple = ()
    notes: list[str] = []
    if cluster:
        try:
            view = kube.get_raycluster(ns, cluster)
            templates = view.worker_groups
            notes += [f"invalid value (safe default used): {p.message}" for p in view.problems]
        except RayGpuError as e:
            return fail(f"cannot read RayCluster {ns}/{cluster}: {e}")
    if address is None:
        notes.append("no Ray address: pass --ray-address, set RAY_ADDRESS or run next to a testbed")

    grace = DEFAULT_ORPHAN_GRACE_S if args.orphan_grace is None else args.orphan_grace

    def observe():
        from raygpu.doctor.snapshot import take_snapshot
        now = time.time()
        snap = scope_nodes(take_snapshot(kube, address, ns, cluster, now, with_nvml=args.nvml), selector)
        with collector_paused():  # the doctor's own process: the caller's decision (plan/common/collector.py)
            return reconcile(snap, now, orphan_grace_s=grace, templates=templates), snap

    report, snapshot = observe()
    notes += list(snapshot.k8s.notes)  # e.g. DRA not served: said once, the checks run as without it

    outcome = None
    if view is not None:
        policy, problems = parse_cluster_policy(view.annotations)
        notes += [f"ignored annotation {p.key}={p.value!r}: {p.reason} (using {p.default_used})" for p in problems]
        if policy.reconcile is ReconcileMode.REPAIR:
            if args.no_repair:
                notes.append("raygpu.io/reconcile=repair, but --no-repair: reporting only")
            elif report.unreachable:
                notes.append("raygpu.io/reconcile=repair, but a view is unreachable: not repairing")
            else:
                from raygpu.doctor.repair import repair_cluster
                outcome = repair_cluster(kube, ns, cluster, report, snapshot, observe=observe)

    code = report.exit_code
    if outcome is not None and outcome.errors and code == 0:
        code = 1
    if args.json:
        d = report_dict(report)
        d["exit_code"] = code
        d["ray_address"] = address
        d["ray_address_source"] = source
        d["notes"] = notes
        d["repair"] = outcome.as_dict() if outcome is not None else None
        print(json.dumps(d, indent=2))
        return code
    body, _, verdict = render_text(report).rstrip("\n").rpartition("\n")
    out = body.rstrip("\n").split("\n")
    out.insert(1, f"ray: {address} (from {source})" if address else "ray: no address")
    if outcome is not None:
        out += ["", "Repair (raygpu.io/reconcile=repair):"] + [f"  {line}" for line in outcome.lines()]
    if notes:
        out += [""] + [f"note: {n}" for n in notes]
    out += ["", verdict if code == report.exit_code else f"exit {code}: repair failed"]
    print("\n".join(out))
    return code
