"""The unit tests' fake Kubernetes (raygpu.testing.fake_kube) keeps namespaces apart as the API server does, so
that a unit test can see a cross-namespace bug (issue 24 item 9)."""

from __future__ import annotations

import pytest

from raygpu.errors import ConflictError, NotFoundError
from raygpu.testing.builders import cluster
from raygpu.testing.builders.recorded import pod
from raygpu.testing.fake_kube import FakeKube


def cm(name: str, namespace: str, **data: str) -> dict:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": namespace,
                                                                  "labels": {"app": "x"}}, "data": data}


def two_namespaces() -> FakeKube:
    """ConfigMap ``x`` in namespace a and another ``x`` in namespace b (both created: no conflict)."""
    kube = FakeKube(cluster("c", namespace="a").worker("gpu", gpus=8).raw())
    kube.create(cm("x", "a", who="a"))
    kube.create(cm("x", "b", who="b"))
    return kube


def test_a_namespaced_object_is_seen_only_in_its_own_namespace():
    kube = two_namespaces()
    assert kube.get("v1", "ConfigMap", "x", "a")["data"] == {"who": "a"}
    assert kube.get("v1", "ConfigMap", "x", "b")["data"] == {"who": "b"}
    assert kube.get("v1", "ConfigMap", "x", "elsewhere") is None
    assert [o["data"] for o in kube.list("v1", "ConfigMap", "a", label_selector="app=x")] == [{"who": "a"}]
    assert sorted(o["data"]["who"] for o in kube.list("v1", "ConfigMap", None)) == ["a", "b"]  # all namespaces
    assert kube.get("v1", "ConfigMap", "x", "a")["metadata"]["uid"] != kube.get("v1", "ConfigMap", "x", "b")[
        "metadata"]["uid"]


def test_writes_in_one_namespace_never_touch_another():
    kube = two_namespaces()
    kube.merge_patch("v1", "ConfigMap", "x", "b", {"data": {"who": "patched"}})
    assert kube.get("v1", "ConfigMap", "x", "a")["data"] == {"who": "a"}
    with pytest.raises(NotFoundError):
        kube.merge_patch("v1", "ConfigMap", "x", "elsewhere", {"data": {}})
    b_uid = kube.get("v1", "ConfigMap", "x", "b")["metadata"]["uid"]
    with pytest.raises(ConflictError):  # b's uid is not a's: the precondition fails, a stays
        kube.delete("v1", "ConfigMap", "x", "a", uid=b_uid)
    assert kube.delete("v1", "ConfigMap", "x", "a") is True
    assert kube.get("v1", "ConfigMap", "x", "a") is None
    assert kube.get("v1", "ConfigMap", "x", "b")["data"] == {"who": "patched"}
    assert kube.delete("v1", "ConfigMap", "x", "a") is False  # already gone there


def test_the_raycluster_and_its_pods_are_found_only_in_its_namespace():
    mine, theirs = (pod(name, "gpu", "k1").model_copy(update={"namespace": ns}) for name, ns in (("mine", "a"),
                                                                                                ("theirs", "b")))
    kube = FakeKube(cluster("c", namespace="a").worker("gpu", gpus=8).raw(), pods=[mine, theirs])
    assert kube.get_raycluster("a", "c").name == "c"
    assert kube.get("ray.io/v1", "RayCluster", "c", "a")["metadata"]["uid"] == "uid-c"
    assert kube.get("ray.io/v1", "RayCluster", "c", "b") is None
    for call in (lambda: kube.get_raycluster("b", "c"), lambda: kube.raw_raycluster("b", "c"),
                 lambda: kube.patch_raycluster("b", "c", [{"op": "test", "path": "/metadata/resourceVersion",
                                                           "value": kube.raw["metadata"]["resourceVersion"]}])):
        with pytest.raises(NotFoundError):
            call()
    assert kube.patches == []
    assert [p.name for p in kube.ray_pods("a", "rc")] == ["mine"]  # the recorded pods' cluster label: rc
    assert [p.name for p in kube.ray_pods("b")] == ["theirs"]
    assert sorted(p.name for p in kube.ray_pods(None)) == ["mine", "theirs"]
    assert kube.ray_pods("a", "another-cluster") == []


def test_a_cluster_scoped_kind_ignores_the_namespace_and_a_namespaced_one_needs_one():
    kube = FakeKube(cluster("c").raw())
    kube.put({"metadata": {"name": "n1"}}, "Node")
    assert kube.get("v1", "Node", "n1")["metadata"]["name"] == "n1"
    assert kube.get("v1", "Node", "n1", "any")["metadata"]["name"] == "n1"
    assert [o["metadata"]["name"] for o in kube.list("v1", "Node", "any")] == ["n1"]
    assert kube.get("v1", "ConfigMap", "n1") is None  # a namespaced kind at the cluster path: not found
    with pytest.raises(ValueError, match="namespace is required"):
        kube.create({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "no-namespace"}})
