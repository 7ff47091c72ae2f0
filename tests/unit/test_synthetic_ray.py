"""The scale test's Ray view synthesized from pods (raygpu.testing.synthetic_ray) and its KubeRay-like pods."""

from __future__ import annotations

import pytest

from raygpu.adapters.kube import pod_view
from raygpu.testing import manifests as m
from raygpu.testing.synthetic_ray import ANNOTATION_RAY_IDLE_S, PodsRayView, ray_view_of

NOW_S = 1_000_000.0


def pod(name: str, *, head: bool = False, idle_s: str | None = None, gpus: int = 4, phase: str = "Running",
        deleting: bool = False):
    body = m.ray_pod("rc", "ns", name, group="headgroup" if head else "gpu", node_name="n1", owner_uid="u-1",
                     head=head, gpus=0 if head else gpus,
                     annotations={ANNOTATION_RAY_IDLE_S: idle_s} if idle_s is not None else None)
    body["metadata"].update(uid=f"uid-{name}", creationTimestamp="2026-01-01T00:00:00Z")
    if deleting:
        body["metadata"]["deletionTimestamp"] = "2026-01-01T00:01:00Z"
    body["status"] = {"phase": phase}
    return pod_view(body)


def test_kuberay_like_pod_parses_as_a_worker_of_its_group_without_the_bridge_label():
    p = pod("rc-gpu-worker-00001")
    assert (p.ray_cluster, p.ray_group, p.ray_node_type, p.node_name) == ("rc", "gpu", "worker", "n1")
    assert p.ray_start_num_gpus == 4 and p.limits["nvidia.com/gpu"] == 4 and not p.problems
    assert "ray.io/is-ray-node" not in p.labels  # the testbed's Ray bridge must start no raylet for it


def test_idle_busy_and_head_as_ray_would_report_them():
    view = ray_view_of([pod("idle", idle_s="3600"), pod("busy"), pod("head", head=True)], NOW_S)
    by_pod = {n.instance_id: n for n in view.nodes}
    assert view.reachable and set(by_pod) == {"idle", "busy", "head"}
    idle, busy, head = by_pod["idle"], by_pod["busy"], by_pod["head"]
    assert idle.idle_since_s == NOW_S - 3600 and idle.gpu_total == 4 and idle.gpu_available == 4
    assert busy.idle_since_s is None and busy.gpu_total == 4 and busy.gpu_available == 0
    assert head.is_head and not idle.is_head and not busy.is_head
    assert (idle.node_type, head.node_type) == ("gpu", "headgroup")
    assert len({n.node_id for n in view.nodes}) == 3 and all(len(n.node_id) == 56 for n in view.nodes)


def test_only_running_pods_that_are_not_going_away_have_a_ray_node():
    view = ray_view_of([pod("pending", phase="Pending"), pod("deleting", deleting=True), pod("up")], NOW_S)
    assert [n.instance_id for n in view.nodes] == ["up"]


@pytest.mark.parametrize("bad", ["-1", "nan", "soon"])
def test_an_impossible_idle_annotation_fails_loudly(bad):
    with pytest.raises(ValueError):
        ray_view_of([pod("p", idle_s=bad)], NOW_S)


def test_the_provider_reads_the_pods_at_each_call():
    pods = [pod("a", idle_s="10")]
    read = PodsRayView(lambda: pods)
    assert [n.instance_id for n in read("ignored", timeout_s=1, now_s=NOW_S).nodes] == ["a"]
    pods.append(pod("b"))
    assert read("ignored", now_s=NOW_S).nodes[1].instance_id == "b"
    assert (read.calls, read.last_nodes) == (2, 2)
