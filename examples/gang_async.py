"""Gang reservation from an asyncio driver (Ray Serve, asyncio apps): nothing blocks the event loop.

    python examples/gang_async.py --address 127.0.0.1:6379 --cluster tenant-a --namespace team-a \
        --workers 2 --gpus-per-worker 8 --backend coscheduling

The reservation is made in a worker thread (``placement_group_async``), ``await pg.ready_async()``
waits for the reserved pods, their Ray nodes and the placement group while the loop keeps serving
(a heartbeat task counts its turns and prints them), the shards are awaited as Ray ObjectRefs, and
the reservation is released when the ``async with`` block ends (also on error or cancellation).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os

import ray
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

import raygpu


@ray.remote
def shard(rank: int) -> dict:
    """Stand-in for one rank: where it runs and which GPUs Ray gave it."""
    return {"rank": rank, "gpu_ids": [str(g) for g in ray.get_gpu_ids()],
            "pod": os.environ.get("RAY_CLOUD_INSTANCE_ID", "?")}


async def heartbeat(turns: list[int]) -> None:
    """What an async server does meanwhile: if a wait blocked the loop, this would stand still."""
    while True:
        turns[0] += 1
        await asyncio.sleep(0.05)


async def run(args: argparse.Namespace) -> None:
    turns = [0]
    beat = asyncio.create_task(heartbeat(turns))
    bundles = [{"GPU": args.gpus_per_worker, "CPU": 1}] * args.workers
    async with raygpu.gang_placement_group_async(bundles, "STRICT_SPREAD", cluster=args.cluster,
                                                 namespace=args.namespace, backend=args.backend,
                                                 timeout_s=args.timeout_s, name="gang-async",
                                                 kubeconfig=args.kubeconfig,
                                                 progress=lambda m: print(f"[raygpu] {m}", flush=True)) as pg:
        before = turns[0]
        await asyncio.wait_for(pg.ready_async(), args.timeout_s)
        print(f"[raygpu] ready; the event loop turned {turns[0] - before} times while waiting", flush=True)
        refs = [shard.options(num_gpus=args.gpus_per_worker, num_cpus=1, scheduling_strategy=
                              PlacementGroupSchedulingStrategy(pg.placement_group, placement_group_bundle_index=i)
                              ).remote(i) for i in range(args.workers)]
        for r in await asyncio.gather(*refs):
            print(json.dumps(r), flush=True)
        print(json.dumps({"loop_turns_while_waiting": turns[0] - before}), flush=True)
    beat.cancel()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--address", default=os.environ.get("RAY_ADDRESS", "auto"))
    ap.add_argument("--cluster", required=True)
    ap.add_argument("--namespace", default="default")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--gpus-per-worker", type=float, default=8)
    ap.add_argument("--backend", default=None, help="coscheduling | kueue | volcano | none (default: annotation)")
    ap.add_argument("--timeout-s", type=float, default=300)
    ap.add_argument("--kubeconfig", default=os.environ.get("KUBECONFIG"))
    args = ap.parse_args()
    ray.init(address=args.address, logging_level="ERROR", log_to_driver=False)
    asyncio.run(run(args))


if __name__ == "__main__":
    main()
