"""Issue 11 item 3: a 4 x 8-GPU gang next to a tenant that keeps every GPU busy with 1-GPU pods.

Scaled for CI (the issue asks for a 10-minute window and a 15-minute max-hold; this machine's whole CI must
stay well inside 90 minutes): the tenant keeps 32 GPUs busy with 1-GPU pods that live 2-6 s each, a new one
created whenever one ends, plus a backlog of pending ones; without the guard the gang is not READY within a
60 s window; with it (``max-hold`` 90 s) it is READY within max-hold. Every pod DELETED while the guarded
gang waited is a tenant pod the test itself ended, a blocker, or a pod of the unguarded reservation the test
released: nothing else was deleted or preempted. The blockers are gone once the gang is bound, and after
the release the scope's Lease is free.
"""

from __future__ import annotations

import os
import random
import threading
import time
import uuid
from pathlib import Path

import ray
import yaml

import raygpu
from raygpu.adapters.kube import KubeAdapter
from raygpu.model.guard import GuardPolicy
from raygpu.model.labels import LABEL_BLOCKER, LABEL_POOL, LABEL_TESTBED_SHAPE
from raygpu.testing import manifests as m
from raygpu.testing.kube import apply
from tests.integration.gang_helpers import nothing_left
from tests.integration.util import pods, ray_address, wait_for

GPU_NODES, GPUS = 4, 8
# CI's scale; RAYGPU_GUARD_WINDOW_S, RAYGPU_GUARD_MAX_HOLD_S and RAYGPU_GUARD_LIFE_S ("30,180") run it at the
# issue's (docs/guard.md, "Testbed status": a 10-minute window, 15-minute max-hold)
WINDOW_S = int(os.environ.get("RAYGPU_GUARD_WINDOW_S", "60"))
MAX_HOLD_S = int(os.environ.get("RAYGPU_GUARD_MAX_HOLD_S", "90"))
LIFE_S = tuple(float(x) for x in os.environ.get("RAYGPU_GUARD_LIFE_S", "2,6").split(","))
BACKLOG = 4  # tenant pods pending at any time, so that every freed GPU is taken at once
TENANT = "tenant"
ROOT = Path(__file__).resolve().parents[2]


class Tenant(threading.Thread):
    """Keeps GPUS x GPU_NODES + BACKLOG 1-GPU pods alive: deletes each a random 2-6 s after it runs, creates
    a new one whenever one ends. Records every pod it deleted."""

    def __init__(self, core, ns: str, pool: str) -> None:
        super().__init__(daemon=True)
        self.core, self.ns, self.pool = core, ns, pool
        self.deleted: set[str] = set()
        self.ends: dict[str, float] = {}
        self.stop = threading.Event()
        self.rng = random.Random(11)

    def pod(self) -> dict:
        return {"metadata": {"name": f"t-{uuid.uuid4().hex[:8]}", "labels": {"app": TENANT}},
                "spec": {"nodeSelector": {LABEL_POOL: self.pool, LABEL_TESTBED_SHAPE: "h100x8"},
                         "terminationGracePeriodSeconds": 0, "containers": [{"name": "w", "image": "busybox",
                         "resources": {"requests": {"cpu": "1", "nvidia.com/gpu": "1"},
                                       "limits": {"cpu": "1", "nvidia.com/gpu": "1"}}}]}}

    def run(self) -> None:
        while not self.stop.is_set():
            live = [p for p in pods(self.core, self.ns, f"app={TENANT}") if not p["metadata"].get("deletionTimestamp")]
            now = time.monotonic()
            for p in live:
                name = p["metadata"]["name"]
                if (p.get("status") or {}).get("phase") == "Running":
                    end = self.ends.setdefault(name, now + self.rng.uniform(*LIFE_S))
                    if now >= end:
                        self.deleted.add(name)
                        self.core.delete_namespaced_pod(name, self.ns, grace_period_seconds=0)
            for _ in range(GPU_NODES * GPUS + BACKLOG - sum(p["metadata"]["name"] not in self.deleted for p in live)):
                self.core.create_namespaced_pod(self.ns, self.pod())
            self.stop.wait(0.3)

    def busy(self) -> bool:
        ps = pods(self.core, self.ns, f"app={TENANT}")
        return sum((p.get("status") or {}).get("phase") == "Running" for p in ps) >= GPU_NODES * GPUS


class Deletions(threading.Thread):
    """Every pod DELETED in the namespace, by a watch."""

    def __init__(self, core, ns: str) -> None:
        super().__init__(daemon=True)
        self.core, self.ns, self.names, self.stop = core, ns, [], threading.Event()

    def run(self) -> None:
        from kubernetes import watch
        rv = None
        while not self.stop.is_set():
            w = watch.Watch()
            try:
                for ev in w.stream(self.core.list_namespaced_pod, self.ns, timeout_seconds=5, resource_version=rv):
                    rv = ev["object"].metadata.resource_version
                    if ev["type"] == "DELETED":
                        self.names.append(ev["object"].metadata.name)
            except Exception:  # noqa: BLE001 - a watch that ends (410) restarts from a fresh list
                rv = None
                self.stop.wait(1.0)


def test_a_guarded_gang_is_ready_within_max_hold_while_a_tenant_keeps_every_gpu_busy(testbed, ns, pool, kube, core):
    for pc in yaml.safe_load_all((ROOT / "deploy/guard/priorityclasses.yaml").read_text()):
        apply(kube, pc)
    pool.add({"cpu": "cpu16", **{f"g{i}": "h100x8" for i in range(GPU_NODES)}})
    apply(kube, m.raycluster("c", ns, [m.worker_group("gpu", replicas=0, pool=pool.name)], pool=pool.name,
                             annotations={"raygpu.io/max-hold": f"{MAX_HOLD_S}s"}))
    ray.init(address=ray_address(testbed, ns, "c"), logging_level="ERROR", log_to_driver=False)
    rk = KubeAdapter(str(testbed.kubeconfig))
    deletions, tenant = Deletions(core, ns), Tenant(core, ns, pool.name)
    deletions.start()
    tenant.start()
    try:
        wait_for("the tenant holds every GPU", tenant.busy, 90)
        args = dict(cluster="c", namespace=ns, backend="none", kubeconfig=str(testbed.kubeconfig))
        # 1. without the guard: never READY in the window
        plain = raygpu.placement_group([{"GPU": GPUS}] * GPU_NODES, "STRICT_SPREAD", timeout_s=WINDOW_S + 60,
                                       name="plain", **args)
        assert not plain.wait(WINDOW_S), "the unguarded gang started: the tenant did not keep the GPUs busy"
        raygpu.remove_placement_group(plain)
        # 2. with it: READY within max-hold
        t0, seen = time.monotonic(), len(deletions.names)
        pg = raygpu.placement_group([{"GPU": GPUS}] * GPU_NODES, "STRICT_SPREAD", timeout_s=MAX_HOLD_S + 60,
                                    name="guarded", guard=True, **args)
        assert pg.wait(MAX_HOLD_S + 30), f"not ready: {pg.state} {pg.error}"
        waited_s = time.monotonic() - t0
        assert waited_s <= MAX_HOLD_S, f"ready after {waited_s:.0f} s > max-hold {MAX_HOLD_S} s"
        wait_for("blockers deleted once the gang is bound", lambda: not pods(core, ns, LABEL_BLOCKER), 15)
        blockers = f"{pg.plan.gang_name}-bl-"
        assert any(n.startswith(blockers) for n in deletions.names), "the gang started without blocking a node"
        during = [n for n in deletions.names[seen:] if n not in tenant.deleted
                  and not n.startswith((blockers, "c-rg-plain-"))]
        assert during == [], f"pods deleted while the guarded gang waited, neither the tenant's nor blockers: {during}"
        raygpu.remove_placement_group(pg)
        wait_for("reservations released", lambda: nothing_left(rk, ns, "c"), 90)
    finally:
        tenant.stop.set()
        tenant.join(10)
        deletions.stop.set()  # (before: left running, it retried against a stopped API server for minutes)
    others = [n for n in deletions.names if n not in tenant.deleted and not n.startswith(("c-rg-plain-",
                                                                                          "c-rg-guarded-"))]
    assert others == [], f"pods deleted that were neither the tenant's ended pods, blockers nor ours: {others}"
    assert not pods(core, ns, LABEL_BLOCKER), "blockers left behind"
    lease = rk.get("coordination.k8s.io/v1", "Lease", GuardPolicy().lease_name(ns), ns)
    assert lease is not None and not lease["spec"].get("holderIdentity"), lease
    reasons = {e.reason for e in core.list_namespaced_event(ns).items if e.involved_object.kind == "RayCluster"}
    assert {"GuardHeld", "GuardReleased"} <= reasons, reasons
    ray.shutdown()
