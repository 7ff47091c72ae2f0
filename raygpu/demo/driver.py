"""A Ray driver for the demo and the tests: asks for one placement group and reports.

    python -m raygpu.demo.driver --address A --mode plain|raygpu --cluster C --namespace NS
        [--backend coscheduling|kueue|none] [--queue Q] [--bundles 6] [--gpus 8]
        [--strategy STRICT_SPREAD] [--timeout-s 120] [--hold-s 0] [--release-file F]

Prints one JSON object per line on stdout: ``{"event": "created"|"ready"|"timeout"|"error"|"released"|"interrupted",
"t": <unix s>, ...}``. With ``--release-file`` it removes its placement group
when that file appears (how the demo says "tenant A is done").
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import os
import signal
import sys
import time


def emit(event: str, **kw) -> None:
    print(json.dumps({"event": event, "t": time.time(), **kw}), flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--address", required=True)
    ap.add_argument("--mode", choices=["plain", "raygpu"], required=True)
    ap.add_argument("--cluster", required=True)
    ap.add_argument("--namespace", required=True)
    ap.add_argument("--backend", default=None)
    ap.add_argument("--queue", default=None)
    ap.add_argument("--bundles", type=int, default=6)
    ap.add_argument("--gpus", type=float, default=8)
    ap.add_argument("--strategy", default="STRICT_SPREAD")
    ap.add_argument("--timeout-s", type=float, default=120)
    ap.add_argument("--name", default="train")
    ap.add_argument("--release-file", default=None)
    ap.add_argument("--kubeconfig", default=os.environ.get("KUBECONFIG"))
    args = ap.parse_args(argv)
    faulthandler.register(signal.SIGUSR1)  # `kill -USR1` dumps every thread's stack to stderr

    import ray
    ray.init(address=args.address, logging_level="ERROR", log_to_driver=False)
    bundles = [{"GPU": args.gpus}] * args.bundles
    pg = None
    try:
        if args.mode == "plain":
            from ray.util.placement_group import placement_group, placement_group_table, remove_placement_group
            pg = placement_group(bundles, strategy=args.strategy, name=args.name)
            emit("created", pg=pg.id.hex())
            # released early (the caller's deadline passed: plain Ray deadlocked) ends the wait too
            _wait(lambda: placement_group_table(pg).get("state") == "CREATED" or _released(args.release_file),
                  args.timeout_s)
            state = placement_group_table(pg).get("state")
            emit("ready" if state == "CREATED" else "timeout", pg=pg.id.hex(), state=state)
            _wait_release(args.release_file)
            remove_placement_group(pg)
        else:
            import raygpu
            pg = raygpu.placement_group(bundles, strategy=args.strategy, cluster=args.cluster,
                                        namespace=args.namespace, backend=args.backend, queue=args.queue,
                                        timeout_s=args.timeout_s, name=args.name, kubeconfig=args.kubeconfig,
                                        progress=lambda m: emit("progress", message=m))
            emit("created", group=pg.plan.reservation_group, plan=pg.plan.reason)
            ok = pg.wait(args.timeout_s + 5)
            if ok:
                table = ray.util.placement_group_table(pg.placement_group)
                emit("ready", pg=pg.placement_group.id.hex(), bundles_to_node_id=table.get("bundles_to_node_id"))
            else:
                emit("timeout", error=pg.error, state=pg.state.value)
            _wait_release(args.release_file)
            raygpu.remove_placement_group(pg)
        emit("released")
        return 0
    except KeyboardInterrupt:
        emit("interrupted")
        if args.mode == "raygpu" and pg is not None:
            pg.interrupt()  # bounded: the prompt comes back in seconds, a detached finisher does the rest
        return 130
    except Exception as e:  # noqa: BLE001 - reported to the caller as data
        emit("error", type=type(e).__name__, message=str(e))
        return 1


def _wait(cond, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.25)
    return False


def _released(path: str | None) -> bool:
    return path is not None and os.path.exists(path)


def _wait_release(path: str | None) -> None:
    if not path:
        return
    while not _released(path):
        time.sleep(0.2)


if __name__ == "__main__":
    sys.exit(main())
