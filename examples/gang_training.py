"""Gang-reserved training: every worker of a data-parallel job starts together or not at all.

Run inside a Ray driver of a KubeRay RayCluster (or on the local testbed):

    python examples/gang_training.py --address 127.0.0.1:6379 --cluster tenant-a --namespace team-a \
        --workers 2 --gpus-per-worker 8 --backend coscheduling

raygpu reserves the worker pods as one all-or-nothing gang, the placement
group lands exactly on them, one "training" task runs per bundle, and the
reservation is released when the ``with`` block ends (also on error/Ctrl-C).

``--guard`` (backend ``none``, after ``kubectl apply -f deploy/guard``): the starvation guard holds the
nodes the gang needs against other tenants' new pods, so a large gang does not wait behind a stream of
small pods (docs/guard.md); the hold is bounded by the RayCluster's
``raygpu.io/max-hold`` (default 15m).
"""

from __future__ import annotations

import argparse
import json
import os

import ray
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

import raygpu


@ray.remote
def train_shard(rank: int, world: int) -> dict:
    """Stand-in for one data-parallel rank: reports where it runs and which GPUs Ray gave it."""
    ctx = ray.get_runtime_context()
    return {"rank": rank, "world": world, "node_id": ctx.get_node_id(),
            "gpu_ids": [str(g) for g in ray.get_gpu_ids()],
            "pod": os.environ.get("RAY_CLOUD_INSTANCE_ID", "?")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--address", default=os.environ.get("RAY_ADDRESS", "auto"))
    ap.add_argument("--cluster", required=True)
    ap.add_argument("--namespace", default="default")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--gpus-per-worker", type=float, default=8)
    ap.add_argument("--backend", default=None, help="coscheduling | kueue | volcano | none (default: annotation)")
    ap.add_argument("--queue", default=None)
    ap.add_argument("--timeout-s", type=float, default=300)
    ap.add_argument("--guard", action="store_true", help="the starvation guard (backend none; docs/guard.md)")
    ap.add_argument("--kubeconfig", default=os.environ.get("KUBECONFIG"))
    args = ap.parse_args()

    ray.init(address=args.address, logging_level="ERROR", log_to_driver=False)
    bundles = [{"GPU": args.gpus_per_worker, "CPU": 1}] * args.workers
    with raygpu.gang_placement_group(bundles, "STRICT_SPREAD", cluster=args.cluster, namespace=args.namespace,
                                     backend=args.backend, queue=args.queue, timeout_s=args.timeout_s,
                                     name="gang-training", kubeconfig=args.kubeconfig, guard=args.guard or None,
                                     progress=lambda m: print(f"[raygpu] {m}", flush=True)) as pg:
        print(f"[raygpu] plan: {pg.plan.reason}", flush=True)
        ray.get(pg.ready(), timeout=args.timeout_s)
        results = ray.get([
            train_shard.options(num_gpus=args.gpus_per_worker, num_cpus=1, scheduling_strategy=
                                PlacementGroupSchedulingStrategy(pg.placement_group, placement_group_bundle_index=i)
                                ).remote(i, args.workers)
            for i in range(args.workers)])
        for r in results:
            print(json.dumps(r), flush=True)
        print(f"trained on {len({r['pod'] for r in results})} reserved pods", flush=True)


if __name__ == "__main__":
    main()
