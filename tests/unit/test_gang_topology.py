"""Topology constraints on a gang: Ray's ``topology_strategy`` read and validated, carried by the plan, and
written by each backend where it can express it (docs/gang.md, "Topology"); a constraint the server drops
fails the reservation instead of being placed without it."""

from __future__ import annotations

import copy
import time

import pytest
from raygpu.testing.builders.clusters import cluster, gang, gpus
from raygpu.testing.fake_kube import FakeKube

from raygpu.errors import PermanentError
from raygpu.gang.backends import get_backend
from raygpu.gang.backends.topology import KUEUE_PREFERRED, KUEUE_REQUIRED, KUEUE_UNCONSTRAINED
from raygpu.gang.requests import gang_request
from raygpu.gang.reservation import reserve
from raygpu.model.gang import GangPlan, Strategy
from raygpu.model.raycluster import RayClusterView
from raygpu.model.topology import Topology, parse_topology_strategy
from raygpu.plan.gang.reservation import plan_gang

ZONE = "topology.kubernetes.io/zone"
BASE = cluster("c").worker("gpu", gpus=8)
REQUIRED, PREFERRED = Topology(key=ZONE), Topology(key=ZONE, required=False)


def view_with(annotations=None, affinity=None) -> RayClusterView:
    """BASE whose group template also carries pod ``annotations`` / ``affinity``."""
    raw = BASE.raw()
    template = raw["spec"]["workerGroupSpecs"][0]["template"]
    template["metadata"]["annotations"] = dict(annotations or {})
    if affinity is not None:
        template["spec"]["affinity"] = affinity
    return RayClusterView.from_k8s(raw)


def request(topology=None, backend="none", n=3, **kw):
    return gang(gpus(8, n), "STRICT_SPREAD", backend=backend, queue="team-a", topology=topology, **kw)


def built(backend: str, topology: Topology | None):
    req = request(topology, backend)
    view = BASE.obj()
    plan = plan_gang(req, view)
    b = get_backend(backend)
    return plan, b.worker_group_spec(plan, view.group(plan.need.template_group), req), b.gang_objects(plan, req, None)


# ----------------------------------------------------------------------------- Ray's topology_strategy
@pytest.mark.parametrize("value,strategy,want", [
    (None, None, ("PACK", None)),
    (None, "SPREAD", ("SPREAD", None)),
    ({ZONE: "STRICT_PACK"}, None, ("PACK", Topology(key=ZONE, ray_key=ZONE))),
    ({ZONE: "pack", "ray.io/node-id": "STRICT_SPREAD"}, None,
     ("STRICT_SPREAD", Topology(key=ZONE, required=False, ray_key=ZONE))),
    ({"ray.io/availability-zone": "STRICT_PACK"}, None,  # Ray's zone label is the node's zone label
     ("PACK", Topology(key=ZONE, ray_key="ray.io/availability-zone"))),
    ({"ray.io/availability-region": "STRICT_PACK"}, None,
     ("PACK", Topology(key="topology.kubernetes.io/region", ray_key="ray.io/availability-region"))),
    ({"ray.io/node-id": "STRICT_PACK"}, None, ("STRICT_PACK", None)),  # node level only: no topology
    ({"kubernetes.io/hostname": "STRICT_PACK"}, None,
     ("PACK", Topology(key="kubernetes.io/hostname", ray_key="kubernetes.io/hostname"))),
])
def test_topology_strategy_is_read_as_ray_reads_it(value, strategy, want):
    assert parse_topology_strategy(value, strategy) == want


@pytest.mark.parametrize("value,strategy,says", [
    ({ZONE: "STRICT_PACK"}, "PACK", "cannot both be given"),
    ({ZONE: "SPREAD"}, None, "STRICT_PACK \\(required\\) or PACK \\(preferred\\)"),
    ({ZONE: "STRICT_PACK", "nvidia.com/gpu.clique": "STRICT_PACK"}, None, "more than one topology key"),
    ({ZONE: "CLOSE"}, None, "expected one of"),
    ({ZONE: 1}, None, "expected one of"),
    ({"ray.io/gpu-domain": "STRICT_PACK"}, None, "Ray node label with no Kubernetes node label"),
    ({"not a key": "STRICT_PACK"}, None, "not a Kubernetes label key"),
    ({"Upper.Case/zone": "STRICT_PACK"}, None, "not a Kubernetes label key"),
    ({"a/" + "x" * 64: "STRICT_PACK"}, None, "not a Kubernetes label key"),
    ({"": "STRICT_PACK"}, None, "non-empty string"),
    ([ZONE], None, "must be a dict"),
])
def test_bad_topology_strategy_is_a_permanent_error(value, strategy, says):
    with pytest.raises(PermanentError, match=says):
        parse_topology_strategy(value, strategy)


def test_the_request_carries_it_and_rejects_anything_but_a_topology():
    req = gang_request(gpus(8, 2), None, "c", "default", "none", 60, "j", None,
                       topology_strategy={"ray.io/node-id": "SPREAD", ZONE: "STRICT_PACK"})
    assert req.strategy is Strategy.SPREAD and req.topology == Topology(key=ZONE, ray_key=ZONE)
    with pytest.raises(PermanentError, match="topology must be a Topology"):
        request({"key": ZONE})


def test_the_plan_carries_the_constraint_and_says_so_and_it_survives_the_state_configmap():
    plan = plan_gang(request(REQUIRED), BASE.obj())
    assert plan.topology == REQUIRED and f"required: all pods on nodes sharing one value of node label {ZONE}" \
        in plan.reason
    assert GangPlan.model_validate_json(plan.model_dump_json()).topology == REQUIRED  # load_plan reads it back
    assert plan_gang(request(None), BASE.obj()).topology is None


# ----------------------------------------------------------------------------- each backend's objects
def test_workload_required_is_the_scheduling_constraint_on_template_and_pod_group_not_pod_affinity():
    _, spec, (workload, pod_group) = built("workload", REQUIRED)
    want = {"topology": [{"key": ZONE}]}
    assert workload["spec"]["podGroupTemplates"][0]["schedulingConstraints"] == want
    assert pod_group["spec"]["schedulingConstraints"] == want
    assert "affinity" not in spec["template"]["spec"]


def test_workload_preferred_has_no_api_field_so_it_is_preferred_pod_affinity():
    _, spec, (workload, pod_group) = built("workload", PREFERRED)
    assert "schedulingConstraints" not in pod_group["spec"]
    assert "schedulingConstraints" not in workload["spec"]["podGroupTemplates"][0]
    terms = spec["template"]["spec"]["affinity"]["podAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert terms == [{"weight": 100, "podAffinityTerm": {
        "labelSelector": {"matchLabels": {"raygpu.io/reservation": "rg-job1"}}, "topologyKey": ZONE}}]


@pytest.mark.parametrize("topology,annotation", [(REQUIRED, KUEUE_REQUIRED), (PREFERRED, KUEUE_PREFERRED)])
def test_kueue_writes_its_tas_annotation_and_replaces_the_templates(topology, annotation):
    view = view_with(annotations={KUEUE_UNCONSTRAINED: "true"})
    req = request(topology, "kueue")
    plan = plan_gang(req, view)
    spec = get_backend("kueue").worker_group_spec(plan, view.group("gpu"), req)
    annotations = spec["template"]["metadata"]["annotations"]
    assert annotations[annotation] == ZONE
    assert not {KUEUE_REQUIRED, KUEUE_PREFERRED, KUEUE_UNCONSTRAINED} - {annotation} & set(annotations)
    assert "affinity" not in spec["template"]["spec"]


@pytest.mark.parametrize("backend", ["coscheduling", "volcano", "none"])
def test_other_backends_require_pod_affinity_to_their_own_pods(backend):
    _, spec, objects = built(backend, REQUIRED)
    terms = spec["template"]["spec"]["affinity"]["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert terms == [{"labelSelector": {"matchLabels": {"raygpu.io/reservation": "rg-job1"}}, "topologyKey": ZONE}]
    assert spec["template"]["metadata"]["labels"]["raygpu.io/reservation"] == "rg-job1"  # the pods match it
    assert all("schedulingConstraints" not in str(o) for o in objects)


@pytest.mark.parametrize("backend", ["coscheduling", "volcano", "none"])
def test_preferred_is_a_preferred_term_only(backend):
    _, spec, _ = built(backend, PREFERRED)
    affinity = spec["template"]["spec"]["affinity"]["podAffinity"]
    assert list(affinity) == ["preferredDuringSchedulingIgnoredDuringExecution"]


def test_the_templates_own_affinity_is_kept():
    own = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "gpu", "operator": "Exists"}]}]}},
           "podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [{"topologyKey": "rack"}]}}
    view = view_with(affinity=copy.deepcopy(own))
    req = request(REQUIRED, "none")
    plan = plan_gang(req, view)
    spec = get_backend("none").worker_group_spec(plan, view.group("gpu"), req)
    affinity = spec["template"]["spec"]["affinity"]
    assert affinity["nodeAffinity"] == own["nodeAffinity"]
    assert [t["topologyKey"] for t in affinity["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]] \
        == ["rack", ZONE]
    assert view.group("gpu").template["spec"]["affinity"] == own  # the snapshot is not mutated


@pytest.mark.parametrize("backend", ["coscheduling", "kueue", "volcano", "workload", "none"])
def test_without_a_topology_nothing_is_added(backend):
    _, spec, objects = built(backend, None)
    assert "affinity" not in spec["template"]["spec"]
    assert not {KUEUE_REQUIRED, KUEUE_PREFERRED} & set(spec["template"]["metadata"].get("annotations") or {})
    assert all("schedulingConstraints" not in str(o) for o in objects)


# ----------------------------------------------------------------------------- a server that drops it
class GateOffKube(FakeKube):
    """kube-apiserver with TopologyAwareWorkloadScheduling off: it clears schedulingConstraints on create
    (pkg/registry/scheduling/{workload,podgroup}/strategy.go, dropDisabledSchedulingConstraintsFields)."""

    def create(self, obj):
        obj = copy.deepcopy(obj)
        if obj["kind"] == "PodGroup":
            obj["spec"].pop("schedulingConstraints", None)
        if obj["kind"] == "Workload":
            for t in obj["spec"]["podGroupTemplates"]:
                t["schedulingConstraints"] = None
        return super().create(obj)


def test_a_dropped_required_topology_fails_the_reservation_and_rolls_everything_back():
    kube = GateOffKube(BASE.raw(), kuberay=True)
    with pytest.raises(PermanentError, match="dropped the required topology.*TopologyAwareWorkloadScheduling"):
        reserve(kube, request(REQUIRED, "workload", n=2), time.time())
    assert kube.objects == {}  # state ConfigMap and Workload deleted; the PodGroup never made
    assert [g["groupName"] for g in kube.raw["spec"]["workerGroupSpecs"]] == ["gpu"]


def test_a_kept_constraint_reserves():
    kube = FakeKube(BASE.raw(), kuberay=True)
    rsv = reserve(kube, request(REQUIRED, "workload", n=2), time.time())
    assert kube.objects[("PodGroup", "default", "c-rg-job1")]["spec"]["schedulingConstraints"] == {"topology": [{"key": ZONE}]}
    assert rsv.plan.topology == REQUIRED


def test_a_preferred_topology_on_a_gate_off_server_is_not_an_error():
    kube = GateOffKube(BASE.raw(), kuberay=True)
    rsv = reserve(kube, request(PREFERRED, "workload", n=2), time.time())
    assert rsv.plan.topology == PREFERRED and ("PodGroup", "default", "c-rg-job1") in kube.objects
