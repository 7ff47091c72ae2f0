"""PACK over several pods asks kube-scheduler to put them together where there is room: a preferred pod
affinity (one Kubernetes node) to the reservation's own pods (issue 11 item 1, docs/gang.md "Pod shapes")."""

from __future__ import annotations

import pytest
from raygpu.testing.builders.clusters import cluster, gang, gpus

from raygpu.gang.backends import get_backend
from raygpu.gang.backends.topology import HOSTNAME, PREFERRED_WEIGHT
from raygpu.model.labels import LABEL_RESERVATION
from raygpu.model.raycluster import RayClusterView
from raygpu.model.topology import Topology
from raygpu.plan.gang.reservation import plan_gang

BASE = cluster("c").worker("small", gpus=2)  # 2-GPU pods: PACK of n x {GPU: 2} is n pods
WHOLE = cluster("c").worker("gpu", gpus=8)
ZONE = "topology.kubernetes.io/zone"


def spec_for(strategy: str, n: int, backend: str = "none", view: RayClusterView | None = None, **kw):
    req = gang(gpus(2, n), strategy, backend=backend, queue="team-a", **kw)
    view = view or BASE.obj()
    plan = plan_gang(req, view)
    return plan, get_backend(backend).worker_group_spec(plan, view.group(plan.need.template_group), req)


def preferred(spec) -> list[dict]:
    aff = spec["template"].get("spec", {}).get("affinity", {}).get("podAffinity", {})
    return aff.get("preferredDuringSchedulingIgnoredDuringExecution", [])


def pack_term(plan) -> dict:
    return {"weight": PREFERRED_WEIGHT, "podAffinityTerm": {
        "labelSelector": {"matchLabels": {LABEL_RESERVATION: plan.reservation_group}}, "topologyKey": HOSTNAME}}


@pytest.mark.parametrize("backend", ["none", "coscheduling", "volcano", "kueue", "workload"])
def test_pack_on_several_pods_prefers_one_node_for_them(backend):
    plan, spec = spec_for("PACK", 4, backend)
    assert plan.pod_count == 4  # one pod per bundle: no free capacity given, the smallest pods
    assert preferred(spec) == [pack_term(plan)]
    # preferred only: a gang never waits for it
    assert "requiredDuringSchedulingIgnoredDuringExecution" not in spec["template"]["spec"]["affinity"]["podAffinity"]


@pytest.mark.parametrize("strategy,n", [("PACK", 1), ("STRICT_PACK", 4), ("SPREAD", 4), ("STRICT_SPREAD", 3)])
def test_no_pack_affinity_for_one_pod_or_a_spreading_strategy(strategy, n):
    plan, spec = spec_for(strategy, n, view=WHOLE.obj() if strategy == "STRICT_PACK" else None)
    assert preferred(spec) == []
    assert (plan.pod_count == 1) == (strategy in ("STRICT_PACK",) or n == 1)


def test_the_templates_own_affinity_terms_are_kept():
    raw = BASE.raw()
    own = {"weight": 5, "podAffinityTerm": {"labelSelector": {"matchLabels": {"app": "cache"}},
                                            "topologyKey": HOSTNAME}}
    for g in raw["spec"]["workerGroupSpecs"]:
        g["template"]["spec"]["affinity"] = {
            "podAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [own]}}
    view = RayClusterView.from_k8s(raw)
    plan, spec = spec_for("PACK", 4, view=view)
    assert preferred(spec) == [own, pack_term(plan)]
    # the cluster's own template is not changed
    assert view.group(plan.need.template_group).template["spec"]["affinity"]["podAffinity"][
        "preferredDuringSchedulingIgnoredDuringExecution"] == [own]


def test_a_preferred_topology_and_pack_give_two_terms_zone_and_node():
    plan, spec = spec_for("PACK", 4, topology=Topology(key=ZONE, required=False))
    keys = [t["podAffinityTerm"]["topologyKey"] for t in preferred(spec)]
    assert keys == [ZONE, HOSTNAME]
