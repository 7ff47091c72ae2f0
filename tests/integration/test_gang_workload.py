"""Issue 13 item 2: gang backend ``workload`` on the testbed.

On a Kubernetes 1.37 testbed (``RAYGPU_TESTBED_KUBERNETES=1.37``, GenericWorkload and scheduling.k8s.io/v1beta1
on): deploy/workload's policy puts a reserved pod in its PodGroup at creation, and the 64-GPU two-tenant
deadlock scenario holds 0 GPUs half-placed with the default kube-scheduler alone. On an older testbed (1.34,
the default) the API is absent, and raygpu's discovery names it. Which of the two applies is read from the
server, never assumed; the other tests say why they do not apply.
"""

from __future__ import annotations

import pytest

from raygpu.adapters.kube import KubeAdapter
from raygpu.commands.demo import install_workload_policy
from raygpu.demo import deadlock
from raygpu.errors import PermanentError
from raygpu.gang.backends import get_backend
from raygpu.gang.backends.workload import GROUP

pytestmark = pytest.mark.k137  # the Workload API is served on 1.37 only


@pytest.fixture
def served(testbed) -> dict:
    return KubeAdapter(str(testbed.kubeconfig)).api_group_kinds(GROUP)


@pytest.fixture
def workload_api(served) -> str:
    try:
        return get_backend("workload", served=served).api_version
    except PermanentError as e:
        pytest.skip(f"this testbed has no Workload API (run with RAYGPU_TESTBED_KUBERNETES=1.37): {e}")


def test_discovery_names_what_this_server_serves(testbed, served):
    """1.37: v1beta1 is chosen. 1.34 (no Workload API): the error names the API and its feature gate, before
    anything is written. Runs on both control planes (.ci/run's two passes); asserts each way, skips neither."""
    if testbed.kubernetes == "1.37":
        assert get_backend("workload", served=served).api_version == "scheduling.k8s.io/v1beta1"
        return
    with pytest.raises(PermanentError) as e:
        get_backend("workload", served=served)
    assert "Workload API" in str(e.value) and "GenericWorkload" in str(e.value)


def pod(ns: str, labels: dict[str, str]) -> dict:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"generateName": "probe-", "namespace": ns,
                                                            "labels": labels},
            "spec": {"containers": [{"name": "c", "image": "busybox"}]}}


def test_the_policy_sets_the_scheduling_group_of_reserved_pods_only(workload_api, kube, ns):
    install_workload_policy(kube, ns)  # applied, then polled until the API server enforces it
    pods = kube.resources.get(api_version="v1", kind="Pod")
    ours = {"raygpu.io/reservation": "rg-x", "raygpu.io/scheduling-group": "c-rg-x"}
    out = pods.create(body=pod(ns, ours), namespace=ns, dry_run="All").to_dict()
    assert out["spec"].get("schedulingGroup") == {"podGroupName": "c-rg-x"}
    for labels in ({"raygpu.io/scheduling-group": "c-rg-x"}, {"raygpu.io/reservation": "rg-x"}, {}):
        other = pods.create(body=pod(ns, labels), namespace=ns, dry_run="All").to_dict()
        assert "schedulingGroup" not in other["spec"] or other["spec"]["schedulingGroup"] is None, labels


@pytest.fixture
def eight_nodes(pool):
    pool.add({f"g{i}": "h100x8" for i in range(8)} | {"cpu": "cpu16"})
    return pool


def test_two_tenants_on_64_gpus_hold_no_gpu_half_placed(workload_api, testbed, ns, eight_nodes, kube):
    """Each tenant asks for 6 x 8 GPUs STRICT_SPREAD on 8 nodes at once: one runs, the other waits holding none."""
    install_workload_policy(kube, ns)
    try:
        r = deadlock.run(testbed, ns, eight_nodes.name, "raygpu", "workload", timeout_s=300)
    finally:
        deadlock.teardown(testbed, ns)
    print(f"\nraygpu/workload ({workload_api}): half-placed GPUs at most {r.max_gpus_held_by_partial_gangs}, "
          f"GPU-s {r.partial_gang_gpu_s:.0f}; ready after {[t.ready_after_s for t in r.tenants.values()]}")
    assert not r.deadlocked
    assert r.max_gpus_held_by_partial_gangs == 0 and r.partial_gang_gpu_s == 0
    ready = sorted(r.tenants.values(), key=lambda t: t.ready_after_s or 1e9)
    assert all(t.ready_after_s is not None for t in ready), "both tenants eventually get their gang"
    assert ready[1].pods_bound_while_other_ran == 0, "the waiting tenant holds no pod"


def test_the_api_server_takes_the_topology_constraint_or_raygpu_says_it_dropped_it(workload_api, kube, ns):
    """Issue 13 item 4: the Workload and PodGroup the backend builds for a required topology pass the real
    API server's validation (server-side dry run). Whether it keeps ``schedulingConstraints`` depends on its
    TopologyAwareWorkloadScheduling gate (alpha, off by default; the testbed leaves it off): kept, the
    backend's check passes; dropped, the check raises, so reserve() rolls back instead of placing the gang
    without its constraint."""
    from raygpu.gang.backends.topology import scheduling_constraints
    from raygpu.model.topology import Topology
    from raygpu.plan.gang.reservation import plan_gang
    from raygpu.testing.builders.clusters import cluster, gang, gpus

    view = cluster("c", ns).worker("gpu", gpus=8).obj()
    req = gang(gpus(8, 2), "STRICT_SPREAD", backend="workload", namespace=ns,
               topology=Topology(key="topology.kubernetes.io/zone"))
    plan = plan_gang(req, view)
    backend = get_backend("workload", served={workload_api.split("/")[1]: {"Workload", "PodGroup"}})
    for obj in backend.gang_objects(plan, req, None):
        made = kube.resources.get(api_version=obj["apiVersion"], kind=obj["kind"]).create(
            body=obj, namespace=ns, dry_run="All").to_dict()  # a 422 here: the shape is wrong
        kept = (made["spec"] if obj["kind"] == "PodGroup" else made["spec"]["podGroupTemplates"][0]).get(
            "schedulingConstraints")
        print(f"\n{obj['kind']} {workload_api}: schedulingConstraints as stored: {kept}")
        if kept:
            assert kept == scheduling_constraints(plan)["schedulingConstraints"]
            backend.check_created(obj, made)
        else:
            with pytest.raises(PermanentError, match="TopologyAwareWorkloadScheduling"):
                backend.check_created(obj, made)

