"""A short job that may backfill onto GPUs the starvation guard holds for a bigger gang.

Run inside a Ray driver of a KubeRay RayCluster (or on the local testbed):

    python examples/gang_backfill.py --address 127.0.0.1:6379 --cluster tenant-a --namespace team-a \
        --runtime-s 300

``expected_runtime_s`` is how long the job holds its placement group. Where a guarded gang holds nodes
and has published when its hold should start (its Lease's ``raygpu.io/guard-estimated-start``), this
(unguarded) gang's pods are let onto the held nodes if it ends 30 s before that start; otherwise it waits
as any other gang. Nothing enforces the hint: a job that overruns delays the hold, never past its
max-hold. docs/guard.md#runtime-hints-and-backfill.
"""

from __future__ import annotations

import argparse
import json
import time

import ray

import raygpu


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--address", default="auto")
    ap.add_argument("--cluster", required=True)
    ap.add_argument("--namespace", default="default")
    ap.add_argument("--runtime-s", type=float, default=300.0, help="the job's expected runtime (the hint)")
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--backend", default="none")
    args = ap.parse_args()
    ray.init(address=args.address)
    t0 = time.monotonic()
    with raygpu.gang_placement_group([{"GPU": args.gpus}], cluster=args.cluster, namespace=args.namespace,
                                     backend=args.backend, guard=False, expected_runtime_s=args.runtime_s,
                                     timeout_s=600, progress=print) as pg:
        ray.get(pg.ready())
        print(json.dumps({"event": "ready", "reservation": pg.plan.reservation_group,
                          "waited_s": round(time.monotonic() - t0, 1)}))
        # ... the job: at most --runtime-s seconds, or the hold it backfilled behind is delayed


if __name__ == "__main__":
    main()
