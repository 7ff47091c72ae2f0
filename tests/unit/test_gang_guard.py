"""gang/guard.py on the one fake Kubernetes: a guarded reservation's Lease, placeholders, swap, timeout, release."""

from __future__ import annotations

import time

import pytest

from raygpu.errors import ConflictError, PermanentError
from raygpu.gang.guard import GUARD_EVERY_S, Guard
from raygpu.gang.reservation import reserve
from raygpu.model.gang import ReservationState
from raygpu.model.labels import (ANNOTATION_GUARD_TIMEOUTS, GUARD_GATE, KEY_GUARD_SCOPE, LABEL_PLACEHOLDER,
                                 LABEL_RESERVATION, PRIORITY_CLASS_GANG, PRIORITY_CLASS_PLACEHOLDER)
from raygpu.model.views import K8sPodView
from raygpu.testing.builders.clusters import cluster, gang, gpus
from raygpu.testing.fake_kube import FakeKube

S = ReservationState
GPU = "nvidia.com/gpu"
LEASE = ("Lease", "raygpu-guard-default")


class Clock:
    def __init__(self) -> None:
        self.now_s = 100.0

    def __call__(self) -> float:
        return self.now_s

    def tick(self, s: float = GUARD_EVERY_S) -> None:
        self.now_s += s


def node(name: str, gpus_free_by_others: int = 0) -> dict:
    return {"metadata": {"name": name, "labels": {}}, "spec": {},
            "status": {"allocatable": {GPU: "8", "cpu": "64", "memory": "512Gi"},
                       "conditions": [{"type": "Ready", "status": "True"}]}}


def tenant(name: str, node_name: str, n: int) -> dict:
    return {"metadata": {"name": name, "namespace": "default", "labels": {}},
            "spec": {"nodeName": node_name, "containers": [{"name": "x", "resources": {"requests": {GPU: str(n)}}}]},
            "status": {"phase": "Running"}}


class World:
    """Cluster c (8-GPU template, annotation max-hold 90s) on nodes n1-n3; n1 has 6 GPUs taken, n3 2."""

    def __init__(self, annotations: dict | None = None, classes: bool = True, **request) -> None:
        raw = cluster("c").worker("gpu", gpus=8).raw()
        raw["metadata"]["annotations"].update(annotations or {"raygpu.io/max-hold": "90s"})
        self.kube = FakeKube(raw, kuberay=True)
        if classes:
            for pc in (PRIORITY_CLASS_PLACEHOLDER, PRIORITY_CLASS_GANG):
                self.kube.objects[("PriorityClass", pc)] = {"metadata": {"name": pc}}
        for n in ("n1", "n2", "n3"):
            self.kube.objects[("Node", n)] = node(n)
        self.kube.objects[("Pod", "t1")] = tenant("t1", "n1", 6)
        self.kube.objects[("Pod", "t3")] = tenant("t3", "n3", 2)
        self.clock = Clock()
        self.said: list[str] = []
        kw = {"guard": True, "backend": "none", **request}
        self.rsv = reserve(self.kube, gang(gpus(8, 2), timeout_s=600, **kw), time.time())
        self.group = self.rsv.plan.reservation_group
        self.kube.extra_pods = [K8sPodView(name=f"{self.group}-{i}", namespace="default", labels={
            LABEL_RESERVATION: self.group}, ray_cluster="c", ray_group=self.group) for i in range(2)]
        for p in self.kube.extra_pods:  # the same pods as objects, for the swap's patches
            self.kube.objects[("Pod", p.name)] = {"metadata": {"name": p.name, "labels": dict(p.labels),
                                                                "resourceVersion": "1"}, "spec": {}}
        self.guard = Guard.of(self.rsv, self.clock, self.said.append)

    def step(self, state: S = S.RESERVED) -> None:
        self.clock.tick()
        self.guard.step(state)

    def placeholders(self) -> dict[str, dict]:
        return {k[1]: o for k, o in self.kube.objects.items() if k[0] == "Pod" and LABEL_PLACEHOLDER in
                o["metadata"].get("labels", {})}

    def bind_all(self) -> None:
        for p in self.placeholders().values():
            p["spec"]["nodeName"] = p["spec"]["affinity"]["nodeAffinity"][
                "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][0]["matchFields"][0]["values"][0]
            p["status"] = {"phase": "Running"}

    def lease(self) -> dict | None:
        return self.kube.objects.get(LEASE)


def test_a_guarded_reservation_needs_backend_none_and_the_priority_classes_and_writes_nothing_without():
    with pytest.raises(PermanentError, match="raygpu-guard-placeholder"):
        World(classes=False)
    with pytest.raises(PermanentError, match="backend none"):
        World(backend="coscheduling")
    for bad in (dict(guard="yes"), dict(expected_runtime_s=0), dict(expected_runtime_s=float("nan")),
                dict(expected_runtime_s="10")):
        with pytest.raises(PermanentError):
            World(**bad)


def test_a_guarded_reservations_pods_are_gated_with_the_gang_priority_and_its_state_names_the_scope():
    world = World(expected_runtime_s=120)
    group = next(g for g in world.kube.raw["spec"]["workerGroupSpecs"] if g["groupName"] == world.group)
    pod = group["template"]["spec"]
    assert pod["priorityClassName"] == PRIORITY_CLASS_GANG and pod["schedulingGates"] == [{"name": GUARD_GATE}]
    cm = world.kube.objects[("ConfigMap", world.rsv.plan.gang_name)]
    assert cm["metadata"]["labels"][KEY_GUARD_SCOPE] == "default"
    assert cm["metadata"]["annotations"]["raygpu.io/expected-runtime-s"] == "120"


def test_unguarded_reservations_are_unchanged():
    raw = cluster("c").worker("gpu", gpus=8).raw()
    kube = FakeKube(raw, kuberay=True)
    rsv = reserve(kube, gang(gpus(8, 2), backend="none"), time.time())
    spec = next(g for g in kube.raw["spec"]["workerGroupSpecs"] if g["groupName"] == rsv.plan.reservation_group)
    assert "schedulingGates" not in spec["template"]["spec"] and rsv.guard is None


def test_the_first_in_line_takes_the_lease_and_places_placeholders_on_the_freest_nodes():
    world = World()
    world.step()
    assert world.lease()["spec"]["holderIdentity"] == world.rsv.plan.gang_name
    ph = world.placeholders()
    assert len(ph) == 16 and all(p["spec"]["priorityClassName"] == PRIORITY_CLASS_PLACEHOLDER for p in ph.values())
    nodes = sorted({p["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
                    ["nodeSelectorTerms"][0]["matchFields"][0]["values"][0] for p in ph.values()})
    assert nodes == ["n2", "n3"]  # n1 has only 2 GPUs free
    owner = next(iter(ph.values()))["metadata"]["ownerReferences"][0]
    assert owner["uid"] == world.rsv.state_uid and owner["kind"] == "ConfigMap"
    assert [e.reason for e in world.kube.events] == ["GuardHeld"]


def test_an_older_waiting_gang_keeps_the_scope_and_nothing_is_placed():
    world = World()
    world.kube.objects[("ConfigMap", "older")] = {"metadata": {
        "name": "older", "creationTimestamp": "2000-01-01T00:00:00Z", "labels": {KEY_GUARD_SCOPE: "default"},
        "annotations": {"raygpu.io/reservation-state": "reserved"}}}
    world.kube.objects[("ConfigMap", world.rsv.plan.gang_name)]["metadata"]["creationTimestamp"] = "2030-01-01T00:00:00Z"
    world.step()
    assert world.lease() is None and not world.placeholders()


def test_a_lease_written_by_someone_else_between_read_and_write_is_never_overwritten():
    world = World()
    world.step()  # ours now
    world.clock.tick(60)
    world.kube.fail("merge_patch", ConflictError("409"), when=lambda *a: a[1] == "Lease")
    with pytest.raises(ConflictError):
        world.guard.step(S.RESERVED)  # renew: the write raised; the next step re-reads
    theirs = world.lease()
    theirs["spec"]["holderIdentity"], theirs["metadata"]["resourceVersion"] = "someone-else", "99"
    world.clock.tick(5)
    with pytest.raises(ConflictError):  # renewing with the resourceVersion we read would overwrite: refused
        world.guard._write_lease(world.guard._read_lease().model_copy(update={"resource_version": "98"}), False)
    assert world.lease()["spec"]["holderIdentity"] == "someone-else"


def test_all_placeholders_holding_swaps_the_pinned_gang_in_and_admission_releases_everything():
    world = World()
    world.step()
    world.bind_all()
    world.step()
    patches = [c[1] for c in world.kube.calls if c[0] == "merge_patch" and c[1][1] == "Pod"]
    pins = [p[4]["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
            ["nodeSelectorTerms"][0]["matchFields"][0]["values"] for p in patches if "affinity" in p[4]["spec"]]
    assert sorted(v[0] for v in pins) == ["n2", "n3"]
    assert [p[2] for p in patches if p[4]["spec"] == {"schedulingGates": None}] == [f"{world.group}-0", f"{world.group}-1"]
    mine = world.placeholders()
    world.kube.objects[("Pod", "not-mine")] = {"metadata": {"name": "not-mine", "labels": {
        LABEL_PLACEHOLDER: world.group}, "ownerReferences": [{"kind": "ConfigMap", "uid": "someone-else"}]},
        "spec": {}}
    world.step(S.ADMITTED)
    assert set(world.placeholders()) == {"not-mine"} and mine
    assert "holderIdentity" not in world.lease()["spec"]
    assert [e.reason for e in world.kube.events] == ["GuardHeld", "GuardReleased"]


def test_past_max_hold_the_placeholders_go_the_lease_is_freed_and_the_gang_queues_behind():
    world = World()
    world.step()
    world.clock.tick(91)
    world.step()
    assert not world.placeholders() and "holderIdentity" not in world.lease()["spec"]
    cm = world.kube.objects[("ConfigMap", world.rsv.plan.gang_name)]
    assert cm["metadata"]["annotations"][ANNOTATION_GUARD_TIMEOUTS] == "1"
    assert [e.reason for e in world.kube.events] == ["GuardHeld", "GuardTimedOut"] and world.guard.failed is None


def test_a_bad_max_hold_gets_an_event_and_the_default():
    world = World(annotations={"raygpu.io/max-hold": "soon"})
    assert world.rsv.guard.max_hold_s == 900.0
    assert [(e.reason, e.type) for e in world.kube.events] == [("InvalidAnnotation", "Warning")]
