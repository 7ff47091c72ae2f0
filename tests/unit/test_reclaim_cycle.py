"""The sidecar cycle against fakes: a RayCluster store with API-server semantics (raygpu.testing.fake_kube)
and a watch cache.

Every accepted write bumps the resourceVersion; a failed ``test`` rejects the whole patch.
"""

from __future__ import annotations

import copy
import logging
import threading
import time

from raygpu.adapters.kube_watch import CacheView
from raygpu.errors import PermanentError, TransientError
from raygpu.model.gc import ReservationRecord
from raygpu.model.labels import LABEL_CLUSTER, LABEL_OWNER_JOB, LABEL_RESERVATION
from raygpu.model.raycluster import RayClusterView
from raygpu.model.views import PgState, PlacementGroupView, RayView
from raygpu.reclaim.loop import CycleOutcome, Reclaimer, SidecarConfig, problem_reporter
from raygpu.testing.builders.recorded import ALL_IDLE, NOW_S, NS, PODS, R, RECORDED, RV0, pod, ray_view
from raygpu.testing.fake_kube import FakeKube


# ------------------------------------------------------- the cycle, on fakes
def fake_kube(raw: dict, **kw) -> FakeKube:
    """The one fake Kubernetes over ``raw``, listing the recorded cluster's pods."""
    return FakeKube(raw, pods=PODS, **kw)


class FakeCache:
    def __init__(self, kube: FakeKube, reservations=()) -> None:
        self.kube, self.reservations = kube, tuple(reservations)
        self.assumed = []

    def view(self) -> CacheView:
        return CacheView(RayClusterView.from_k8s(self.kube.raw), PODS, self.reservations, True)

    def assume_cluster(self, written, planned_from_rv):
        self.assumed.append((written.resource_version, planned_from_rv))

    def wait_cluster_change(self, resource_version, timeout_s):
        return self.kube.raw["metadata"]["resourceVersion"] != resource_version


def reclaimer(kube, cache=None, ray=None, **kw):
    cfg = SidecarConfig(namespace=NS, cluster="rc", ray_address="127.0.0.1:1", interval_s=0.01, startup_grace_s=0)
    reads = []

    def read_ray(address, timeout_s, now_s):
        reads.append(address)
        return ray or ray_view(ALL_IDLE)
    drains: list[tuple[str, int]] = []  # (Ray node id, patches sent before this drain)
    kw.setdefault("drain", lambda node_id, msg: (drains.append((node_id, len(kube.patches))), (True, ""))[1])
    r = Reclaimer(kube, cache or FakeCache(kube), cfg, clock=lambda: NOW_S, read_ray=read_ray,
                  read_jobs=lambda a: {}, **kw)
    r.ray_reads, r.drains = reads, drains
    return r


def counter(r, name, **labels) -> float:
    return r.metrics.registry.get_sample_value(name, labels or None) or 0.0


def test_cycle_applies_one_patch_then_nothing_more():
    kube = fake_kube(RECORDED)
    r = reclaimer(kube)
    first = r.cycle()
    assert first.outcome is CycleOutcome.APPLIED
    assert first.deleted_pods == ("rc-gpu-worker-a", "rc-gpu-worker-b", "rc-small-worker-d")
    assert len(kube.patches) == 1
    scaled = kube.with_reason("ScaledDown")
    assert len(scaled) == 2 and "rc-gpu-worker-a (Idle: idle 60s >= timeout 5s)" in scaled[0].message
    assert r.cache.assumed == [(str(RV0 + 1), str(RV0))]
    for _ in range(3):  # a restarted or repeated cycle finds the deletions done, not to do
        assert r.cycle().outcome is CycleOutcome.IDLE
    assert len(kube.patches) == 1
    assert counter(r, "raygpu_reclaim_gpus_reclaimed_total") == 17
    assert counter(r, "raygpu_reclaim_decisions_total", action="keep", reason="AlreadyDeleting") == 9


def test_a_write_between_plan_and_patch_causes_a_replan_not_a_wrong_delete():
    # KubeAdapter.patch_raycluster turns a CRD's bare 422 on a moved object into ConflictError
    # (checked for real on the testbed by tests/integration/test_sidecar.py).
    kube = fake_kube(RECORDED, bare_422=False)
    r = reclaimer(kube)

    def concurrent_writer(plan):  # someone raises the minimum of both groups after our snapshot
        def raise_min(raw):
            for g in raw["spec"]["workerGroupSpecs"]:
                g["minReplicas"] = g["replicas"]
        kube.bump(raise_min)
    stale = r.cycle(before_apply=concurrent_writer)
    assert stale.outcome is CycleOutcome.CONFLICT and stale.replan_now
    assert kube.patches == [] and counter(r, "raygpu_reclaim_patch_conflicts_total") == 1
    fresh = r.cycle()
    assert fresh.outcome is CycleOutcome.IDLE and kube.patches == []
    assert fresh.plan.decision("rc-gpu-worker-a").reason is R.GROUP_MINIMUM
    assert kube.with_reason("ScaledDown") == []


def test_a_rejected_patch_on_an_unchanged_cluster_is_an_error_not_a_conflict():
    kube = fake_kube(RECORDED)
    kube.patch_raycluster = lambda ns, name, patch: (_ for _ in ()).throw(PermanentError("422: bad patch"))
    rep = reclaimer(kube).cycle()
    assert rep.outcome is CycleOutcome.ERROR and not rep.replan_now and "bad patch" in rep.error


def test_run_replans_at_once_after_a_conflict_and_stops_on_the_event():
    kube = fake_kube(RECORDED)
    hits = []

    def writer_once(plan):
        if not hits:
            hits.append(plan.cluster_resource_version)
            kube.bump(lambda raw: raw["metadata"].setdefault("labels", {}).update({"touched": "yes"}))
    r = reclaimer(kube, before_apply=writer_once)
    last = r.run(threading.Event(), once=True)
    assert hits == [str(RV0)] and last.outcome is CycleOutcome.APPLIED
    assert kube.patches[0][0]["value"] == str(RV0 + 1)  # re-planned from the writer's version
    stop = threading.Event()
    stop.set()
    assert r.run(stop) is None


def test_bad_annotation_gives_one_event_per_value_and_dry_run():
    kube = fake_kube(RECORDED)
    kube.raw["metadata"]["annotations"]["raygpu.io/reclaim"] = "yes-please"
    r = reclaimer(kube)
    for _ in range(3):
        assert r.cycle().outcome is CycleOutcome.DRY_RUN
    invalid = kube.with_reason("InvalidAnnotation")
    assert len(invalid) == 1 and invalid[0].type == "Warning" and "'yes-please'" in invalid[0].message
    assert "dry-run" in invalid[0].message
    assert kube.patches == []
    assert len(kube.with_reason("ScaleDownDryRun")) == 1  # one per distinct plan
    kube.bump(lambda raw: raw["metadata"]["annotations"].update({"raygpu.io/reclaim": "maybe"}))
    r.cycle()
    assert len(kube.with_reason("InvalidAnnotation")) == 2
    assert kube.patches == []


def test_off_reads_nothing_and_writes_nothing():
    kube = fake_kube(RECORDED)
    kube.raw["metadata"]["annotations"]["raygpu.io/reclaim"] = "off"
    r = reclaimer(kube)
    assert r.cycle().outcome is CycleOutcome.OFF
    assert r.ray_reads == [] and kube.patches == [] and kube.events == []


def test_ray_unreachable_deletes_nothing():
    kube = fake_kube(RECORDED)
    r = reclaimer(kube, ray=RayView(reachable=False, reason="GCS down"))
    rep = r.cycle()
    assert rep.outcome is CycleOutcome.IDLE and kube.patches == []
    assert rep.plan.decision("rc-gpu-worker-a").reason is R.RAY_UNREACHABLE


RC_UID = RECORDED["metadata"]["uid"]
A_PG = [PlacementGroupView(pg_id="aa", state=PgState.CREATED)]
# Ray cannot be read: the heartbeat is the only evidence of a driver's life (with Ray's word, see plan_gc)
RAY_UNREAD = RayView(reachable=False, reason="the Ray GCS did not answer")


def with_reservation_group(name: str, replicas: int, labelled: bool = True) -> dict:
    """RECORDED plus a worker group ``name`` (a copy of the gpu group, replicas = minReplicas); ``labelled``: its
    pod template carries raygpu.io/reservation=<name>, as raygpu builds a reservation group (else a user's group)."""
    raw = copy.deepcopy(RECORDED)
    spec = {**copy.deepcopy(raw["spec"]["workerGroupSpecs"][0]), "groupName": name, "replicas": replicas,
            "minReplicas": replicas}
    if labelled:
        spec["template"].setdefault("metadata", {}).setdefault("labels", {})[LABEL_RESERVATION] = name
    raw["spec"]["workerGroupSpecs"].append(spec)
    return raw


def state_cm(name: str, group: str, *, state: str = "ready", pg: str | None = None, heartbeat_at_s: float | None = None,
             owned: bool = True, job: str | None = None) -> ReservationRecord:
    """A state ConfigMap as the watch cache parses it; ``owned``: with the ownerReference ``reserve`` writes;
    ``job``: the driver's Ray job id (label raygpu.io/owner-job)."""
    return ReservationRecord.from_configmap(raw_cm(name, group, state=state, pg=pg, heartbeat_at_s=heartbeat_at_s,
                                                   owned=owned, job=job))


def raw_cm(name: str, group: str, *, state: str = "ready", pg: str | None = None, heartbeat_at_s: float | None = None,
           owned: bool = True, job: str | None = None) -> dict:
    """A state ConfigMap as the API server returns it (``state_cm`` before parsing)."""
    ann = {"raygpu.io/reservation-state": state}
    if pg:
        ann["raygpu.io/placement-group"] = pg
    if heartbeat_at_s is not None:
        ann["raygpu.io/heartbeat-at"] = f"{heartbeat_at_s:.0f}"
    md = {"name": name, "namespace": NS, "uid": f"uid-{name}", "annotations": ann,
          "labels": {LABEL_RESERVATION: group, LABEL_CLUSTER: "rc"}}
    if job:
        md["labels"][LABEL_OWNER_JOB] = job
    if owned:
        md["ownerReferences"] = [{"apiVersion": "ray.io/v1", "kind": "RayCluster", "name": "rc", "uid": RC_UID}]
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": md}


def groups(kube) -> dict[str, dict]:
    return {g["groupName"]: g for g in kube.raw["spec"]["workerGroupSpecs"]}


def test_gc_releases_a_dead_drivers_reservation_with_the_gang_code():
    raw = with_reservation_group("rg-train", replicas=1)
    kube = fake_kube(raw)
    kube.configmaps = {"rc-rg-train", "rc-rg-live"}
    dead = state_cm("rc-rg-train", "rg-train", pg="aa", heartbeat_at_s=NOW_S - 5)
    live = state_cm("rc-rg-live", "rg-live", pg="bb", heartbeat_at_s=NOW_S - 5)
    ray = ray_view({}, pgs=[PlacementGroupView(pg_id="aa", state=PgState.REMOVED),
                            PlacementGroupView(pg_id="bb", state=PgState.CREATED)])
    r = reclaimer(kube, FakeCache(kube, [dead, live]), ray=ray)
    rep = r.cycle()
    assert rep.outcome is CycleOutcome.APPLIED and rep.released == ("rc-rg-train",)
    assert [g["groupName"] for g in kube.raw["spec"]["workerGroupSpecs"]] == ["gpu", "small"]
    assert kube.configmaps == {"rc-rg-live"}
    assert [e.reason for e in kube.events] == ["ReservationReleased"]
    assert counter(r, "raygpu_gc_reservations_released_total", reason="PlacementGroupGone") == 1
    rep2 = r.cycle()  # the cache still shows it: releasing again is a no-op, counted and evented once
    assert rep2.released == () and [e.reason for e in kube.events] == ["ReservationReleased"]
    assert counter(r, "raygpu_gc_reservations_released_total", reason="PlacementGroupGone") == 1


def test_gc_never_blocks_a_cycle_on_a_draining_group():
    """Pods of the released group still there: scale to zero and move on; a later cycle removes the group."""
    raw = with_reservation_group("rg-train", replicas=1)
    kube = fake_kube(raw)
    kube.configmaps = {"rc-rg-train"}
    kube.extra_pods = [pod("rc-rg-train-worker-z", "rg-train", "k5")]
    dead = state_cm("rc-rg-train", "rg-train", state="released", heartbeat_at_s=NOW_S - 5)
    r = reclaimer(kube, FakeCache(kube, [dead]), ray=ray_view({}))
    t0 = time.monotonic()
    rep = r.cycle()
    assert time.monotonic() - t0 < 5  # one look at the pods, no drain wait
    group = groups(kube)["rg-train"]
    assert group["replicas"] == 0 and group["minReplicas"] == 0
    assert group["scaleStrategy"]["workersToDelete"] == ["rc-rg-train-worker-z"]
    assert rep.released == () and kube.configmaps == {"rc-rg-train"} and kube.events == []
    rep = r.cycle()  # still draining: the same patch is not written again
    assert rep.released == () and len(kube.patches) == 1
    kube.extra_pods = []  # KubeRay deleted the pod
    rep = r.cycle()
    assert rep.released == ("rc-rg-train",) and kube.configmaps == set()
    assert [g["groupName"] for g in kube.raw["spec"]["workerGroupSpecs"]] == ["gpu", "small"]
    assert [e.reason for e in kube.events] == ["ReservationReleased"]


def test_a_users_rg_group_and_configmaps_named_like_state_are_never_touched():
    """Issue 14 item 1: the user's own group rg-a100, a ConfigMap rc-rg-a100 (no labels: the cache never lists it)
    and a labelled look-alike without the ownerReference, in state released: many cycles, nothing of theirs moves."""
    kube = fake_kube(with_reservation_group("rg-a100", replicas=1, labelled=False))
    kube.configmaps = {"rc-rg-a100", "mine"}
    look_alike = state_cm("mine", "rg-a100", state="released", owned=False)
    now = [NOW_S]
    r = reclaimer(kube, FakeCache(kube, [look_alike]), ray=ray_view({}))
    r.clock = lambda: now[0]
    for _ in range(4):
        rep = r.cycle()
        now[0] += 61
    assert rep.released == () and kube.deleted == [] and kube.configmaps == {"rc-rg-a100", "mine"}
    assert groups(kube)["rg-a100"]["replicas"] == 1 and groups(kube)["rg-a100"]["minReplicas"] == 1
    assert not any("rg-a100" in e.message for e in kube.events)
    assert {(d.reservation, d.reason.value) for d in rep.gc.decisions} == {("mine", "Unproven"),
                                                                           ("rg-a100", "Unproven")}


def test_a_proven_group_whose_seen_state_went_is_only_scaled_to_zero():
    """Its proven state ConfigMap seen, then deleted out of band: after the timeout, zero replicas; never removed."""
    kube = fake_kube(with_reservation_group("rg-lost", replicas=1))
    cache = FakeCache(kube, [state_cm("rc-rg-lost", "rg-lost", pg="aa", heartbeat_at_s=NOW_S)])
    now = [NOW_S]
    r = reclaimer(kube, cache, ray=ray_view({}, pgs=A_PG))
    r.clock = lambda: now[0]
    assert r.cycle().gc.decisions[0].reason.value == "Live"
    cache.reservations = ()  # someone deleted the state ConfigMap
    now[0] += 10
    assert r.cycle().released == ()  # it may be in flight: wait
    now[0] += 61
    rep = r.cycle()
    assert rep.released == ("rg-lost",), rep
    assert groups(kube)["rg-lost"]["replicas"] == 0 and groups(kube)["rg-lost"]["minReplicas"] == 0
    assert kube.deleted == []  # no ConfigMap deleted by a constructed name
    (ev,) = kube.with_reason("ReservationScaledToZero")
    assert ev.type == "Warning" and "StateLost" in ev.message
    patches = len(kube.patches)
    for _ in range(3):
        now[0] += 61
        assert r.cycle().released == ()
    assert "rg-lost" in groups(kube) and len(kube.patches) == patches


def test_a_restarted_sidecar_never_scales_a_group_whose_state_it_did_not_see():
    kube = fake_kube(with_reservation_group("rg-lost", replicas=1))
    now = [NOW_S]
    r = reclaimer(kube, FakeCache(kube, []), ray=ray_view({}))
    r.clock = lambda: now[0]
    for _ in range(3):
        rep = r.cycle()
        now[0] += 600
    assert groups(kube)["rg-lost"]["replicas"] == 1 and rep.gc.decisions[0].reason.value == "Unproven"


def test_liveness_is_measured_on_the_sidecars_clock():
    """Issue 14 item 11: the driver's clock is 61 s behind; its fresh heartbeat keeps the reservation, a stopped one
    releases it heartbeat_timeout_s after the sidecar saw it last change, and a restarted sidecar waits again.
    Ray cannot be read throughout, so the heartbeat is the evidence."""
    kube = fake_kube(with_reservation_group("rg-train", replicas=0))
    kube.configmaps = {"rc-rg-train"}
    cache = FakeCache(kube, [state_cm("rc-rg-train", "rg-train", pg="aa", heartbeat_at_s=NOW_S - 61)])
    kube.objects[("ConfigMap", NS, "rc-rg-train")] = raw_cm("rc-rg-train", "rg-train", pg="aa", heartbeat_at_s=NOW_S - 11)
    now = [NOW_S]
    r = reclaimer(kube, cache, ray=RAY_UNREAD)
    r.clock = lambda: now[0]
    assert r.cycle().gc.decisions[0].reason.value == "Live"
    now[0] += 50
    cache.reservations = (state_cm("rc-rg-train", "rg-train", pg="aa", heartbeat_at_s=NOW_S - 11),)
    assert r.cycle().gc.decisions[0].reason.value == "Live"
    now[0] += 60  # 60 s since the sidecar saw it change: the limit, still live
    assert r.cycle().gc.decisions[0].reason.value == "Live"
    restarted = reclaimer(kube, cache, ray=RAY_UNREAD)
    restarted.clock = lambda: now[0] + 30
    assert restarted.cycle().gc.decisions[0].reason.value == "Live"  # 90 s quiet, but first seen just now
    now[0] += 1
    rep = r.cycle()
    assert rep.released == ("rc-rg-train",) and rep.gc.decisions[0].reason.value == "HeartbeatLost"


def test_a_heartbeat_the_hung_watch_did_not_deliver_never_reads_as_lost():
    """Issue 14 must-show 1 (c): the ConfigMap watch hangs, so the cache keeps an old heartbeat while the driver
    beats on. Before releasing on HeartbeatLost (or DeadlineMissed) the sidecar reads the ConfigMap live: a moved
    heartbeat defers the release and counts as seen then; only a heartbeat unchanged on the API server too
    releases, and a failed live read releases nothing. Ray cannot be read throughout, so the heartbeat is the
    evidence."""
    kube = fake_kube(with_reservation_group("rg-train", replicas=2))
    kube.configmaps = {"rc-rg-train"}
    cache = FakeCache(kube, [state_cm("rc-rg-train", "rg-train", pg="aa", heartbeat_at_s=NOW_S)])  # never updated
    now = [NOW_S]
    r = reclaimer(kube, cache, ray=RAY_UNREAD)
    r.clock = lambda: now[0]
    assert r.cycle().gc.decisions[0].reason.value == "Live"
    for beat in (40, 80):  # the driver beats on; the hung watch delivers none of it
        kube.objects[("ConfigMap", NS, "rc-rg-train")] = raw_cm("rc-rg-train", "rg-train", pg="aa",
                                                            heartbeat_at_s=NOW_S + beat)
        now[0] += 61  # past the 60 s timeout since the sidecar last saw a change
        rep = r.cycle()
        assert rep.gc.decisions[0].reason.value == "HeartbeatLost" and rep.released == ()
        assert groups(kube)["rg-train"]["replicas"] == 2 and not kube.patches
        now[0] += 30  # the moved heartbeat counts as seen at the live read: live again for the timeout
        assert r.cycle().gc.decisions[0].reason.value == "Live"
    kube.fail("get", TransientError("get ConfigMap: 503"))  # cannot confirm: nothing is written
    now[0] += 61
    assert r.cycle().released == () and not kube.patches
    now[0] += 1  # the watch catches up, and the driver is really gone: live and cached copies agree
    cache.reservations = (state_cm("rc-rg-train", "rg-train", pg="aa", heartbeat_at_s=NOW_S + 80),)
    assert r.cycle().gc.decisions[0].reason.value == "Live"  # the caught-up beat is a change the cache shows
    now[0] += 61
    rep = r.cycle()
    assert rep.released == ("rc-rg-train",) and rep.gc.decisions[0].reason.value == "HeartbeatLost" and kube.patches


def test_a_driver_that_lost_api_access_keeps_its_running_gang_on_rays_word(caplog):
    """Issue 24 item 1: a READY gang whose driver can no longer write its heartbeat (token expired, RoleBinding
    revoked) while Ray says its job is alive and its placement group CREATED is kept for three heartbeat timeouts
    and more, with one log line saying why; once the job ends (Ray removes its PG) it is released."""
    kube = fake_kube(with_reservation_group("rg-train", replicas=2))
    kube.configmaps = {"rc-rg-train"}
    stale = raw_cm("rc-rg-train", "rg-train", pg="aa", heartbeat_at_s=NOW_S, job="01000000")
    kube.objects[("ConfigMap", "rc-rg-train")] = stale  # the live read agrees: the heartbeat really stopped
    cache = FakeCache(kube, [ReservationRecord.from_configmap(stale)])
    ray = [ray_view({}, pgs=A_PG)]
    jobs = [{"01000000": True}]
    now = [NOW_S]
    r = reclaimer(kube, cache)
    r.read_ray, r.read_jobs, r.clock = (lambda address, timeout_s, now_s: ray[0]), (lambda a: jobs[0]), lambda: now[0]
    assert r.cycle().gc.decisions[0].reason.value == "Live"
    caplog.clear()  # what the cycles past the heartbeat timeout say, only
    with caplog.at_level(logging.INFO, logger="raygpu.sidecar"):
        for _ in range(4):  # 4 x 61 s: past three heartbeat timeouts
            now[0] += 61
            rep = r.cycle()
            assert rep.gc.decisions[0].reason.value == "RaySaysAlive" and rep.released == ()
    assert groups(kube)["rg-train"]["replicas"] == 2 and kube.configmaps == {"rc-rg-train"}
    said = [rec for rec in caplog.records if rec.getMessage() == "gc-decision"]
    assert len(said) == 1 and "kept on Ray's word" in said[0].fields["detail"]
    ray[0], jobs[0] = ray_view({}, pgs=[]), {"01000000": False}  # the job ended: Ray removed its PG with it
    now[0] += 1
    rep = r.cycle()
    assert rep.released == ("rc-rg-train",) and rep.gc.decisions[0].reason.value == "PlacementGroupGone"
    assert groups(kube).get("rg-train", {"replicas": 0})["replicas"] == 0


def test_dry_run_releases_a_dead_drivers_reservation_and_scales_nothing_down():
    """Issue 14 item 8: releasing a dead driver's reservation is the safe action, in every mode but off."""
    kube = fake_kube(with_reservation_group("rg-x", replicas=1))
    kube.raw["metadata"]["annotations"]["raygpu.io/reclaim"] = "dry-run"
    kube.configmaps = {"rc-rg-x"}
    dead = state_cm("rc-rg-x", "rg-x", state="reserved", pg="gone", heartbeat_at_s=NOW_S)
    r = reclaimer(kube, FakeCache(kube, [dead]))
    rep = r.cycle()
    assert rep.released == ("rc-rg-x",) and kube.configmaps == set()
    assert list(groups(kube)) == ["gpu", "small"]  # the reservation group removed ...
    assert groups(kube)["gpu"] == RECORDED["spec"]["workerGroupSpecs"][0]  # ... the idle workers not
    assert rep.plan.deleted_pods and len(kube.with_reason("ScaleDownDryRun")) == 1


def test_off_releases_nothing():
    kube = fake_kube(with_reservation_group("rg-x", replicas=1))
    kube.raw["metadata"]["annotations"]["raygpu.io/reclaim"] = "off"
    kube.configmaps = {"rc-rg-x"}
    r = reclaimer(kube, FakeCache(kube, [state_cm("rc-rg-x", "rg-x", state="released")]))
    assert r.cycle().outcome is CycleOutcome.OFF and kube.deleted == [] and kube.patches == []


def test_apply_release_writes_only_what_is_proven_at_write_time():
    """The group proof is re-checked on the RayCluster the patch is tested against; a ConfigMap is deleted only
    with the uid read; a decision without a proven ConfigMap is refused with a clear error."""
    from raygpu.model.gc import GcAction, GcDecision, GcReason
    from raygpu.reclaim.apply import ReleaseStatus, apply_release
    kube = fake_kube(with_reservation_group("rg-a100", replicas=1, labelled=False))
    kube.configmaps, kube.configmap_uids = {"rc-rg-a100"}, {"rc-rg-a100": "uid-new"}
    stale = GcDecision(reservation="rc-rg-a100", group="rg-a100", action=GcAction.RELEASE, reason=GcReason.TERMINAL,
                       group_owned=True, state_uid="uid-old")  # proofs that no longer hold
    assert apply_release(kube, NS, "rc", stale).status is ReleaseStatus.ALREADY_RELEASED
    lost = stale.model_copy(update={"action": GcAction.SCALE_TO_ZERO, "state_uid": ""})
    assert apply_release(kube, NS, "rc", lost).status is ReleaseStatus.ALREADY_RELEASED
    unproven = stale.model_copy(update={"state_uid": ""})
    refused = apply_release(kube, NS, "rc", unproven)
    assert refused.status is ReleaseStatus.FAILED and "no proven state ConfigMap" in refused.error
    assert kube.patches == [] and kube.deleted == [] and kube.configmaps == {"rc-rg-a100"}
    assert groups(kube)["rg-a100"]["replicas"] == 1


def test_the_sidecar_plans_its_cycle_with_the_collector_paused_and_restores_it(monkeypatch):
    # the sidecar owns its process: it pauses the cyclic collector around plan_cycle (plan/common/collector.py)
    import gc

    import raygpu.reclaim.loop as loop

    seen: list[bool] = []
    real = loop.plan_cycle
    monkeypatch.setattr(loop, "plan_cycle", lambda state: (seen.append(gc.isenabled()), real(state))[1])
    was = gc.isenabled()
    gc.enable()
    try:
        assert reclaimer(fake_kube(RECORDED)).cycle().outcome is CycleOutcome.APPLIED
        assert seen == [False]
        assert gc.isenabled()
    finally:
        (gc.enable if was else gc.disable)()


def test_an_invalid_spec_is_a_warning_event_on_the_raycluster_and_never_an_exception():
    """The watch cache's on_problem (reclaim.loop.problem_reporter): an Event on this namespace's RayCluster only."""
    kube = fake_kube(RECORDED)
    problem_reporter(kube, NS, "rc")("Pod w1: rayStartParams num-gpus 'abc'")
    (ev,) = kube.with_reason("InvalidSpec")
    assert (ev.kind, ev.name, ev.type) == ("RayCluster", "rc", "Warning") and "'abc'" in ev.message
    problem_reporter(kube, "elsewhere", "rc")("no such RayCluster in this namespace")  # no Event, no exception
    kube.fail("get", TransientError("get RayCluster: 503"))
    problem_reporter(kube, NS, "rc")("the uid lookup fails")  # logged, not raised
    assert len(kube.with_reason("InvalidSpec")) == 1
