"""plan_gang's pod shapes for admission (raygpu.plan.gang.shapes): least waste first, then what binds now,
else the smallest pods; STRICT_PACK stays one pod. One line per case."""

from __future__ import annotations

import math

import pytest
from raygpu.testing.builders.clusters import cluster, gang, gpus

from raygpu.errors import PermanentError
from raygpu.model.gang import NodeFree
from raygpu.model.views import K8sNodeView, K8sPodView
from raygpu.plan.gang.reservation import plan_gang
from raygpu.plan.gang.shapes import admission_fit, free_nodes

GPU_K = "nvidia.com/gpu"


def groups(*sizes: int):
    """Worker groups of 1/2/4/8 GPUs whose CPU and memory grow with the GPUs (so no shape idles more CPU)."""
    b = cluster()
    for n in sizes:
        b = b.worker(f"gpu{n}", gpus=n, cpus=8 * n, memory=f"{64 * n}Gi", max_replicas=100)
    return b


ALL = groups(1, 2, 4, 8)
ONLY8 = groups(8)
FLAT_CPU = cluster().worker("gpu2", gpus=2, cpus=32).worker("gpu8", gpus=8, cpus=32)  # same CPU per pod


def node(free_gpu: float, alloc_gpu: float = 8, count: int = 1) -> NodeFree:
    big = {"cpu": 1000.0, "memory": 2.0**50}
    return NodeFree(free={GPU_K: free_gpu, **big}, allocatable={GPU_K: alloc_gpu, **big}, count=count)


FRAGS_2 = (node(2),) * 4
HALVES = (node(4), node(4))
ONE_EMPTY = (node(8),)


@pytest.mark.parametrize("builder,bundles,strategy,free,template,pods", [
    # the old planner merged 4 x {GPU: 2} into one 8-GPU pod in every one of these (fewest pods on equal waste)
    pytest.param(ALL, gpus(2, 4), "PACK", None, "gpu2", 4, id="unknown-free-one-pod-per-bundle"),
    pytest.param(ALL, gpus(2, 4), "PACK", FRAGS_2, "gpu2", 4, id="fits-four-2-gpu-fragments"),
    pytest.param(ALL, gpus(2, 4), "PACK", HALVES, "gpu4", 2, id="two-half-free-nodes-fewest-pods-that-bind"),
    pytest.param(ALL, gpus(2, 4), "PACK", ONE_EMPTY + FRAGS_2, "gpu2", 4, id="fragments-before-an-untouched-node"),
    pytest.param(ALL, gpus(2, 4), "PACK", (node(1), node(1)), "gpu2", 4, id="nothing-binds-smallest-pods"),
    pytest.param(ALL, gpus(2, 4), "PACK", (node(2, count=4),), "gpu2", 4, id="count-is-identical-nodes"),
    pytest.param(ALL, gpus(1, 8), "PACK", (node(4), node(4)), "gpu4", 2, id="8x1-into-two-halves"),
    # what the new rule keeps as it was
    pytest.param(ALL, gpus(2, 4), "PACK", ONE_EMPTY, "gpu8", 1, id="one-untouched-node-fewest-pods"),
    pytest.param(ALL, gpus(2, 4), "STRICT_PACK", FRAGS_2, "gpu8", 1, id="strict-pack-stays-one-pod"),
    pytest.param(ALL, gpus(2, 4), "STRICT_PACK", None, "gpu8", 1, id="strict-pack-stays-one-pod-unknown"),
    pytest.param(ONLY8, gpus(2, 4), "PACK", FRAGS_2, "gpu8", 1, id="no-smaller-template-no-extra-waste"),
    pytest.param(FLAT_CPU, gpus(2, 4), "PACK", FRAGS_2, "gpu8", 1, id="smaller-pods-would-idle-more-cpu"),
    pytest.param(ALL, gpus(2, 3), "PACK", ONE_EMPTY, "gpu2", 3, id="least-gpu-waste-still-first"),
    pytest.param(ALL, gpus(8, 2), "SPREAD", FRAGS_2, "gpu8", 2, id="spread-one-per-pod"),
])
def test_shape_for_admission(builder, bundles, strategy, free, template, pods):
    plan = plan_gang(gang(bundles, strategy), builder.obj(), free=free)
    assert (plan.need.template_group, plan.pod_count) == (template, pods)
    cap = plan.need.ray_resources
    for p in range(plan.pod_count):  # every pod holds what is planned on it
        on = [bundles[i] for i in plan.bundles_on_pod(p)]
        assert on and all(sum(b.get(r, 0) for b in on) <= cap.get(r, 0) + 1e-9 for r in {"GPU", "CPU"})


def test_reason_says_why_the_shape():
    plan = plan_gang(gang(gpus(2, 4)), ALL.obj(), free=FRAGS_2)
    assert "all 4 pod(s) fit the free nodes now, in existing fragments" in plan.reason
    waiting = plan_gang(gang(gpus(2, 4)), ALL.obj(), free=(node(1),))
    assert "only 0 of 4 pod(s) fit the free nodes now" in waiting.reason
    unknown = plan_gang(gang(gpus(2, 4)), ALL.obj())
    assert "free capacity not given" in unknown.reason


def test_same_inputs_same_plan():
    c, free = ALL.obj(), ONE_EMPTY + FRAGS_2
    assert plan_gang(gang(gpus(2, 4)), c, free=free) == plan_gang(gang(gpus(2, 4)), c, free=free)


@pytest.mark.parametrize("need,pods,free,binds,untouched", [
    ({GPU_K: 2}, 4, FRAGS_2, True, 0),
    ({GPU_K: 2}, 5, FRAGS_2, False, 0),
    ({GPU_K: 2}, 5, FRAGS_2 + ONE_EMPTY, True, 1),
    ({GPU_K: 4}, 3, (node(8, count=3),), True, 2),  # two per untouched node: the fewest broken
    ({GPU_K: 2, "cpu": 8}, 1, (NodeFree(free={GPU_K: 8, "cpu": 4}),), False, 0),  # GPUs free, CPU not
    ({GPU_K: 2}, 1, (NodeFree(free={GPU_K: -3}, allocatable={GPU_K: 8}),), False, 0),  # overcommitted
    ({GPU_K: 2}, 1, (), False, 0),
])
def test_admission_fit(need, pods, free, binds, untouched):
    fit = admission_fit(need, pods, free)
    assert (fit.binds_now, fit.untouched_nodes_used) == (binds, untouched)


def test_admission_fit_unknown():
    assert admission_fit({GPU_K: 1}, 1, None).binds_now is None


def test_free_nodes_from_kubernetes_views():
    nodes = [K8sNodeView(name="a", allocatable={GPU_K: 8, "cpu": 96}),
             K8sNodeView(name="cordoned", allocatable={GPU_K: 8}, unschedulable=True),
             K8sNodeView(name="down", allocatable={GPU_K: 8}, ready=False)]
    pods = [K8sPodView(name="p1", namespace="x", node_name="a", phase="Running", requests={GPU_K: 3, "cpu": 10}),
            K8sPodView(name="p2", namespace="x", node_name="a", phase="Succeeded", requests={GPU_K: 4}),
            K8sPodView(name="p3", namespace="x", node_name="a", phase="Running", deleting=True, requests={GPU_K: 1}),
            K8sPodView(name="pending", namespace="x", requests={GPU_K: 8})]
    (a,) = free_nodes(nodes, pods)
    assert (a.name, a.free, a.allocatable) == ("a", {GPU_K: 4, "cpu": 86}, {GPU_K: 8, "cpu": 96})


@pytest.mark.parametrize("kw,words", [
    (dict(free={GPU_K: math.nan}), "finite"),
    (dict(free={GPU_K: "lots"}), "amounts must be numbers"),
    (dict(free=[1, 2]), "dict of resource"),
    (dict(free={GPU_K: 1}, count=0), "count must be an integer >= 1"),
    (dict(free={GPU_K: 1}, count=True), "count must be an integer >= 1"),
])
def test_bad_node_free_raises(kw, words):
    with pytest.raises(PermanentError, match=words):
        NodeFree(**kw)
