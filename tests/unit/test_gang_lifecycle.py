"""The driver side of a reservation (raygpu.gang.api) against a fake Ray and the one fake Kubernetes.

The watchdog is driven step by step (``start_watchdog=False``, ``pg._step()``)
on a fake clock, except where a test is about two threads meeting.
"""

from __future__ import annotations

import threading
import time

import pytest

from raygpu.errors import PermanentError, TransientError
from raygpu.gang import api
from raygpu.gang.api import GangPlacementGroup, RayCalls
from raygpu.gang.reservation import reserve
from raygpu.model.gang import ReservationState
from raygpu.model.labels import ANNOTATION_HEARTBEAT, ANNOTATION_PLACEMENT_GROUP, ANNOTATION_RESERVATION_STATE, \
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
        return self.kube.objects.get(("ConfigMap", self.pg.plan.gang_name))

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
        self.pg._step()
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
    w.pg._step()
    assert w.pg.state == S.RESERVED and w.annotation(ANNOTATION_HEARTBEAT)
    w.bound()
    w.nodes_joined()
    w.pg._step()
    w.pg._step()
    assert w.pg.state == S.READY and w.annotation(ANNOTATION_RESERVATION_STATE) == "ready"
    assert w.annotation(ANNOTATION_PLACEMENT_GROUP) == w.ray.created[0].id.hex()
    assert w.pg.wait(0) is True and w.pg.ready() == w.ray.created[0].ready()
    w.pg.remove()
    assert w.ray.leaked() == [] and w.released() and w.pg.state == S.RELEASED
