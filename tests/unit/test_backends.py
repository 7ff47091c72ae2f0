"""Gang backends: the worker group copy and each backend's wiring, checked against upstream field names."""

from __future__ import annotations

import copy

import pytest
from raygpu.testing.builders.clusters import cluster, gang, gpus
from raygpu.testing.builders.patch import apply_json_patch

from raygpu.errors import PermanentError
from raygpu.gang.backends import (CoschedulingBackend, KueueBackend, NoneBackend, VolcanoBackend, WorkloadBackend,
                                  get_backend)
from raygpu.gang.backends.base import format_quantity
from raygpu.model.gang import Backend
from raygpu.model.raycluster import RayClusterView
from raygpu.plan.gang.reservation import plan_gang
from raygpu.plan.common.patch import add_worker_group, raycluster_patch

BASE = cluster().worker("cpu", cpus=8).worker("gpu", gpus=8, cpus=96, memory="512Gi",
                                              sidecar={"cpu": "500m", "memory": "1Gi"})
OWNER = {"apiVersion": "ray.io/v1", "kind": "RayCluster", "name": "c", "uid": "uid-c", "controller": True}


def setup(backend: str, n: int = 6, queue: str | None = "team-a", **kw):
    view = BASE.obj()
    req = gang(gpus(8, n), "STRICT_SPREAD", backend=backend, queue=queue, **kw)
    plan = plan_gang(req, view)
    return plan, view.group(plan.need.template_group), req


@pytest.mark.parametrize("name,cls", [("coscheduling", CoschedulingBackend), ("KUEUE", KueueBackend),
                                      ("volcano", VolcanoBackend), ("none", NoneBackend),
                                      (Backend.VOLCANO, VolcanoBackend), ("Workload", WorkloadBackend)])
def test_registry(name, cls):
    backend = get_backend(name)
    assert type(backend) is cls and backend.name is Backend(cls.name)


@pytest.mark.parametrize("name", ["slurm", "", "yunikorn"])
def test_registry_rejects_unknown_names(name):
    with pytest.raises(PermanentError, match="unknown gang backend"):
        get_backend(name)


@pytest.mark.parametrize("backend", ["coscheduling", "kueue", "volcano", "workload", "none"])
def test_worker_group_is_a_pinned_copy_of_the_template(backend):
    plan, group, req = setup(backend, owner_job="02000000")
    before = copy.deepcopy(group.template)
    spec = get_backend(backend).worker_group_spec(plan, group, req)
    assert group.template == before  # the snapshot is not mutated
    assert spec["groupName"] == plan.reservation_group == "rg-job1"
    assert spec["replicas"] == spec["minReplicas"] == spec["maxReplicas"] == 6
    assert spec["labels"] == {"raygpu.io/reservation": "rg-job1"}  # -> ray start --labels
    assert spec["rayStartParams"] == group.ray_start_params
    pod_labels = spec["template"]["metadata"]["labels"]
    assert pod_labels["raygpu.io/reservation"] == "rg-job1" and pod_labels["team"] == "ml"
    assert pod_labels["raygpu.io/owner-job"] == "02000000"
    assert spec["template"]["spec"]["containers"] == group.template["spec"]["containers"]


@pytest.mark.parametrize("backend,labels,annotations,scheduler,objects", [
    ("coscheduling", {"scheduling.x-k8s.io/pod-group": "c-rg-job1"}, {}, "scheduler-plugins-scheduler", 1),
    ("kueue", {"kueue.x-k8s.io/queue-name": "team-a", "kueue.x-k8s.io/pod-group-name": "c-rg-job1"},
     {"kueue.x-k8s.io/pod-group-total-count": "6"}, None, 0),
    ("volcano", {}, {"scheduling.k8s.io/group-name": "c-rg-job1"}, "volcano", 1),
    ("workload", {"raygpu.io/scheduling-group": "c-rg-job1"}, {}, "default-scheduler", 2),
    ("none", {}, {}, None, 0),
])
def test_backend_wiring(backend, labels, annotations, scheduler, objects):
    plan, group, req = setup(backend)
    spec = get_backend(backend).worker_group_spec(plan, group, req)
    meta = spec["template"]["metadata"]
    assert labels.items() <= meta["labels"].items()
    assert annotations.items() <= meta.get("annotations", {}).items()
    gang_keys = {"scheduling.x-k8s.io/pod-group", "kueue.x-k8s.io/queue-name", "scheduling.k8s.io/group-name",
                 "kueue.x-k8s.io/pod-group-name", "kueue.x-k8s.io/pod-group-total-count", "raygpu.io/scheduling-group"}
    assert gang_keys & (set(meta["labels"]) | set(meta.get("annotations", {}))) == set(labels) | set(annotations)
    assert spec["template"]["spec"].get("schedulerName") == scheduler
    assert len(get_backend(backend).gang_objects(plan, req, OWNER)) == objects


def test_coscheduling_pod_group():
    plan, group, req = setup("coscheduling", timeout_s=90.5)
    [pg] = get_backend("coscheduling").gang_objects(plan, req, OWNER)
    assert (pg["apiVersion"], pg["kind"]) == ("scheduling.x-k8s.io/v1alpha1", "PodGroup")
    assert pg["metadata"]["name"] == "c-rg-job1" and pg["metadata"]["namespace"] == "default"
    assert pg["metadata"]["ownerReferences"] == [OWNER]
    assert pg["metadata"]["labels"] == {"raygpu.io/reservation": "rg-job1", "raygpu.io/cluster": "c"}
    # 6 pods x (96 CPU + 0.5 sidecar, 512Gi + 1Gi, 8 GPUs)
    assert pg["spec"] == {"minMember": 6, "scheduleTimeoutSeconds": 91,
                          "minResources": {"cpu": "579", "memory": str(6 * 513 * 2**30), "nvidia.com/gpu": "48"}}


def test_only_coscheduling_nudges_a_waiting_gang():
    """Coscheduling requeues rejected pods on a PodGroup update, not on a new node: the heartbeat touches it."""
    plan, _, _ = setup("coscheduling")
    [(api, kind, name, body)] = get_backend("coscheduling").requeue_patches(plan, 1234.4)
    [pg] = get_backend("coscheduling").gang_objects(plan, setup("coscheduling")[2], None)
    assert (api, kind, name) == (pg["apiVersion"], pg["kind"], pg["metadata"]["name"])
    assert body == {"metadata": {"annotations": {"raygpu.io/requeue-at": "1234"}}}
    for other in ("kueue", "volcano", "workload", "none"):  # Kueue requeues on its own; Volcano retries every session
        assert get_backend(other).requeue_patches(setup(other)[0], 1.0) == []


@pytest.mark.parametrize("queue,expected", [(None, "default"), ("gpu-q", "gpu-q")])
def test_volcano_pod_group(queue, expected):
    plan, group, req = setup("volcano", queue=queue)
    [pg] = get_backend("volcano").gang_objects(plan, req, None)
    assert (pg["apiVersion"], pg["kind"]) == ("scheduling.volcano.sh/v1beta1", "PodGroup")
    assert "ownerReferences" not in pg["metadata"]
    assert pg["spec"]["minMember"] == 6 and pg["spec"]["queue"] == expected
    assert pg["spec"]["minResources"]["nvidia.com/gpu"] == "48"
    spec = get_backend("volcano").worker_group_spec(plan, group, req)
    assert spec["template"]["metadata"]["annotations"]["scheduling.k8s.io/group-name"] == pg["metadata"]["name"]


def test_kueue_needs_a_queue():
    plan, group, req = setup("kueue")
    no_queue = plan.model_copy(update={"queue": None})
    with pytest.raises(PermanentError, match="LocalQueue"):
        get_backend("kueue").worker_group_spec(no_queue, group, req.model_copy(update={"queue": None}))


def test_mismatched_plan_is_refused():
    plan, group, req = setup("volcano")
    with pytest.raises(PermanentError, match="for backend volcano"):
        get_backend("coscheduling").worker_group_spec(plan, group, req)
    with pytest.raises(PermanentError, match="copies group 'gpu'"):
        get_backend("volcano").worker_group_spec(plan, BASE.obj().group("cpu"), req)


def test_foreign_gang_wiring_is_stripped():
    raw = BASE.raw()
    meta = raw["spec"]["workerGroupSpecs"][1]["template"]["metadata"]
    meta["labels"]["scheduling.x-k8s.io/pod-group"] = "someone-else"
    meta["annotations"] = {"scheduling.k8s.io/group-name": "someone-else", "keep": "me"}
    view = RayClusterView.from_k8s(raw)
    req = gang(gpus(8, 2), "SPREAD", backend="none")
    plan = plan_gang(req, view)
    out = get_backend("none").worker_group_spec(plan, view.group("gpu"), req)["template"]["metadata"]
    assert "scheduling.x-k8s.io/pod-group" not in out["labels"]
    assert out["annotations"] == {"keep": "me"}


def test_group_round_trips_through_a_raycluster_patch():
    plan, group, req = setup("coscheduling")
    spec = get_backend("coscheduling").worker_group_spec(plan, group, req)
    raw = BASE.raw()
    after = RayClusterView.from_k8s(apply_json_patch(raw, raycluster_patch("1001", add_worker_group(spec))))
    rg = after.group("rg-job1")
    assert (rg.replicas, rg.min_replicas, rg.max_replicas) == (6, 6, 6)
    assert (rg.ray_gpus, rg.ray_cpus, rg.limits) == (group.ray_gpus, group.ray_cpus, group.limits)
    assert rg.ray_labels == {"raygpu.io/reservation": "rg-job1"}
    assert rg.scheduler_name == "scheduler-plugins-scheduler"


@pytest.mark.parametrize("resource,amount,text", [("cpu", 96, "96"), ("cpu", 0.5, "500m"), ("cpu", 96.5, "96500m"),
                                                  ("memory", 2**30, "1073741824"), ("nvidia.com/gpu", 48.0, "48")])
def test_format_quantity(resource, amount, text):
    assert format_quantity(resource, amount) == text
