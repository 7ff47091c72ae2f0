"""Keep-warm on the testbed: ``raygpu.io/idle-timeout: auto`` vs fixed 60 s and 600 s, one bursty PG script.

Three arms side by side in one testbed run (``raygpu testbed up``), each its own
namespace, pool of kwok nodes (a CPU node for the head, ``--max-workers`` 1-GPU
nodes) and RayCluster (a 1-GPU, 1-CPU worker group, 0..``--max-workers``
replicas), with real Ray nodes started by the testbed's bridge:

* scale-up: Ray's KubeRay autoscaler v2, as KubeRay's autoscaler container runs
  it (``raygpu.testing.rayprocs``), its own idle termination out of the way
  (``idleTimeoutSeconds`` one day);
* scale-down: raygpu's sidecar only, mode ``on``, a cycle every 5 s, start-up
  grace 30 s, with ``raygpu.io/idle-timeout`` ``auto``, ``60s`` or ``600s``;
* one driver per arm (``benchmarks._warm_driver``) runs the SAME seeded bursty
  schedule (``benchmarks._warm_schedule``): a burst of 1-3 PGs of one 1-GPU
  bundle every ``--burst-every-s`` ± 25 %, each held 20-60 % of that once ready.

The arms start ``--burst-every-s``/3 apart so their bursts do not queue behind
each other at the bridge (which starts one Ray node at a time for the whole
testbed). The ``auto`` arm starts from ``--prior-h`` hours of the demand history
the same kind of schedule gives (another seed), seeded into its state ConfigMap
as a sidecar restart would find it, because the policy needs 30 one-minute
rises before it trusts a quantile (a cold start would spend the whole run on
its 300 s fallback: ``--prior-h 0`` shows that). Start-ups are measured live.

``--scale`` (default ``--burst-every-s``/180) scales the fixed timeouts and the
auto fallback with the schedule, for compressed development runs; the output
says so. Measured per arm: worker pod launches (a pod watch), PG wait
(creation -> ready, by the driver), worker pod-seconds and the idle part of
them (not holding a PG).

    python -m benchmarks.bench_warm_testbed                       # 20 min, bursts every ~180 s
    python -m benchmarks.bench_warm_testbed --minutes 4 --burst-every-s 40
"""

from __future__ import annotations

import argparse
import json
import secrets
import sys
import threading
import time
from datetime import datetime
from pathlib import Path

from benchmarks._common import RESULTS, machine, machine_line, print_table
from raygpu.testing.rayprocs import RAY_USER, Proc, proc_env, ray_autoscaler_role, start_ray_autoscaler, start_sidecar
from benchmarks._warm_schedule import prior_demand, schedule, summarize
from raygpu.model.labels import LABEL_POOL
from raygpu.model.warm import GroupHistory
from raygpu.testing import addons
from raygpu.testing import manifests as m
from raygpu.testing.bridge import head_address
from raygpu.testing.builders.warm import warm_state_configmap
from raygpu.testing.controlplane import Testbed
from raygpu.testing.kube import api_client, apply, dynamic
from raygpu.testing.procs import wait_for

CLUSTER, GROUP = "rc", "gpu"


def _log(msg: str) -> None:
    print(f"[bench_warm_testbed] {msg}", file=sys.stderr, flush=True)


class PodWatch:
    """Worker pods of one namespace: uid -> [created, deleted] (epoch s; deleted: first sight of deletion)."""

    def __init__(self, core, ns: str) -> None:
        from kubernetes import watch
        self.pods: dict[str, list] = {}
        self._w = watch.Watch()
        self._t = threading.Thread(target=self._run, args=(core, ns), daemon=True)
        self._t.start()

    def _run(self, core, ns: str) -> None:
        rv = None
        while True:
            try:
                for ev in self._w.stream(core.list_namespaced_pod, ns, label_selector="ray.io/node-type=worker",
                                         resource_version=rv, deserialize=False, timeout_seconds=300):
                    md = ev["object"]["metadata"]
                    rv = md["resourceVersion"]
                    created = datetime.fromisoformat(md["creationTimestamp"].replace("Z", "+00:00")).timestamp()
                    rec = self.pods.setdefault(md["uid"], [created, None])
                    if (ev["type"] == "DELETED" or md.get("deletionTimestamp")) and rec[1] is None:
                        rec[1] = time.time()
            except Exception:  # noqa: BLE001 - the namespace goes away at the end
                return

    def stop(self) -> None:
        self._w.stop()


def _arms(args) -> dict[str, dict[str, str]]:
    s = args.scale
    base = {"raygpu.io/reclaim": "on"}
    return {"auto": {**base, "raygpu.io/idle-timeout": "auto", "raygpu.io/warm-fallback": f"{round(300 * s)}s"},
            "60s": {**base, "raygpu.io/idle-timeout": f"{round(60 * s)}s"},
            "600s": {**base, "raygpu.io/idle-timeout": f"{round(600 * s)}s"}}


def run(args) -> dict:
    tb = Testbed()
    started = False
    if not tb.is_up():
        _log("starting the testbed (raygpu testbed up)")
        tb.up(progress=_log)
        started = True
    from kubernetes import client

    admin = api_client(tb.kubeconfig)
    core, kube = client.CoreV1Api(admin), dynamic(admin)
    run_id = secrets.token_hex(3)
    work = Path.home() / ".cache" / "raygpu" / "bench" / f"warm-{run_id}"
    work.mkdir(parents=True, exist_ok=True)
    _, crt, key = tb.kubeconfig_for_client_cert(RAY_USER, work / "ray.kubeconfig")
    sched = schedule(args.seed, args.minutes, args.burst_every_s, args.max_workers)
    arms = _arms(args)
    procs: list[Proc] = []
    watches: dict[str, PodWatch] = {}
    nodes: list[str] = []
    names = {arm: f"warm-{arm}-{run_id}" for arm in arms}
    try:
        for arm, ns in names.items():
            core.create_namespace({"metadata": {"name": ns}})
            shapes = {f"{ns}-cpu": "cpu16", **{f"{ns}-t{i}": "t4x1" for i in range(args.max_workers)}}
            nodes += list(shapes)
            addons.add_nodes(tb, shapes, labels={LABEL_POOL: ns})
            rc = m.raycluster(CLUSTER, ns, [m.worker_group(GROUP, replicas=0, min_replicas=0,
                                                           max_replicas=args.max_workers, cpu="1", memory="4Gi",
                                                           gpus={"nvidia.com/gpu": 1}, pool=ns)],
                              pool=ns, annotations=arms[arm])
            rc["spec"]["enableInTreeAutoscaling"] = True
            rc["spec"]["autoscalerOptions"] = {"version": "v2", "idleTimeoutSeconds": 86400}
            apply(kube, rc)
            for obj in ray_autoscaler_role(ns):
                apply(kube, obj)
            watches[arm] = PodWatch(core, ns)
        gcs = {arm: wait_for(f"the Ray head of {ns}", lambda ns=ns: head_address(tb.root / "ray", ns, CLUSTER), 300,
                             log=tb.logs / "bridge.log") for arm, ns in names.items()}
        if args.prior_h > 0:
            ns = names["auto"]
            uid = kube.resources.get(api_version="ray.io/v1", kind="RayCluster").get(
                name=CLUSTER, namespace=ns).metadata.uid
            demand = prior_demand(args.seed + 1, args.prior_h, args.burst_every_s, time.time(),
                                  max_burst=args.max_workers)
            core.create_namespaced_config_map(ns, warm_state_configmap(ns, CLUSTER, uid, {
                GROUP: GroupHistory(demand=demand)}))
        grace = "30"
        for arm, ns in names.items():
            procs.append(start_sidecar(CLUSTER, ns, gcs[arm], tb.kubeconfig, work / f"{arm}-sidecar.log",
                                       "--interval-s", "5", "--startup-grace-s", grace))
            procs.append(start_ray_autoscaler(tb, CLUSTER, ns, gcs[arm], crt, key, work / f"{arm}-autoscaler.log"))
        t_first = time.time() + 20
        stagger = args.burst_every_s / 3
        t0 = {arm: t_first + i * stagger for i, arm in enumerate(arms)}
        t_end = {arm: t0[arm] + args.minutes * 60 for arm in arms}
        body = json.dumps([[b.at_s, list(b.holds_s)] for b in sched])
        drivers = {}
        for arm, ns in names.items():
            drivers[arm] = Proc(f"{arm}-driver", [sys.executable, "-m", "benchmarks._warm_driver", gcs[arm],
                                                  str(t0[arm]), body, str(work / f"{arm}-pgs.jsonl"),
                                                  str(t_end[arm] + 300)], proc_env(), work / f"{arm}-driver.log")
        procs += drivers.values()
        _log(f"{len(sched)} bursts, {sum(len(b.holds_s) for b in sched)} PGs per arm; logs under {work}")
        last = max(t_end.values())
        next_note = time.time() + 60
        while time.time() < last or any(d.alive() for d in drivers.values()):
            if time.time() > last + 360:
                raise RuntimeError(f"drivers still running 6 min after the end; logs under {work}")
            for p in procs:
                if not p.alive() and p not in drivers.values():
                    raise RuntimeError(f"{p.name} exited: {p.log.read_text()[-2000:]}")
            if time.time() >= next_note:
                _log(f"{(time.time() - t_first) / 60:.0f} min; worker pods so far "
                     + ", ".join(f"{a}: {len(w.pods)}" for a, w in watches.items()))
                next_note += 60
            time.sleep(1)
        load = machine()
        rows = []
        for arm in arms:
            pgs = [json.loads(line) for line in (work / f"{arm}-pgs.jsonl").read_text().splitlines()]
            pods = {u: (c, d) for u, (c, d) in watches[arm].pods.items()}
            rows.append({"arm": arm, "idle_timeout": arms[arm]["raygpu.io/idle-timeout"],
                         **summarize(pods, pgs, t0[arm], t_end[arm]),
                         **_warm_lines(work / f"{arm}-sidecar.log")})
    finally:
        for p in procs:
            p.stop()
        for w in watches.values():
            w.stop()
        for ns in names.values():
            try:
                core.delete_namespace(ns)
            except Exception as e:  # noqa: BLE001 - best effort; the testbed is shared
                _log(f"cleanup: {e}")
        try:
            addons.remove_nodes(tb, nodes)
        except Exception as e:  # noqa: BLE001
            _log(f"cleanup: {e}")
        if started and not args.keep_testbed:
            tb.down(quiet=True)
    return {"benchmark": "warm_testbed", "machine": load,
            "params": {"minutes": args.minutes, "burst_every_s": args.burst_every_s, "scale": args.scale,
                       "seed": args.seed, "max_workers": args.max_workers, "prior_h": args.prior_h,
                       "bursts": len(sched), "pgs": sum(len(b.holds_s) for b in sched)},
            "rows": rows, "logs": str(work)}


def _warm_lines(log: Path) -> dict:
    """From a sidecar's JSON log: the keep-warm targets it reported, and its deletions."""
    targets, deleted = [], 0
    for line in log.read_text().splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if rec.get("event") == "warm":
            targets.append(rec.get("warm"))
        if rec.get("event") == "decision" and rec.get("action") == "delete" and rec.get("mode") == "on":
            deleted += 1
    return {"warm_targets": targets, "delete_decisions": deleted}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=float, default=20, help="length of each arm's schedule (default 20)")
    ap.add_argument("--burst-every-s", type=float, default=180, help="mean time between bursts (default 180)")
    ap.add_argument("--scale", type=float, default=None,
                    help="multiply the fixed timeouts and the auto fallback (default burst-every-s / 180)")
    ap.add_argument("--max-workers", type=int, default=3, help="workers per cluster, and the largest burst")
    ap.add_argument("--prior-h", type=float, default=2.0, help="hours of demand history seeded into auto (0: cold)")
    ap.add_argument("--seed", type=int, default=12)
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of tables")
    ap.add_argument("--keep-testbed", action="store_true", help="leave a testbed this run started running")
    ap.add_argument("--save", action="store_true", help="also write benchmarks/results/warm_testbed.txt")
    args = ap.parse_args()
    if args.scale is None:
        args.scale = args.burst_every_s / 180
    result = run(args)
    if args.json:
        print(json.dumps(result))
        return 0
    text = report(result)
    print(text)
    if args.save:
        RESULTS.mkdir(parents=True, exist_ok=True)
        (RESULTS / "warm_testbed.txt").write_text(text + "\n")
    return 0


def report(result: dict) -> str:
    import contextlib
    import io

    p = result["params"]
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        print(machine_line(result["machine"]) + " (load avg at the end of the run; a shared machine)")
        print(f"{p['minutes']:g} min per arm, a burst every ~{p['burst_every_s']:g} s ({p['bursts']} bursts, "
              f"{p['pgs']} PGs of 1 GPU, seed {p['seed']}), max {p['max_workers']} workers per cluster; "
              f"auto seeded with {p['prior_h']:g} h of demand history")
        if p["scale"] != 1:
            print(f"COMPRESSED: fixed timeouts and the auto fallback scaled by {p['scale']:.3g} "
                  "(the arms are still named 60s and 600s)")
        print_table(result["rows"], [("arm", "arm", "s"), ("idle_timeout", "timeout", "s"),
                                     ("pod_launches", "launches", "d"), ("pgs_ready", "PGs ready", "d"),
                                     ("wait_p50_s", "wait p50 s", ".1f"), ("wait_p90_s", "p90 s", ".1f"),
                                     ("wait_max_s", "max s", ".1f"), ("waits_over_10s", ">10s", "d"),
                                     ("worker_pod_s", "pod-s", ".0f"), ("idle_worker_s", "idle pod-s", ".0f")])
        for row in result["rows"]:
            if row["warm_targets"]:
                print(f"  {row['arm']}: warm targets reported in order {row['warm_targets']}")
    return buf.getvalue().rstrip()


if __name__ == "__main__":
    sys.exit(main())
