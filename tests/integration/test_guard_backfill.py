"""Issue 11 item 2, runtime hints: a gang with a short enough hint backfills onto a node the guard holds.

Two 8-GPU nodes. A tenant fills g0 with eight 1-GPU pods that have ``activeDeadlineSeconds`` (the test
ends each at its deadline, as a kubelet would: kwok does not). A guarded 2 x 8-GPU gang holds g1 (free)
and g0 (free at the tenant's deadlines) and publishes that estimated start on its Lease. An unguarded gang
with ``expected_runtime_s`` short enough (hint + 30 s margin before the start) gets the pass, lands on
held g1, becomes READY and is removed (its job done); one with too long a hint never binds onto the held
nodes. The guarded gang is still READY within max-hold.
"""

from __future__ import annotations

import datetime as dt
import threading
import time

import ray

import raygpu
from raygpu.adapters.kube import KubeAdapter
from raygpu.model.guard import GuardPolicy, guard_tag
from raygpu.model.labels import ANNOTATION_GUARD_START, LABEL_GUARD_ASK, LABEL_GUARD_PASS, LABEL_RESERVATION
from raygpu.testing import manifests as m
from raygpu.testing.kube import apply
from tests.integration.gang_helpers import nothing_left
from tests.integration.guard_helpers import GUARD_NS, guard_setup
from tests.integration.util import pods, ray_address, wait_for

GPUS, ADS_S, MAX_HOLD_S = 8, 110, 240
SHORT_S, LONG_S = 20, 600  # 20 + 30 s margin ends well before the tenant's deadlines; 600 never does


def started_s(p: dict) -> float:
    raw = (p.get("status") or {}).get("startTime") or p["metadata"]["creationTimestamp"]
    return dt.datetime.fromisoformat(raw.replace("Z", "+00:00")).timestamp()


class Deadlines(threading.Thread):
    """Ends every pod with activeDeadlineSeconds once it passes, as a kubelet does (kwok does not)."""

    def __init__(self, core, ns: str) -> None:
        super().__init__(daemon=True)
        self.core, self.ns, self.stop, self.ended = core, ns, threading.Event(), []

    def run(self) -> None:
        while not self.stop.is_set():
            for p in pods(self.core, self.ns, "app=deadline"):
                ads = (p.get("spec") or {}).get("activeDeadlineSeconds")
                if ads and time.time() >= started_s(p) + ads and not p["metadata"].get("deletionTimestamp"):
                    self.core.delete_namespaced_pod(p["metadata"]["name"], self.ns, grace_period_seconds=0)
                    self.ended.append(p["metadata"]["name"])
            self.stop.wait(0.5)


def gang_pods(core, ns: str, pg) -> list[dict]:
    return pods(core, ns, f"{LABEL_RESERVATION}={pg.plan.reservation_group}")


def test_a_short_hint_backfills_onto_held_gpus_a_long_one_does_not_and_the_hold_still_starts(
        testbed, ns, pool, kube, core):
    guard_setup(kube)
    pool.add({"cpu": "cpu16", "g0": "h100x8", "g1": "h100x8"})
    g0, g1 = pool.node("g0"), pool.node("g1")
    apply(kube, m.raycluster("c", ns, [m.worker_group("gpu", replicas=0, pool=pool.name)], pool=pool.name,
                             annotations={"raygpu.io/max-hold": f"{MAX_HOLD_S}s"}))
    ray.init(address=ray_address(testbed, ns, "c"), logging_level="ERROR", log_to_driver=False)
    rk = KubeAdapter(str(testbed.kubeconfig))
    deadlines = Deadlines(core, ns)
    deadlines.start()
    try:
        for i in range(GPUS):  # the tenant: g0 full until its pods' deadlines
            core.create_namespaced_pod(ns, {"metadata": {"name": f"d-{i}", "labels": {"app": "deadline"}}, "spec": {
                "nodeName": g0, "activeDeadlineSeconds": ADS_S, "terminationGracePeriodSeconds": 0,
                "containers": [{"name": "w", "image": "busybox", "resources": {
                    "requests": {"cpu": "1", "nvidia.com/gpu": "1"}, "limits": {"cpu": "1", "nvidia.com/gpu": "1"}}}]}})
        wait_for("the tenant runs on g0", lambda: sum((p.get("status") or {}).get("phase") == "Running"
                                                      for p in pods(core, ns, "app=deadline")) == GPUS, 60)
        tenant_end = max(started_s(p) + ADS_S for p in pods(core, ns, "app=deadline"))
        args = dict(cluster="c", namespace=ns, backend="none", kubeconfig=str(testbed.kubeconfig))
        t0 = time.monotonic()
        held = raygpu.placement_group([{"GPU": GPUS}] * 2, "STRICT_SPREAD", timeout_s=MAX_HOLD_S + 60,
                                      name="held", guard=True, **args)
        lease_name = GuardPolicy().lease_name(ns)

        def published() -> float | None:
            lease = rk.get("coordination.k8s.io/v1", "Lease", lease_name, GUARD_NS) or {}
            raw = ((lease.get("metadata") or {}).get("annotations") or {}).get(ANNOTATION_GUARD_START)
            return float(raw) if raw else None
        start = wait_for("the hold's estimated start on the Lease", published, 30)
        assert abs(start - tenant_end) <= 2, (start, tenant_end)  # g0 frees at the tenant's deadlines
        long = raygpu.placement_group([{"GPU": GPUS}], timeout_s=MAX_HOLD_S, name="long", guard=False,
                                      expected_runtime_s=LONG_S, progress=lambda m: print("long:", m), **args)
        short = raygpu.placement_group([{"GPU": GPUS}], timeout_s=MAX_HOLD_S, name="short", guard=False,
                                       expected_runtime_s=SHORT_S, progress=lambda m: print("short:", m), **args)
        assert short.wait(60), f"the short job did not backfill: {short.state} {short.error}"
        [sp] = gang_pods(core, ns, short)
        assert sp["spec"]["nodeName"] == g1 and sp["metadata"]["labels"][LABEL_GUARD_PASS] == guard_tag(ns, held.plan.gang_name)
        assert time.time() + SHORT_S < start, "the backfill could not end before the hold starts"
        raygpu.remove_placement_group(short)  # its job done, well before the hold's start
        wait_for("the short job's pod gone", lambda: not gang_pods(core, ns, short), 60)
        lp = gang_pods(core, ns, long)
        assert lp and all(not p["spec"].get("nodeName") for p in lp), "the long job got onto a held node"
        assert all(LABEL_GUARD_PASS not in p["metadata"].get("labels", {}) for p in lp)
        assert not long.wait(5), "the long job bound while the nodes were held"
        raygpu.remove_placement_group(long)
        # each released gang deleted its own ask (the holder answers and waits for none of them any more)
        assert not rk.list("coordination.k8s.io/v1", "Lease", GUARD_NS, f"{LABEL_GUARD_ASK}={lease_name}")
        assert held.wait(MAX_HOLD_S + 30), f"not ready: {held.state} {held.error}"
        waited_s = time.monotonic() - t0
        assert waited_s <= MAX_HOLD_S, f"ready after {waited_s:.0f} s > max-hold {MAX_HOLD_S} s"
        assert sorted(p["spec"]["nodeName"] for p in gang_pods(core, ns, held)) == sorted([g0, g1])
        assert len(deadlines.ended) == GPUS  # it waited for the tenant's deadlines, nothing was taken from it
        raygpu.remove_placement_group(held)
        wait_for("reservations released", lambda: nothing_left(rk, ns, "c"), 90)
    finally:
        deadlines.stop.set()
        deadlines.join(10)
        ray.shutdown()
    assert published() is None  # freeing the Lease cleared it
