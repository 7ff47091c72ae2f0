"""``raygpu testbed up|down|status [--kubernetes 1.N] [--json]``: the local testbed (real control plane + Ray)."""

from __future__ import annotations

import argparse
import json
import sys

from raygpu.testing import components


def register(sub) -> None:
    tb = sub.add_parser("testbed", help="start, stop or inspect the local testbed",
                        description="The local testbed: etcd, kube-apiserver, kube-controller-manager, kube-scheduler, "
                                    "kwok GPU nodes, KubeRay, scheduler-plugins coscheduling, Kueue and a Ray bridge, "
                                    "all real processes on 127.0.0.1. The first `up` builds the components from the "
                                    "Go module proxy (tens of minutes on 2 cores); later ones reuse the cache.")
    tb.add_argument("action", choices=["up", "down", "status"])
    tb.add_argument("--kubernetes", choices=list(components.KUBERNETES), default=None,
                    help="the control plane's Kubernetes minor: "
                         + ", ".join(f"{k} (v{v.lstrip('v')})" for k, v in components.KUBERNETES.items())
                         + f". Default: ${components.KUBERNETES_ENV} if set, else {components.DEFAULT_KUBERNETES}. "
                           "1.37 also serves the Workload API (scheduling.k8s.io/v1beta1, gate GenericWorkload) and "
                           "runs the 1.34 scheduler-plugins against it (docs/testbed.md). `up` stops a running "
                           "testbed of another version; `status` describes the running one")
    tb.add_argument("--json", action="store_true", help="machine-readable output")
    tb.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from raygpu.testing.controlplane import Testbed, run_dir
    from raygpu.testing.testbed_lock import hold_testbed_lock
    try:
        flag = args.kubernetes
        if flag is None and args.action == "status":  # describe what runs, whatever its version
            flag = Testbed.recorded_kubernetes(run_dir())
        tb = Testbed(kubernetes=flag)
    except ValueError as exc:  # a bad $RAYGPU_TESTBED_KUBERNETES
        print(f"raygpu testbed: {exc}", file=sys.stderr)
        return 2
    say = lambda m: print(f"[testbed] {m}", file=sys.stderr, flush=True)  # noqa: E731
    if args.action == "up":
        with hold_testbed_lock(progress=say):  # not while another run uses it (docs/testbed.md)
            st = tb.up(progress=say)
        _print_status(st, args.json)
        return 0
    if args.action == "down":
        with hold_testbed_lock(progress=say):
            stopped = tb.down(quiet=True)
        print(json.dumps({"stopped": stopped}) if args.json else
              (f"stopped {len(stopped)} components: {', '.join(stopped)}" if stopped else "testbed was not running"))
        return 0
    st = tb.status()
    _print_status(st, args.json)
    return 0 if st["up"] else 1


def _print_status(st: dict, as_json: bool) -> None:
    if as_json:
        print(json.dumps(st, indent=2))
        return
    print(f"testbed: {'UP' if st['up'] else 'DOWN'}   Kubernetes {st.get('kubernetes') or '-'}   "
          f"run dir: {st['run_dir']}")
    print(f"kubeconfig: {st['kubeconfig']}   apiserver: {st['apiserver']}")
    if st.get("ready_s") is not None:
        print(f"ready in {st['ready_s']} s")
    print(f"{'component':<26}{'pid':>8}  {'alive':<6} version")
    for name, c in st["components"].items():
        print(f"{name:<26}{c['pid']:>8}  {str(c['alive']):<6} {c['version'] or ''}")
    for rc in st["ray_clusters"]:
        print(f"ray cluster {rc['namespace']}/{rc['cluster']}: address {rc['address']} (head pod {rc['head_pod']})")
    if not st["ray_clusters"]:
        print("no RayCluster head is up")
