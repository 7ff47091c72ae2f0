"""Use the doctor from Python: read the three views, reconcile, alert on what matters to you.

``raygpu doctor`` is the command; this is the library underneath it, for a
cron job, a Prometheus exporter or a CI gate. It reads one snapshot of
RayCluster NAMESPACE/CLUSTER (Kubernetes through a kubeconfig, Ray through its
GCS address), runs the pure ``reconcile`` on it, and prints one line per
finding at or above ``--min-severity`` with the layer that broke and what to
look at there. Exit 0 when nothing is at or above it, 1 when something is, 2
when a view could not be read.

    python examples/doctor_alert.py --namespace team-a --cluster tenant-a \\
        --ray-address 10.0.0.5:6379 --min-severity warning

On the local testbed (``raygpu testbed up``) the kubeconfig and the Ray
address are found for you when you leave them out.
"""

from __future__ import annotations

import argparse
import sys
import time

from raygpu.adapters.kube import KubeAdapter
from raygpu.model.findings import Severity
from raygpu.plan.doctor.reconcile import reconcile
from raygpu.doctor.snapshot import take_snapshot


def testbed_defaults(namespace: str, cluster: str) -> tuple[str | None, str | None]:
    """(kubeconfig, Ray address) of the local testbed, when it is up and runs that cluster."""
    from raygpu.testing.bridge import head_address
    from raygpu.testing.controlplane import Testbed

    tb = Testbed()
    if not tb.is_up():
        return None, None
    return str(tb.kubeconfig), head_address(tb.root / "ray", namespace, cluster)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--namespace", required=True)
    ap.add_argument("--cluster", required=True, help="RayCluster name")
    ap.add_argument("--kubeconfig", help="default: the testbed's when it is up, else $KUBECONFIG / ~/.kube/config")
    ap.add_argument("--ray-address", help="Ray GCS host:port (default: the testbed's bridge, else RAY_ADDRESS)")
    ap.add_argument("--min-severity", choices=[s.value for s in Severity], default="warning")
    ap.add_argument("--orphan-grace-s", type=float, default=120.0,
                    help="a Running pod without a Ray node is an orphan only after this (default 120 s)")
    args = ap.parse_args()

    kubeconfig, address = args.kubeconfig, args.ray_address
    if kubeconfig is None or address is None:
        tb_kubeconfig, tb_address = testbed_defaults(args.namespace, args.cluster)
        kubeconfig, address = kubeconfig or tb_kubeconfig, address or tb_address

    now = time.time()
    snapshot = take_snapshot(KubeAdapter(kubeconfig), address, args.namespace, args.cluster, now)
    report = reconcile(snapshot, now, orphan_grace_s=args.orphan_grace_s)
    if report.unreachable:
        for reason in report.unreachable:
            print(f"UNREACHABLE {reason}")
        return 2

    floor = Severity(args.min_severity).rank
    alerts = [f for f in report.findings if f.severity.rank <= floor]  # rank 0 is the worst
    for f in alerts:
        print(f"{f.severity.value.upper():8} {f.layer.value:18} {f.kind.value:22} {f.subject}")
        print(f"         {f.message}")
        print(f"         look at: {f.remedy}")
    s = report.stranded
    print(f"{len(report.findings)} finding(s), {len(alerts)} at or above {args.min_severity}; "
          f"stranded GPUs: {s.integer_model_gpus + s.cpu_memory_gpus + s.fragment_gpus:g} "
          f"of {s.allocatable_gpus:g} allocatable")
    return 1 if alerts else 0


if __name__ == "__main__":
    sys.exit(main())
