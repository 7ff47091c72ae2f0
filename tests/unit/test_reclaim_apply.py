"""Applying reclaim plans: the JSON patch on a recorded RayCluster, and the sidecar cycle against fakes.

The RayCluster below was recorded from the testbed's API server (KubeRay v1.5.0,
after the operator reconciled it; managedFields dropped): groups ``gpu`` (3 x 8
GPUs) and ``small`` (1 x 1 GPU, with a stale ``workersToDelete`` entry). Patches are applied to it with
a small RFC 6902 applier that behaves like the API server: a failed ``test``
rejects the whole patch, and every accepted write bumps the resourceVersion.
"""

from __future__ import annotations

import copy
import json
import threading
import time

import pytest

from raygpu.errors import ConflictError, InvalidError, PermanentError
from raygpu.model.gc import ReservationRecord
from raygpu.model.raycluster import RayClusterView
from raygpu.model.reclaim import ReclaimPolicy, ReclaimReason
from raygpu.model.views import K8sPodView, K8sView, PgState, PlacementGroupView, RayNodeView, RayView, Snapshot
from raygpu.plan.reclaim import plan_reclaim
from raygpu.reclaim.apply import reclaim_patch
from raygpu.adapters.kube_watch import CacheView
from raygpu.reclaim.loop import CycleOutcome, Reclaimer, SidecarConfig

NOW_S = 2_000_000.0
R = ReclaimReason

RECORDED = json.loads(r"""
{
 "apiVersion": "ray.io/v1",
 "kind": "RayCluster",
 "metadata": {
  "annotations": {
   "raygpu.io/idle-timeout": "5s",
   "raygpu.io/reclaim": "on"
  },
  "creationTimestamp": "2026-12-02T13:26:18Z",
  "generation": 1,
  "name": "rc",
  "namespace": "record-rc",
  "resourceVersion": "2533",
  "uid": "ce5a4c98-9e68-4274-a4a8-e8438696f3c3"
 },
 "spec": {
  "headGroupSpec": {
   "rayStartParams": {},
   "template": {
    "spec": {
     "containers": [
      {
       "image": "rayproject/ray:2.60.0",
       "name": "ray-head",
       "resources": {
        "limits": {
         "cpu": "2",
         "memory": "8Gi"
        },
        "requests": {
         "cpu": "2",
         "memory": "8Gi"
        }
       }
      }
     ],
     "nodeSelector": {
      "raygpu.io/pool": "record-none",
      "raygpu.io/testbed-shape": "cpu16"
     }
    }
   }
  },
  "rayVersion": "2.60.0",
  "workerGroupSpecs": [
   {
    "groupName": "gpu",
    "maxReplicas": 16,
    "minReplicas": 0,
    "numOfHosts": 1,
    "rayStartParams": {},
    "replicas": 3,
    "template": {
     "spec": {
      "containers": [
       {
        "image": "rayproject/ray:2.60.0",
        "name": "ray-worker",
        "resources": {
         "limits": {
          "cpu": "8",
          "memory": "64Gi",
          "nvidia.com/gpu": "8"
         },
         "requests": {
          "cpu": "8",
          "memory": "64Gi",
          "nvidia.com/gpu": "8"
         }
        }
       }
      ],
      "nodeSelector": {
       "raygpu.io/pool": "record-none"
      }
     }
    }
   },
   {
    "groupName": "small",
    "maxReplicas": 4,
    "minReplicas": 0,
    "numOfHosts": 1,
    "rayStartParams": {},
    "replicas": 1,
    "scaleStrategy": {
     "workersToDelete": [
      "rc-small-worker-gone1"
     ]
    },
    "template": {
     "spec": {
      "containers": [
       {
        "image": "rayproject/ray:2.60.0",
        "name": "ray-worker",
        "resources": {
         "limits": {
          "cpu": "4",
          "memory": "16Gi",
          "nvidia.com/gpu": "1"
         },
         "requests": {
          "cpu": "4",
          "memory": "16Gi",
          "nvidia.com/gpu": "1"
         }
        }
       }
      ],
      "nodeSelector": {
       "raygpu.io/pool": "record-none"
      }
     }
    }
   }
  ]
 },
 "status": {
  "conditions": [
   {
    "lastTransitionTime": "2026-12-02T13:26:18Z",
    "message": "",
    "reason": "Unknown",
    "status": "False",
    "type": "HeadPodReady"
   },
   {
    "lastTransitionTime": "2026-12-02T13:26:18Z",
    "message": "RayCluster Pods are being provisioned for first time",
    "reason": "RayClusterPodsProvisioning",
    "status": "False",
    "type": "RayClusterProvisioned"
   },
   {
    "lastTransitionTime": "2026-12-02T13:26:18Z",
    "message": "",
    "reason": "RayClusterSuspended",
    "status": "False",
    "type": "RayClusterSuspended"
   },
   {
    "lastTransitionTime": "2026-12-02T13:26:18Z",
    "message": "",
    "reason": "RayClusterSuspending",
    "status": "False",
    "type": "RayClusterSuspending"
   }
  ],
  "desiredCPU": "30",
  "desiredGPU": "25",
  "desiredMemory": "216Gi",
  "desiredTPU": "0",
  "desiredWorkerReplicas": 4,
  "endpoints": {
   "client": "10001",
   "dashboard": "8265",
   "gcs-server": "6379",
   "metrics": "8080",
   "serve": "8000"
  },
  "head": {
   "podName": "rc-head-7dn79",
   "serviceName": "rc-head-svc"
  },
  "lastUpdateTime": "2026-12-02T13:26:18Z",
  "maxWorkerReplicas": 20,
  "observedGeneration": 1
 }
}
""")
NS = RECORDED["metadata"]["namespace"]
RV0 = int(RECORDED["metadata"]["resourceVersion"])



# ------------------------------------------------------------------ helpers
class PatchRejected(Exception):
    pass


def json_patch(doc: dict, ops: list[dict]) -> dict:
    """RFC 6902 (test/add/replace/remove) on a copy of ``doc``; a failed test rejects everything."""
    doc = copy.deepcopy(doc)
    for op in ops:
        *parents, last = [p.replace("~1", "/").replace("~0", "~") for p in op["path"].lstrip("/").split("/")]
        node = doc
        for p in parents:
            node = node[int(p)] if isinstance(node, list) else node[p]
        key = (len(node) if last == "-" else int(last)) if isinstance(node, list) else last
        if op["op"] == "test":
            if (node[key] if isinstance(node, list) or key in node else object()) != op["value"]:
                raise PatchRejected(f"test failed at {op['path']}")
        elif op["op"] == "add" and isinstance(node, list):
            node.insert(key, op["value"])
        elif op["op"] in ("add", "replace"):
            node[key] = op["value"]
        elif op["op"] == "remove":
            del node[key]
    return doc


def pod(name: str, group: str, node: str, age_s: float = 3600, head: bool = False) -> K8sPodView:
    return K8sPodView(name=name, namespace=NS, node_name=node, phase="Running", created_at_s=NOW_S - age_s,
                      ray_cluster="rc", ray_group=group, ray_node_type="head" if head else "worker")


def ray_node(pod_name: str, gpus: float, idle_for_s: float | None, head: bool = False) -> RayNodeView:
    return RayNodeView(node_id=f"n-{pod_name}", alive=True, is_head=head, instance_id=pod_name,
                       total={"GPU": gpus, "CPU": 8}, available={"GPU": gpus if idle_for_s is not None else 0, "CPU": 8},
                       idle_since_s=None if idle_for_s is None else NOW_S - idle_for_s)


PODS = (pod("rc-head-x", "headgroup", "k0", head=True), pod("rc-gpu-worker-a", "gpu", "k1"),
        pod("rc-gpu-worker-b", "gpu", "k2"), pod("rc-gpu-worker-c", "gpu", "k3"),
        pod("rc-small-worker-d", "small", "k4"))


def ray_view(idle: dict[str, float | None], pgs=()) -> RayView:
    gpus = {"rc-gpu-worker-a": 8, "rc-gpu-worker-b": 8, "rc-gpu-worker-c": 8, "rc-small-worker-d": 1}
    return RayView(nodes=(ray_node("rc-head-x", 0, 100, head=True),
                          *(ray_node(p, gpus[p], idle.get(p)) for p in gpus)), placement_groups=tuple(pgs))


ALL_IDLE = {"rc-gpu-worker-a": 60, "rc-gpu-worker-b": 60, "rc-gpu-worker-c": None, "rc-small-worker-d": 60}


def plan_on(raw: dict, ray: RayView, **policy):
    snap = Snapshot(taken_at_s=NOW_S, cluster="rc", namespace=NS, ray=ray, k8s=K8sView(pods=PODS))
    return plan_reclaim(snap, RayClusterView.from_k8s(raw), ReclaimPolicy(idle_timeout_s=5, **policy), NOW_S)


# -------------------------------------------------------------- the patch
def test_patch_tests_version_group_and_replicas_then_sets_both_fields():
    plan = plan_on(RECORDED, ray_view(ALL_IDLE))
    assert plan.deleted_pods == ("rc-gpu-worker-a", "rc-gpu-worker-b", "rc-small-worker-d")
    ops = reclaim_patch(plan)
    assert ops[0] == {"op": "test", "path": "/metadata/resourceVersion", "value": str(RV0)}
    assert ops[1:5] == [
        {"op": "test", "path": "/spec/workerGroupSpecs/0/groupName", "value": "gpu"},
        {"op": "test", "path": "/spec/workerGroupSpecs/0/replicas", "value": 3},
        {"op": "add", "path": "/spec/workerGroupSpecs/0/replicas", "value": 1},
        {"op": "add", "path": "/spec/workerGroupSpecs/0/scaleStrategy",
         "value": {"workersToDelete": ["rc-gpu-worker-a", "rc-gpu-worker-b"]}}]
    out = json_patch(RECORDED, ops)
    gpu, small = out["spec"]["workerGroupSpecs"]
    assert (gpu["replicas"], gpu["scaleStrategy"]["workersToDelete"]) == (1, ["rc-gpu-worker-a", "rc-gpu-worker-b"])
    # an existing list is kept: the operator may still be deleting what it names
    assert (small["replicas"], small["scaleStrategy"]["workersToDelete"]) == (
        0, ["rc-small-worker-gone1", "rc-small-worker-d"])
    # nothing else changed
    strip = lambda d: {**d, "spec": {**d["spec"], "workerGroupSpecs": [  # noqa: E731
        {k: v for k, v in g.items() if k not in ("replicas", "scaleStrategy")} for g in d["spec"]["workerGroupSpecs"]]}}
    assert strip(out) == strip(RECORDED)


def test_a_patch_from_a_stale_read_is_rejected_whole():
    plan = plan_on(RECORDED, ray_view(ALL_IDLE))
    moved = copy.deepcopy(RECORDED)
    moved["metadata"]["resourceVersion"] = str(RV0 + 1)
    with pytest.raises(PatchRejected):
        json_patch(moved, reclaim_patch(plan))
    reordered = copy.deepcopy(RECORDED)
    reordered["spec"]["workerGroupSpecs"].reverse()  # same version (a test of the group guard alone)
    with pytest.raises(PatchRejected):
        json_patch(reordered, reclaim_patch(plan))


def test_replanning_after_the_patch_deletes_nothing_twice():
    ray = ray_view(ALL_IDLE)
    first = plan_on(RECORDED, ray)
    after = json_patch(RECORDED, reclaim_patch(first))
    after["metadata"]["resourceVersion"] = str(RV0 + 1)
    second = plan_on(after, ray)  # the pods still exist: the operator has not deleted them yet
    assert second.to_delete == ()
    assert {second.decision(p).reason for p in first.deleted_pods} == {R.ALREADY_DELETING}


def test_no_plan_without_a_version_or_without_deletions():
    plan = plan_on(RECORDED, ray_view({}))
    assert plan.to_delete == ()
    with pytest.raises(PermanentError):
        reclaim_patch(plan)
    stale = plan_on(RECORDED, ray_view(ALL_IDLE)).model_copy(update={"cluster_resource_version": ""})
    with pytest.raises(PermanentError):
        reclaim_patch(stale)


# ------------------------------------------------------- the cycle, on fakes
class FakeKube:
    """The KubeAdapter calls the cycle makes, over one RayCluster dict, with API-server semantics."""

    def __init__(self, raw: dict, bare_422: bool = False) -> None:
        self.raw = copy.deepcopy(raw)
        self.bare_422 = bare_422  # answer a failed test with a bare 422 (a malformed patch, as the adapter sees it)
        self.patches: list[list[dict]] = []
        self.events: list[tuple[str, str, str]] = []
        self.deleted: list[tuple[str, str]] = []
        self.configmaps: set[str] = set()
        self.extra_pods: list[K8sPodView] = []

    def bump(self, mutate) -> None:
        mutate(self.raw)
        self.raw["metadata"]["resourceVersion"] = str(int(self.raw["metadata"]["resourceVersion"]) + 1)

    def ray_pods(self, namespace, cluster=None):
        return list(PODS) + list(self.extra_pods)

    def get_raycluster(self, namespace, name):
        return RayClusterView.from_k8s(self.raw)

    def patch_raycluster(self, namespace, name, patch):
        assert patch[0]["path"] == "/metadata/resourceVersion"
        try:
            out = json_patch(self.raw, patch)
        except PatchRejected as e:
            if self.bare_422:
                raise InvalidError(f"patch RayCluster {namespace}/{name}: 422: the server rejected our request "
                                     "due to an error in our request") from e
            raise ConflictError(str(e)) from e
        self.patches.append(patch)
        self.raw = out
        self.bump(lambda r: None)
        return RayClusterView.from_k8s(self.raw)

    def event(self, involved, reason, message, type_="Normal", component="raygpu"):
        assert involved["kind"] == "RayCluster" and involved["uid"]
        self.events.append((reason, type_, message))

    def delete(self, api_version, kind, name, namespace=None):
        self.deleted.append((kind, name))
        if name in self.configmaps:
            self.configmaps.discard(name)
            return True
        return False


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
    r = Reclaimer(kube, cache or FakeCache(kube), cfg, clock=lambda: NOW_S, read_ray=read_ray,
                  read_jobs=lambda a: {}, **kw)
    r.ray_reads = reads
    return r


def counter(r, name, **labels) -> float:
    return r.metrics.registry.get_sample_value(name, labels or None) or 0.0


def test_cycle_applies_one_patch_then_nothing_more():
    kube = FakeKube(RECORDED)
    r = reclaimer(kube)
    first = r.cycle()
    assert first.outcome is CycleOutcome.APPLIED
    assert first.deleted_pods == ("rc-gpu-worker-a", "rc-gpu-worker-b", "rc-small-worker-d")
    assert len(kube.patches) == 1
    scaled = [e for e in kube.events if e[0] == "ScaledDown"]
    assert len(scaled) == 2 and "rc-gpu-worker-a (Idle: idle 60s >= timeout 5s)" in scaled[0][2]
    assert r.cache.assumed == [(str(RV0 + 1), str(RV0))]
    for _ in range(3):  # a restarted or repeated cycle finds the deletions done, not to do
        assert r.cycle().outcome is CycleOutcome.IDLE
    assert len(kube.patches) == 1
    assert counter(r, "raygpu_reclaim_gpus_reclaimed_total") == 17
    assert counter(r, "raygpu_reclaim_decisions_total", action="keep", reason="AlreadyDeleting") == 9


def test_a_write_between_plan_and_patch_causes_a_replan_not_a_wrong_delete():
    # KubeAdapter.patch_raycluster turns a CRD's bare 422 on a moved object into ConflictError
    # (checked for real on the testbed by tests/integration/test_sidecar.py).
    kube = FakeKube(RECORDED, bare_422=False)
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
    assert [e for e in kube.events if e[0] == "ScaledDown"] == []


def test_a_rejected_patch_on_an_unchanged_cluster_is_an_error_not_a_conflict():
    kube = FakeKube(RECORDED)
    kube.patch_raycluster = lambda ns, name, patch: (_ for _ in ()).throw(PermanentError("422: bad patch"))
    rep = reclaimer(kube).cycle()
    assert rep.outcome is CycleOutcome.ERROR and not rep.replan_now and "bad patch" in rep.error


def test_run_replans_at_once_after_a_conflict_and_stops_on_the_event():
    kube = FakeKube(RECORDED)
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
    kube = FakeKube(RECORDED)
    kube.raw["metadata"]["annotations"]["raygpu.io/reclaim"] = "yes-please"
    r = reclaimer(kube)
    for _ in range(3):
        assert r.cycle().outcome is CycleOutcome.DRY_RUN
    invalid = [e for e in kube.events if e[0] == "InvalidAnnotation"]
    assert len(invalid) == 1 and invalid[0][1] == "Warning" and "'yes-please'" in invalid[0][2]
    assert "dry-run" in invalid[0][2]
    assert kube.patches == []
    assert len([e for e in kube.events if e[0] == "ScaleDownDryRun"]) == 1  # one per distinct plan
    kube.bump(lambda raw: raw["metadata"]["annotations"].update({"raygpu.io/reclaim": "maybe"}))
    r.cycle()
    assert len([e for e in kube.events if e[0] == "InvalidAnnotation"]) == 2
    assert kube.patches == []


def test_off_reads_nothing_and_writes_nothing():
    kube = FakeKube(RECORDED)
    kube.raw["metadata"]["annotations"]["raygpu.io/reclaim"] = "off"
    r = reclaimer(kube)
    assert r.cycle().outcome is CycleOutcome.OFF
    assert r.ray_reads == [] and kube.patches == [] and kube.events == []


def test_ray_unreachable_deletes_nothing():
    kube = FakeKube(RECORDED)
    r = reclaimer(kube, ray=RayView(reachable=False, reason="GCS down"))
    rep = r.cycle()
    assert rep.outcome is CycleOutcome.IDLE and kube.patches == []
    assert rep.plan.decision("rc-gpu-worker-a").reason is R.RAY_UNREACHABLE


def with_reservation_group(name: str, replicas: int) -> dict:
    """RECORDED plus a reservation worker group ``name`` (a copy of the gpu group, replicas = minReplicas)."""
    raw = copy.deepcopy(RECORDED)
    raw["spec"]["workerGroupSpecs"].append({**copy.deepcopy(raw["spec"]["workerGroupSpecs"][0]),
                                            "groupName": name, "replicas": replicas, "minReplicas": replicas})
    return raw


def test_gc_releases_a_dead_drivers_reservation_with_the_gang_code():
    raw = with_reservation_group("rg-train", replicas=1)
    kube = FakeKube(raw)
    kube.configmaps = {"rc-rg-train", "rc-rg-live"}
    dead = ReservationRecord(name="rc-rg-train", namespace=NS, group="rg-train", state="ready",
                             placement_group_id="aa", heartbeat_at_s=NOW_S - 5)
    live = ReservationRecord(name="rc-rg-live", namespace=NS, group="rg-live", state="ready",
                             placement_group_id="bb", heartbeat_at_s=NOW_S - 5)
    ray = ray_view({}, pgs=[PlacementGroupView(pg_id="aa", state=PgState.REMOVED),
                            PlacementGroupView(pg_id="bb", state=PgState.CREATED)])
    r = reclaimer(kube, FakeCache(kube, [dead, live]), ray=ray)
    rep = r.cycle()
    assert rep.outcome is CycleOutcome.APPLIED and rep.released == ("rc-rg-train",)
    assert [g["groupName"] for g in kube.raw["spec"]["workerGroupSpecs"]] == ["gpu", "small"]
    assert kube.configmaps == {"rc-rg-live"}
    assert [e[0] for e in kube.events] == ["ReservationReleased"]
    assert counter(r, "raygpu_gc_reservations_released_total", reason="PlacementGroupGone") == 1
    rep2 = r.cycle()  # the cache still shows it: releasing again is a no-op, counted and evented once
    assert rep2.released == () and [e[0] for e in kube.events] == ["ReservationReleased"]
    assert counter(r, "raygpu_gc_reservations_released_total", reason="PlacementGroupGone") == 1


def test_gc_never_blocks_a_cycle_on_a_draining_group():
    """Pods of the released group still there: scale to zero and move on; a later cycle removes the group."""
    raw = with_reservation_group("rg-train", replicas=1)
    kube = FakeKube(raw)
    kube.configmaps = {"rc-rg-train"}
    kube.extra_pods = [pod("rc-rg-train-worker-z", "rg-train", "k5")]
    dead = ReservationRecord(name="rc-rg-train", namespace=NS, group="rg-train", state="released",
                             heartbeat_at_s=NOW_S - 5)
    r = reclaimer(kube, FakeCache(kube, [dead]), ray=ray_view({}))
    t0 = time.monotonic()
    rep = r.cycle()
    assert time.monotonic() - t0 < 5  # one look at the pods, no drain wait
    group = {g["groupName"]: g for g in kube.raw["spec"]["workerGroupSpecs"]}["rg-train"]
    assert group["replicas"] == 0 and group["minReplicas"] == 0
    assert group["scaleStrategy"]["workersToDelete"] == ["rc-rg-train-worker-z"]
    assert rep.released == () and kube.configmaps == {"rc-rg-train"} and kube.events == []
    rep = r.cycle()  # still draining: the same patch is not written again
    assert rep.released == () and len(kube.patches) == 1
    kube.extra_pods = []  # KubeRay deleted the pod
    rep = r.cycle()
    assert rep.released == ("rc-rg-train",) and kube.configmaps == set()
    assert [g["groupName"] for g in kube.raw["spec"]["workerGroupSpecs"]] == ["gpu", "small"]
    assert [e[0] for e in kube.events] == ["ReservationReleased"]


def test_gc_removes_a_reservation_group_whose_state_configmap_is_gone():
    raw = with_reservation_group("rg-lost", replicas=0)
    kube = FakeKube(raw)
    now = [NOW_S]
    r = reclaimer(kube, FakeCache(kube, []), ray=ray_view({}))
    r.clock = lambda: now[0]
    assert r.cycle().released == ()  # first seen without its ConfigMap: wait, it may be in flight
    assert "rg-lost" in [g["groupName"] for g in kube.raw["spec"]["workerGroupSpecs"]]
    now[0] += 61
    rep = r.cycle()
    assert rep.released == ("rc-rg-lost",), rep
    assert [g["groupName"] for g in kube.raw["spec"]["workerGroupSpecs"]] == ["gpu", "small"]
    assert [e[0] for e in kube.events] == ["ReservationReleased"] and "StateLost" in kube.events[0][2]


def test_dry_run_releases_nothing():
    kube = FakeKube(RECORDED)
    kube.raw["metadata"]["annotations"]["raygpu.io/reclaim"] = "dry-run"
    kube.configmaps = {"rc-rg-x"}
    stale = ReservationRecord(name="rc-rg-x", namespace=NS, group="rg-x", state="reserved", heartbeat_at_s=0)
    r = reclaimer(kube, FakeCache(kube, [stale]))
    rep = r.cycle()
    assert rep.outcome is CycleOutcome.DRY_RUN and [d.reservation for d in rep.gc.to_release] == ["rc-rg-x"]
    assert kube.deleted == [] and kube.patches == []


# ------------------------------------------------------------ the watch cache
class FakeList:
    """A kubernetes-client list method: LISTs answer ``lists`` in turn; WATCHes play ``watches`` in turn.

    A watch step is "gone" (HTTP 410), a list of (type, object) events, or "block" (until released).
    """

    def __init__(self, lists: list[tuple[str, list[dict]]], watches: list) -> None:
        self.lists, self.watches, self.calls = list(lists), list(watches), []
        self.release = threading.Event()

    def __call__(self, *args, watch=None, resource_version=None, _preload_content=True, **kw):
        from types import SimpleNamespace
        self.calls.append(("watch" if watch else "list", resource_version))
        if not watch:
            rv, items = self.lists.pop(0) if len(self.lists) > 1 else self.lists[0]
            return SimpleNamespace(data=json.dumps({"metadata": {"resourceVersion": rv}, "items": items}))
        step = self.watches.pop(0) if self.watches else "block"
        if step == "gone":
            from kubernetes.client import ApiException
            raise ApiException(status=410, reason="Gone: too old resource version")
        if step == "block":
            self.release.wait(5)
            step = []
        body = "".join(json.dumps({"type": t, "object": o}) + "\n" for t, o in step).encode()
        return SimpleNamespace(stream=lambda amt=None, decode_content=False: iter([body] if body else []),
                               close=lambda: None, release_conn=lambda: None, status=200)


def _pod_obj(name: str, rv: str) -> dict:
    return {"metadata": {"name": name, "namespace": NS, "resourceVersion": rv,
                         "labels": {"ray.io/cluster": "rc", "ray.io/group": "gpu", "ray.io/node-type": "worker"}},
            "spec": {"containers": [{"name": "ray-worker"}]}, "status": {"phase": "Running"}}


def test_watch_cache_lists_once_watches_and_resyncs_on_410_gone():
    from kubernetes.client import ApiClient, Configuration

    from raygpu.adapters.kube_watch import ClusterCache
    cache = ClusterCache(ApiClient(Configuration()), NS, "rc")
    pods = FakeList([("10", [_pod_obj("a", "9")]), ("20", [_pod_obj("a", "9"), _pod_obj("b", "19")])],
                    ["gone", [("ADDED", _pod_obj("c", "21")), ("DELETED", _pod_obj("a", "22"))]])
    rc = FakeList([("5", [RECORDED])], [])
    cms = FakeList([("7", [])], [])
    cache.kinds["pods"].list_fn, cache.kinds["raycluster"].list_fn, cache.kinds["reservations"].list_fn = pods, rc, cms
    cache.start()
    try:
        assert cache.wait_synced(5)
        deadline = time.monotonic() + 5
        while ([p.name for p in cache.view().pods] != ["b", "c"] or len(pods.calls) < 5) \
                and time.monotonic() < deadline:
            time.sleep(0.02)
        view = cache.view()
        assert [p.name for p in view.pods] == ["b", "c"] and view.synced
        assert view.cluster.resource_version == str(RV0)
        # LIST at start, WATCH from its version, 410 -> LIST again, WATCH from the new version, go on from the last event
        assert pods.calls[:5] == [("list", None), ("watch", "10"), ("list", None), ("watch", "20"), ("watch", "22")]
        assert cache.list_calls() == {"raycluster": 1, "pods": 2, "reservations": 1}
    finally:
        cache.stop()
        for f in (pods, rc, cms):
            f.release.set()


def test_cache_serves_our_own_write_until_the_watch_catches_up():
    from kubernetes.client import ApiClient, Configuration

    from raygpu.adapters.kube_watch import ClusterCache
    cache = ClusterCache(ApiClient(Configuration()), NS, "rc")
    kind = cache.kinds["raycluster"]
    kind.items["rc"] = RayClusterView.from_k8s(RECORDED)
    at = lambda rv: {**RECORDED, "metadata": {**RECORDED["metadata"], "resourceVersion": str(rv)}}  # noqa: E731
    cache.assume_cluster(RayClusterView.from_k8s(at(RV0 + 1)), str(RV0))
    assert cache.view().cluster.resource_version == str(RV0 + 1)
    assert cache.wait_cluster_change(str(RV0), 0.1)
    kind.items["rc"] = RayClusterView.from_k8s(at(RV0 + 2))
    assert cache.view().cluster.resource_version == str(RV0 + 2)  # someone wrote after us: trust the watch
