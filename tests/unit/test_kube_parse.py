"""One object that does not parse never hides the others: bad values take a safe default and are recorded."""

from __future__ import annotations

import copy
import json
from types import SimpleNamespace

import pytest

from raygpu.adapters.kube import node_view, parse_each, pod_view
from raygpu.model.raycluster import RayClusterView
from raygpu.plan.gang.capacity import template_capacity
from raygpu.errors import PermanentError
from raygpu.testing.builders.recorded import RECORDED


def pod(name: str, *, start_cmd: str | None = None, gpu: str = "1", created: str = "2024-05-01T12:00:00Z") -> dict:
    env = [{"name": "KUBERAY_GEN_RAY_START_CMD", "value": start_cmd}] if start_cmd else []
    return {"metadata": {"name": name, "namespace": "ns", "creationTimestamp": created,
                         "labels": {"ray.io/cluster": "rc", "ray.io/group": "gpu", "ray.io/node-type": "worker"}},
            "spec": {"containers": [{"name": "ray-worker", "env": env,
                                     "resources": {"limits": {"nvidia.com/gpu": gpu, "cpu": "4"}}}]},
            "status": {"phase": "Running"}}


@pytest.mark.parametrize("cmd, want", [
    ("ray start --num-gpus=2 --block", 2.0),
    ("ray start --num-gpus='4'", 4.0),
    ("ray start --num-gpus=$(N) --block", None),
    ("ray start --num-gpus=", None),
    ("ray start --num-gpus=-1", None),
    ("ray start --num-gpus=nan", None),
    ("ray start --num-gpus=1e9", None),  # not a pod's GPUs: a typo, never planned as 10^9 GPUs
])
def test_pod_start_command_num_gpus(cmd, want):
    v = pod_view(pod("p", start_cmd=cmd))
    assert v.ray_start_num_gpus == want
    assert bool(v.problems) == (want is None)
    if want is None:
        assert "Pod ns/p" in v.problems[0].message and "--num-gpus" in v.problems[0].message


def test_pod_and_node_quantities_that_are_not_quantities_are_left_out_and_recorded():
    v = pod_view(pod("p", gpu="abc"))
    assert v.limits == {"cpu": 4.0} and v.problems[0].field == "containers[ray-worker].limits.nvidia.com/gpu"
    n = node_view({"metadata": {"name": "n1"}, "status": {"capacity": {"cpu": "8", "nvidia.com/gpu": "x8"},
                                                           "allocatable": {"cpu": "8"}}})
    assert n.capacity == {"cpu": 8.0} and n.allocatable == {"cpu": 8.0}
    assert n.problems[0].message.startswith("Node n1: capacity.nvidia.com/gpu='x8'")


def test_parse_each_skips_the_one_object_that_cannot_be_parsed(caplog):
    views = parse_each([pod("a"), pod("bad", created="yesterday"), pod("c")], pod_view, "Pod")
    assert [v.name for v in views] == ["a", "c"]
    assert "skipping Pod ns/bad" in caplog.text


def test_ray_pods_lists_every_good_pod_when_one_is_bad():
    from raygpu.adapters.kube import KubeAdapter
    kube = KubeAdapter.__new__(KubeAdapter)  # no API server: only the listing's parse is under test
    kube._t = {}
    body = json.dumps({"items": [pod("a", start_cmd="ray start --num-gpus=$(N)"), pod("b", created="?")]})
    kube.core = SimpleNamespace(list_namespaced_pod=lambda *a, **kw: SimpleNamespace(data=body))
    assert [p.name for p in kube.ray_pods("ns", "rc")] == ["a"]


def _recorded_with(mutate) -> dict:
    obj = copy.deepcopy(RECORDED)
    mutate(obj["spec"]["workerGroupSpecs"][0])
    return obj


def test_raycluster_bad_values_take_safe_defaults_and_are_recorded():
    def bad(g):
        g["rayStartParams"]["num-gpus"] = "abc"
        g["rayStartParams"]["num-cpus"] = "-2"
        g["maxReplicas"] = "lots"
        g["template"]["spec"]["containers"][0].setdefault("resources", {}).setdefault("requests", {})["memory"] = "1 GB"
    rc = RayClusterView.from_k8s(_recorded_with(bad))
    g = rc.worker_groups[0]
    fields = [p.field for p in rc.problems]
    assert fields == ["requests.memory", "rayStartParams.num-gpus", "rayStartParams.num-cpus", "maxReplicas"]
    assert g.ray_start_params["num-gpus"] == "abc"  # kept as written: a copy of the group is the user's spec
    assert g.ray_gpus == g.limits.get("nvidia.com/gpu", 0.0) and g.max_replicas == 2**31 - 1
    assert "memory" not in g.requests
    with pytest.raises(PermanentError, match="rayStartParams.num-gpus='abc' is not a number"):
        template_capacity(g)


def test_an_out_of_range_num_gpus_takes_the_containers_limit_and_is_recorded():
    def huge(g):
        g["rayStartParams"]["num-gpus"] = "1e9"
    rc = RayClusterView.from_k8s(_recorded_with(huge))
    g = rc.worker_groups[0]
    assert g.ray_gpus == g.limits.get("nvidia.com/gpu", 0.0) < 1e9
    assert [(p.field, p.value) for p in rc.problems] == [("rayStartParams.num-gpus", "1e9")]
    assert "is not a number in [0, 1024]" in rc.problems[0].message


def test_a_good_raycluster_has_no_problems():
    assert RayClusterView.from_k8s(RECORDED).problems == ()


@pytest.mark.parametrize("start, ads, want_start, want_ads, problems", [
    ("2024-05-01T12:00:10Z", 60, 1714564810.0, 60.0, 0),
    (None, None, None, None, 0),  # not started, no deadline
    ("soon", 0, None, None, 2),  # bad values: safe defaults, recorded
    (None, True, None, None, 1),  # a bool is no number of seconds
])
def test_pod_start_time_and_active_deadline(start, ads, want_start, want_ads, problems):
    raw = pod("p")
    raw["status"]["startTime"] = start
    raw["spec"]["activeDeadlineSeconds"] = ads
    v = pod_view(raw)
    assert (v.started_at_s, v.active_deadline_s, len(v.problems)) == (want_start, want_ads, problems)
