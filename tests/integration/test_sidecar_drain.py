"""Issue 14, drain before delete, on the testbed (real KubeRay, real Ray): a task that lands on an idle worker
after the sidecar planned to delete it is not killed.

The sidecar's cycle runs in this process (``Reclaimer.cycle(before_apply=...)``), so the test acts exactly
between the plan and the patch: it starts an actor holding a GPU on the worker the plan deletes. Ray then
refuses the idle drain, the worker is kept (``DrainRejected``) and the actor keeps running; once the actor
ends, the worker is drained and deleted. A second test lets the drain land and the patch conflict: the next
cycle deletes the drained pod (``Drained``) without waiting for the idle timeout again.
"""

from __future__ import annotations

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from raygpu.adapters.kube import KubeAdapter
from raygpu.adapters.kube_watch import ClusterCache
from raygpu.model.reclaim import ReclaimReason
from raygpu.reclaim.loop import CycleOutcome, Reclaimer, SidecarConfig
from raygpu.testing import manifests as m
from tests.integration.sidecar_helpers import GPU_RES, ON_5S, _cluster, _merge_patch, _ready, _spec_groups, _workers
from tests.integration.util import alive_ray_nodes, holds_for, wait_for


@ray.remote(num_gpus=1, num_cpus=0)
class Holder:
    """Holds one GPU of the node it runs on until killed: the node is busy."""

    def where(self) -> str:
        return ray.get_runtime_context().get_node_id()


def _setup(testbed, ns, pool, kube, core):
    pool.add({"cpu": "cpu16", "g1": "h100x8"})
    _cluster(kube, ns, pool.name, [m.worker_group("gpu", replicas=1, pool=pool.name, gpus=GPU_RES)], ON_5S)
    addr, names = _ready(testbed, core, ns, "rc", 1)
    adapter = KubeAdapter(str(testbed.kubeconfig))
    cache = ClusterCache(adapter.api, ns, "rc").start()
    assert cache.wait_synced(30)
    reclaimer = Reclaimer(adapter, cache, SidecarConfig(namespace=ns, cluster="rc", ray_address=addr,
                                                        interval_s=0.5, startup_grace_s=0))
    return addr, names[0], cache, reclaimer


def _cycle_until(reclaimer, what: str, pred, timeout_s: float, before_apply=None):
    seen = []

    def probe():
        seen.append(reclaimer.cycle(before_apply=before_apply))
        return seen[-1] if pred(seen[-1]) else None
    try:
        return wait_for(what, probe, timeout_s)
    except Exception:
        last = seen[-1] if seen else None
        raise AssertionError(f"{what}: last cycle {last and (last.outcome, last.error)}; decisions "
                             f"{last and last.plan and [(d.pod_name, d.reason.value, d.detail) for d in last.plan.decisions]}")


def test_a_task_placed_on_an_idle_worker_after_the_plan_is_not_killed(testbed, ns, pool, kube, core):
    addr, worker, cache, reclaimer = _setup(testbed, ns, pool, kube, core)
    node_id = next(n.node_id for n in alive_ray_nodes(addr) if n.instance_id == worker)
    ray.init(address=addr, logging_level="ERROR", log_to_driver=False)
    holders = []

    def task_lands_after_the_plan(plan):
        if worker in plan.deleted_pods and not holders:  # the plan deletes the idle worker: now put work on it
            h = Holder.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False)).remote()
            assert ray.get(h.where.remote(), timeout=60) == node_id
            holders.append(h)
    try:
        report = _cycle_until(reclaimer, "a plan deleting the idle worker, with a task landed before its patch",
                              lambda r: bool(holders), 60, before_apply=task_lands_after_the_plan)
        assert report.plan.decision(worker).reason is ReclaimReason.DRAIN_REJECTED, report.plan.decisions
        assert "no longer idle" in report.plan.decision(worker).detail
        assert report.outcome is CycleOutcome.IDLE and report.deleted_pods == ()
        assert reclaimer.metrics.registry.get_sample_value("raygpu_reclaim_drains_total", {"result": "rejected"}) == 1
        # the task runs on: the pod stays, nothing lists it for deletion, the actor still answers from its node
        holds_for("the worker and its task stay", lambda: _workers(core, ns) == [worker] and not (
            _spec_groups(kube, ns)["gpu"].get("scaleStrategy") or {}).get("workersToDelete"), 5)
        assert ray.get(holders[0].where.remote(), timeout=30) == node_id
        for _ in range(3):  # later cycles see it busy and keep it
            assert reclaimer.cycle().plan.decision(worker).reason is ReclaimReason.NOT_IDLE_LONG_ENOUGH
        # control: once the task ends and the idle timeout passes, the same worker is drained and deleted
        ray.kill(holders[0])
        done = _cycle_until(reclaimer, "the idle worker drained and deleted", lambda r: r.outcome is
                            CycleOutcome.APPLIED, 90)
        assert done.deleted_pods == (worker,) and done.plan.decision(worker).reason is ReclaimReason.IDLE
        wait_for("the worker pod deleted", lambda: _workers(core, ns) == [], 60)
    finally:
        ray.shutdown()
        cache.stop()


def test_a_drained_worker_whose_patch_conflicts_is_deleted_by_the_next_cycle(testbed, ns, pool, kube, core):
    """Ray accepts the drain (the raylet exits; the testbed's bridge restarts it, as a container restart
    would), a concurrent write sets a one-hour idle timeout and the patch conflicts: the next cycle deletes
    the drained pod anyway (``Drained``), and only it."""
    addr, worker, cache, reclaimer = _setup(testbed, ns, pool, kube, core)
    wrote = []

    def concurrent_writer(plan):
        if worker in plan.deleted_pods and not wrote:
            _merge_patch(kube, ns, {"metadata": {"annotations": {"raygpu.io/idle-timeout": "1h"}}})
            wrote.append(plan)
    try:
        conflicted = _cycle_until(reclaimer, "a drained worker whose patch conflicts",
                                  lambda r: bool(wrote), 60, before_apply=concurrent_writer)
        assert conflicted.outcome is CycleOutcome.CONFLICT, (conflicted.outcome, conflicted.error)
        assert reclaimer.metrics.registry.get_sample_value("raygpu_reclaim_drains_total", {"result": "accepted"}) == 1
        done = _cycle_until(reclaimer, "the drained worker deleted by a later cycle",
                            lambda r: r.outcome is CycleOutcome.APPLIED, 60)
        assert done.deleted_pods == (worker,) and done.plan.decision(worker).reason is ReclaimReason.DRAINED
        assert "1h" == cache.view().cluster.annotations["raygpu.io/idle-timeout"]  # the timeout did not apply
        wait_for("the worker pod deleted", lambda: _workers(core, ns) == [], 60)
    finally:
        cache.stop()
