"""The driver side of a reservation (raygpu.gang.api) against a fake Ray and the one fake Kubernetes.

The watchdog is driven step by step (``start_watchdog=False``, ``pg.watchdog.step()``)
on a fake clock, except where a test is about two threads meeting.
"""

from __future__ import annotations

import threading
import time

import pytest

from raygpu.errors import ConflictError, ForbiddenError, PermanentError, TransientError
from raygpu.gang import api
from raygpu.gang.api import GangPlacementGroup, RayCalls
from raygpu.gang.reservation import GroupOutcome, reserve
from raygpu.model.gang import ReservationState
from raygpu.model.labels import ANNOTATION_HEARTBEAT, ANNOTATION_PLACEMENT_GROUP, ANNOTATION_REQUEST_ID, \
    ANNOTATION_RESERVATION_STATE, \
    LABEL_RESERVATION
from raygpu.model.views import K8sPodView
from raygpu.testing.builders.clusters import cluster, gang, gpus
from raygpu.testing.fake_kube import FakeKube

S = ReservationState
TIMEOUT_S = 60.0
UNAVAILABLE = TransientError("patch ConfigMap default/c-rg-job1: 503 Service Unavailable")


class FakePg:
    def __init__(self, n: int) -> None:
        self.id = bytes([n]) * 18

    def ready(self) -> str:
        return f"ready-ref-{self.id.hex()[:4]}"


class FakeRay:
    """Ray's view: the reserved nodes that joined, the PGs created (and removed), their table state."""

    def __init__(self) -> None:
        self.nodes: list[dict] = []
        self.created: list[FakePg] = []
        self.removed: list[FakePg] = []
        self.table_state = "CREATED"
        self.on_create = lambda: None  # runs inside placement_group(), before it returns

    def calls(self) -> RayCalls:
        def placement_group(bundles, strategy, name, bundle_label_selector):
            self.on_create()
            pg = FakePg(len(self.created) + 1)
            self.created.append(pg)
            return pg
        return RayCalls(placement_group=placement_group, placement_group_table=lambda pg: {"state": self.table_state},
                        remove_placement_group=self.removed.append, nodes=lambda: list(self.nodes))

    def leaked(self) -> list[FakePg]:
        return [pg for pg in self.created if pg not in self.removed]


class Clock:
    def __init__(self) -> None:
        self.now_s = 1000.0

    def __call__(self) -> float:
        return self.now_s


class World:
    """One reservation of 2 x 8 GPUs on cluster ``c`` (backend none), reserved on the fake Kubernetes."""

    def __init__(self, start_watchdog: bool = False, timeout_s: float = TIMEOUT_S) -> None:
        self.kube = FakeKube(cluster("c").worker("gpu", gpus=8).raw(), kuberay=True)
        self.ray = FakeRay()
        self.clock = Clock()
        self.said: list[str] = []
        rsv = reserve(self.kube, gang(gpus(8, 2), backend="none", timeout_s=timeout_s), time.time())
        self.group = rsv.plan.reservation_group
        self.pg = GangPlacementGroup(rsv, self.said.append, ray_calls=self.ray.calls(), clock=self.clock,
                                     start_watchdog=start_watchdog)

    @property
    def configmap(self) -> dict | None:
        return self.kube.objects.get(("ConfigMap", "default", self.pg.plan.gang_name))

    def annotation(self, key: str) -> str | None:
        return ((self.configmap or {}).get("metadata", {}).get("annotations") or {}).get(key)

    def pods_running(self) -> None:
        self.kube.extra_pods = [K8sPodView(name=f"{self.group}-{i}", namespace="default", node_name=f"k{i}",
                                           phase="Running", labels={LABEL_RESERVATION: self.group},
                                           ray_cluster="c", ray_group=self.group, ray_node_type="worker")
                                for i in range(2)]

    def nodes_joined(self) -> None:
        self.ray.nodes = [{"Alive": True, "Labels": {LABEL_RESERVATION: self.group}} for _ in range(2)]

    def bound(self) -> None:
        self.pods_running()
        self.pg.watchdog.step()
        assert self.pg.state == S.BOUND and self.annotation(ANNOTATION_RESERVATION_STATE) == "bound"

    def released(self) -> bool:
        return self.configmap is None and self.group not in {g["groupName"] for g in
                                                             self.kube.raw["spec"]["workerGroupSpecs"]}


def is_state(value: str):
    return lambda api_version, kind, name, ns, body: (body.get("metadata", {}).get("annotations") or {}).get(
        ANNOTATION_RESERVATION_STATE) == value


def writes(key: str):
    return lambda api_version, kind, name, ns, body: key in (body.get("metadata", {}).get("annotations") or {})


def call_bounded(fn, timeout_s: float = 5.0):
    """``fn()`` in a thread: its result, or AssertionError if it is still blocked after ``timeout_s``."""
    out: list = []
    t = threading.Thread(target=lambda: out.append(_outcome(fn)), daemon=True)
    t.start()
    t.join(timeout_s)
    assert out, f"still blocked after {timeout_s} s"
    if isinstance(out[0], BaseException):
        raise out[0]
    return out[0]


def _outcome(fn):
    try:
        return fn()
    except BaseException as e:  # noqa: BLE001 - handed back to the test
        return e


# ------------------------------------------------------------------ the happy path
def test_the_watchdog_walks_reserved_to_ready_and_remove_releases_everything():
    w = World()
    w.pg.watchdog.step()
    assert w.pg.state == S.RESERVED and w.annotation(ANNOTATION_HEARTBEAT)
    w.bound()
    w.nodes_joined()
    w.pg.watchdog.step()
    w.pg.watchdog.step()
    assert w.pg.state == S.READY and w.annotation(ANNOTATION_RESERVATION_STATE) == "ready"
    assert w.annotation(ANNOTATION_PLACEMENT_GROUP) == w.ray.created[0].id.hex()
    assert w.pg.wait(0) is True and w.pg.ready() == w.ray.created[0].ready()
    w.pg.remove()
    assert w.ray.leaked() == [] and w.released() and w.pg.state == S.RELEASED


# ------------------------------------------- issue 14 item 2: belief and ConfigMap never diverge
@pytest.mark.parametrize("what, failing_write", [
    ("transition-admitted", is_state("admitted")),
    ("transition-bound", is_state("bound")),
    ("transition-ready", is_state("ready")),
    ("record-pg-id", writes(ANNOTATION_PLACEMENT_GROUP)),
    ("heartbeat", writes(ANNOTATION_HEARTBEAT)),
])
def test_a_lifecycle_write_that_fails_once_lands_on_the_next_step_and_the_driver_never_believes_more(
        what, failing_write):
    w = World()
    w.pods_running()
    w.nodes_joined()
    w.kube.objects[("ConfigMap", "default", w.pg.plan.gang_name)]["metadata"]["annotations"][ANNOTATION_HEARTBEAT] = "0"
    w.kube.fail("merge_patch", UNAVAILABLE, when=failing_write)
    w.pg.watchdog.step()  # everything would happen in this one step, but one write gets a 503
    assert w.pg.state.value == w.annotation(ANNOTATION_RESERVATION_STATE), "the driver believes what the ConfigMap says"
    if what != "heartbeat":
        assert w.pg.state != S.READY
        assert w.annotation(ANNOTATION_HEARTBEAT) != "0", "one failed write does not skip the heartbeat"
    w.clock.now_s += api.WATCH_EVERY_S
    w.pg.watchdog.step()
    w.pg.watchdog.step()
    assert w.pg.state == S.READY and w.annotation(ANNOTATION_RESERVATION_STATE) == "ready"
    assert w.annotation(ANNOTATION_PLACEMENT_GROUP) == w.ray.created[0].id.hex() and len(w.ray.created) == 1
    assert w.annotation(ANNOTATION_HEARTBEAT) != "0"


def test_a_failed_ready_write_is_retried_until_it_lands_and_wait_only_then_says_ready():
    w = World()
    w.bound()
    w.nodes_joined()
    w.kube.fail("merge_patch", UNAVAILABLE, times=3, when=is_state("ready"))
    for _ in range(3):
        w.pg.watchdog.step()
        assert w.pg.state == S.BOUND and w.annotation(ANNOTATION_RESERVATION_STATE) == "bound"
        assert w.pg.wait(0) is False
    w.pg.watchdog.step()
    assert w.pg.state == S.READY and w.annotation(ANNOTATION_RESERVATION_STATE) == "ready" and w.pg.wait(0)


# ---------------------------------------- issue 14 item 3: ready() and wait() end by the deadline
def test_ready_returns_once_the_pg_exists_though_recording_its_id_failed_and_the_id_is_recorded_next():
    w = World()
    w.bound()
    w.nodes_joined()
    w.kube.fail("merge_patch", UNAVAILABLE, when=writes(ANNOTATION_PLACEMENT_GROUP))
    w.pg.watchdog.step()
    assert call_bounded(w.pg.ready, 2.0) == w.ray.created[0].ready()
    assert w.annotation(ANNOTATION_PLACEMENT_GROUP) is None
    w.pg.watchdog.step()
    assert w.annotation(ANNOTATION_PLACEMENT_GROUP) == w.ray.created[0].id.hex()
    w.pg.watchdog.step()
    assert w.pg.state == S.READY and w.annotation(ANNOTATION_RESERVATION_STATE) == "ready"


@pytest.mark.parametrize("failing", [
    pytest.param(("ray_pods", 4, lambda *a: True), id="observe-fails"),  # 3 steps, then the one at the deadline
    pytest.param(("merge_patch", 10**6, writes(ANNOTATION_PLACEMENT_GROUP)), id="record-pg-id-fails"),
])
def test_the_watchdog_rolls_back_at_the_deadline_whatever_keeps_failing(failing):
    w = World()
    w.pods_running()
    w.nodes_joined()
    method, times, when = failing
    w.kube.fail(method, UNAVAILABLE, times=times, when=when)
    for _ in range(3):
        w.pg.watchdog.step()
    assert w.pg.state != S.READY
    w.clock.now_s += TIMEOUT_S + 1
    assert w.pg.watchdog.step() == "done"
    assert w.released() and w.pg.state == S.ROLLED_BACK and w.ray.leaked() == []
    assert w.pg.wait(0) is False
    with pytest.raises(PermanentError, match="rolled back"):
        call_bounded(w.pg.ready, 2.0)


def test_ready_and_wait_give_up_past_the_deadline_even_when_the_watchdog_is_stuck():
    w = World()  # no watchdog steps at all: as if it hung in a request
    w.clock.now_s += TIMEOUT_S + api.WATCHDOG_JOIN_S + 1
    assert call_bounded(lambda: w.pg.wait(), 2.0) is False
    with pytest.raises(PermanentError, match="not ready within timeout_s"):
        call_bounded(w.pg.ready, 2.0)


# -------------------------------- issue 14 item 13: no PG leaked, a failed release stays retryable
@pytest.mark.parametrize("how", ["remove", "interrupt"])
def test_a_release_while_the_watchdog_creates_the_ray_pg_leaves_no_pg(how, monkeypatch):
    monkeypatch.setattr(api, "WATCHDOG_JOIN_S", 0.2)
    w = World(start_watchdog=True)
    handoffs: list[str] = []
    w.pg._hand_off = handoffs.append
    entered, proceed = threading.Event(), threading.Event()
    w.ray.on_create = lambda: (entered.set(), proceed.wait(10))
    w.pods_running()
    w.nodes_joined()
    assert entered.wait(10), "the watchdog started creating the Ray PG"
    releaser = threading.Thread(target=w.pg.remove if how == "remove" else lambda: w.pg.interrupt(budget_s=0.5))
    releaser.start()
    releaser.join(1.0)  # the release gives up waiting for the creation (a Ray call that hangs) ...
    proceed.set()  # ... and only then does Ray return the PG
    releaser.join(10)
    w.pg.watchdog.thread.join(10)
    assert not releaser.is_alive() and not w.pg.watchdog.thread.is_alive()
    assert len(w.ray.created) == 1 and w.ray.leaked() == [], "the PG created under the release is removed"
    assert w.annotation(ANNOTATION_PLACEMENT_GROUP) is None


def test_a_release_that_fails_leaves_the_handle_retryable_and_does_not_claim_released():
    w = World()
    w.bound()
    w.nodes_joined()
    w.pg.watchdog.step()
    assert w.pg.state == S.READY
    w.kube.fail("patch_raycluster", UNAVAILABLE)
    with pytest.raises(TransientError):
        w.pg.remove()
    assert w.pg.state != S.RELEASED and not w.released()
    assert w.annotation(ANNOTATION_RESERVATION_STATE) == "ready"
    w.pg.remove()  # tries again
    assert w.released() and w.pg.state == S.RELEASED and w.ray.leaked() == []
    w.pg.remove()  # and then is a no-op
    assert w.kube.calls[-1][0] != "patch_raycluster"


def test_a_rollback_that_fails_is_finished_by_the_next_remove():
    w = World()
    w.bound()
    w.clock.now_s += TIMEOUT_S + 1
    w.kube.fail("patch_raycluster", UNAVAILABLE)
    assert w.pg.watchdog.step() == "done"  # the rollback failed: the watchdog says so and ends
    assert w.annotation(ANNOTATION_RESERVATION_STATE) == "failed" and not w.released()
    assert any("rollback" in m or "rolled back" in m or "failed" in m for m in w.said)
    w.pg.remove()
    assert w.released() and w.pg.state == S.ROLLED_BACK


def test_release_with_a_failure_after_a_drained_release_still_removes_the_group_and_state():
    w = World()
    w.bound()
    w.kube.kuberay = False  # the pods outlive the drain wait
    rsv = w.pg.reservation
    assert rsv.release(drain_timeout_s=0) is GroupOutcome.DRAINING and rsv.state == S.RELEASED
    w.kube.extra_pods = []
    rsv.release(failed="driver exited")
    assert w.released()


def test_a_state_configmap_whose_create_answer_was_lost_is_deleted_and_only_that_one():
    """The create lands but its answer is lost: reserve fails and leaves no ConfigMap; one another call created
    under the same name (another request id) is never deleted."""
    kube = FakeKube(cluster("c").worker("gpu", gpus=8).raw(), kuberay=True)
    kube.fail("create", TransientError("create ConfigMap: connection reset"), when=lambda obj: obj["kind"] == "ConfigMap",
              lost=True)
    with pytest.raises(TransientError):
        reserve(kube, gang(gpus(8, 2), backend="none", timeout_s=TIMEOUT_S), time.time())
    assert not [k for k in kube.objects if k[0] == "ConfigMap"], kube.objects
    assert kube.raw["spec"]["workerGroupSpecs"][-1]["groupName"] == "gpu", "no reservation group was added"

    def someone_elses(obj):  # the name is taken by the time our create's error comes back
        other = dict(obj, metadata={**obj["metadata"], "annotations": {ANNOTATION_REQUEST_ID: "not-ours"}})
        kube.objects[("ConfigMap", "default", obj["metadata"]["name"])] = {**other, "metadata": {**other["metadata"], "uid": "u2"}}
        return True
    kube.fail("create", TransientError("create ConfigMap: timed out"), when=lambda obj: obj["kind"] == "ConfigMap"
              and someone_elses(obj))
    with pytest.raises(TransientError):
        reserve(kube, gang(gpus(8, 2), backend="none", timeout_s=TIMEOUT_S), time.time())
    assert [k for k in kube.objects if k[0] == "ConfigMap"], "another call's ConfigMap was deleted"


def test_a_reserve_whose_undo_also_fails_raises_the_cause_not_the_undos_error():
    """A Role missing create on PodGroups and delete on Workloads (backend workload: the Workload is created
    first): the caller hears about the create (the cause), with the failed undo as a note and in progress;
    before, the delete's 403 replaced the create's."""
    from raygpu.errors import ForbiddenError
    kube = FakeKube(cluster("c").worker("gpu", gpus=8).raw(), kuberay=True)
    kube.fail("create", ForbiddenError("missing permission: create podgroups.scheduling.k8s.io"),
              when=lambda obj: obj["kind"] == "PodGroup")
    kube.fail("delete", ForbiddenError("missing permission: delete workloads.scheduling.k8s.io"),
              when=lambda api_version, kind, name, ns: kind == "Workload")
    said: list[str] = []
    with pytest.raises(ForbiddenError, match="create podgroups") as err:
        reserve(kube, gang(gpus(8, 2), backend="workload", timeout_s=TIMEOUT_S), time.time(), progress=said.append)
    assert any("delete workloads" in n and "garbage collection" in n for n in err.value.__notes__)
    assert any("undoing the failed reservation also failed" in m for m in said)
    assert [k for k in kube.objects if k[0] == "ConfigMap"] == []  # the rest of the undo still happened


def test_a_state_configmap_deleted_under_a_waiting_gang_rolls_it_back_at_once():
    """The sidecar's GC (or a person) deleted the state ConfigMap while the gang waited: the next heartbeat's
    404 ends the watch and releases the rest, and wait()/ready() answer at once, not at the deadline."""
    w = World()
    w.pg.watchdog.step()
    assert w.pg.state == S.RESERVED
    del w.kube.objects[("ConfigMap", "default", w.pg.plan.gang_name)]
    w.clock.now_s += api.HEARTBEAT_EVERY_S + 1
    assert w.pg.watchdog.step() == "done"
    assert w.pg.wait(0) is False and w.ray.leaked() == [] and w.released()
    with pytest.raises(PermanentError, match="state ConfigMap was deleted"):
        call_bounded(w.pg.ready, 2.0)


def test_a_driver_that_loses_api_access_says_so_once_and_keeps_its_running_gang(caplog):
    """Issue 24 item 1: the API server refuses the heartbeat (token expired, RoleBinding revoked). The driver says
    so once, clearly (progress and a warning), keeps its gang and placement group, beats on quietly, and says
    so again once a heartbeat lands."""
    w = World()
    w.bound()
    w.nodes_joined()
    w.pg.watchdog.step()
    assert w.pg.state == S.READY
    w.kube.fail("merge_patch", ForbiddenError("patch ConfigMap default/c-rg-job1: forbidden (401): Unauthorized"),
                times=10, when=writes(ANNOTATION_HEARTBEAT))
    before = len(w.said)
    with caplog.at_level("WARNING", logger="raygpu.gang.api"):
        for _ in range(10):  # 10 heartbeat periods refused
            w.clock.now_s += api.HEARTBEAT_EVERY_S + 1
            assert w.pg.watchdog.step() == "retry"
    lost = [m for m in w.said[before:] if "lost access to the Kubernetes API" in m]
    assert len(lost) == 1 and w.said[before:] == lost, w.said[before:]
    assert "401" in lost[0] and "kept" in lost[0] and w.group in lost[0]
    assert [r.getMessage() for r in caplog.records if r.levelname == "WARNING"] == lost
    assert w.ray.removed == [] and not w.released() and w.pg.wait(0) is True and w.pg.state == S.READY
    w.clock.now_s += api.HEARTBEAT_EVERY_S + 1  # the 10 refusals are spent: access is back
    assert w.pg.watchdog.step() == "ok"
    assert "accepts this driver's heartbeat" in w.said[-1] and len(w.said) == before + 2


def test_a_state_configmap_deleted_under_a_running_gang_leaves_the_job_alone_until_remove():
    w = World()
    w.bound()
    w.nodes_joined()
    w.pg.watchdog.step()
    assert w.pg.state == S.READY
    del w.kube.objects[("ConfigMap", "default", w.pg.plan.gang_name)]
    w.clock.now_s += api.HEARTBEAT_EVERY_S + 1
    assert w.pg.watchdog.step() == "done"  # no more heartbeats to a state object that is gone
    assert w.ray.removed == [] and not w.released() and w.pg.wait(0) is True  # the running job is not broken
    assert any("state ConfigMap was deleted" in m and "left alone" in m for m in w.said)
    w.pg.remove()
    assert w.ray.leaked() == [] and w.released()


def test_a_write_between_plan_and_patch_re_plans_and_the_patch_tests_the_version_read_again():
    """Someone writes the RayCluster first: reserve re-reads it, lays the patch out again and it lands, once."""
    kube = FakeKube(cluster("c").worker("gpu", gpus=8).raw(), kuberay=True, conflicts=1)
    said: list[str] = []
    rsv = reserve(kube, gang(gpus(8, 2), backend="none", timeout_s=TIMEOUT_S), time.time(), progress=said.append)
    assert rsv.state is S.RESERVED and any("changed under us (attempt 1)" in m for m in said)
    assert len(kube.patches) == 1 and kube.patches[0][0]["value"] == "1002"  # the version read after the write
    assert [g["groupName"] for g in kube.raw["spec"]["workerGroupSpecs"]] == ["gpu", "rg-job1"]


def test_conflicts_on_every_patch_roll_back_and_raise():
    kube = FakeKube(cluster("c").worker("gpu", gpus=8).raw(), kuberay=True, conflicts=5)
    with pytest.raises(ConflictError, match="5 conflicting writes"):
        reserve(kube, gang(gpus(8, 2), backend="coscheduling", timeout_s=TIMEOUT_S), time.time())
    assert kube.patches == [] and kube.objects == {}  # the state ConfigMap and the PodGroup are gone
    assert [g["groupName"] for g in kube.raw["spec"]["workerGroupSpecs"]] == ["gpu"]


def test_a_patch_that_landed_with_its_answer_lost_is_not_sent_again():
    kube = FakeKube(cluster("c").worker("gpu", gpus=8).raw(), kuberay=True)
    real_patch = kube.patch_raycluster

    def lost_answer(namespace, name, patch):
        real_patch(namespace, name, patch)
        kube.patch_raycluster = real_patch
        raise ConflictError("connection reset after the write (the test op failed on a retry)")
    kube.patch_raycluster = lost_answer
    rsv = reserve(kube, gang(gpus(8, 2), backend="none", timeout_s=TIMEOUT_S), time.time())
    assert rsv.state is S.RESERVED and len(kube.patches) == 1
    assert [g["groupName"] for g in kube.raw["spec"]["workerGroupSpecs"]] == ["gpu", "rg-job1"]
