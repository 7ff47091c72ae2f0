"""A gang kept in one topology domain: all worker pods in one zone (or rack, or NVLink domain).

Run inside a Ray driver of a KubeRay RayCluster (or on the local testbed):

    python examples/gang_topology.py --address 127.0.0.1:6379 --cluster tenant-a --namespace team-a \
        --key topology.kubernetes.io/zone --backend workload

``topology_strategy`` is Ray's own argument: ``STRICT_PACK`` on a node label key makes the domain a
requirement, ``PACK`` a preference; ``ray.io/node-id`` carries the node-level strategy. What each backend
writes for it (Workload schedulingConstraints, Kueue TAS annotations, pod affinity): docs/gang.md#topology.
"""

from __future__ import annotations

import argparse
import json

import ray

import raygpu


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--address", default="auto")
    ap.add_argument("--cluster", required=True)
    ap.add_argument("--namespace", default="default")
    ap.add_argument("--key", default="topology.kubernetes.io/zone", help="the node label all pods share")
    ap.add_argument("--preferred", action="store_true", help="PACK (a preference) instead of STRICT_PACK")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--gpus-per-worker", type=int, default=8)
    ap.add_argument("--backend", default=None)
    args = ap.parse_args()
    ray.init(address=args.address)
    topology = {"ray.io/node-id": "STRICT_SPREAD", args.key: "PACK" if args.preferred else "STRICT_PACK"}
    with raygpu.gang_placement_group([{"GPU": args.gpus_per_worker}] * args.workers, cluster=args.cluster,
                                     namespace=args.namespace, backend=args.backend, timeout_s=600,
                                     topology_strategy=topology, progress=print) as pg:
        ray.get(pg.ready())
        print(json.dumps({"event": "ready", "reservation": pg.plan.reservation_group,
                          "topology": pg.plan.topology.model_dump() if pg.plan.topology else None,
                          "reason": pg.plan.reason}))


if __name__ == "__main__":
    main()
