"""``raygpu demo --unmodified``: the two tenants of the deadlock demo run UNMODIFIED Ray Train jobs.

Two RayClusters share 8 nodes x 8 GPUs. Each runs a Ray Train v2 ``DataParallelTrainer`` with 6 workers of 8
GPUs (Ray Train's controller creates the workers' placement group, PACK); the job knows nothing of raygpu.
Three arms, each on fresh clusters:

* ``autoscaler``: Ray's own autoscaler (v2, as KubeRay's autoscaler container runs it) scales the GPU groups;
  no raygpu. Its pods bind one by one: whoever gets fewer than 6 holds GPUs it cannot use.
* ``scale-up+autoscaler``: Ray's autoscaler on with the settings of docs/gang-scale-up.md (GPU templates
  ``maxReplicas: 0``), and raygpu's sidecar with ``raygpu.io/gang-scale-up: on`` (backend coscheduling).
* ``scale-up``: no in-tree autoscaler; the sidecar's gang scale-up is the only scale-up.

Per arm: when each job's placement group became ready and when the job completed, the GPU-seconds held by
half-placed gangs (bound worker pods of a tenant whose placement group is not ready, while fewer than 6 are
bound), the most GPUs held so at once, and what a reservation left behind once both jobs ended.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import textwrap
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from raygpu.adapters.kube import KubeAdapter
from raygpu.demo.deadlock import TENANTS, RunResult, TenantResult, _Events, _Sampler, fresh_heads
from raygpu.testing import manifests as m

WORKERS = 6
ARMS: dict[str, dict[str, bool]] = {
    "autoscaler": {"autoscaler": True, "scale_up": False},
    "scale-up+autoscaler": {"autoscaler": True, "scale_up": True},
    "scale-up": {"autoscaler": False, "scale_up": True},
}
SCALE_UP = {"raygpu.io/gang-scale-up": "on", "raygpu.io/gang-backend": "coscheduling",
            "raygpu.io/reclaim": "on", "raygpu.io/idle-timeout": "120s"}  # above the autoscaler's 60 s
# docs/gang-scale-up.md "Beside Ray's in-tree autoscaler": what the autoscaler container gets
AUTOSCALER_ENV = {"RAY_AUTOSCALER_RECONCILE_ALLOCATE_STATUS_TIMEOUT_S": "86400"}

# The tenant's job: no raygpu anywhere. A thread prints "ready" when the job's placement group is CREATED
# (plain Ray API), the train function "trains" for TRAIN_S seconds on every rank.
JOB = textwrap.dedent("""
    import json, os, sys, tempfile, threading, time, ray
    from ray.train import RunConfig, ScalingConfig
    from ray.train.v2.api.data_parallel_trainer import DataParallelTrainer
    assert "raygpu" not in sys.modules
    address, workers, train_s = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
    ray.init(address=address, logging_level="ERROR", log_to_driver=False)
    say = lambda **kw: print(json.dumps({**kw, "t": time.time()}), flush=True)
    done = threading.Event()

    def watch():
        while not done.is_set():
            try:
                table = ray.util.placement_group_table()
            except Exception:
                table = {}
            if any(p["state"] == "CREATED" and len(p["bundles"]) == workers for p in table.values()):
                say(event="ready")
                return
            done.wait(0.5)
    threading.Thread(target=watch, daemon=True).start()

    def train_fn(config):
        import time, ray
        from ray import train
        end = time.time() + config["train_s"]
        while time.time() < end:
            time.sleep(0.5)
        train.report({"rank": train.get_context().get_world_rank(),
                      "node": ray.get_runtime_context().get_node_id()})

    out = tempfile.mkdtemp(prefix="raygpu-demo-train-")
    trainer = DataParallelTrainer(train_fn, train_loop_config={"train_s": train_s},
                                  scaling_config=ScalingConfig(num_workers=workers, use_gpu=True,
                                                               resources_per_worker={"GPU": 8}),
                                  run_config=RunConfig(name="demo", storage_path=out))
    say(event="started")
    result = trainer.fit()
    done.set()
    say(event="done", ok=result.error is None, error=None if result.error is None else str(result.error)[:500])
    assert "raygpu" not in sys.modules
""")


@dataclass
class ArmResult(RunResult):
    autoscaler: bool = False
    scale_up: bool = False
    completed: dict[str, float | None] = field(default_factory=dict)  # tenant -> seconds until its job ended ok
    left_behind: dict[str, dict[str, list[str]]] = field(default_factory=dict)  # tenant -> what was left


def run_arm(tb, ns: str, pool: str, arm: str, *, deadline_s: float = 600, baseline_deadline_s: float = 300,
            train_s: float = 15, sample_s: float = 0.5, progress: Callable[[str], None] = print) -> ArmResult:
    """Run ``arm`` (a key of ARMS) on fresh RayClusters ``tenant-a``/``tenant-b`` in ``ns`` on ``pool``'s nodes;
    both jobs start at once. Ends when both jobs are done, or at ``deadline_s`` (``baseline_deadline_s`` for the
    arm without raygpu, which may never end). The caller tears the clusters down (``deadlock.teardown``)."""
    from raygpu.testing.kube import apply, dynamic
    from raygpu.testing.leftovers import reservation_leftovers
    from raygpu.testing.procs import wait_for
    from raygpu.testing.rayprocs import RAY_USER, Proc, proc_env, ray_autoscaler_role, start_ray_autoscaler, \
        start_sidecar
    opts = ARMS[arm]
    kube, dyn = KubeAdapter(str(tb.kubeconfig)), dynamic(tb.kubeconfig)
    result = ArmResult(mode=f"unmodified/{arm}", backend="coscheduling" if opts["scale_up"] else None,
                       autoscaler=opts["autoscaler"], scale_up=opts["scale_up"],
                       tenants={t: TenantResult(t) for t in TENANTS})
    tmp = Path(tempfile.mkdtemp(prefix=f"raygpu-demo-{arm}-"))
    # the GPU group: Ray's autoscaler may grow it to all 8 nodes, unless gang scale-up is on beside it
    max_replicas = 0 if opts["autoscaler"] and opts["scale_up"] else 8
    for t in TENANTS:
        rc = m.raycluster(t, ns, [m.worker_group("gpu", replicas=0, min_replicas=0, max_replicas=max_replicas,
                                                 pool=pool)], pool=pool,
                          annotations=SCALE_UP if opts["scale_up"] else None)
        if opts["autoscaler"]:
            rc["spec"]["enableInTreeAutoscaling"] = True
            rc["spec"]["autoscalerOptions"] = {"version": "v2", "idleTimeoutSeconds": 60,
                                               "env": [{"name": k, "value": v} for k, v in AUTOSCALER_ENV.items()]}
        apply(dyn, rc)
    if opts["autoscaler"]:
        for obj in ray_autoscaler_role(ns):
            apply(dyn, obj)
    gcs = wait_for("both tenants' Ray heads up", lambda: fresh_heads(tb, kube, ns, TENANTS), 180,
                   log=tb.logs / "bridge.log")
    procs: list[Proc] = []
    drivers: dict[str, subprocess.Popen] = {}
    sampler = _Sampler(kube, ns, result, sample_s, WORKERS)
    t0, wall0 = time.monotonic(), time.time()
    try:
        if opts["autoscaler"]:
            _, crt, key = tb.kubeconfig_for_client_cert(RAY_USER, tmp / "ray.kubeconfig")
        for t in TENANTS:
            if opts["scale_up"]:
                procs.append(start_sidecar(t, ns, gcs[t], tb.kubeconfig, tmp / f"sidecar-{t}.log",
                                           "--interval-s", "2"))
            if opts["autoscaler"]:
                procs.append(start_ray_autoscaler(tb, t, ns, gcs[t], crt, key, tmp / f"autoscaler-{t}.log",
                                                  env=AUTOSCALER_ENV))
        job = tmp / "job.py"
        job.write_text(JOB)
        for t in TENANTS:
            with open(tmp / f"job-{t}.stderr", "w") as err:
                drivers[t] = subprocess.Popen([sys.executable, str(job), gcs[t], str(WORKERS), str(train_s)],
                                              stdout=subprocess.PIPE, stderr=err, text=True, env=proc_env(),
                                              cwd=tmp)
        readers = {t: _Events(p, result.tenants[t].events) for t, p in drivers.items()}
        for r in readers.values():
            r.start()
        sampler.start()
        end = time.monotonic() + (deadline_s if opts["scale_up"] else baseline_deadline_s)
        noted: set[tuple[str, str]] = set()
        while time.monotonic() < end and not all(readers[t].first("done") for t in TENANTS):
            for p in procs:
                if not p.alive():
                    raise RuntimeError(f"{p.name} exited; its log: {p.log.read_text()[-2000:]}")
            for t in TENANTS:
                for kind in ("ready", "done"):
                    ev = readers[t].first(kind)
                    if ev and (t, kind) not in noted:
                        noted.add((t, kind))
                        sampler.ready.add(t)  # from here its pods are the job's, not a half-placed gang
                        what = "placement group READY" if kind == "ready" else (
                            "job completed" if ev.get("ok") else f"job FAILED: {ev.get('error')}")
                        progress(f"  {t}: {what} after {ev['t'] - wall0:.0f} s")
            time.sleep(0.25)  # pacing of this loop; each condition above is its own
        for t in TENANTS:
            ready, done = readers[t].first("ready"), readers[t].first("done")
            result.tenants[t].ready_after_s = round(ready["t"] - wall0, 1) if ready else None
            result.tenants[t].bound_pods_at_deadline = sampler.bound[t]
            result.completed[t] = round(done["t"] - wall0, 1) if done and done.get("ok") else None
        partial = [t for t in TENANTS if 0 < sampler.bound[t] < WORKERS and t not in sampler.ready]
        result.gpus_held_by_partial_gangs_at_deadline = sum(sampler.bound[t] * 8 for t in partial)
        result.deadlocked = len(partial) == len(TENANTS)
        if opts["scale_up"] and all(result.completed.values()):
            def clean() -> dict | None:
                left = {t: reservation_leftovers(kube, ns, t) for t in TENANTS}
                return None if any(v for d in left.values() for v in d.values()) else left
            try:
                result.left_behind = wait_for("the sidecars release both reservations", clean, 180)
            except Exception:  # noqa: BLE001 - reported, not raised: the table says what was left
                result.left_behind = {t: reservation_leftovers(kube, ns, t) for t in TENANTS}
        elif opts["scale_up"]:
            result.left_behind = {t: reservation_leftovers(kube, ns, t) for t in TENANTS}
    finally:
        result.duration_s = time.monotonic() - t0
        sampler.stop.set()
        for p in drivers.values():
            if p.poll() is None:
                p.kill()
            p.wait(30)
        for p in procs:
            p.stop()
    result.notes.append(f"logs under {tmp}")
    return result


def leftover_count(r: ArmResult) -> int:
    return sum(len(v) for d in r.left_behind.values() for v in d.values())


def render(results: dict[str, ArmResult]) -> str:
    """The three arms side by side."""
    heads = {"autoscaler": "Ray's autoscaler, no raygpu", "scale-up+autoscaler": "gang scale-up + Ray's autoscaler",
             "scale-up": "gang scale-up, autoscaler off"}
    arms = [a for a in ARMS if a in results]

    def job(r: ArmResult, t: str) -> str:
        done, ready = r.completed.get(t), r.tenants[t].ready_after_s
        if done:
            return f"completed after {done:.0f} s"
        return (f"ready after {ready:.0f} s, not done at {r.duration_s:.0f} s" if ready else
                f"never ready: {r.tenants[t].bound_pods_at_deadline}/{WORKERS} pods bound at {r.duration_s:.0f} s")

    def left(r: ArmResult) -> str:
        if not r.scale_up:
            return "-"
        n = leftover_count(r)
        return "nothing" if n == 0 else f"{n} objects: {json.dumps(r.left_behind)}"
    rows: list[tuple[str, ...]] = [("", *(heads[a] for a in arms))]
    rows += [(f"{t} Ray Train job", *(job(results[a], t) for a in arms)) for t in TENANTS]
    rows += [("most GPUs held half-placed", *(f"{results[a].max_gpus_held_by_partial_gangs} of 64" for a in arms)),
             ("GPU-seconds held half-placed", *(f"{results[a].partial_gang_gpu_s:,.0f}" for a in arms)),
             ("left behind by raygpu", *(left(results[a]) for a in arms))]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(f"{c:<{w}}" for c, w in zip(r, widths)).rstrip() for r in rows]
    lines.insert(1, "-" * len(lines[0]))
    return "\n".join(lines)


def verdict(results: dict[str, ArmResult]) -> bool:
    """Gang scale-up did its job in every arm that has it: both jobs completed, no GPU held half-placed, nothing
    left behind."""
    return all(all(r.completed.values()) and r.max_gpus_held_by_partial_gangs == 0 and leftover_count(r) == 0
               for r in results.values() if r.scale_up)

