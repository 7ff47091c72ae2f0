"""``raygpu doctor``: read Ray's, kubelet's and NVML's views of the GPUs and say which layer broke."""

from __future__ import annotations

import argparse

from raygpu.commands.argtypes import add_request_timeout, seconds
from raygpu.doctor.run import run

DESCRIPTION = """\
Read three views of every GPU of a RayCluster - Ray's (the GCS), kubelet's
(nodes, pods, device-plugin pods) and, with --nvml, the container's (NVML in
a tiny task on each Ray node) - and print one row per GPU node with the four
counts side by side, then the findings lowest layer first (kernel driver ->
container toolkit -> device plugin -> kubelet -> Ray configuration), each
with its evidence and fix, then the stranded-GPU arithmetic.

Reads only, unless the RayCluster is annotated raygpu.io/reconcile=repair:
then orphan pods (Running Ray worker pods with no live Ray node, past the
grace period) are put into their group's workersToDelete and the group's
replicas lowered, in one JSON patch that tests the resourceVersion first,
with an Event RepairedOrphanPod on the RayCluster for each.

Where the cluster is: --kubeconfig, else $KUBECONFIG, else the local
testbed's when it is up, else ~/.kube/config or in-cluster. The Ray GCS:
--ray-address, else the testbed's Ray bridge (when talking to the testbed),
else $RAY_ADDRESS, else (inside Kubernetes) <cluster>-head-svc.<ns>.svc:6379.

exit codes: 0 healthy, 1 findings (or a failed repair), 2 cannot reach the
cluster (Kubernetes API or Ray GCS; the reason is printed) or bad usage.
"""

EPILOG = """\
examples:
  raygpu doctor --cluster tenant-a -n team-a
  raygpu doctor --cluster tenant-a -n team-a --json | jq '.findings[].kind'
  raygpu doctor --cluster tenant-a -n team-a --nvml --node-selector pool=a100
"""


def register(sub) -> None:
    p = sub.add_parser("doctor", help="reconcile Ray / kubelet / NVML views of the GPUs; say which layer broke",
                       description=DESCRIPTION, epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cluster", "-c", default=None,
                   help="RayCluster name (default: the only RayCluster the testbed runs in NAMESPACE)")
    p.add_argument("--namespace", "-n", default=None, help="namespace of the RayCluster (default: default)")
    p.add_argument("--ray-address", default=None, metavar="HOST:PORT", help="the Ray GCS address")
    p.add_argument("--kubeconfig", default=None,
                   help="kubeconfig (default: $KUBECONFIG, else the testbed's when it is up, else "
                        "~/.kube/config or in-cluster)")
    add_request_timeout(p)
    p.add_argument("--json", action="store_true", help="print the report as JSON (DoctorReport + exit_code)")
    p.add_argument("--nvml", action="store_true",
                   help="also probe NVML on every Ray node (a num_cpus=0 task pinned to each node; connects a driver)")
    p.add_argument("--orphan-grace", type=seconds(minimum=0.0), default=None, metavar="SECONDS",
                   help="a Running pod younger than this is not an orphan yet: finite, >= 0 (default 120)")
    p.add_argument("--node-selector", "-l", default=None, metavar="KEY=VALUE[,KEY=VALUE]",
                   help="check only the Kubernetes nodes with these labels (e.g. the RayCluster's node pool)")
    p.add_argument("--no-repair", action="store_true",
                   help="report only, even if the RayCluster is annotated raygpu.io/reconcile=repair")
    p.set_defaults(func=run)
