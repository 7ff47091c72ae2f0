"""The sidecar's keep-warm learner (raygpu.reclaim.warm) in the cycle, on the fake Kubernetes: learning, the
fallback, the explanation (log, Event, gauge) and the state ConfigMap it owns (restart, conflict, malformed,
not ours, failed write)."""

from __future__ import annotations

import copy
import json

from raygpu.adapters.kube_watch import CacheView
from raygpu.errors import TransientError
from raygpu.model.annotations import parse_cluster_policy
from raygpu.model.labels import LABEL_CLUSTER, LABEL_WARM_STATE, WARM_STATE_KEY, warm_state_name
from raygpu.model.raycluster import RayClusterView
from raygpu.model.reclaim import ReclaimReason
from raygpu.model.views import RayView
from raygpu.model.warm import GroupHistory, decode_history
from raygpu.reclaim.loop import CycleOutcome, Reclaimer, SidecarConfig
from raygpu.testing.builders.recorded import NOW_S, NS, PODS, RECORDED, pod, ray_node
from raygpu.testing.builders.warm import warm_state_configmap
from raygpu.testing.fake_kube import FakeKube

R = ReclaimReason
CM = warm_state_name("rc")
GPUS = {"rc-gpu-worker-a": 8, "rc-gpu-worker-b": 8, "rc-gpu-worker-c": 8, "rc-small-worker-d": 1, "rc-gpu-worker-n": 8}


def auto_cluster(**annotations: str) -> dict:
    raw = copy.deepcopy(RECORDED)
    raw["metadata"]["annotations"] = {"raygpu.io/idle-timeout": "auto", "raygpu.io/reclaim": "dry-run", **annotations}
    return raw


class World:
    """A clock, the cluster's pods and which workers are busy; cycles one Reclaimer over a FakeKube."""

    def __init__(self, kube: FakeKube) -> None:
        self.kube, self.now, self.pods, self.busy = kube, NOW_S, list(PODS), {"rc-gpu-worker-c"}
        self.joined: set[str] = {p.name for p in PODS}

    def view(self) -> CacheView:
        return CacheView(RayClusterView.from_k8s(self.kube.raw), tuple(self.pods), (), True)

    def ray(self, address, timeout_s, now_s) -> RayView:
        nodes = [ray_node("rc-head-x", 0, 100, head=True)]
        for p in self.pods:
            if not p.is_head and p.name in self.joined:
                n = ray_node(p.name, GPUS[p.name], None if p.name in self.busy else 60)
                nodes.append(n.model_copy(update={"idle_since_s": None if p.name in self.busy else self.now - 60}))
        return RayView(nodes=tuple(nodes))

    def assume_cluster(self, written, planned_from_rv):
        pass

    def wait_cluster_change(self, resource_version, timeout_s):
        return True

    def reclaimer(self) -> Reclaimer:
        cfg = SidecarConfig(namespace=NS, cluster="rc", ray_address="127.0.0.1:1", startup_grace_s=0)
        return Reclaimer(self.kube, self, cfg, clock=lambda: self.now, read_ray=self.ray, read_jobs=lambda a: {},
                         drain=lambda node_id, msg: (True, ""))

    def learn(self, r: Reclaimer, cycles: int) -> None:
        """A start-up of 180 s first (pod n), then demand that rises by one worker every 5 minutes."""
        for i in range(cycles):
            if i == 0:
                self.pods.append(pod("rc-gpu-worker-n", "gpu", "k5", age_s=0).model_copy(
                    update={"created_at_s": self.now}))
            if i == 3:
                self.joined.add("rc-gpu-worker-n")
            self.busy = {"rc-gpu-worker-c"} | ({"rc-gpu-worker-a"} if i % 5 == 4 else set())
            assert r.cycle().outcome in (CycleOutcome.IDLE, CycleOutcome.DRY_RUN)
            self.now += 60
        self.busy = {"rc-gpu-worker-c"}


def gauge(r: Reclaimer, group: str) -> float | None:
    return r.metrics.registry.get_sample_value("raygpu_reclaim_warm_target", {"group": group})


def stored(kube: FakeKube) -> dict:
    return kube.objects[("ConfigMap", NS, CM)]


# ------------------------------------------------------------------ the annotation
def test_auto_is_parsed_per_cluster_and_per_group_and_bad_knobs_keep_their_defaults():
    cp, problems = parse_cluster_policy({"raygpu.io/idle-timeout": "300s", "raygpu.io/idle-timeout.gpu": " Auto",
                                         "raygpu.io/warm-quantile": "1.5", "raygpu.io/warm-history": "2h"})
    assert cp.is_auto("gpu") and not cp.is_auto("small") and cp.idle_timeout_s == 300
    assert cp.warm.history_s == 7200 and cp.warm.quantile == 0.8
    assert [(p.key, p.default_used) for p in problems] == [("raygpu.io/warm-quantile", "0.8")]
    cp, problems = parse_cluster_policy({"raygpu.io/idle-timeout": "auto", "raygpu.io/idle-timeout.small": "60s"})
    assert cp.is_auto("gpu") and not cp.is_auto("small") and cp.idle_timeout_for("small") == 60 and not problems
    cp, problems = parse_cluster_policy({"raygpu.io/idle-timeout": "automatic"})
    assert not cp.is_auto("gpu") and cp.idle_timeout_s == 600 and problems[0].key == "raygpu.io/idle-timeout"


def test_the_hold_is_parsed_in_startups_and_a_bad_one_keeps_the_default():
    cp, problems = parse_cluster_policy({"raygpu.io/idle-timeout": "auto", "raygpu.io/warm-hold": " 1.5"})
    assert cp.warm.hold_startups == 1.5 and not problems
    cp, problems = parse_cluster_policy({"raygpu.io/idle-timeout": "auto", "raygpu.io/warm-hold": "0"})
    assert cp.warm.hold_startups == 0.0 and not problems  # 0: beyond the target, at once (the old default)
    for bad in ("-1", "101", "nan", "3m"):
        cp, problems = parse_cluster_policy({"raygpu.io/idle-timeout": "auto", "raygpu.io/warm-hold": bad})
        assert cp.warm.hold_startups == 0.5  # the default
        assert [(p.key, p.default_used) for p in problems] == [("raygpu.io/warm-hold", "0.5")], bad


# ------------------------------------------------------------------ fallback, learning, explaining
def test_until_enough_history_each_auto_group_has_the_fallback_timeout():
    w = World(FakeKube(auto_cluster(**{"raygpu.io/warm-fallback": "45s"})))
    r = w.reclaimer()
    report = r.cycle()
    assert report.plan.decision("rc-gpu-worker-a").reason is R.IDLE  # idle 60 s >= the 45 s fallback
    assert report.plan.decision("rc-gpu-worker-a").detail == "idle 60s >= timeout 45s"
    assert gauge(r, "gpu") is None
    events = w.kube.with_reason("WarmTarget")
    assert len(events) == 2 and "no pod start-up measured yet: fallback idle timeout 45s" in events[0].message
    r.cycle()
    assert len(w.kube.with_reason("WarmTarget")) == 2  # no change, no new Event


NO_HOLD = {"raygpu.io/warm-hold": "0"}  # beyond the target at once: the workers here are idle 60 s, under the hold


def test_the_sidecar_learns_keeps_warm_explains_and_persists():
    w = World(FakeKube(auto_cluster(**NO_HOLD)))
    r = w.reclaimer()
    w.learn(r, 40)
    report = r.cycle()
    gpu = {d.pod_name: d for d in report.plan.decisions if d.group == "gpu"}
    assert sorted(d.reason for d in gpu.values() if d.reason in (R.IDLE, R.KEEP_WARM)) == [R.IDLE, R.IDLE, R.KEEP_WARM]
    warm = next(d for d in gpu.values() if d.reason is R.KEEP_WARM)
    assert "warm target 1 of group gpu: keep 1 warm = q0.8 of the demand rise over the 180s start-up" in warm.detail
    # small never started a pod while watched: no start-up measured, so still its fallback timeout
    assert report.plan.decision("rc-small-worker-d").detail == "idle 60s < timeout 300s"
    assert (gauge(r, "gpu"), gauge(r, "small")) == (1.0, None)
    assert any("keep 1 warm" in e.message for e in w.kube.with_reason("WarmTarget"))
    cm = stored(w.kube)
    md = cm["metadata"]
    assert md["labels"] == {LABEL_CLUSTER: "rc", LABEL_WARM_STATE: "rc"}
    assert md["ownerReferences"] == [{"apiVersion": "ray.io/v1", "kind": "RayCluster", "name": "rc",
                                      "uid": RECORDED["metadata"]["uid"]}]
    saved = decode_history(cm["data"][WARM_STATE_KEY])
    assert saved.groups["gpu"].startup_s == (180.0,) and len(saved.groups["gpu"].demand) >= 36
    writes = [c for c in w.kube.calls if c[0] in ("create", "merge_patch")]
    assert len(writes) == 40 // 6  # at most one write every 6 cycles


def test_with_the_default_hold_a_worker_beyond_the_target_stays_half_a_start_up():
    """Unset, the hold is 0.5 start-ups: 90 s of the measured 180 s; each of the 3 idle-60 s workers stays, the 2
    beyond the target too (test_the_sidecar_learns_keeps_warm_explains_and_persists: the same with no hold)."""
    w = World(FakeKube(auto_cluster()))
    r = w.reclaimer()
    w.learn(r, 40)
    gpu = {d.pod_name: d for d in r.cycle().plan.decisions if d.group == "gpu"}
    held = [d for d in gpu.values() if d.detail == "idle 60s < timeout 90s"]  # the warm one among them (it counts)
    assert len(held) == 3 and {d.reason for d in held} == {R.NOT_IDLE_LONG_ENOUGH}
    assert not [d for d in gpu.values() if d.reason in (R.IDLE, R.KEEP_WARM)]  # without the hold: 3 Idle, 1 KeepWarm
    assert gauge(r, "gpu") == 1.0
    assert any("beyond it, idle 90s first (0.5 start-ups)" in e.message for e in w.kube.with_reason("WarmTarget"))


def test_a_restarted_sidecar_starts_from_the_stored_history():
    kube = FakeKube(auto_cluster(**NO_HOLD))
    w = World(kube)
    w.learn(w.reclaimer(), 40)
    again = World(kube)
    again.now = w.now
    r2 = again.reclaimer()
    report = r2.cycle()
    assert R.KEEP_WARM in {d.reason for d in report.plan.decisions} and gauge(r2, "gpu") == 1.0


def test_a_conflict_rereads_and_the_next_write_lands():
    kube = FakeKube(auto_cluster())
    w = World(kube)
    r = w.reclaimer()
    w.learn(r, 7)  # created at cycle 6
    cm = stored(kube)
    cm["metadata"]["resourceVersion"] = "99"  # someone (a second sidecar) wrote it
    cm["metadata"]["annotations"] = {"touched": "yes"}
    w.learn(r, 6)  # the write of cycle 12 conflicts and re-reads; cycle 13 writes on the version it read
    assert len([c for c in kube.calls if c[0] == "get"]) == 2  # the first read, then the re-read
    assert len([c for c in kube.calls if c[0] == "merge_patch"]) == 2
    assert stored(kube)["metadata"]["resourceVersion"] == "100"
    assert stored(kube)["metadata"]["annotations"] == {"touched": "yes"}  # a merge patch: nothing else lost


def test_a_malformed_state_is_an_event_and_the_fallback_then_rewritten():
    kube = FakeKube(auto_cluster())
    w = World(kube)
    kube.create({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {
        "name": CM, "namespace": NS, "labels": {LABEL_CLUSTER: "rc", LABEL_WARM_STATE: "rc"},
        "ownerReferences": [{"kind": "RayCluster", "uid": RECORDED["metadata"]["uid"]}]},
        "data": {WARM_STATE_KEY: "{not json"}})
    r = w.reclaimer()
    report = r.cycle()
    assert report.outcome in (CycleOutcome.IDLE, CycleOutcome.DRY_RUN)
    assert "not JSON" in w.kube.with_reason("WarmStateInvalid")[0].message
    assert report.plan.decision("rc-gpu-worker-a").detail == "idle 60s < timeout 300s"  # the fallback
    assert json.loads(stored(kube)["data"][WARM_STATE_KEY])["version"] == 1  # ours: rewritten at once


def test_a_same_named_configmap_raygpu_did_not_create_is_never_written():
    kube = FakeKube(auto_cluster())
    theirs = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": CM, "namespace": NS},
              "data": {"user": "data"}}
    kube.create(theirs)
    w = World(kube)
    r = w.reclaimer()
    w.learn(r, 40)
    assert len(kube.with_reason("WarmStateNotOwned")) == 1
    assert not [c for c in kube.calls if c[0] in ("merge_patch", "delete")]
    assert stored(kube)["data"] == {"user": "data"}
    assert gauge(r, "gpu") == 1.0  # it still learns, in memory


def test_a_failed_write_loses_nothing_the_next_write_carries():
    kube = FakeKube(auto_cluster())
    kube.fail("create", TransientError("503"), times=1)
    w = World(kube)
    r = w.reclaimer()
    w.learn(r, 6)  # the write of cycle 6 fails
    assert ("ConfigMap", NS, CM) not in kube.objects
    w.learn(r, 1)  # the next cycle writes again, with every sample
    saved = decode_history(stored(kube)["data"][WARM_STATE_KEY])
    assert len(saved.groups["gpu"].demand) == 7


def test_groups_not_in_auto_learn_nothing_and_write_nothing():
    raw = copy.deepcopy(RECORDED)
    raw["metadata"]["annotations"]["raygpu.io/reclaim"] = "dry-run"
    w = World(FakeKube(raw))
    r = w.reclaimer()
    w.learn(r, 10)
    assert not [c for c in w.kube.calls if c[0] in ("get", "create", "merge_patch")]
    assert not w.kube.with_reason("WarmTarget") and gauge(r, "gpu") is None


# ------------------------------------------------------------------ a state read defensively
def seeded(text: str | None = None, annotations: dict[str, str] | None = None, **groups: GroupHistory) -> FakeKube:
    """A cluster in auto (and ``annotations``) whose state ConfigMap (ours) holds ``groups``, or the raw ``text``
    (no size cap)."""
    kube = FakeKube(auto_cluster(**(annotations or {})))
    cm = warm_state_configmap(NS, "rc", RECORDED["metadata"]["uid"], groups)
    if text is not None:
        cm["data"][WARM_STATE_KEY] = text
    kube.create(cm)
    return kube


def test_a_future_dated_sample_in_the_state_is_dropped_and_learning_goes_on():
    steady = tuple((NOW_S - 7200 + 60 * i, 1) for i in range(100))
    kube = seeded(gpu=GroupHistory(demand=steady + ((NOW_S + 10 * 86400, 1),), startup_s=(180.0,)))
    w = World(kube)
    r = w.reclaimer()
    w.learn(r, 1)
    (event,) = kube.with_reason("WarmStateFutureSamples")
    assert event.type == "Warning" and "1 demand sample dated after now dropped (group gpu: 1)" in event.message
    saved = decode_history(stored(kube)["data"][WARM_STATE_KEY]).groups["gpu"].demand
    assert saved == steady + ((NOW_S - NOW_S % 60, 1),)  # repaired, rewritten at once, the new sample in
    w.learn(r, 6)  # the next write, 6 cycles later: every new sample was kept
    assert len(decode_history(stored(kube)["data"][WARM_STATE_KEY]).groups["gpu"].demand) == 100 + 7


def test_a_clock_that_steps_back_drops_the_samples_it_left_in_the_future_once():
    w = World(FakeKube(auto_cluster()))
    r = w.reclaimer()
    w.learn(r, 10)
    w.now -= 3600  # the clock steps back an hour: the 10 samples are now in the future
    w.learn(r, 8)  # writes at the 2nd and the 8th of these cycles
    (event,) = w.kube.with_reason("WarmStateFutureSamples")
    assert event.type == "Warning" and "group gpu: 10" in event.message and "clock stepped back" in event.message
    saved = decode_history(stored(w.kube)["data"][WARM_STATE_KEY]).groups["gpu"].demand
    assert len(saved) == 8 and max(t for t, _ in saved) <= w.now  # no sample ahead holds the new ones out


def test_a_demand_of_ten_to_the_eighteen_is_dropped_and_idle_workers_are_reclaimed():
    """Half the stored samples at 10^18: taken whole, the target was 10^18 and every idle worker stayed."""
    absurd = tuple((NOW_S - 7200 + 60 * i, 10**18 if i % 2 else 0) for i in range(110))
    kube = seeded(gpu=GroupHistory(demand=absurd, startup_s=(180.0,)), annotations=NO_HOLD)
    report = World(kube).reclaimer().cycle()
    gpu = [d for d in report.plan.decisions if d.group == "gpu" and d.reason in (R.IDLE, R.KEEP_WARM)]
    assert gpu and {d.reason for d in gpu} == {R.IDLE}
    (event,) = kube.with_reason("WarmStateOutOfBounds")
    assert event.type == "Warning" and "55 demand samples" in event.message


def test_an_oversized_state_is_cut_to_its_newest_part_with_a_warning():
    demand = [[NOW_S - 21000 + 0.5 * i, i % 3] for i in range(40_000)]
    text = json.dumps({"version": 1, "groups": {"gpu": {"demand": demand, "startup_s": [180]}}})
    kube = seeded(text)
    r = World(kube).reclaimer()
    r.cycle()
    (event,) = kube.with_reason("WarmStateTooLarge")
    assert event.type == "Warning" and f"{len(text)} bytes" in event.message
    target = next(e.message for e in kube.with_reason("WarmTarget") if "gpu" in e.message)
    samples = int(target.split(" samples in")[0].rsplit(", ", 1)[1])
    assert 0 < samples < 10_000, target  # planned on the newest part only
