"""The gang deadlock, counted out, on the testbed.

Two tenants (two RayClusters) share 8 nodes x 8 GPUs. Each driver asks at the
same time for a placement group of 6 bundles x 8 GPUs, STRICT_SPREAD.

* ``plain``: plain Ray placement groups; worker replicas are raised in
  interleaved steps (a, b, a, b, ...) as two autoscalers would. The scheduler
  binds pods one by one: 4 + 4 run, 2 + 2 pend, 64 GPUs held, 0 used.
* ``raygpu``: ``raygpu.placement_group`` with a gang backend. One tenant gets all
  6 pods, the other none; it gets its 6 once the first releases.

``run`` returns a :class:`RunResult`; idle GPU-seconds are sampled every
``sample_s``: GPUs of bound worker pods whose tenant's placement group is not
ready are idle. A gang is *half-placed* when some of its pods are bound and
the others are not for ``BINDING_GRACE_S`` or longer (then from the first
sample that saw it so): a gang scheduler admits a gang's pods together, but
binds them one API write each, so for a moment an admitted gang shows some
pods bound, and a sample that lands then is not a half-placed gang.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from raygpu.adapters.kube import KubeAdapter
from raygpu.plan.common.patch import raycluster_patch, set_replicas
from raygpu.testing import manifests as m

TENANTS = ("tenant-a", "tenant-b")
# A gang's pods bind one API write each after it is admitted: under load the writes of one gang spread over a
# second or two. A gang scheduler's half-placed gang stays so (the plain demo's: for its whole deadline).
BINDING_GRACE_S = 5.0


@dataclass
class TenantResult:
    cluster: str
    ready_after_s: float | None = None  # since the drivers started
    pods_bound_while_other_ran: int | None = None
    bound_pods_at_deadline: int = 0
    events: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class RunResult:
    mode: str
    backend: str | None
    duration_s: float = 0.0
    idle_gpu_s: float = 0.0  # GPUs on bound worker pods whose tenant's placement group is not ready
    partial_gang_gpu_s: float = 0.0  # the part of it held by gangs with only some of their pods bound
    gpus_held_by_partial_gangs_at_deadline: int = 0
    max_gpus_held_by_partial_gangs: int = 0  # the most GPUs half-placed gangs held at any one sample
    deadlocked: bool = False
    tenants: dict[str, TenantResult] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


class _Sampler(threading.Thread):
    """Integrates idle GPUs over time from the real pods and the drivers' ready events."""

    def __init__(self, kube: KubeAdapter, ns: str, result: RunResult, sample_s: float, gang_size: int) -> None:
        super().__init__(daemon=True)
        self.kube, self.ns, self.result, self.sample_s = kube, ns, result, sample_s
        self.gang_size = gang_size
        self.stop = threading.Event()
        self.bound: dict[str, int] = {t: 0 for t in TENANTS}
        self.ready: set[str] = set()
        self.partial_since: dict[str, float] = {}  # tenant -> first sample of its current partial run
        self.last = 0.0  # the previous sample's time

    def run(self) -> None:
        self.last = time.monotonic()
        while not self.stop.is_set():
            try:
                pods = [p for p in self.kube.ray_pods(self.ns) if p.ray_node_type == "worker" and not p.deleting]
            except Exception:  # noqa: BLE001 - a blink of the API server: sample again
                pods = []
            self.sample(pods, time.monotonic())
            self.stop.wait(self.sample_s)

    def sample(self, pods: list, now: float) -> None:
        """Account one sample of the worker pods (``ray_cluster``, ``node_name``, ``limits``) taken at ``now``."""
        last, held = self.last, 0
        for t in TENANTS:
            mine = [p for p in pods if p.ray_cluster == t and p.node_name]
            self.bound[t] = len(mine)
            if t not in self.ready:
                gpus = sum(p.limits.get("nvidia.com/gpu", 0) for p in mine)
                self.result.idle_gpu_s += gpus * (now - last)
                if 0 < len(mine) < self.gang_size:
                    since = self.partial_since.setdefault(t, now)
                    if now - since >= BINDING_GRACE_S:  # not a gang binding: half-placed since ``since``
                        counted_from = since if last - since < BINDING_GRACE_S else last  # first time: all of it
                        self.result.partial_gang_gpu_s += gpus * (now - counted_from)
                        held += int(gpus)
                    continue
            self.partial_since.pop(t, None)
        self.result.max_gpus_held_by_partial_gangs = max(self.result.max_gpus_held_by_partial_gangs, held)
        self.last = now


def _driver(address: str, mode: str, cluster: str, ns: str, backend: str | None, queue: str | None,
            timeout_s: float, release_file: Path, kubeconfig: Path, bundles: int) -> subprocess.Popen:
    argv = [sys.executable, "-m", "raygpu.demo.driver", "--address", address, "--mode", mode, "--cluster", cluster,
            "--namespace", ns, "--timeout-s", str(timeout_s), "--release-file", str(release_file),
            "--bundles", str(bundles), "--kubeconfig", str(kubeconfig)]
    if backend:
        argv += ["--backend", backend]
    if queue:
        argv += ["--queue", queue]
    # stderr (Ray's and Python's own messages) goes next to the release file, for when a run goes wrong
    with open(release_file.parent / f"driver-{cluster}.stderr", "w") as err:
        return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=err, text=True,
                                env=dict(os.environ, KUBECONFIG=str(kubeconfig)))


class _Events(threading.Thread):
    def __init__(self, proc: subprocess.Popen, out: list[dict[str, Any]]) -> None:
        super().__init__(daemon=True)
        self.proc, self.out = proc, out

    def run(self) -> None:
        for line in self.proc.stdout:  # type: ignore[union-attr]
            start = line.find('{"event"')  # an event may follow text something else left without a newline
            if start < 0:
                continue
            try:
                self.out.append(json.loads(line[start:]))
            except ValueError:
                pass

    def first(self, kind: str) -> dict[str, Any] | None:
        return next((e for e in list(self.out) if e["event"] == kind), None)


def setup_clusters(tb, kube: KubeAdapter, ns: str, pool: str, annotations: dict[str, str] | None = None) -> dict[str, str]:
    """Create the two tenants' RayClusters and wait for their Ray heads. Returns {cluster: address}."""
    from raygpu.testing.kube import apply, dynamic
    from raygpu.testing.procs import wait_for
    dyn = dynamic(tb.kubeconfig)
    for t in TENANTS:
        apply(dyn, m.raycluster(t, ns, [m.worker_group("gpu", replicas=0, max_replicas=8, pool=pool)], pool=pool,
                                annotations=annotations))

    return wait_for("both tenants' Ray heads up", lambda: fresh_heads(tb, kube, ns, TENANTS), 120,
                    log=tb.logs / "bridge.log")


def fresh_heads(tb, kube: KubeAdapter, ns: str, clusters: tuple[str, ...]) -> dict[str, str] | None:
    """{cluster: GCS address} once the bridge runs a Ray head for the head pod each cluster has NOW, else None.
    A record of an earlier head of the same name (a cluster deleted and made again, whose old head the bridge
    has not stopped yet) never counts: its head pod is not the current one."""
    from raygpu.testing.bridge import ray_clusters
    current = {p.ray_cluster: p.name for p in kube.ray_pods(ns) if p.is_head and not p.deleting}
    found = {c["cluster"]: c["address"] for c in ray_clusters(tb.root / "ray")
             if c["namespace"] == ns and c.get("head_pod") == current.get(c["cluster"])}
    return found if all(t in found for t in clusters) else None


def run(tb, ns: str, pool: str, mode: str, backend: str | None = None, *, queue: str | None = None,
        bundles: int = 6, timeout_s: float = 300, plain_deadline_s: float = 40, sample_s: float = 0.5,
        progress: Callable[[str], None] = print) -> RunResult:
    """Run one side of the demo on RayClusters ``tenant-a``/``tenant-b`` already set up in ``ns``."""
    kube = KubeAdapter(str(tb.kubeconfig))
    addresses = setup_clusters(tb, kube, ns, pool)
    result = RunResult(mode=mode, backend=backend, tenants={t: TenantResult(t) for t in TENANTS})
    tmp = Path(tempfile.mkdtemp(prefix="raygpu-demo-"))
    sampler = _Sampler(kube, ns, result, sample_s, bundles)
    t0, wall0 = time.monotonic(), time.time()
    procs = {t: _driver(addresses[t], mode, t, ns, backend, queue, timeout_s, tmp / f"release-{t}",
                        tb.kubeconfig, bundles) for t in TENANTS}
    readers = {t: _Events(p, result.tenants[t].events) for t, p in procs.items()}
    for r in readers.values():
        r.start()
    sampler.start()
    try:
        if mode == "plain":
            _plain(kube, ns, bundles, progress)
            deadline = time.monotonic() + plain_deadline_s
            while time.monotonic() < deadline and not all(readers[t].first("ready") for t in TENANTS):
                time.sleep(0.5)
        else:
            _gang(readers, sampler, result, tmp, timeout_s, progress, t0)
        for t in TENANTS:
            ev = readers[t].first("ready")
            result.tenants[t].ready_after_s = round(ev["t"] - wall0, 1) if ev else None
            result.tenants[t].bound_pods_at_deadline = sampler.bound[t]
            if ev:
                sampler.ready.add(t)
        if mode == "plain":
            partial = [t for t in TENANTS if 0 < sampler.bound[t] < bundles and t not in sampler.ready]
            result.gpus_held_by_partial_gangs_at_deadline = sum(sampler.bound[t] * 8 for t in partial)
            result.deadlocked = len(partial) == len(TENANTS)
    finally:
        result.duration_s = time.monotonic() - t0
        sampler.stop.set()
        for t in TENANTS:
            (tmp / f"release-{t}").touch()
        for t, p in procs.items():
            try:
                p.wait(timeout=60)
            except subprocess.TimeoutExpired:  # a driver that ignores its release file is a bug: say so
                progress(f"  {t}: its driver did not exit within 60 s of its release; killed")
                p.kill()
    return result


def _plain(kube: KubeAdapter, ns: str, bundles: int, progress) -> None:
    """Raise both clusters' replicas one step at a time, interleaved, as two autoscalers would."""
    for step in range(1, bundles + 1):
        for t in TENANTS:
            for _ in range(5):  # tested patch; re-read on conflict
                view = kube.get_raycluster(ns, t)
                try:
                    kube.patch_raycluster(ns, t, raycluster_patch(view.resource_version,
                                                                  set_replicas(0, step, "gpu")))
                    break
                except Exception:  # noqa: BLE001
                    continue
        progress(f"  autoscalers asked for {step} worker(s) each")
        time.sleep(0.5)  # pacing of the simulated autoscalers, not a wait for a condition


def _gang(readers, sampler, result: RunResult, tmp: Path, timeout_s: float, progress, t0: float) -> None:
    deadline = time.monotonic() + timeout_s
    first = None
    while time.monotonic() < deadline and first is None:
        first = next((t for t in TENANTS if readers[t].first("ready")), None)
        if any(readers[t].first("error") for t in TENANTS):
            raise RuntimeError(f"a driver failed: {[readers[t].first('error') for t in TENANTS]}")
        time.sleep(0.25)
    if first is None:
        seen = {t: [e.get("message") or e["event"] for e in list(readers[t].out)][-8:] for t in TENANTS}
        raise RuntimeError(f"no tenant's gang became ready within the timeout; the drivers said: {seen}; "
                           f"their stderr is in {tmp}")
    sampler.ready.add(first)
    other = TENANTS[1 - TENANTS.index(first)]
    progress(f"  {first}: all pods reserved together, placement group READY after "
             f"{time.monotonic() - t0:.0f} s")
    # while the first runs, the other holds nothing: watch for a few seconds
    hold_until = time.monotonic() + 5
    most = 0
    while time.monotonic() < hold_until:
        most = max(most, sampler.bound[other])
        time.sleep(0.25)
    result.tenants[other].pods_bound_while_other_ran = most
    progress(f"  {other}: waiting with {most} pods bound (nothing held)")
    (tmp / f"release-{first}").touch()
    progress(f"  {first} releases its placement group")
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and not readers[other].first("ready"):
        if readers[other].first("timeout") or readers[other].first("error"):
            break
        time.sleep(0.25)
    if readers[other].first("ready"):
        sampler.ready.add(other)
        progress(f"  {other}: placement group READY after {time.monotonic() - t0:.0f} s")


def teardown(tb, ns: str) -> None:
    """Delete the tenants' RayClusters and wait until their pods are gone."""
    from raygpu.testing.kube import dynamic
    from raygpu.testing.procs import wait_for
    dyn = dynamic(tb.kubeconfig)
    rc = dyn.resources.get(api_version="ray.io/v1", kind="RayCluster")
    for t in TENANTS:
        try:
            rc.delete(name=t, namespace=ns)
        except Exception:  # noqa: BLE001
            pass
    kube = KubeAdapter(str(tb.kubeconfig))
    try:
        wait_for("tenant pods gone", lambda: not kube.ray_pods(ns), 120)
    except Exception:  # noqa: BLE001 - see below
        # Pods of a Kueue pod group keep Kueue's finalizer until Kueue finishes
        # the group; a deleted pod still held by it after 2 minutes is released
        # here so that the next run starts from an empty namespace.
        for p in kube.ray_pods(ns):
            if p.deleting:
                kube.core.patch_namespaced_pod(p.name, ns, {"metadata": {"finalizers": None}})
        wait_for("tenant pods gone", lambda: not kube.ray_pods(ns), 60)
    from raygpu.testing.bridge import ray_clusters
    wait_for("the bridge stopped the tenants' Ray heads",
             lambda: not [c for c in ray_clusters(tb.root / "ray") if c["namespace"] == ns], 60,
             log=tb.logs / "bridge.log")
