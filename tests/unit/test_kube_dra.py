"""Reading DRA objects (raygpu.adapters.kube_dra) and pods' allocatedResourcesStatus: never a crash."""

from __future__ import annotations

import copy

import pytest
from raygpu.testing.builders.dra import gpu_slice, slice_object
from raygpu.testing.fake_kube import FakeKube

from raygpu.adapters.kube import pod_view
from raygpu.adapters.kube_dra import read_dra, resource_claim, resource_slice
from raygpu.doctor.snapshot import read_k8s_view
from raygpu.errors import ForbiddenError, NotFoundError, TransientError

V1 = ("resource.k8s.io", "v1", "ResourceSlice")


def kube(*slices: dict, claims: tuple[dict, ...] = (), served=(V1,)) -> FakeKube:
    k = FakeKube({"metadata": {"name": "rc", "namespace": "default"}})
    k.served_kinds = set(served)
    for i, o in enumerate(slices):
        k.objects[("ResourceSlice", None, o["metadata"].get("name", f"#{i}"))] = o
    for o in claims:
        k.objects[("ResourceClaim", "default", o["metadata"]["name"])] = o
    return k


def claim_object(name: str, *devices: str, pods=("p1",)) -> dict:
    return {"metadata": {"name": name, "namespace": "default"},
            "status": {"allocation": {"devices": {"results": [
                {"request": "gpu", "driver": "gpu.nvidia.com", "pool": "n1", "device": d} for d in devices]}},
                "reservedFor": [{"resource": "pods", "name": p, "uid": "u"} for p in pods]}}


def test_slice_round_trips_what_a_driver_writes():
    s = gpu_slice("n1", 2, taints={1: "xid=79:NoExecute"}, generation=3, slice_count=2)
    assert resource_slice(slice_object(s)) == s


def test_v1beta1_devices_nest_under_basic():
    o = slice_object(gpu_slice("n1", 1, taints={0: "k:NoSchedule"}), "resource.k8s.io/v1beta1")
    o["spec"]["devices"] = [{"name": d["name"], "basic": {k: v for k, v in d.items() if k != "name"}}
                            for d in o["spec"]["devices"]]
    v = resource_slice(o)
    assert v.devices[0].attributes["type"] == "gpu" and v.devices[0].taints[0].effect == "NoSchedule"


def test_attribute_kinds_become_strings():
    o = {"metadata": {"name": "s"}, "spec": {"driver": "gpu.nvidia.com", "nodeName": "n1", "devices": [
        {"name": "gpu-0", "attributes": {"index": {"int": 0}, "migCapable": {"bool": True},
                                         "driverVersion": {"version": "550.54.15"}, "empty": {}}}]}}
    assert resource_slice(o).devices[0].attributes == {"index": "0", "migCapable": "true", "driverVersion": "550.54.15"}


@pytest.mark.parametrize("spec, devices, count", [
    ({"devices": [{"name": "gpu-0"}, {"attributes": {}}, "junk", {"name": 7}]}, ["gpu-0"], 4),  # bad devices left out
    ({"devices": "not a list"}, [], 0),
    ({}, [], 0),
    ({"pool": "not a dict", "devices": None}, [], 0),
    ({"devices": [{"name": "gpu-0", "taints": [{"effect": "NoSchedule"}, "x"]}]}, ["gpu-0"], 1),  # keyless taint dropped
])
def test_partial_slices_parse(spec, devices, count):
    v = resource_slice({"metadata": {"name": "s"}, "spec": {"driver": "gpu.nvidia.com", **spec}})
    assert [d.name for d in v.devices] == devices and v.device_count == count and v.node_name is None


def test_claim():
    c = resource_claim(claim_object("c1", "gpu-0", "gpu-1"))
    assert [(a.driver, a.pool, a.device) for a in c.allocated] == [("gpu.nvidia.com", "n1", "gpu-0"),
                                                                    ("gpu.nvidia.com", "n1", "gpu-1")]
    assert c.reserved_for_pods == ("p1",)
    assert resource_claim({"metadata": {"name": "c", "namespace": "x"}}).allocated == ()  # not allocated yet


def test_claim_made_for_an_extended_resource_request_is_marked():
    assert resource_claim(claim_object("c1", "gpu-0")).extended_resource is False
    raw = claim_object("p1-extended-resources-0", "gpu-0")
    raw["metadata"]["annotations"] = {"resource.kubernetes.io/extended-resource-claim": "true"}
    assert resource_claim(raw).extended_resource is True


def test_read_dra_reads_slices_and_claims():
    got = read_dra(kube(slice_object(gpu_slice("n1", 8)), claims=(claim_object("c1", "gpu-0"),)), "default")
    assert [s.name for s in got.slices] == ["n1-gpu.nvidia.com-0"] and len(got.slices[0].devices) == 8
    assert [c.name for c in got.claims] == ["c1"] and got.notes == ()


def test_newest_served_version_is_read():
    k = kube(served=(V1, ("resource.k8s.io", "v1beta2", "ResourceSlice")))
    read_dra(k, None)
    assert {c[1][0] for c in k.calls if c[0] == "list"} == {"resource.k8s.io/v1"}


def test_one_bad_slice_is_skipped_with_a_note_not_the_others():
    bad = {"metadata": {"labels": {}}, "spec": {}}  # no name
    got = read_dra(kube(slice_object(gpu_slice("n1", 8)), bad), None)
    assert [s.name for s in got.slices] == ["n1-gpu.nvidia.com-0"]
    assert len(got.notes) == 1 and got.notes[0].startswith("DRA: skipped ResourceSlice ?: cannot parse it: KeyError")


@pytest.mark.parametrize("served, fail, note", [
    ((), None, "DRA: resource.k8s.io is not served by this API server; GPUs counted from node allocatable only"),
    ((V1,), ("discover", NotFoundError("discovery: not found")), "DRA: cannot discover resource.k8s.io"),
    ((V1,), ("list", ForbiddenError("list ResourceSlice: forbidden (403): missing permission: list "
                                    "resourceslices.resource.k8s.io cluster-wide")),
     "DRA: cannot list ResourceSlices (list ResourceSlice: forbidden (403): missing permission"),
    ((V1,), ("list", TransientError("list: cannot reach the API server")), "DRA: cannot list ResourceSlices"),
])
def test_without_the_dra_api_nothing_is_read_and_it_says_so_once(served, fail, note):
    k = kube(slice_object(gpu_slice("n1", 8)), served=served)
    if fail:
        k.fail(fail[0], fail[1], times=5)
    got = read_dra(k, None)
    assert (got.slices, got.claims) == (None, None)
    assert len(got.notes) == 1 and got.notes[0].startswith(note)


def test_claims_forbidden_keeps_the_slices():
    k = kube(slice_object(gpu_slice("n1", 8)))
    k.fail("list", ForbiddenError("forbidden"), when=lambda api, kind, *a: kind == "ResourceClaim")
    got = read_dra(k, "default")
    assert len(got.slices) == 1 and got.claims is None
    assert got.notes == ("DRA: cannot list ResourceClaims (forbidden); tainted devices are not matched to their pods",)


def test_k8s_view_carries_dra_and_its_note():
    class Kube(FakeKube):
        def nodes(self):
            return []

    k = Kube({"metadata": {"name": "rc", "namespace": "default"}})
    view = read_k8s_view(k, "default", "rc")
    assert view.reachable and view.resource_slices is None and len(view.notes) == 1


POD = {"metadata": {"name": "p1", "namespace": "default", "creationTimestamp": "2026-01-01T00:00:00Z"},
       "spec": {"containers": [{"name": "ray-worker", "resources": {"claims": [{"name": "gpu", "request": "gpu"}]}}]},
       "status": {"phase": "Running", "containerStatuses": [{"name": "ray-worker", "allocatedResourcesStatus": [
           {"name": "claim:gpu/gpu", "resources": [
               {"resourceID": "gpu.nvidia.com/n1/gpu-0", "health": "Unhealthy"},
               {"resourceID": "gpu.nvidia.com/n1/gpu-1", "health": "Healthy"},
               {"health": "Unhealthy"}]}]}]}}  # no id: left out


def test_pod_device_health():
    got = [(h.container, h.resource, h.resource_id, h.health) for h in pod_view(POD).device_health]
    assert got == [("ray-worker", "claim:gpu/gpu", "gpu.nvidia.com/n1/gpu-0", "Unhealthy"),
                   ("ray-worker", "claim:gpu/gpu", "gpu.nvidia.com/n1/gpu-1", "Healthy")]


@pytest.mark.parametrize("status", [{"allocatedResourcesStatus": "junk"}, {"allocatedResourcesStatus": [None, "x"]},
                                    {"allocatedResourcesStatus": [{"name": "x", "resources": "junk"}]}])
def test_malformed_device_health_is_skipped(status):
    p = copy.deepcopy(POD)
    p["status"]["containerStatuses"][0] = {"name": "ray-worker", **status}
    assert pod_view(p).device_health == ()
