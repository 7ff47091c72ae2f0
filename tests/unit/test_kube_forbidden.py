"""A 403 from the API server becomes a ForbiddenError that names the missing permission (issue 16 item 3).

The adapter knows what it asked (verb, resource, namespace); the error says it in RBAC's words, so an
operator can add exactly that rule. The API server here is a hand-written fake DynamicClient that refuses.
"""

from __future__ import annotations

import json

import pytest
from kubernetes.client import ApiException

from raygpu.adapters.kube import KubeAdapter, _convert
from raygpu.errors import ForbiddenError, NotFoundError

RBAC_MSG = ('podgroups.scheduling.x-k8s.io "g" is forbidden: User "system:serviceaccount:ns:raygpu-driver" '
            'cannot create resource "podgroups" in API group "scheduling.x-k8s.io" in the namespace "ns"')


def refusal(status: int = 403) -> ApiException:
    exc = ApiException(status=status, reason="Forbidden")
    exc.body = json.dumps({"kind": "Status", "message": RBAC_MSG, "reason": "Forbidden", "code": status})
    return exc


class Resource:
    """One API resource of the fake: every call raises ``exc``."""

    def __init__(self, name: str, group: str, exc: Exception) -> None:
        self.name, self.group, self._exc = name, group, exc

    def _raise(self, *args, **kwargs):
        raise self._exc

    create = get = patch = delete = _raise


class Resources:
    def __init__(self, table: dict[tuple[str, str], Resource]) -> None:
        self.table = table

    def get(self, api_version: str, kind: str) -> Resource:
        return self.table[(api_version, kind)]


def adapter(exc: Exception) -> KubeAdapter:
    kube = object.__new__(KubeAdapter)  # no server: only the dynamic client is used below
    kube._t = {}
    kube.dyn = type("Dyn", (), {})()
    kube.dyn.resources = Resources({
        ("scheduling.x-k8s.io/v1alpha1", "PodGroup"): Resource("podgroups", "scheduling.x-k8s.io", exc),
        ("v1", "ConfigMap"): Resource("configmaps", "", exc),
        ("ray.io/v1", "RayCluster"): Resource("rayclusters", "ray.io", exc)})
    return kube


CALLS = {  # what the driver does -> (verb, resource) the error must name
    "create a PodGroup": (lambda k: k.create({"apiVersion": "scheduling.x-k8s.io/v1alpha1", "kind": "PodGroup",
                                              "metadata": {"name": "g", "namespace": "ns"}}),
                          ("create", "podgroups.scheduling.x-k8s.io")),
    "patch a ConfigMap": (lambda k: k.merge_patch("v1", "ConfigMap", "c", "ns", {}), ("patch", "configmaps")),
    "delete a ConfigMap": (lambda k: k.delete("v1", "ConfigMap", "c", "ns"), ("delete", "configmaps")),
    "get a ConfigMap": (lambda k: k.get("v1", "ConfigMap", "c", "ns"), ("get", "configmaps")),
    "list ConfigMaps": (lambda k: k.list("v1", "ConfigMap", "ns"), ("list", "configmaps")),
    "read the RayCluster": (lambda k: k.raw_raycluster("ns", "rc"), ("get", "rayclusters.ray.io")),
    "patch the RayCluster": (lambda k: k.patch_raycluster("ns", "rc", [
        {"op": "test", "path": "/metadata/resourceVersion", "value": "1"}]), ("patch", "rayclusters.ray.io")),
}


@pytest.mark.parametrize("what", sorted(CALLS))
def test_a_403_names_the_verb_resource_and_namespace_it_needed(what):
    call, (verb, resource) = CALLS[what]
    with pytest.raises(ForbiddenError) as err:
        call(adapter(refusal()))
    e = err.value
    assert (e.verb, e.resource, e.namespace) == (verb, resource, "ns")
    assert f"missing permission: {verb} {resource} in namespace ns" in str(e), str(e)
    assert RBAC_MSG in str(e)  # the API server's own words stay


def test_a_cluster_scoped_refusal_says_cluster_wide_and_a_401_claims_no_permission():
    e = _convert(refusal(), "list nodes", ("list", "nodes", None))
    assert isinstance(e, ForbiddenError) and "missing permission: list nodes cluster-wide" in str(e)
    e = _convert(refusal(401), "list nodes", ("list", "nodes", None))  # a refused credential, not a rule
    assert isinstance(e, ForbiddenError) and e.verb is None and "missing permission" not in str(e)
    e = _convert(refusal(), "x")  # a caller that names no permission still gets the class
    assert isinstance(e, ForbiddenError) and e.verb is None


def test_a_404_is_still_not_found():
    exc = ApiException(status=404, reason="Not Found")
    exc.body = '{"message": "not there"}'
    assert adapter(exc).get("v1", "ConfigMap", "c", "ns") is None
    assert isinstance(_convert(exc, "x", ("get", "configmaps", "ns")), NotFoundError)
