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
import time

import ray

import raygpu
from raygpu.adapters.kube import KubeAdapter
from raygpu.model.guard import GuardPolicy, guard_tag
from raygpu.testing import manifests as m
from raygpu.testing.kube import apply
from tests.integration.gang_helpers import nothing_left
from tests.integration.guard_helpers import GUARD_NS, Deletions, Tenant, blockers, guard_setup
from tests.integration.util import pods, ray_address, wait_for

GPU_NODES, GPUS = 4, 8
# CI's scale; RAYGPU_GUARD_WINDOW_S, RAYGPU_GUARD_MAX_HOLD_S and RAYGPU_GUARD_LIFE_S ("30,180") run it at the
# issue's (docs/guard.md, "Testbed status": a 10-minute window, 15-minute max-hold)
WINDOW_S = int(os.environ.get("RAYGPU_GUARD_WINDOW_S", "60"))
MAX_HOLD_S = int(os.environ.get("RAYGPU_GUARD_MAX_HOLD_S", "90"))
LIFE_S = tuple(float(x) for x in os.environ.get("RAYGPU_GUARD_LIFE_S", "2,6").split(","))
BACKLOG = 4  # tenant pods pending at any time, so that every freed GPU is taken at once


def test_a_guarded_gang_is_ready_within_max_hold_while_a_tenant_keeps_every_gpu_busy(testbed, ns, pool, kube, core):
    guard_setup(kube)
    pool.add({"cpu": "cpu16", **{f"g{i}": "h100x8" for i in range(GPU_NODES)}})
    apply(kube, m.raycluster("c", ns, [m.worker_group("gpu", replicas=0, pool=pool.name)], pool=pool.name,
                             annotations={"raygpu.io/max-hold": f"{MAX_HOLD_S}s"}))
    ray.init(address=ray_address(testbed, ns, "c"), logging_level="ERROR", log_to_driver=False)
    rk = KubeAdapter(str(testbed.kubeconfig))
    deletions, tenant = Deletions(core, ns), Tenant(core, ns, pool.name, GPU_NODES * GPUS, BACKLOG, LIFE_S)
    guard_deletions = Deletions(core, GUARD_NS)  # blockers live in the guard namespace
    deletions.start()
    guard_deletions.start()
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
        wait_for("blockers deleted once the gang is bound", lambda: not blockers(core, ns), 15)
        prefix = f"{guard_tag(ns, pg.plan.gang_name)}-bl-"
        # the guard namespace is shared with other tests running beside this one: only this namespace's blockers
        # (a blocker's name starts with its gang's tag, which starts with the gang's namespace)
        ours = [n for n in guard_deletions.names if n.startswith(f"{ns}-")]
        assert any(n.startswith(prefix) for n in ours), "the gang started without blocking a node"
        assert all(n.startswith(prefix) for n in ours), ours  # only its own
        during = [n for n in deletions.names[seen:] if n not in tenant.deleted and not n.startswith("c-rg-plain-")]
        assert during == [], f"pods deleted while the guarded gang waited, neither the tenant's nor blockers: {during}"
        raygpu.remove_placement_group(pg)
        wait_for("reservations released", lambda: nothing_left(rk, ns, "c"), 90)
    finally:
        tenant.stop.set()
        tenant.join(10)
        deletions.stop.set()  # (before: left running, it retried against a stopped API server for minutes)
        guard_deletions.stop.set()
    others = [n for n in deletions.names if n not in tenant.deleted and not n.startswith(("c-rg-plain-",
                                                                                          "c-rg-guarded-"))]
    assert others == [], f"pods deleted that were neither the tenant's ended pods, blockers nor ours: {others}"
    assert not blockers(core, ns), "blockers left behind"
    lease = rk.get("coordination.k8s.io/v1", "Lease", GuardPolicy().lease_name(ns), GUARD_NS)
    assert lease is not None and not lease["spec"].get("holderIdentity"), lease
    reasons = {e.reason for e in core.list_namespaced_event(ns).items if e.involved_object.kind == "RayCluster"}
    assert {"GuardHeld", "GuardReleased"} <= reasons, reasons
    ray.shutdown()
