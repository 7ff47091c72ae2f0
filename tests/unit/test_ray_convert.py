"""Conversion of recorded Ray GCS replies (Ray 2.60, ``tests/ray`` cluster) and Kubernetes objects into views."""

from __future__ import annotations

import pytest

from raygpu.adapters.ray_gcs import node_view, placement_group_view
from raygpu.model.views import PgState
from raygpu.doctor.snapshot import device_plugin_pod, resource_slice

GPU_NODE_ID = "052bcc01ddc6d07e43c0e577dad95020a21556f693a3ab02cf5c9063"
HEAD_ID = "85d7e3b636af940143176b8bed11234776d05488114574c2bd5f1120"
PG = "517d193e0843897beb68a98afcea01000000"


# dataclasses.asdict(ray.autoscaler.v2.schema.NodeInfo), as read_ray_view gets them.
GPU_NODE = {
    "instance_type_name": "", "ray_node_type_name": "gpu-group", "instance_id": "pod-gpu-0", "ip_address": "192.0.2.2",
    "node_status": "RUNNING", "node_id": GPU_NODE_ID, "failure_detail": None, "details": None,
    "node_activity": ["Resource: CPU currently in use.", "Resource: GPU currently in use."],
    "labels": {"raygpu.io/reservation": "r1", "ray.io/node-group": "gpu-group", "ray.io/node-id": GPU_NODE_ID},
    "resource_usage": {"idle_time_ms": 0, "usage": [
        {"resource_name": f"GPU_group_{PG}", "total": 8.0, "used": 0.0},
        {"resource_name": f"bundle_group_{PG}", "total": 2000.0, "used": 0.0},
        {"resource_name": f"CPU_group_1_{PG}", "total": 1.0, "used": 0.0},
        {"resource_name": f"GPU_group_0_{PG}", "total": 4.0, "used": 0.0},
        {"resource_name": "accelerator_type:H100", "total": 1.0, "used": 0.0},
        {"resource_name": "memory", "total": 24374407168.0, "used": 0.0},
        {"resource_name": "CPU", "total": 1.0, "used": 1.0},
        {"resource_name": "GPU", "total": 8.0, "used": 8.0},
        {"resource_name": "node:192.0.2.2", "total": 1.0, "used": 0.0}]}}
HEAD = {
    "instance_type_name": "", "ray_node_type_name": f"node_{HEAD_ID}", "instance_id": "", "ip_address": "192.0.2.2",
    "node_status": "IDLE", "node_id": HEAD_ID, "failure_detail": None, "details": None, "node_activity": [],
    "labels": {"ray.io/node-id": HEAD_ID},
    "resource_usage": {"idle_time_ms": 3061, "usage": [
        {"resource_name": "CPU", "total": 1.0, "used": 0.0},
        {"resource_name": "node:__internal_head__", "total": 1.0, "used": 0.0}]}}
DEAD = {
    "instance_type_name": "", "ray_node_type_name": "cpu-group", "instance_id": "pod-cpu-0", "ip_address": "192.0.2.2",
    "node_status": "DEAD", "node_id": "bb629783605173aa32ea70ad63466ee3a589332152a376ecd5c2a7c2",
    "resource_usage": None, "failure_detail": "NodeTerminated", "details": None, "node_activity": [], "labels": {}}

# MessageToDict(PlacementGroupTableData, preserving_proto_field_name=True), stats and namespace left out.
_NIL_ACTOR = "/////////////////////w=="
CREATED = {
    "placement_group_id": "UX0ZPghDiXvraKmK/OoBAAAA", "name": "pg1", "strategy": "STRICT_PACK", "state": "CREATED",
    "bundles": [
        {"bundle_id": {"placement_group_id": "UX0ZPghDiXvraKmK/OoBAAAA", "bundle_index": 1},
         "unit_resources": {"CPU": 1.0, "GPU": 4.0}, "node_id": "BSvMAd3G0H5DwOV32tlQIKIVVvaTo6sCz1yQYw==",
         "label_selector": {"raygpu.io/reservation": "r1"}},
        {"bundle_id": {"placement_group_id": "UX0ZPghDiXvraKmK/OoBAAAA"}, "unit_resources": {"GPU": 4.0},
         "node_id": "BSvMAd3G0H5DwOV32tlQIKIVVvaTo6sCz1yQYw==", "label_selector": {"raygpu.io/reservation": "r1"}}],
    "creator_job_id": "AQAAAA==", "creator_actor_id": _NIL_ACTOR, "creator_actor_dead": True}
PENDING = {  # state PENDING (0) and bundle_index 0 are proto defaults: absent
    "placement_group_id": "rO0fAE/kcot+wvj4ClgBAAAA", "name": "pending", "strategy": "SPREAD",
    "bundles": [{"bundle_id": {"placement_group_id": "rO0fAE/kcot+wvj4ClgBAAAA"}, "unit_resources": {"GPU": 16.0}}],
    "creator_job_id": "AQAAAA==", "creator_actor_id": _NIL_ACTOR, "creator_actor_dead": True}
REMOVED = {  # strategy PACK (0) absent
    "placement_group_id": "R/40pkgXt6sT6MinbxYBAAAA", "name": "gone", "state": "REMOVED",
    "bundles": [{"bundle_id": {"placement_group_id": "R/40pkgXt6sT6MinbxYBAAAA"}, "unit_resources": {"CPU": 0.1},
                 "node_id": "u2KXg2BRc6oy6nCtY0Zu46WJMyFSo3bs1cKnwg=="}],
    "creator_job_id": "AQAAAA==", "creator_actor_id": _NIL_ACTOR, "creator_actor_dead": True}


def test_gpu_node_drops_pg_derived_resources_and_keeps_identity():
    v = node_view(GPU_NODE, now_s=1000.0)
    assert (v.node_id, v.alive, v.is_head, v.instance_id, v.node_type) == (GPU_NODE_ID, True, False, "pod-gpu-0",
                                                                           "gpu-group")
    assert v.total == {"accelerator_type:H100": 1.0, "memory": 24374407168.0, "CPU": 1.0, "GPU": 8.0,
                       "node:192.0.2.2": 1.0}
    assert (v.gpu_total, v.gpu_available, v.available["CPU"]) == (8.0, 0.0, 0.0)
    assert v.labels["raygpu.io/reservation"] == "r1"
    assert (v.accelerator_type, v.idle_since_s, v.ip) == ("H100", None, "192.0.2.2")


@pytest.mark.parametrize("info, alive, is_head, node_type, instance_id, idle_since_s", [
    (HEAD, True, True, None, None, 1000.0 - 3.061),  # parser's node_<id> stand-in type -> None
    (DEAD, False, False, "cpu-group", "pod-cpu-0", None),
])
def test_node_status_head_and_idle(info, alive, is_head, node_type, instance_id, idle_since_s):
    v = node_view(info, now_s=1000.0)
    assert (v.alive, v.is_head, v.node_type, v.instance_id) == (alive, is_head, node_type, instance_id)
    assert v.idle_since_s == pytest.approx(idle_since_s) if idle_since_s else v.idle_since_s is None


def test_a_draining_node_is_alive_and_marked_draining():
    """Ray's DRAINING state (an accepted drain): alive (it may still run work), takes no new work."""
    v = node_view({**GPU_NODE, "node_status": "DRAINING"}, now_s=0)
    assert (v.alive, v.draining, v.idle_since_s) == (True, True, None)
    assert not node_view(GPU_NODE, now_s=0).draining and not node_view(DEAD, now_s=0).draining


def test_accelerator_label_wins_over_resource():
    info = {**GPU_NODE, "labels": {"ray.io/accelerator-type": "A100"}}
    assert node_view(info, now_s=0).accelerator_type == "A100"


@pytest.mark.parametrize("pg, state, strategy, bundles, node_ids, selectors", [
    (CREATED, PgState.CREATED, "STRICT_PACK", ({"GPU": 4.0}, {"CPU": 1.0, "GPU": 4.0}),  # sorted by bundle index
     (GPU_NODE_ID, GPU_NODE_ID), ({"raygpu.io/reservation": "r1"},) * 2),
    (PENDING, PgState.PENDING, "SPREAD", ({"GPU": 16.0},), (None,), ({},)),
    (REMOVED, PgState.REMOVED, "PACK", ({"CPU": 0.1},), (DEAD["node_id"],), ({},)),  # where it was
])
def test_placement_group_table_row(pg, state, strategy, bundles, node_ids, selectors):
    v = placement_group_view(pg)
    assert (v.state, v.strategy, v.bundles, v.bundle_label_selectors) == (state, strategy, bundles, selectors)
    assert v.bundle_node_ids == node_ids
    assert v.creator_job_id == "01000000"
    assert len(v.pg_id) == 36 and v.name == pg["name"]


# ------------------------------------------------ Kubernetes objects read by snapshot.py
def _plugin_pod(node: str | None, ready: str, affinity_node: str | None = None) -> dict:
    spec: dict = {"nodeName": node} if node else {}
    if affinity_node:
        spec["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [affinity_node]}]}]}}}
    return {"metadata": {"name": "nvidia-device-plugin-daemonset-x7k2p", "namespace": "kube-system"}, "spec": spec,
            "status": {"conditions": [{"type": "PodScheduled", "status": "True"}, {"type": "Ready", "status": ready}]}}


@pytest.mark.parametrize("pod, node_name, ready", [
    (_plugin_pod("gpu-1", "True"), "gpu-1", True),
    (_plugin_pod("gpu-1", "False"), "gpu-1", False),
    (_plugin_pod(None, "False", affinity_node="gpu-2"), "gpu-2", False),  # unscheduled DaemonSet pod
])
def test_device_plugin_pod(pod, node_name, ready):
    v = device_plugin_pod(pod)
    assert (v.node_name, v.ready, v.namespace) == (node_name, ready, "kube-system")


def test_device_plugin_pod_without_node_is_skipped():
    assert device_plugin_pod(_plugin_pod(None, "False")) is None


def test_resource_slice():
    s = {"metadata": {"name": "gpu-1-gpu.nvidia.com-abcde"},
         "spec": {"driver": "gpu.nvidia.com", "nodeName": "gpu-1", "pool": {"name": "gpu-1", "generation": 1,
                  "resourceSliceCount": 1}, "devices": [{"name": "gpu-0"}, {"name": "gpu-1"}]}}
    v = resource_slice(s)
    assert (v.name, v.node_name, v.driver, v.device_count, v.pool, v.pool_generation, v.pool_slice_count) == (
        "gpu-1-gpu.nvidia.com-abcde", "gpu-1", "gpu.nvidia.com", 2, "gpu-1", 1, 1)
    assert [d.name for d in v.devices] == ["gpu-0", "gpu-1"]