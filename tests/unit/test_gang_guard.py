"""guard/holder.py on the one fake Kubernetes: a guarded reservation's Lease, blockers, swap, timeout, release."""

from __future__ import annotations

import time

import pytest

from raygpu.errors import ConflictError, PermanentError, RayGpuError
from raygpu.guard.holder import GUARD_EVERY_S, Guard
from raygpu.gang.reservation import reserve
from raygpu.model.gang import ReservationState
from raygpu.model.labels import (ANNOTATION_GUARD_TIMEOUTS, GUARD_GATE, KEY_GUARD_SCOPE, LABEL_BLOCKER,
                                 LABEL_GUARD_FOR, LABEL_GUARD_PASS, LABEL_RESERVATION, PRIORITY_CLASS_BLOCKER)
from raygpu.model.guard import LEASE_DURATION_S, STEP_DOWN_S, HoldPhase, guard_tag
from raygpu.model.views import K8sPodView
from raygpu.testing.builders.clusters import cluster, gang, gpus
from raygpu.testing.fake_kube import FakeKube

S = ReservationState
GPU = "nvidia.com/gpu"
LEASE = ("Lease", "raygpu-system", "raygpu-guard-default")


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
    """Cluster c (8-GPU template, annotation max-hold 90s) on nodes n1-n3; n1 has 6 GPUs taken (t1), n3 2 (t3).
    The guarded gang is 2 x 8 GPUs: it is given n2 (free) and n3 (free once t3 ends)."""

    def __init__(self, annotations: dict | None = None, classes: bool = True, **request) -> None:
        raw = cluster("c").worker("gpu", gpus=8).raw()
        raw["metadata"]["annotations"].update(annotations or {"raygpu.io/max-hold": "90s"})
        self.kube = FakeKube(raw, kuberay=True)
        if classes:
            self.kube.objects[("PriorityClass", None, PRIORITY_CLASS_BLOCKER)] = {"metadata": {"name": PRIORITY_CLASS_BLOCKER}}
        for n in ("n1", "n2", "n3"):
            self.kube.objects[("Node", None, n)] = node(n)
        self.kube.objects[("Pod", "default", "t1")] = tenant("t1", "n1", 6)
        self.kube.objects[("Pod", "default", "t3")] = tenant("t3", "n3", 2)
        self.deletes: list[tuple[str, str, str | None]] = []
        real_delete = self.kube.delete

        def delete(api_version, kind, name, namespace=None, *, uid=None):
            self.deletes.append((kind, name, uid))
            return real_delete(api_version, kind, name, namespace, uid=uid)
        self.kube.delete = delete
        self.clock = Clock()
        self.said: list[str] = []
        kw = {"guard": True, "backend": "none", **request}
        self.rsv = reserve(self.kube, gang(gpus(8, 2), timeout_s=600, **kw), time.time())
        self.group = self.rsv.plan.reservation_group
        self.kube.extra_pods = [K8sPodView(name=f"{self.group}-{i}", namespace="default", labels={
            LABEL_RESERVATION: self.group}, ray_cluster="c", ray_group=self.group) for i in range(2)]
        for p in self.kube.extra_pods:  # the same pods as objects, for the swap's patches
            self.kube.objects[("Pod", "default", p.name)] = {"metadata": {"name": p.name, "labels": dict(p.labels),
                                                                "resourceVersion": "1"}, "spec": {}}
        self.guard = Guard.of(self.rsv, self.clock, self.said.append)

    def step(self, state: S = S.RESERVED) -> None:
        self.clock.tick()
        self.guard.step(state)

    def blockers(self) -> dict[str, dict]:
        """Blocker pods in the guard namespace, anyone's but the ones a test put there itself."""
        return {k[2]: o for k, o in self.kube.objects.items() if k[0] == "Pod" and LABEL_BLOCKER in
                o["metadata"].get("labels", {}) and not k[2].startswith("other-ns-")}

    def bind_gang(self) -> None:
        """The scheduler binds the gang's pods where the swap pinned them."""
        pins = {c[1][2]: c[1][4]["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
                ["nodeSelectorTerms"][0]["matchFields"][0]["values"][0] for c in self.kube.calls
                if c[0] == "merge_patch" and c[1][1] == "Pod" and "affinity" in c[1][4].get("spec", {})}
        self.kube.extra_pods = [p.model_copy(update={"node_name": pins[p.name], "phase": "Running"})
                                for p in self.kube.extra_pods]

    def pod_patches(self) -> list[tuple]:
        return [c[1] for c in self.kube.calls if c[0] == "merge_patch" and c[1][1] == "Pod"]

    def lease(self) -> dict | None:
        return self.kube.objects.get(LEASE)


def test_a_guarded_reservation_needs_backend_none_and_the_blocker_priority_class_and_writes_nothing_without():
    with pytest.raises(PermanentError, match=PRIORITY_CLASS_BLOCKER):
        World(classes=False)
    with pytest.raises(PermanentError, match="backend none"):
        World(backend="coscheduling")
    for bad in (dict(guard="yes"), dict(expected_runtime_s=0), dict(expected_runtime_s=float("nan")),
                dict(expected_runtime_s="10")):
        with pytest.raises(PermanentError):
            World(**bad)


def test_a_guarded_reservations_pods_are_gated_keep_the_users_priority_and_its_state_names_the_scope():
    world = World(expected_runtime_s=120)
    group = next(g for g in world.kube.raw["spec"]["workerGroupSpecs"] if g["groupName"] == world.group)
    pod = group["template"]["spec"]
    assert pod["schedulingGates"] == [{"name": GUARD_GATE}] and "priorityClassName" not in pod
    cm = world.kube.objects[("ConfigMap", "default", world.rsv.plan.gang_name)]
    assert cm["metadata"]["labels"][KEY_GUARD_SCOPE] == "default"
    assert cm["metadata"]["annotations"]["raygpu.io/expected-runtime-s"] == "120"


def test_unguarded_reservations_are_unchanged():
    raw = cluster("c").worker("gpu", gpus=8).raw()
    kube = FakeKube(raw, kuberay=True)
    rsv = reserve(kube, gang(gpus(8, 2), backend="none"), time.time())
    spec = next(g for g in kube.raw["spec"]["workerGroupSpecs"] if g["groupName"] == rsv.plan.reservation_group)
    assert "schedulingGates" not in spec["template"]["spec"] and rsv.wiring.guard is None


def test_the_first_in_line_takes_the_lease_and_binds_a_blocker_to_each_of_the_freest_nodes():
    world = World()
    world.step()
    tag = world.guard.tag
    assert tag == guard_tag("default", world.rsv.plan.gang_name)
    assert world.lease()["spec"]["holderIdentity"] == tag
    bl = world.blockers()
    assert sorted(b["spec"]["nodeName"] for b in bl.values()) == ["n2", "n3"]  # n1 has only 2 GPUs free
    for b in bl.values():
        spec = b["spec"]
        assert spec["priorityClassName"] == PRIORITY_CLASS_BLOCKER and "schedulerName" not in spec
        assert all(GPU not in c["resources"]["requests"] for c in spec["containers"])
        [term] = spec["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        assert term == {"labelSelector": {"matchExpressions": [  # ANDed: blocked unless the gang's or with its pass
                            {"key": LABEL_GUARD_FOR, "operator": "NotIn", "values": [tag]},
                            {"key": LABEL_GUARD_PASS, "operator": "NotIn", "values": [tag]}]},
                        "namespaceSelector": {}, "topologyKey": "kubernetes.io/hostname"}
        assert b["metadata"]["labels"][LABEL_GUARD_FOR] == tag  # its own anti-affinity never matches itself
        assert b["metadata"]["namespace"] == "raygpu-system" and b["metadata"]["labels"][KEY_GUARD_SCOPE] == "default"
        owner = b["metadata"]["ownerReferences"][0]  # its gang's ticket: it goes when the ticket goes
        assert owner["uid"] == world.guard.ticket_uid and owner["kind"] == "Lease" and owner["name"] == world.guard.ticket
    assert [e.reason for e in world.kube.events] == ["GuardHeld"]
    world.step()  # t3 still holds 2 GPUs of n3: no room for the gang yet, nothing created twice
    assert world.pod_patches() == [] and len(world.blockers()) == 2
    assert ("Pod", "default", "t1") in world.kube.objects and ("Pod", "default", "t3") in world.kube.objects  # running pods untouched


def ticket(name_tag: str, created: str, renew: str = "r1", scope: str = "default", **labels) -> dict:
    """A ticket Lease in the guard namespace, as another gang's driver writes it."""
    return {"metadata": {"name": f"raygpu-guard-{scope}.{name_tag}", "namespace": "raygpu-system", "uid": f"uid-{name_tag}",
                         "resourceVersion": "1", "creationTimestamp": created,
                         "labels": {"raygpu.io/guard-ticket": scope, KEY_GUARD_SCOPE: scope, **labels}},
            "spec": {"holderIdentity": name_tag, "leaseDurationSeconds": 30, "renewTime": renew}}


def test_an_older_waiting_gang_keeps_the_scope_and_nothing_is_placed():
    world = World()
    # (the fake API server writes no creationTimestamp: ours counts as 1970)
    world.kube.objects[("Lease", "raygpu-system", "raygpu-guard-default.older")] = ticket("older", "1960-01-01T00:00:00Z")
    world.step()
    assert world.lease() is None and not world.blockers()
    assert world.kube.objects[("Lease", "raygpu-system", world.guard.ticket)]["spec"]["holderIdentity"] == world.guard.tag


def test_only_proven_reservations_queue_a_lookalike_never_goes_first_in_line():
    world = World()
    # a ConfigMap that carries the scope label and says "planned", older than every gang: not a ticket, never read
    world.kube.objects[("ConfigMap", "default", "lookalike")] = {"metadata": {
        "name": "lookalike", "namespace": "default", "creationTimestamp": "2000-01-01T00:00:00Z",
        "labels": {KEY_GUARD_SCOPE: "default", LABEL_RESERVATION: "rg-x"},
        "annotations": {"raygpu.io/reservation-state": "planned"}}}
    # Leases in the guard namespace that are not proven tickets: no ticket label, a name that is not
    # <scope lease>.<holder>, another scope's label
    bad = [ticket("a", "2000-01-01T00:00:00Z"), ticket("b", "2000-01-01T00:00:00Z"),
           ticket("c", "2000-01-01T00:00:00Z")]
    del bad[0]["metadata"]["labels"]["raygpu.io/guard-ticket"]
    bad[1]["metadata"]["name"] = "raygpu-guard-default.not-b"
    bad[2]["metadata"]["labels"][KEY_GUARD_SCOPE] = "other"
    for b in bad:
        world.kube.objects[("Lease", "raygpu-system", b["metadata"]["name"])] = b
    world.step()
    assert world.lease()["spec"]["holderIdentity"] == world.guard.tag and len(world.blockers()) == 2


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


def test_room_on_every_blocked_node_swaps_the_labelled_pinned_gang_in_then_only_the_blockers_are_deleted():
    world = World()
    world.step()
    mine = {n: b["metadata"]["uid"] for n, b in world.blockers().items()}
    del world.kube.objects[("Pod", "default", "t3")]  # the tenant's pod on n3 ends on its own
    world.step()
    patches = world.pod_patches()
    pins = {p[2]: p[4]["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
            ["nodeSelectorTerms"][0]["matchFields"][0]["values"][0] for p in patches if "affinity" in p[4]["spec"]}
    assert sorted(pins.values()) == ["n2", "n3"]
    assert all(p[4]["metadata"]["labels"] == {LABEL_GUARD_FOR: world.guard.tag}
               for p in patches if "affinity" in p[4]["spec"])
    assert [p[2] for p in patches if p[4]["spec"] == {"schedulingGates": None}] == [f"{world.group}-0", f"{world.group}-1"]
    world.step()  # ungated, not bound yet: the blockers stay
    assert set(world.blockers()) == set(mine) and world.deletes == []
    world.bind_gang()
    world.step()
    assert not world.blockers() and sorted(world.deletes) == sorted(("Pod", n, uid) for n, uid in mine.items())
    world.kube.objects[("Pod", "default", "not-mine")] = {"metadata": {"name": "not-mine", "labels": {
        LABEL_BLOCKER: world.group}, "ownerReferences": [{"kind": "ConfigMap", "uid": "someone-else"}]}, "spec": {}}
    world.step(S.ADMITTED)
    assert ("Pod", "default", "not-mine") in world.kube.objects and ("Pod", "default", "t1") in world.kube.objects
    assert {d[1] for d in world.deletes if d[0] == "Pod"} == set(mine)  # nothing but our own blockers was ever deleted
    assert {d[1] for d in world.deletes if d[0] == "Lease"} == {world.guard.ticket}  # and our ticket, on release
    assert "holderIdentity" not in world.lease()["spec"]
    assert [e.reason for e in world.kube.events] == ["GuardHeld", "GuardReleased"]


def test_a_swap_cut_short_by_a_failed_patch_is_finished_next_step_although_the_first_pod_took_its_room():
    world = World()
    world.step()
    del world.kube.objects[("Pod", "default", "t3")]
    world.kube.fail("merge_patch", ConflictError("boom"), when=lambda *a: a[1] == "Pod" and a[2].endswith("-1")
                    and a[4]["spec"] == {"schedulingGates": None})
    with pytest.raises(ConflictError):
        world.step()
    world.kube.objects[("Pod", "default", "t3b")] = tenant("t3b", "n3", 8)  # pod 0 now bound there (room taken, as it should)
    world.step()
    ungates = [p[2] for p in world.pod_patches() if p[4]["spec"] == {"schedulingGates": None}]
    assert ungates.count(f"{world.group}-1") == 2  # the failed try (recorded), then the one that lands


def test_a_blocker_that_ended_blocks_nothing_and_the_gang_is_not_swapped_in():
    world = World()
    world.step()
    del world.kube.objects[("Pod", "default", "t3")]
    next(iter(world.blockers().values()))["status"] = {"phase": "Failed"}  # e.g. a kubelet refused it
    world.step()
    assert world.pod_patches() == []


def test_past_max_hold_the_blockers_go_the_lease_is_freed_and_the_gang_queues_behind():
    world = World()
    world.step()
    world.clock.tick(91)
    world.step()
    assert not world.blockers() and "holderIdentity" not in world.lease()["spec"]
    pods_deleted = [d[1] for d in world.deletes if d[0] == "Pod"]
    assert pods_deleted and all(n.startswith(f"{world.guard.tag}-bl-") for n in pods_deleted)
    cm = world.kube.objects[("ConfigMap", "default", world.rsv.plan.gang_name)]
    assert cm["metadata"]["annotations"][ANNOTATION_GUARD_TIMEOUTS] == "1"
    assert [e.reason for e in world.kube.events] == ["GuardHeld", "GuardTimedOut"]


def test_max_hold_bounds_the_total_time_a_gangs_nodes_are_blocked_it_never_holds_again_and_is_rolled_back():
    world = World()  # max-hold 90 s, a lone gang that does not fit within it
    world.step()
    world.clock.tick(91)
    world.step()  # its one hold ran out: the whole of max-hold is spent
    assert world.guard.failed and "max-hold" in world.guard.failed  # the watchdog rolls the gang back
    created = len([c for c in world.kube.calls if c[0] == "create" and c[1][0].get("kind") == "Pod"])
    for _ in range(5):  # still waiting (the watchdog has not finished it yet): it never takes the scope again
        world.step()
    assert not world.blockers() and "holderIdentity" not in world.lease()["spec"]
    assert len([c for c in world.kube.calls if c[0] == "create" and c[1][0].get("kind") == "Pod"]) == created


def test_swapped_in_but_not_bound_by_max_hold_rolls_the_gang_back():
    world = World()
    world.step()
    del world.kube.objects[("Pod", "default", "t3")]
    world.step()  # swapped
    world.clock.tick(91)
    world.step()
    assert not world.blockers() and world.guard.failed and "holderIdentity" not in world.lease()["spec"]


def test_a_bad_max_hold_gets_an_event_and_the_default():
    world = World(annotations={"raygpu.io/max-hold": "soon"})
    assert world.rsv.wiring.guard.max_hold_s == 900.0
    assert [(e.reason, e.type) for e in world.kube.events] == [("InvalidAnnotation", "Warning")]


def test_after_choosing_its_nodes_a_step_reads_only_those_nodes_and_the_pods_bound_there():
    world = World()
    for i in range(50):  # a bigger cluster: none of it should be read on every step
        world.kube.objects[("Node", None, f"x{i}")] = node(f"x{i}")
        world.kube.objects[("Pod", "default", f"u{i}")] = tenant(f"u{i}", f"x{i}", 8)
    world.step()  # chooses n2 and n3 (one full read), creates the blockers
    world.kube.calls.clear()
    world.step()
    reads = [(m, a) for m, a in world.kube.calls if m in ("list", "get") and a[1] in ("Node", "Pod")]
    assert sorted(a[2] for m, a in reads if m == "get") == ["n2", "n3"]
    pod_lists = [a for m, a in reads if m == "list"]
    assert all(a[4] or a[3] for a in pod_lists)  # every Pod list is narrowed by a label or field selector
    assert sorted(a[4] for a in pod_lists if a[4]) == ["spec.nodeName=n2", "spec.nodeName=n3"]
    del world.kube.objects[("Pod", "default", "t3")]  # and what it reads is enough to see room and swap
    world.step()
    assert world.pod_patches()


def test_a_misspelt_guard_key_gets_an_invalid_annotation_event():
    world = World(annotations={"raygpu.io/max-hold": "90s", "raygpu.io/gaurd-scope": "pool"})
    assert [(e.reason, e.type) for e in world.kube.events] == [("InvalidAnnotation", "Warning")]
    assert "raygpu.io/gaurd-scope" in world.kube.events[0].message


def test_a_timeout_count_that_is_not_a_whole_number_times_out_without_raising():
    world = World()
    cm = world.kube.objects[("ConfigMap", "default", world.rsv.plan.gang_name)]
    cm["metadata"]["annotations"][ANNOTATION_GUARD_TIMEOUTS] = "1.0"
    world.step()
    world.clock.tick(91)
    world.step()  # times out: counts 1.0 + 1
    assert cm["metadata"]["annotations"][ANNOTATION_GUARD_TIMEOUTS] == "2"
    assert "holderIdentity" not in world.lease()["spec"] and not world.blockers()


def test_two_namespaces_of_one_scope_share_one_lease_and_never_both_block():
    world = World(annotations={"raygpu.io/max-hold": "90s", "raygpu.io/guard-scope": "gpu-pool"})
    g1 = world.guard
    plan_b = g1.plan.model_copy(update={"namespace": "team-b"})  # the same gang name, in another namespace
    g2 = Guard(world.kube, plan_b, g1.policy, state_uid="uid-b", cluster_uid="uid-cb", template_spec=g1.template_spec,
               clock=world.clock)
    assert g1.tag != g2.tag and g1.lease_name == g2.lease_name == "raygpu-guard-gpu-pool"
    for _ in range(10):
        world.step()
        g2.step(S.RESERVED)
        tags = {b["metadata"]["labels"][LABEL_BLOCKER] for b in world.blockers().values()}
        assert len(tags) <= 1, f"two gangs block at once: {tags}"
    leases = [k for k in world.kube.objects if k[0] == "Lease" and not k[2].startswith("raygpu-guard-gpu-pool.")]
    assert leases == [("Lease", "raygpu-system", "raygpu-guard-gpu-pool")]  # one Lease for the scope, whatever the namespace
    lease = world.kube.objects[("Lease", "raygpu-system", "raygpu-guard-gpu-pool")]
    assert lease["spec"]["holderIdentity"] in (g1.tag, g2.tag)
    assert len(world.blockers()) == 2


def test_a_holder_that_cannot_renew_stops_blocking_before_its_lease_can_be_taken():
    world = World()
    world.step()
    assert len(world.blockers()) == 2
    renewed_at = world.clock.now_s
    world.kube.fail("merge_patch", RayGpuError("API server unreachable"), times=1000, when=lambda *a: a[1] == "Lease")
    while world.clock.now_s - renewed_at < LEASE_DURATION_S - GUARD_EVERY_S:
        world.clock.tick()
        try:
            world.guard.step(S.RESERVED)
        except RayGpuError:
            pass  # the renewal failed; the watchdog retries next step
        if world.clock.now_s - renewed_at > STEP_DOWN_S + GUARD_EVERY_S:
            break
    assert not world.blockers(), "blockers still stand although the Lease could not be renewed"
    assert world.clock.now_s - renewed_at < LEASE_DURATION_S  # before any other gang may take the Lease
    assert "GuardLost" in [e.reason for e in world.kube.events]


def test_a_killed_holders_blockers_and_ticket_are_removed_by_the_next_holder_within_the_lease_duration_and_a_step():
    world = World()
    dead = "other-ns-c-rg-dead"
    world.kube.objects[("Lease", "raygpu-system", f"raygpu-guard-default.{dead}")] = ticket(dead, "1960-01-01T00:00:00Z")
    world.kube.objects[LEASE] = {"metadata": {"name": LEASE[2], "namespace": "raygpu-system", "resourceVersion": "5"},
                                 "spec": {"holderIdentity": dead, "leaseDurationSeconds": 30, "renewTime": "x"}}
    for i, n in enumerate(("n1", "n2")):  # the dead holder's blockers, owned by its ticket
        world.kube.objects[("Pod", "raygpu-system", f"{dead}-bl-{i}")] = {"metadata": {
            "name": f"{dead}-bl-{i}", "namespace": "raygpu-system", "uid": f"uid-dead-bl-{i}",
            "labels": {LABEL_BLOCKER: dead, LABEL_GUARD_FOR: dead, KEY_GUARD_SCOPE: "default"},
            "ownerReferences": [{"kind": "Lease", "uid": f"uid-{dead}"}]}, "spec": {"nodeName": n}}
    world.kube.objects[("Pod", "raygpu-system", "not-a-blocker")] = {"metadata": {   # never touched
        "name": "not-a-blocker", "namespace": "raygpu-system", "labels": {KEY_GUARD_SCOPE: "default"}}, "spec": {}}
    t0 = world.clock.now_s
    world.step()
    assert world.lease()["spec"]["holderIdentity"] == dead and world.guard.held_since is None
    while world.lease()["spec"]["holderIdentity"] == dead:
        assert world.clock.now_s - t0 <= LEASE_DURATION_S + GUARD_EVERY_S, "not taken over in time"
        world.step()
    assert world.clock.now_s - t0 <= LEASE_DURATION_S + 2 * GUARD_EVERY_S
    assert world.lease()["spec"]["holderIdentity"] == world.guard.tag
    left = {k[2] for k in world.kube.objects if k[0] == "Pod" and k[1] == "raygpu-system"}
    assert not any(n.startswith(dead) for n in left) and "not-a-blocker" in left
    assert ("Lease", "raygpu-system", f"raygpu-guard-default.{dead}") not in world.kube.objects
    assert {("Pod", f"{dead}-bl-0", "uid-dead-bl-0"), ("Pod", f"{dead}-bl-1", "uid-dead-bl-1")} <= set(world.deletes)
    assert len(world.blockers()) == 2  # and it blocks its own nodes


def test_a_live_gangs_blockers_are_waited_for_not_deleted():
    world = World()
    other = "other-ns-c-rg-live"
    world.kube.objects[("Lease", "raygpu-system", f"raygpu-guard-default.{other}")] = ticket(other, "2100-01-01T00:00:00Z")
    world.kube.objects[("Pod", "raygpu-system", f"{other}-bl-0")] = {"metadata": {
        "name": f"{other}-bl-0", "namespace": "raygpu-system", "uid": "uid-live-bl",
        "labels": {LABEL_BLOCKER: other, KEY_GUARD_SCOPE: "default"},
        "ownerReferences": [{"kind": "Lease", "uid": f"uid-{other}"}]}, "spec": {"nodeName": "n1"}}
    world.step()  # we are first in line and take the Lease, but a live gang's blocker still stands
    assert world.lease()["spec"]["holderIdentity"] == world.guard.tag and not world.blockers()
    assert ("Pod", "raygpu-system", f"{other}-bl-0") in world.kube.objects
    del world.kube.objects[("Pod", "raygpu-system", f"{other}-bl-0")]  # its gang removed it
    world.step()
    assert len(world.blockers()) == 2


def test_a_hold_walks_its_phases_along_the_table_and_an_edge_outside_it_raises():
    world = World()
    seen = [world.guard.phase]
    real = world.guard._to

    def to(phase):
        real(phase)
        seen.append(phase)
    world.guard._to = to
    world.step()  # takes the Lease, chooses n2 and n3, blocks them
    del world.kube.objects[("Pod", "default", "t3")]
    world.step()  # room on both: swapped in
    world.bind_gang()
    world.step()  # bound: blockers deleted
    world.step(S.ADMITTED)
    assert [p.value for p in seen] == ["waiting", "choosing", "blocking", "swapping", "swapped", "unblocked", "released"]
    with pytest.raises(PermanentError, match="illegal hold transition released -> choosing"):
        real(HoldPhase.CHOOSING)


def test_a_lost_hold_stops_deletes_its_blockers_and_is_back_in_line():
    world = World()
    world.step()
    assert world.guard.phase == HoldPhase.BLOCKING and len(world.blockers()) == 2
    world.kube.objects[("Lease", "raygpu-system", "raygpu-guard-default.older")] = ticket("older", "1960-01-01T00:00:00Z")
    world.kube.objects[LEASE]["spec"]["holderIdentity"] = "older"  # an older gang in line took it (we lost it)
    world.kube.objects[LEASE]["metadata"]["resourceVersion"] = "99"
    world.step()
    assert world.guard.phase == HoldPhase.WAITING and not world.blockers() and not world.guard.failed
    assert "GuardLost" in [e.reason for e in world.kube.events]
