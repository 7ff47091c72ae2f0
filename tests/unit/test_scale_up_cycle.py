"""Gang scale-up in the sidecar's cycle, against the one fake Kubernetes (API-server semantics: a failed
``test`` rejects a patch, a second create of a name is refused) and a watch cache that reads it back."""

from __future__ import annotations

import copy

from raygpu.adapters.kube_watch import CacheView
from raygpu.errors import TransientError
from raygpu.model.gc import ReservationRecord
from raygpu.model.labels import (ANNOTATION_PLACEMENT_GROUP, ANNOTATION_RESERVATION_STATE, CREATED_BY_SCALE_UP,
                                 LABEL_CREATED_BY, LABEL_RESERVATION)
from raygpu.model.raycluster import RayClusterView
from raygpu.model.views import PgState, PlacementGroupView, RayNodeView, RayView
from raygpu.plan.scale_up import GRACE_S, scale_up_name
from raygpu.reclaim.loop import CycleOutcome, Reclaimer, SidecarConfig
from raygpu.testing.builders.recorded import ALL_IDLE, NOW_S, NS, PODS, RECORDED, ray_view
from raygpu.testing.fake_kube import FakeKube

PG = "5e" * 9
NAME = scale_up_name(PG)
GANG = f"rc-rg-{NAME}"  # the state ConfigMap and PodGroup
GROUP = f"rg-{NAME}"


def recorded(**annotations: str) -> dict:
    raw = copy.deepcopy(RECORDED)
    raw["metadata"]["annotations"] = {**raw["metadata"]["annotations"], "raygpu.io/gang-scale-up": "on",
                                      "raygpu.io/gang-backend": "coscheduling", **annotations}
    return raw


class LiveCache:
    """A watch cache that reads the fake's RayCluster and state ConfigMaps back at every view."""

    def __init__(self, kube: FakeKube) -> None:
        self.kube = kube

    def view(self) -> CacheView:
        records = tuple(ReservationRecord.from_configmap(o) for (kind, _, _), o in sorted(self.kube.objects.items())
                        if kind == "ConfigMap" and LABEL_RESERVATION in (o["metadata"].get("labels") or {}))
        return CacheView(RayClusterView.from_k8s(self.kube.raw), PODS, records, True)

    def assume_cluster(self, written, planned_from_rv):
        pass

    def wait_cluster_change(self, resource_version, timeout_s):
        return True


def pending(n: int = 4, state: PgState = PgState.PENDING, on=()) -> PlacementGroupView:
    return PlacementGroupView(pg_id=PG, state=state, strategy="STRICT_SPREAD", bundles=({"GPU": 8.0},) * n,
                              bundle_node_ids=on or (None,) * n, created_ms=1.0)


class World:
    """The fake API server, a clock, Ray's view (settable) and a sidecar; ``restart`` makes a new sidecar."""

    def __init__(self, raw: dict, ray: RayView) -> None:
        self.kube = FakeKube(raw, pods=PODS)
        self.now, self.ray = NOW_S, ray
        self.drained: list[str] = []
        self.refuse_drain = False
        self.sidecar = self.restart()

    def restart(self) -> Reclaimer:
        cfg = SidecarConfig(namespace=NS, cluster="rc", ray_address="127.0.0.1:1", interval_s=0.01,
                            startup_grace_s=0)

        def drain(node_id, msg):
            if self.refuse_drain:
                return False, "node is busy"
            self.drained.append(node_id)
            return True, ""
        self.sidecar = Reclaimer(self.kube, LiveCache(self.kube), cfg, clock=lambda: self.now,
                                 read_ray=lambda address, timeout_s, now_s: self.ray, read_jobs=lambda a: {},
                                 drain=drain)
        return self.sidecar

    def cycle(self, after_s: float = 0.0):
        self.now += after_s
        report = self.sidecar.cycle()
        self.collect_owned()
        return report

    def collect_owned(self) -> None:
        """Kubernetes' garbage collector: objects whose owner (by uid) is gone go too."""
        uids = {o["metadata"].get("uid") for o in self.kube.objects.values()} | {self.kube.raw["metadata"]["uid"]}
        for key, o in list(self.kube.objects.items()):
            owners = [r["uid"] for r in o["metadata"].get("ownerReferences") or []]
            if owners and not any(u in uids for u in owners):
                del self.kube.objects[key]

    def state_cm(self) -> dict | None:
        return self.kube.obj("ConfigMap", GANG, NS)

    def groups(self) -> list[str]:
        return [g["groupName"] for g in self.kube.raw["spec"]["workerGroupSpecs"]]


def gpu_ray(*pgs: PlacementGroupView, extra=()) -> RayView:
    base = ray_view(ALL_IDLE)
    return base.model_copy(update={"nodes": (*base.nodes, *extra), "placement_groups": pgs})


def reservation_nodes(n: int = 4) -> tuple[RayNodeView, ...]:
    return tuple(RayNodeView(node_id=f"r{i}", alive=True, instance_id=f"{GROUP}-{i}", node_type=GROUP,
                             labels={LABEL_RESERVATION: GROUP}, total={"GPU": 8.0}, available={"GPU": 8.0})
                 for i in range(n))


def test_a_pending_gang_gets_one_reservation_after_the_grace_and_a_restarted_sidecar_makes_no_second():
    w = World(recorded(**{"raygpu.io/reclaim": "off"}), gpu_ray(pending()))
    assert w.cycle().outcome is CycleOutcome.IDLE  # first seen now: under the grace
    assert w.state_cm() is None
    report = w.cycle(GRACE_S + 1)
    assert report.outcome is CycleOutcome.APPLIED and report.reserved == (NAME,)
    cm = w.state_cm()
    assert cm is not None
    assert cm["metadata"]["labels"][LABEL_CREATED_BY] == CREATED_BY_SCALE_UP
    assert cm["metadata"]["annotations"][ANNOTATION_PLACEMENT_GROUP] == PG
    assert cm["metadata"]["annotations"][ANNOTATION_RESERVATION_STATE] == "reserved"
    pod_group = w.kube.obj("PodGroup", GANG, NS)
    assert pod_group is not None and pod_group["spec"]["minMember"] == 4
    assert pod_group["metadata"]["ownerReferences"][0]["uid"] == cm["metadata"]["uid"]
    assert w.groups().count(GROUP) == 1
    spec = w.kube.raw["spec"]["workerGroupSpecs"][w.groups().index(GROUP)]
    assert spec["replicas"] == spec["minReplicas"] == spec["maxReplicas"] == 4
    assert w.kube.with_reason("GangScaleUp") and PG in w.kube.with_reason("GangScaleUp")[0].message
    patches = len(w.kube.patches)
    for sidecar in (w.sidecar, w.restart()):  # the same process, then a restarted one (no memory)
        w.sidecar = sidecar
        w.cycle(GRACE_S + 1)
        assert w.groups().count(GROUP) == 1 and len(w.kube.patches) == patches  # never a second one


def test_reclaim_off_and_scale_up_off_writes_nothing():
    w = World(recorded(**{"raygpu.io/reclaim": "off", "raygpu.io/gang-scale-up": "off"}), gpu_ray(pending()))
    assert w.cycle().outcome is CycleOutcome.OFF and w.cycle(60).outcome is CycleOutcome.OFF
    assert w.state_cm() is None and w.kube.patches == []


def test_scale_down_and_scale_up_in_one_cycle_the_second_patch_replans_on_the_conflict():
    w = World(recorded(), gpu_ray(pending()))
    w.sidecar._scale_up.first_seen[PG] = w.now - GRACE_S - 1  # seen pending before: both act in this cycle
    report = w.cycle()
    assert report.deleted_pods and report.reserved == (NAME,)  # the scale-down's patch moved the resourceVersion
    assert len(w.kube.patches) == 2 and w.groups().count(GROUP) == 1


def test_the_reservation_is_marked_ready_when_ray_places_the_group_on_its_pods_and_released_when_it_goes():
    w = World(recorded(**{"raygpu.io/reclaim": "off"}), gpu_ray(pending()))
    w.cycle()
    w.cycle(GRACE_S + 1)
    nodes = reservation_nodes()
    w.ray = gpu_ray(pending(state=PgState.CREATED, on=tuple(n.node_id for n in nodes)), extra=nodes)
    w.cycle(5)
    assert w.state_cm()["metadata"]["annotations"][ANNOTATION_RESERVATION_STATE] == "ready"
    w.ray = gpu_ray(extra=nodes)  # the job ended: its placement group left Ray's table
    w.cycle(5)
    assert set(w.drained) == {n.node_id for n in nodes}  # Ray drained them before the pods were deleted
    assert GROUP not in w.groups() and w.state_cm() is None  # (the fake has no pods to wait for)
    assert "PlacementGroupGone" in w.kube.with_reason("ReservationReleased")[-1].message


def test_a_node_ray_will_not_drain_defers_the_release():
    w = World(recorded(**{"raygpu.io/reclaim": "off"}), gpu_ray(pending()))
    w.cycle()
    w.cycle(GRACE_S + 1)
    w.refuse_drain = True
    w.ray = gpu_ray(pending(state=PgState.CREATED, on=("elsewhere",) * 4), extra=reservation_nodes())
    w.cycle(5)
    spec = w.kube.raw["spec"]["workerGroupSpecs"][w.groups().index(GROUP)]
    assert spec["replicas"] == 4  # nothing written while Ray refuses
    w.refuse_drain = False
    w.cycle(5)
    assert GROUP not in w.groups() and w.state_cm() is None
    assert "PlacedElsewhere" in w.kube.with_reason("ReservationReleased")[-1].message


def test_a_reservation_still_unused_at_its_deadline_is_rolled_back_and_retried_after_a_back_off():
    w = World(recorded(**{"raygpu.io/reclaim": "off", "raygpu.io/gang-scale-up-timeout": "60s"}), gpu_ray(pending()))
    w.cycle()
    w.cycle(GRACE_S + 1)
    assert w.state_cm() is not None
    w.cycle(5)  # the deadline counts on the sidecar's clock from when it first saw the state ConfigMap
    assert w.state_cm() is not None
    w.cycle(61)  # past the deadline with no pods: released at once (nothing to drain)
    assert w.state_cm() is None and GROUP not in w.groups()
    released = w.kube.with_reason("ReservationReleased")
    assert released and "TimedOut" in released[-1].message
    w.cycle(5)
    assert w.state_cm() is None  # backing off
    w.cycle(30)
    assert w.state_cm() is not None  # retried after the back-off


def test_a_failed_write_rolls_back_backs_off_and_leaves_nothing():
    w = World(recorded(**{"raygpu.io/reclaim": "off"}), gpu_ray(pending()))
    w.cycle()
    w.kube.fail("create", TransientError("503: the API server is overloaded"), when=lambda obj: obj["kind"] == "PodGroup")
    report = w.cycle(GRACE_S + 1)
    assert report.reserved == ()
    assert w.state_cm() is None and w.kube.obj("PodGroup", GANG, NS) is None and GROUP not in w.groups()
    assert w.sidecar.metrics.registry.get_sample_value("raygpu_scale_up_reservations_total",
                                                       {"result": "failed"}) == 1
    w.cycle(5)
    assert w.state_cm() is None  # backing off
    w.cycle(30)
    assert w.state_cm() is not None


def test_a_lost_create_answer_is_not_a_second_reservation():
    w = World(recorded(**{"raygpu.io/reclaim": "off"}), gpu_ray(pending()))
    w.cycle()
    w.kube.fail("create", TransientError("connection reset"), lost=True,
                when=lambda obj: obj["kind"] == "ConfigMap")
    w.cycle(GRACE_S + 1)
    # the create landed and its answer was lost: undone (this call's request id), nothing half-made stays
    assert w.state_cm() is None and GROUP not in w.groups()
    w.cycle(30)
    assert w.state_cm() is not None and w.groups().count(GROUP) == 1


def test_a_look_alike_configmap_of_that_name_is_never_overwritten():
    w = World(recorded(**{"raygpu.io/reclaim": "off"}), gpu_ray(pending()))
    w.kube.put({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": GANG, "namespace": NS,
                                                                     "labels": {"app": "mine"}}, "data": {"k": "v"}})
    w.cycle()
    w.cycle(GRACE_S + 1)
    cm = w.state_cm()
    assert cm["data"] == {"k": "v"} and GROUP not in w.groups()
    assert w.sidecar.metrics.registry.get_sample_value("raygpu_scale_up_reservations_total",
                                                       {"result": "exists"}) == 1


def test_bundle_label_selectors_choose_the_group_the_reservation_copies():
    raw = recorded(**{"raygpu.io/reclaim": "off"})
    small = next(g for g in raw["spec"]["workerGroupSpecs"] if g["groupName"] == "small")
    small["labels"] = {"tier": "small"}
    pg = PlacementGroupView(pg_id=PG, state=PgState.PENDING, strategy="PACK", bundles=({"GPU": 1.0},) * 2,
                            bundle_node_ids=(None, None), bundle_label_selectors=({"tier": "small"},) * 2,
                            created_ms=1.0)
    w = World(raw, gpu_ray(pg))
    w.cycle()
    assert w.cycle(GRACE_S + 1).reserved == (NAME,)
    spec = w.kube.raw["spec"]["workerGroupSpecs"][w.groups().index(GROUP)]
    assert spec["labels"] == {"tier": "small", LABEL_RESERVATION: GROUP}  # Ray labels its selectors match
    assert spec["template"]["spec"]["containers"] == small["template"]["spec"]["containers"]
