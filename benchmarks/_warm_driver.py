"""The keep-warm benchmark's Ray driver: runs one bursty schedule of placement groups and records each PG.

    python -m benchmarks._warm_driver GCS_ADDRESS T0_EPOCH SCHEDULE_JSON OUT_JSONL DEADLINE_EPOCH

``SCHEDULE_JSON``: ``[[at_s, [hold_s, ...]], ...]``. At ``T0 + at_s`` it creates one
placement group ``[{"GPU": 1}]`` per hold, polls each until ``CREATED`` (ready),
holds it ``hold_s`` and removes it. Each PG is one line of ``OUT_JSONL`` once
removed: ``burst``, ``created``, ``ready`` (None: not ready by the deadline),
``removed`` (epoch seconds). Waiting is by polling the GCS's PG table every
0.25 s, so a ready time is late by at most that.
"""

from __future__ import annotations

import json
import sys
import time


def main(argv: list[str]) -> int:
    import ray
    from ray.util.placement_group import placement_group, placement_group_table, remove_placement_group

    address, t0, sched, out_path, deadline = argv[0], float(argv[1]), json.loads(argv[2]), argv[3], float(argv[4])
    ray.init(address=address, logging_level="ERROR", log_to_driver=False)
    due = sorted((t0 + at, b, hold) for b, (at, holds) in enumerate(sched) for hold in holds)
    live: list[dict] = []
    with open(out_path, "w") as out:
        while due or live:
            now = time.time()
            while due and due[0][0] <= now:
                _, b, hold = due.pop(0)
                live.append({"burst": b, "hold_s": hold, "created": time.time(), "ready": None,
                             "pg": placement_group([{"GPU": 1}])})
            for rec in list(live):
                now = time.time()
                if rec["ready"] is None and placement_group_table(rec["pg"]).get("state") == "CREATED":
                    rec["ready"] = time.time()
                done = rec["ready"] is not None and now >= rec["ready"] + rec["hold_s"]
                if done or now > deadline:
                    remove_placement_group(rec.pop("pg"))
                    rec["removed"] = time.time()
                    live.remove(rec)
                    out.write(json.dumps(rec) + "\n")
                    out.flush()
            time.sleep(0.25)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
