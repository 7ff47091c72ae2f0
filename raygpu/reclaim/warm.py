"""The sidecar's keep-warm learner (``raygpu.io/idle-timeout: auto``): observe, remember, explain, persist.

Each cycle with a worker group in ``auto`` (``WarmKeeper.apply``):

1. Observe, from what the cycle already read: each group's demand
   (``plan.warm.demand_by_group``: busy workers, unplaced bundles of pending PGs,
   Ray's pending tasks) and start-ups (a pod this process saw with no Ray node,
   later with one: creation -> first cycle that saw its node, so at most one
   interval long).
2. Decide, purely: ``plan.warm.record`` then ``plan.warm.plan_warm``; the targets go
   into the cycle's ``ReclaimPolicy`` (``warm_targets``; a group without enough
   history gets its fallback timeout), and ``plan_reclaim`` honours them after
   every protection.
3. Explain: a ``warm`` log line and a ``WarmTarget`` Event when a group's target
   changes; the gauge ``raygpu_reclaim_warm_target{group}`` (absent while a group
   is on its fallback).
4. Persist, at most every ``WRITE_EVERY_CYCLES`` cycles, in one ConfigMap this
   sidecar owns (``labels.warm_state_name``; labels ``raygpu.io/cluster`` and
   ``raygpu.io/warm-state``, an ownerReference to the RayCluster so it goes with
   it; at most ``MAX_STATE_BYTES``). Updates carry the resourceVersion read: a
   conflict re-reads it, never overwrites blindly. A failed write loses at most
   the samples since the last one that landed.

Never raises (errors are logged; learning goes on in memory). A ConfigMap of that
name that raygpu cannot prove it created (labels and ownerReference) is never
written: one Warning Event ``WarmStateNotOwned`` and the history stays in memory.
One that is ours but does not parse: one Warning Event ``WarmStateInvalid`` and
the fallback (the empty history), then it is overwritten by the next write. One
that parses is still read sample by sample (``model.warm.load_history``): a
number out of bounds, a sample dated after now, a state over ``MAX_STATE_BYTES``
is dropped or cut, one Warning Event each (``WarmStateOutOfBounds``,
``WarmStateFutureSamples``, ``WarmStateTooLarge``), and the repaired state is
written back in the same cycle. A clock that steps back drops, in memory, the samples
it left ahead (``WarmStateFutureSamples``).
"""

from __future__ import annotations

import logging
from typing import Callable

from raygpu.errors import ConflictError, NotFoundError, RayGpuError
from raygpu.model.annotations import ClusterPolicy
from raygpu.model.cycle import CycleState
from raygpu.model.labels import LABEL_CLUSTER, LABEL_WARM_STATE, WARM_STATE_KEY, dns_label, warm_state_name
from raygpu.model.raycluster import RayClusterView
from raygpu.model.views import K8sView, Snapshot
from raygpu.model.warm import (MAX_STARTUP_SAMPLES, MAX_STATE_BYTES, GroupHistory, StateRepair, WarmHistory,
                               WarmTarget, drop_future, encode_history, load_history)
from raygpu.plan.reclaim.warm import demand_by_group, plan_warm, record

log = logging.getLogger("raygpu.sidecar")

WRITE_EVERY_CYCLES = 6  # about a minute at the default 10 s interval
EventFn = Callable[..., bool]  # (cluster, reason, message, type_=...) -> recorded


class WarmKeeper:
    """Learns, per auto group, the demand and start-up history of one RayCluster. One caller at a time."""

    def __init__(self, kube, metrics, event: EventFn, ids: Callable[[dict], dict],
                 write_every: int = WRITE_EVERY_CYCLES) -> None:
        self.kube, self.metrics, self.event, self.ids = kube, metrics, event, ids
        self.write_every = write_every
        self.history = WarmHistory()
        self.loaded = False  # the ConfigMap was read (absent, ours or not ours)
        self.resource_version: str | None = None  # of our ConfigMap; None: create it
        self.not_owned = False  # a same-named ConfigMap raygpu did not create: never written
        self.dirty = 0  # cycles with new samples since the last write that landed
        self._starting: dict[str, float] = {}  # pod uid/name -> created_at_s, seen without a Ray node
        self._targets: dict[str, tuple[int | None, str]] = {}  # group -> last (warm, reason) reported

    def apply(self, state: CycleState, cp: ClusterPolicy) -> CycleState:
        """The cycle's state with the keep-warm targets in its policy (unchanged when no group is in auto)."""
        cluster = state.cluster
        groups = [g.group_name for g in cluster.worker_groups if cp.is_auto(g.group_name)]
        for gone in set(self._targets) - set(groups):
            self._targets.pop(gone)
            self.metrics.warm_target.remove(gone)
        if not groups:
            return state
        try:
            if not self.loaded:
                self._load(cluster, state.now_s)
            self.history, future = drop_future(self.history, state.now_s, "the clock stepped back")
            if future is not None:  # once per step back: the samples it left ahead are gone after this
                self._report(cluster, future, "in memory")
            if state.ray.reachable:  # Ray's view unavailable: nothing to learn (and plan_reclaim keeps all)
                snapshot = Snapshot(taken_at_s=state.now_s, cluster=cluster.name, namespace=cluster.namespace,
                                    ray=state.ray, k8s=K8sView(pods=state.pods))
                demand = demand_by_group(snapshot, cluster)
                self.history = record(self.history, state.now_s, {g: demand.get(g, 0) for g in groups}, cp.warm,
                                      self._startups(state, set(groups)))
                self.dirty += 1
            targets = plan_warm(self.history, groups, state.now_s, cp.warm)
            self._explain(targets, cluster)
            if self.dirty >= self.write_every and self.loaded and not self.not_owned:
                self._write(cluster, state.now_s)
        except Exception as e:  # noqa: BLE001 - keep-warm must never stop a cycle: fixed timeouts then
            log.exception("warm-failed", extra={"fields": self.ids({"error": str(e)})})
            targets = {g: WarmTarget(group=g, warm=None, reason=f"keep-warm failed: {e}",
                                     fallback_timeout_s=cp.warm.fallback_timeout_s) for g in groups}
        policy = state.policy.model_copy(update={
            "warm_targets": {g: t.warm for g, t in targets.items() if t.warm is not None},
            "warm_reasons": {g: t.reason for g, t in targets.items() if t.warm is not None},
            "warm_hold_s": {g: t.hold_s for g, t in targets.items() if t.warm is not None and t.hold_s > 0},
            "group_idle_timeout_s": {**state.policy.group_idle_timeout_s,
                                     **{g: t.fallback_timeout_s for g, t in targets.items() if t.warm is None}}})
        return state.model_copy(update={"policy": policy})

    # ----------------------------------------------------------- observe
    def _startups(self, state: CycleState, groups: set[str]) -> dict[str, list[float]]:
        """Start-up durations of pods this process saw start: creation -> the first cycle with their Ray node."""
        live = {n.instance_id for n in state.ray.nodes if n.alive and n.instance_id}
        out: dict[str, list[float]] = {}
        seen = set()
        for p in state.pods:
            key = p.uid or p.name
            seen.add(key)
            if p.is_head or p.ray_group not in groups or p.deleting:
                continue
            if p.name not in live:
                self._starting.setdefault(key, p.created_at_s)
            elif key in self._starting:
                out.setdefault(p.ray_group, []).append(max(0.0, state.now_s - self._starting.pop(key)))
        self._starting = {k: v for k, v in self._starting.items() if k in seen}
        return out

    # ----------------------------------------------------------- explain
    def _explain(self, targets: dict[str, WarmTarget], cluster: RayClusterView) -> None:
        for g, t in targets.items():
            if t.warm is None:
                if (self._targets.get(g) or (None, ""))[0] is not None:
                    self.metrics.warm_target.remove(g)
            else:
                self.metrics.warm_target.labels(g).set(t.warm)
            last = self._targets.get(g)
            if last is not None and last[0] == t.warm and (t.warm is not None or last[1] == t.reason.split(":")[0]):
                continue
            self._targets[g] = (t.warm, t.reason.split(":")[0])
            log.info("warm", extra={"fields": self.ids({
                "group": g, "warm": t.warm, "quantile": t.quantile, "window_s": t.window_s, "samples": t.samples,
                "fallback_timeout_s": None if t.warm is not None else t.fallback_timeout_s, "reason": t.reason})})
            self.event(cluster, "WarmTarget", f"worker group {g}: {t.reason}")

    # ----------------------------------------------------------- persist
    def _owned(self, obj: dict, cluster: RayClusterView) -> bool:
        md = obj.get("metadata") or {}
        labels = md.get("labels") or {}
        return (labels.get(LABEL_WARM_STATE) == dns_label(cluster.name)
                and labels.get(LABEL_CLUSTER) == dns_label(cluster.name)
                and any(r.get("uid") == cluster.uid and r.get("kind") == "RayCluster"
                        for r in md.get("ownerReferences") or []))

    def _load(self, cluster: RayClusterView, now_s: float) -> None:
        """Read the state ConfigMap (once, and after a conflict), defensively (``load_history``: what it drops
        or cuts is a Warning Event each, and the repaired state is written back this cycle). A failed read is
        retried next cycle."""
        name = warm_state_name(cluster.name)
        try:
            obj = self.kube.get("v1", "ConfigMap", name, cluster.namespace)
        except RayGpuError as e:
            log.warning("warm-state-read-failed", extra={"fields": self.ids({"configmap": name, "error": str(e)})})
            return
        self.loaded = True
        if obj is None:
            self.resource_version = None
            return
        if not self._owned(obj, cluster):
            if not self.not_owned:
                self.not_owned = True
                self.event(cluster, "WarmStateNotOwned", f"ConfigMap {name} exists but raygpu cannot prove it "
                           f"created it (labels {LABEL_WARM_STATE}, {LABEL_CLUSTER} and an ownerReference to this "
                           "RayCluster): it is never written; the keep-warm history stays in memory", type_="Warning")
            return
        self.not_owned = False
        self.resource_version = (obj.get("metadata") or {}).get("resourceVersion")
        try:
            stored, repairs = load_history(((obj.get("data") or {}).get(WARM_STATE_KEY)) or "", now_s)
        except ValueError as e:
            self.dirty = self.write_every  # ours: rewrite it with what this process learns
            self.event(cluster, "WarmStateInvalid", f"ConfigMap {name} key {WARM_STATE_KEY} ignored: {e}; "
                       "starting from the fallback (no history)", type_="Warning")
            return
        for r in repairs:
            self._report(cluster, r, f"ConfigMap {name} key {WARM_STATE_KEY}")
        if repairs:
            self.dirty = self.write_every  # ours: rewrite it repaired
        self.history = _merged(stored, self.history)

    def _report(self, cluster: RayClusterView, repair: StateRepair, where: str) -> None:
        log.warning("warm-state-repaired", extra={"fields": self.ids({
            "reason": repair.reason, "where": where, "detail": repair.message})})
        self.event(cluster, repair.reason, f"keep-warm history ({where}): {repair.message}", type_="Warning")

    def _write(self, cluster: RayClusterView, now_s: float) -> None:
        name = warm_state_name(cluster.name)
        text = encode_history(self.history, MAX_STATE_BYTES)
        try:
            if self.resource_version is None:
                obj = self.kube.create(self._object(cluster, name, text))
            else:
                obj = self.kube.merge_patch("v1", "ConfigMap", name, cluster.namespace, {
                    "metadata": {"resourceVersion": self.resource_version}, "data": {WARM_STATE_KEY: text}})
        except ConflictError as e:  # someone wrote it (or created it) since we read: re-read, never overwrite
            log.info("warm-state-conflict", extra={"fields": self.ids({"configmap": name, "error": str(e)})})
            self.loaded = False
            self._load(cluster, now_s)
            return
        except RayGpuError as e:  # lost: at most this window of samples; the next write carries them
            log.warning("warm-state-write-failed", extra={"fields": self.ids({"configmap": name, "error": str(e)})})
            if isinstance(e, NotFoundError):  # deleted since we read it: create it next time
                self.resource_version = None
            return
        self.resource_version = (obj.get("metadata") or {}).get("resourceVersion")
        self.dirty = 0

    @staticmethod
    def _object(cluster: RayClusterView, name: str, text: str) -> dict:
        label = dns_label(cluster.name)
        return {"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": name, "namespace": cluster.namespace,
                             "labels": {LABEL_CLUSTER: label, LABEL_WARM_STATE: label},
                             "ownerReferences": [{"apiVersion": "ray.io/v1", "kind": "RayCluster",
                                                  "name": cluster.name, "uid": cluster.uid}]},
                "data": {WARM_STATE_KEY: text}}


def _merged(stored: WarmHistory, learned: WarmHistory) -> WarmHistory:
    """The stored history followed by what this process learned before it could read it."""
    out = dict(stored.groups)
    for g, h in learned.groups.items():
        old = out.get(g, GroupHistory())
        first = h.demand[0][0] if h.demand else float("inf")
        out[g] = GroupHistory(demand=tuple(s for s in old.demand if s[0] < first) + h.demand,
                              startup_s=(old.startup_s + h.startup_s)[-MAX_STARTUP_SAMPLES:])
    return WarmHistory(groups=out)
