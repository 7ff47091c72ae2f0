"""The reclaimer's one JSON patch, applied to a RayCluster recorded from the testbed's API server.

Patches go through the RFC 6902 applier of ``raygpu.testing.builders.patch``, which behaves like the
API server: a failed ``test`` rejects the whole patch.
"""

from __future__ import annotations

import copy

import pytest

from raygpu.errors import PermanentError
from raygpu.reclaim.apply import reclaim_patch
from raygpu.testing.builders.patch import PatchTestFailed as PatchRejected
from raygpu.testing.builders.patch import apply_json_patch as json_patch
from raygpu.testing.builders.recorded import ALL_IDLE, R, RECORDED, RV0, plan_on, ray_view


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
