"""The ``raygpu`` command line.

    raygpu testbed up|down|status [--json]   the local testbed (real control plane + Ray)
    raygpu demo                               the gang-deadlock demo on the testbed
    raygpu plan ...                           dry-run a gang reservation (no side effects)
    raygpu doctor [--cluster C] [--json]      reconcile Ray / kubelet / NVML views
    raygpu sidecar                            the idle-node reclaimer loop

Exit codes: 0 success, 1 findings or a failed operation, 2 cannot reach the
cluster / bad usage.
"""

from __future__ import annotations

import argparse
import json
import sys


def _testbed(args: argparse.Namespace) -> int:
    from raygpu.testing.controlplane import Testbed
    tb = Testbed()
    if args.action == "up":
        st = tb.up(progress=lambda m: print(f"[testbed] {m}", file=sys.stderr, flush=True))
        _print_status(st, args.json)
        return 0
    if args.action == "down":
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
    print(f"testbed: {'UP' if st['up'] else 'DOWN'}   run dir: {st['run_dir']}")
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


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="raygpu", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)
    tb = sub.add_parser("testbed", help="start, stop or inspect the local testbed",
                        description="The local testbed: etcd, kube-apiserver, kube-controller-manager, kube-scheduler, "
                                    "kwok GPU nodes, KubeRay, scheduler-plugins coscheduling, Kueue and a Ray bridge, "
                                    "all real processes on 127.0.0.1. The first `up` builds the components from the "
                                    "Go module proxy (tens of minutes on 2 cores); later ones reuse the cache.")
    tb.add_argument("action", choices=["up", "down", "status"])
    tb.add_argument("--json", action="store_true", help="machine-readable output")
    tb.set_defaults(func=_testbed)
    for register in _extra_commands():
        register(sub)
    return ap


def _extra_commands():
    """Sub-commands living in their own modules (each exposes ``register(subparsers)``)."""
    import importlib
    out = []
    for mod in ("raygpu.commands.demo", "raygpu.commands.plan", "raygpu.commands.doctor", "raygpu.commands.sidecar"):
        try:
            out.append(importlib.import_module(mod).register)
        except ModuleNotFoundError as e:
            if e.name != mod:
                raise
    return out


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
