"""A scale run of the sidecar on the testbed: many kwok GPU nodes, one RayCluster with many Ray pods.

``run_scale(testbed, ScaleSpec(nodes=2000, pods=4000))``, shared by ``benchmarks/bench_sidecar_scale.py`` and
``tests/integration/test_sidecar_scale.py``:

1. a fresh namespace; ``nodes`` kwok nodes of shape ``h100x8`` plus one ``cpu16`` node for the head, labelled
   ``raygpu.io/pool=<namespace>``, created with a small thread pool; wait until kwok marks them all Ready;
2. RayCluster ``rc`` (one worker group ``gpu``, ``replicas = pods``, ``minReplicas`` 0, ``raygpu.io/reclaim:
   dry-run``) with ``spec.managedBy: kueue.x-k8s.io/multikueue``: KubeRay (v1.5, ``rayClusterReconcile``)
   leaves a RayCluster managed by another controller alone, so it neither creates pods for it nor deletes ours;
3. the pods KubeRay would have made (``manifests.ray_pod``: its labels, ownerReference and ``ray start``
   command), bound with ``nodeName``: the head on the CPU node, worker ``i`` on GPU node ``i % nodes``. Worker
   ``i`` is idle for Ray (``synthetic_ray.ANNOTATION_RAY_IDLE_S`` = ``idle_s``) when ``i % idle_every == 0``,
   busy otherwise. None carries ``ray.io/is-ray-node``, so the Ray bridge starts no raylet; wait until kwok
   marks every pod Running;
4. ``python -m raygpu.testing.scale_sidecar``: the sidecar's first watch sync and one dry-run cycle, measured
   in its own process (its log in ``work_dir``);
5. what the cluster shows afterwards: pods, the RayCluster's replicas and resourceVersion (a dry run writes
   no patch), ``ScaleDownDryRun`` Events;
6. always, also on failure or Ctrl-C: force-delete the pods (kwok would take minutes for thousands), delete
   the namespace and every node with the pool label.

Returns one dict: ``params``, ``setup`` (seconds per step), ``sidecar`` (the measurements of
``scale_sidecar``), ``expected`` (idle and busy worker names, the head), ``after``, ``load_avg`` (1-min load
average at start and end: the testbed's box is shared). Raises RuntimeError when a step does not finish.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

from raygpu.model.labels import LABEL_POOL
from raygpu.testing import manifests as m
from raygpu.testing.catalog import node_manifest
from raygpu.testing.kube import api_client, apply, dynamic
from raygpu.testing.synthetic_ray import ANNOTATION_RAY_IDLE_S

CLUSTER, GROUP = "rc", "gpu"
MANAGED_BY_OTHER = "kueue.x-k8s.io/multikueue"  # the one other value the RayCluster CRD accepts


@dataclass(frozen=True)
class ScaleSpec:
    nodes: int = 2000
    pods: int = 4000  # workers; the head comes on top
    idle_every: int = 2  # worker i is idle for Ray when i % idle_every == 0
    idle_s: float = 3600.0  # how long an idle worker has been idle (the default idle timeout is 10 min)
    gpus_per_pod: int = 4
    threads: int = 8  # parallel creates
    ray_imports: bool = True
    sidecar_timeout_s: float = 900.0

    def __post_init__(self) -> None:
        if self.nodes < 1 or self.pods < 1 or self.idle_every < 1 or self.threads < 1:
            raise ValueError(f"nodes, pods, idle_every and threads must be >= 1: {self}")
        if self.pods > 100 * self.nodes:
            raise ValueError(f"{self.pods} pods on {self.nodes} nodes: more than 100 per node (kwok's limit is 110)")


def worker_name(i: int) -> str:
    return f"{CLUSTER}-{GROUP}-worker-{i:05d}"


def run_scale(tb: Any, spec: ScaleSpec, progress: Callable[[str], None] = print,
              work_dir: Path | None = None) -> dict[str, Any]:
    """Steps 1-6 of the module docstring on testbed ``tb`` (``raygpu.testing.controlplane.Testbed``)."""
    from kubernetes import client

    ns = f"scale-{secrets.token_hex(3)}"
    work = work_dir or Path(os.environ.get("RAYGPU_BENCH_DIR", Path.home() / ".cache" / "raygpu" / "bench")) / ns
    work.mkdir(parents=True, exist_ok=True)
    admin = api_client(tb.kubeconfig)
    core = client.CoreV1Api(admin)
    load = [round(os.getloadavg()[0], 2)]
    setup: dict[str, float] = {}
    gpu_nodes = [f"{ns}-n{i:05d}" for i in range(spec.nodes)]
    head_node = f"{ns}-head"
    idle = [worker_name(i) for i in range(spec.pods) if i % spec.idle_every == 0]
    busy = [worker_name(i) for i in range(spec.pods) if i % spec.idle_every != 0]
    head = f"{CLUSTER}-head"
    try:
        core.create_namespace({"metadata": {"name": ns}})
        t = time.monotonic()
        pool = {LABEL_POOL: ns}
        bodies = [node_manifest(n, "h100x8", pool) for n in gpu_nodes] + [node_manifest(head_node, "cpu16", pool)]
        _bulk(tb, bodies, lambda api, b: api.create_node(b, _preload_content=False), spec.threads,
              progress, "nodes")
        setup["create_nodes_s"] = time.monotonic() - t
        _wait(lambda: _ready_nodes(core, ns) >= len(bodies), f"{len(bodies)} nodes Ready (kwok)",
              120 + 0.1 * len(bodies), progress)
        setup["nodes_ready_s"] = time.monotonic() - t

        rc = m.raycluster(CLUSTER, ns, [m.worker_group(GROUP, replicas=spec.pods, min_replicas=0,
                                                       max_replicas=spec.pods, pool=ns,
                                                       gpus={"nvidia.com/gpu": spec.gpus_per_pod})],
                          pool=ns, annotations={"raygpu.io/reclaim": "dry-run"})
        rc["spec"]["managedBy"] = MANAGED_BY_OTHER
        live = apply(dynamic(admin), rc).to_dict()
        uid, rv_before = live["metadata"]["uid"], live["metadata"]["resourceVersion"]

        t = time.monotonic()
        pods = [m.ray_pod(CLUSTER, ns, head, group="headgroup", node_name=head_node, owner_uid=uid, head=True,
                          cpu="2", memory="8Gi")]
        pods += [m.ray_pod(CLUSTER, ns, worker_name(i), group=GROUP, node_name=gpu_nodes[i % spec.nodes],
                           owner_uid=uid, gpus=spec.gpus_per_pod,
                           annotations={ANNOTATION_RAY_IDLE_S: f"{spec.idle_s:g}"} if i % spec.idle_every == 0
                           else None)
                 for i in range(spec.pods)]
        _bulk(tb, pods, lambda api, b: api.create_namespaced_pod(ns, b, _preload_content=False), spec.threads,
              progress, "pods")
        setup["create_pods_s"] = time.monotonic() - t
        _wait(lambda: not _items(core.list_namespaced_pod(ns, field_selector="status.phase!=Running", limit=1,
                                                          _preload_content=False)),
              f"{len(pods)} pods Running (kwok)", 120 + 0.1 * len(pods), progress)
        setup["pods_running_s"] = time.monotonic() - t
        load.append(round(os.getloadavg()[0], 2))

        progress(f"{ns}: running the sidecar (first sync + one dry-run cycle) on {len(pods)} pods")
        sidecar = _run_sidecar(tb, ns, spec, work)
        after = _after(core, admin, ns, rv_before)
    finally:
        _cleanup(core, ns, progress)
        admin.close()
    load.append(round(os.getloadavg()[0], 2))
    return {"params": asdict(spec), "namespace": ns, "setup": {k: round(v, 2) for k, v in setup.items()},
            "sidecar": sidecar, "expected": {"idle": idle, "busy": busy, "head": head}, "after": after,
            "load_avg": load, "work_dir": str(work)}


def _run_sidecar(tb: Any, ns: str, spec: ScaleSpec, work: Path) -> dict[str, Any]:
    result, log = work / "sidecar-result.json", work / "sidecar.log"
    argv = [sys.executable, "-m", "raygpu.testing.scale_sidecar", "--kubeconfig", str(tb.kubeconfig),
            "--namespace", ns, "--cluster", CLUSTER, "--result", str(result)]
    if not spec.ray_imports:
        argv.append("--no-ray-imports")
    with open(log, "w") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, cwd=Path(__file__).resolve().parents[2],
                                env={**os.environ, "PYTHONUNBUFFERED": "1"})
        try:
            rc = proc.wait(spec.sidecar_timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
            raise RuntimeError(f"the sidecar did not finish within {spec.sidecar_timeout_s:.0f}s; log: {log}") from None
    if not result.exists():
        raise RuntimeError(f"the sidecar exited {rc} without a result: {log.read_text()[-3000:]}")
    return {**json.loads(result.read_text()), "exit_code": rc, "log": str(log)}


def _after(core: Any, admin: Any, ns: str, rv_before: str) -> dict[str, Any]:
    """What the cluster shows after the cycle: it must be as the dry run found it, plus one Event."""
    rc = dynamic(admin).resources.get(api_version="ray.io/v1", kind="RayCluster").get(name=CLUSTER, namespace=ns)
    rc = rc.to_dict()
    events = core.list_namespaced_event(ns, field_selector=f"involvedObject.name={CLUSTER}").items
    return {"pods": _count(core.list_namespaced_pod(ns, limit=1, _preload_content=False)),
            "raycluster_resource_version_unchanged": rc["metadata"]["resourceVersion"] == rv_before,
            "raycluster_replicas": rc["spec"]["workerGroupSpecs"][0]["replicas"],
            "workers_to_delete": len((rc["spec"]["workerGroupSpecs"][0].get("scaleStrategy") or {})
                                     .get("workersToDelete") or []),
            "events": sorted(e.reason for e in events)}


def _cleanup(core: Any, ns: str, progress: Callable[[str], None]) -> None:
    """Force-delete the pods (gone at once, no kwok round trip), then the namespace and the pool's nodes."""
    for what, call in [("pods", lambda: core.delete_collection_namespaced_pod(ns, grace_period_seconds=0)),
                       ("namespace", lambda: core.delete_namespace(ns)),
                       ("nodes", lambda: core.delete_collection_node(label_selector=f"{LABEL_POOL}={ns}"))]:
        try:
            call()
        except Exception as e:  # noqa: BLE001 - best effort; the testbed is shared, so say what is left
            progress(f"cleanup of {ns}: deleting {what} failed: {e}")


def _bulk(tb: Any, bodies: list[dict[str, Any]], create: Callable[[Any, dict[str, Any]], Any], threads: int,
          progress: Callable[[str], None], what: str) -> None:
    """``create(core_v1_api, body)`` for every body, ``threads`` at a time, one API client per thread.
    Raises the first failure (a name already taken included: every name here is new); after one, no further
    create is sent."""
    from kubernetes import client

    local, clients, lock, failed = threading.local(), [], threading.Lock(), threading.Event()
    done = [0]

    def one(body: dict[str, Any]) -> None:
        if failed.is_set():
            return  # another create failed: send no more
        api = getattr(local, "api", None)
        if api is None:
            local.api = api = client.CoreV1Api(api_client(tb.kubeconfig))
            with lock:
                clients.append(api.api_client)
        try:
            resp = create(api, body)
        except BaseException:
            failed.set()
            raise
        resp.data  # noqa: B018 - read the reply so that its connection is reused
        resp.release_conn()
        with lock:
            done[0] += 1
            if done[0] % 1000 == 0:
                progress(f"{done[0]}/{len(bodies)} {what} created")
    ex = ThreadPoolExecutor(threads)
    try:
        for _ in ex.map(one, bodies):
            pass
    finally:  # on a failure (or Ctrl-C) the creates not yet started are dropped, not sent
        ex.shutdown(wait=True, cancel_futures=True)
        for c in clients:
            c.close()


def _items(resp: Any) -> list[dict[str, Any]]:
    return json.loads(resp.data).get("items") or []


def _count(resp: Any) -> int:
    """Objects a ``limit=1`` LIST without selectors would return in all (its remainingItemCount + its items)."""
    body = json.loads(resp.data)
    return len(body.get("items") or []) + int(body["metadata"].get("remainingItemCount") or 0)


def _ready_nodes(core: Any, ns: str) -> int:
    nodes = _items(core.list_node(label_selector=f"{LABEL_POOL}={ns}", _preload_content=False))
    return sum(1 for n in nodes if _is_ready(n.get("status") or {}))


def _is_ready(status: dict[str, Any]) -> bool:
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or [])


def _wait(probe: Callable[[], bool], what: str, timeout_s: float, progress: Callable[[str], None],
          interval_s: float = 2.0) -> None:
    """Poll ``probe`` until true; RuntimeError naming ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not probe():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout_s:.0f}s waiting for {what}")
        time.sleep(interval_s)
    progress(f"{what}")
