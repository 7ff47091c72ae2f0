"""The starvation guard's own writes under faults, through the fault-injecting proxy (docs/reliability.md,
"The starvation guard").

A guarded 2 x 8-GPU gang on a pool of two 8-GPU nodes, each with one pod of the test's that never ends (the
gang never fits while they run, so the hold stands); its driver talks to the API server through a
``FaultProxy``. In one run:

1. The first blocker create lands but its answer is lost (500 after the API server said 201): the holder
   finds the same blocker next step and never stands two on one node nor more than one per gang pod.
2. While it holds, every write of the scope's Lease fails (503) for longer than the Lease duration: the
   holder stops blocking (deletes its blockers) after STEP_DOWN_S without a renewal and before anyone may
   take its Lease (LEASE_DURATION_S after its last renewal), and takes the scope again once writes land.
3. The test ends its two pods; the gang swaps in and is READY, and the first blocker delete after that
   lands with its answer lost: the blockers are still all gone.

Throughout, a watcher samples the blockers: never more than one per node, never another tag's; no pod in
the test's namespace is deleted but the test's own and the gang's at its release.
"""

from __future__ import annotations

import time

import ray

import raygpu
from raygpu.adapters.kube import KubeAdapter
from raygpu.guard.holder import GUARD_EVERY_S
from raygpu.model.guard import LEASE_DURATION_S, STEP_DOWN_S, GuardPolicy, guard_tag
from raygpu.model.labels import LABEL_BLOCKER
from raygpu.testing import manifests as m
from raygpu.testing.controlplane import ADMIN_TOKEN
from raygpu.testing.faultproxy import Fail, Rule, start_for
from raygpu.testing.kube import apply
from tests.integration.gang_helpers import nothing_left, seen_after
from tests.integration.guard_helpers import GUARD_NS, BlockerWatch, Deletions, blockers, guard_setup
from tests.integration.util import holds_for, pods, ray_address, wait_for

GPU_NODES, GPUS, MAX_HOLD_S = 2, 8, 240
PODS = rf"/api/v1/namespaces/{GUARD_NS}/pods"


def test_the_guards_lost_and_failed_writes_never_double_a_blocker_and_a_cut_off_holder_stops_in_time(
        testbed, ns, pool, kube, core, tmp_path, keep_on_failure):
    guard_setup(kube)
    nodes = pool.add({"cpu": "cpu16", **{f"g{i}": "h100x8" for i in range(GPU_NODES)}})[1:]
    for i, node in enumerate(nodes):  # one pod of unknown end per node: the gang never fits while they run
        core.create_namespaced_pod(ns, {"metadata": {"name": f"stay-{i}", "labels": {"app": "stay"}}, "spec": {
            "nodeName": node, "terminationGracePeriodSeconds": 0, "containers": [{"name": "w", "image": "busybox",
            "resources": {"requests": {"cpu": "1", "nvidia.com/gpu": "1"}, "limits": {"cpu": "1", "nvidia.com/gpu": "1"}}}]}})
    apply(kube, m.raycluster("c", ns, [m.worker_group("gpu", replicas=0, pool=pool.name)], pool=pool.name,
                             annotations={"raygpu.io/max-hold": f"{MAX_HOLD_S}s"}))
    ray.init(address=ray_address(testbed, ns, "c"), logging_level="ERROR", log_to_driver=False)
    rk = KubeAdapter(str(testbed.kubeconfig))
    lease_path = rf"/apis/coordination.k8s.io/v1/namespaces/{GUARD_NS}/leases/{GuardPolicy().lease_name(ns)}"
    watch, deletions = BlockerWatch(core, ns), Deletions(core, ns)
    with start_for(testbed) as proxy:
        keep_on_failure("driver-proxy.log", proxy.write_log)
        kc = str(proxy.kubeconfig_for_token(ADMIN_TOKEN, tmp_path / "driver.kubeconfig"))
        lost_create = proxy.add(Rule(verb="POST", path=PODS, action=Fail(500, forward=True), times=1))
        watch.start()
        deletions.start()
        pg = None
        try:
            pg = raygpu.placement_group([{"GPU": GPUS}] * GPU_NODES, "STRICT_SPREAD", cluster="c", namespace=ns,
                                        backend="none", guard=True, timeout_s=MAX_HOLD_S + 120, name="g", kubeconfig=kc)
            tag = guard_tag(ns, pg.plan.gang_name)
            # 1. a blocker create whose answer was lost: found again, never made twice
            wait_for("the gang holds: a blocker on each node", lambda: len(blockers(core, ns)) == GPU_NODES, 90)
            got = proxy.wait_seen(lambda s: s.rule is lost_create, 5)
            assert (got.status, got.upstream_status) == (500, 201), got
            standing = {p["metadata"]["name"] for p in blockers(core, ns)}
            holds_for("the same blockers stand while it holds", lambda: {
                p["metadata"]["name"] for p in blockers(core, ns)} == standing, 3 * GUARD_EVERY_S)
            creates = [s for s in proxy.log if s.verb == "POST" and s.path == PODS and s.done]
            assert [s.upstream_status for s in creates].count(201) == GPU_NODES, creates  # one landed per node

            # 2. the scope's Lease cannot be written for longer than its duration
            start = len(proxy.log)
            seen_after(proxy, start, lambda s: s.verb == "PATCH" and s.path == lease_path and s.status == 200,
                       LEASE_DURATION_S)
            last_renew = time.monotonic()  # a write of the Lease just landed: the outage starts now
            outage = proxy.add(Rule(verb="PATCH", path=lease_path, action=Fail(503)))
            wait_for("the cut-off holder's blockers gone", lambda: watch.gone_since(last_renew), LEASE_DURATION_S + 15)
            stopped_s = watch.gone_since(last_renew) - last_renew
            print(f"\nblockers gone {stopped_s:.1f} s after the last Lease write landed (step down {STEP_DOWN_S:g} s, "
                  f"Lease duration {LEASE_DURATION_S} s)")
            assert STEP_DOWN_S - GUARD_EVERY_S <= stopped_s < LEASE_DURATION_S, (
                f"blockers gone {stopped_s:.1f} s after the last renewal: not within [{STEP_DOWN_S - GUARD_EVERY_S}, "
                f"{LEASE_DURATION_S}) s")
            holds_for("nothing blocked while the Lease cannot be written", lambda: not blockers(core, ns),
                      max(1.0, last_renew + LEASE_DURATION_S + 5 - time.monotonic()))
            failed = [s for s in proxy.log[start:] if s.rule is outage and s.done]
            assert failed and all(s.status == 503 and s.upstream_status is None for s in failed), failed
            proxy.clear()
            wait_for("the gang holds the scope again", lambda: len(blockers(core, ns)) == GPU_NODES, 30)
            lease = rk.get("coordination.k8s.io/v1", "Lease", GuardPolicy().lease_name(ns), GUARD_NS)
            assert lease["spec"]["holderIdentity"] == tag, lease

            # 3. the room frees, the gang swaps in; the first blocker delete's answer is lost
            lost_delete = proxy.add(Rule(verb="DELETE", path=rf"{PODS}/{tag}-bl-\d+",
                                         action=Fail(500, forward=True), times=1))
            for i in range(GPU_NODES):
                core.delete_namespaced_pod(f"stay-{i}", ns, grace_period_seconds=0)
            assert pg.wait(120), f"not ready: {pg.state} {pg.error}"
            wait_for("blockers gone once the gang is bound", lambda: not blockers(core, ns), 30)
            got = proxy.wait_seen(lambda s: s.rule is lost_delete, 5)
            assert (got.status, got.upstream_status) == (500, 200), got
            raygpu.remove_placement_group(pg)
            pg = None
            wait_for("reservations released", lambda: nothing_left(rk, ns, "c"), 90)
        finally:
            if pg is not None:
                raygpu.remove_placement_group(pg)
            watch.stop.set()
            deletions.stop.set()
            ray.shutdown()
    assert watch.samples, "the watcher saw nothing"
    assert watch.gangs() == {tag}, watch.gangs()  # only this gang's
    for at, standing in watch.samples:
        assert all(n.startswith(f"{tag}-bl-") for n in standing), standing
        nodes = [node for node, _ in standing.values()]
        assert len(set(nodes)) == len(nodes) <= GPU_NODES, standing  # at most one per node
    others = [n for n in deletions.names if not n.startswith(("stay-", "c-rg-g-"))]
    assert others == [], f"pods deleted that were neither the test's nor the gang's: {others}"
    assert not pods(core, GUARD_NS, f"{LABEL_BLOCKER}={tag}"), "blockers left behind"
    lease = rk.get("coordination.k8s.io/v1", "Lease", GuardPolicy().lease_name(ns), GUARD_NS)
    assert lease is not None and not lease["spec"].get("holderIdentity"), lease
