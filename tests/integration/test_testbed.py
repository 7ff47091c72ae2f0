"""Issue 2: the testbed is real and does what KubeRay, the schedulers and Ray do; issue 13: on the Kubernetes
it was asked for ($RAYGPU_TESTBED_KUBERNETES), 1.37 with the Workload API and DRA served."""

from __future__ import annotations

import json
import ssl
import subprocess
import sys
import urllib.request

import pytest
from kubernetes import client

from raygpu.testing import components
from raygpu.testing import manifests as m
from raygpu.testing.controlplane import ADMIN_TOKEN
from raygpu.testing.kube import apply
from tests.integration.util import alive_ray_nodes, pods, ray_address, wait_for


def _kubectl(testbed) -> str:
    return str(components.ensure_built(lambda _m: None, testbed.kubernetes).kubectl)


def _get(testbed, port: int, path: str) -> str:
    """GET https://127.0.0.1:<port><path> as admin (the API server, or a scheduler's / controller-manager's
    secure port, which delegate authn/authz to the API server); their serving certs are self-signed."""
    ctx = ssl.create_default_context()
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
    req = urllib.request.Request(f"https://127.0.0.1:{port}{path}", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
    with urllib.request.urlopen(req, timeout=10, context=ctx) as r:  # noqa: S310 - loopback
        return r.read().decode()


@pytest.mark.k137  # the selected control plane is what runs
def test_the_control_plane_runs_the_selected_kubernetes(testbed):
    want = components.KUBERNETES[components.selected_kubernetes()]
    assert testbed.kubernetes == components.selected_kubernetes() and testbed.state["kubernetes"] == testbed.kubernetes
    ports = testbed.state["ports"]
    assert json.loads(_get(testbed, ports["apiserver"], "/version"))["gitVersion"] == want
    client_server = json.loads(subprocess.run([_kubectl(testbed), "--kubeconfig", str(testbed.kubeconfig), "version",
                                               "-o", "json"], check=True, capture_output=True, text=True).stdout)
    assert client_server["clientVersion"]["gitVersion"] == client_server["serverVersion"]["gitVersion"] == want
    status = json.loads(subprocess.run([sys.executable, "-m", "raygpu.cli", "testbed", "status", "--json"],
                                       check=True, capture_output=True, text=True).stdout)
    assert status["up"] and status["kubernetes"] == testbed.kubernetes
    assert status["components"]["kube-scheduler"]["version"] == want


@pytest.mark.k137  # what 1.37 serves
def test_on_1_37_the_workload_api_and_dra_are_served_and_gated_on(testbed, ns, kube):
    if testbed.kubernetes != "1.37":
        assert "scheduling.k8s.io/v1beta1" not in _api_versions(testbed)  # the default testbed is plain 1.34
        return
    served = _api_versions(testbed)
    assert {"workloads", "podgroups"} <= served["scheduling.k8s.io/v1beta1"]
    assert {"deviceclasses", "resourceclaims", "resourceclaimtemplates", "resourceslices"} <= served["resource.k8s.io/v1"]
    # served means stored: the gate is on in the API server, not only the group version in discovery
    wl = kube.resources.get(api_version="scheduling.k8s.io/v1beta1", kind="Workload")
    wl.create(namespace=ns, body={"metadata": {"name": "gang"}, "spec": {"podGroupTemplates": [
        {"name": "workers", "schedulingPolicy": {"gang": {"minCount": 2}}}]}})
    pg = kube.resources.get(api_version="scheduling.k8s.io/v1beta1", kind="PodGroup")
    pg.create(namespace=ns, body={"metadata": {"name": "workers"}, "spec": {"schedulingPolicy": {"gang": {"minCount": 2}}}})
    assert wl.get(name="gang", namespace=ns).spec.podGroupTemplates[0].schedulingPolicy.gang.minCount == 2
    assert pg.get(name="workers", namespace=ns).spec.schedulingPolicy.gang.minCount == 2
    # ... and in the scheduler and the controller-manager (their gang plugin / PodGroup protection controller)
    ports = testbed.state["ports"]
    for name, port in (("kube-apiserver", ports["apiserver"]), ("kube-scheduler", ports["scheduler"]),
                       ("kube-controller-manager", ports["kcm"])):
        metrics = _get(testbed, port, "/metrics")
        assert 'kubernetes_feature_enabled{name="GenericWorkload",stage="BETA"} 1' in metrics, name


def _api_versions(testbed) -> dict[str, set[str]]:
    out = subprocess.run([_kubectl(testbed), "--kubeconfig", str(testbed.kubeconfig), "api-resources", "-o", "wide",
                          "--no-headers"], check=True, capture_output=True, text=True).stdout
    served: dict[str, set[str]] = {}
    for line in out.splitlines():
        cols = line.split()
        name, group_version = cols[0], next(c for c in cols[1:] if "/" in c or c == "v1")
        served.setdefault(group_version, set()).add(name)
    return served


def test_kubectl_lists_gpu_nodes_with_capacity(testbed):
    kubectl = _kubectl(testbed)
    out = subprocess.run([kubectl, "--kubeconfig", str(testbed.kubeconfig), "get", "nodes", "-o", "json"],
                         check=True, capture_output=True, text=True).stdout
    nodes = {n["metadata"]["name"]: n for n in json.loads(out)["items"]}
    assert nodes["gpu-a"]["status"]["capacity"]["nvidia.com/gpu"] == "8"
    assert nodes["gpu-a"]["metadata"]["labels"]["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3"
    assert nodes["mig-a"]["status"]["allocatable"]["nvidia.com/mig-3g.40gb"] == "8"
    assert nodes["mig-a"]["metadata"]["labels"]["nvidia.com/mig.strategy"] == "mixed"
    assert nodes["t4-a"]["status"]["capacity"]["nvidia.com/gpu"] == "1"
    table = subprocess.run([kubectl, "--kubeconfig", str(testbed.kubeconfig), "get", "nodes"],
                           check=True, capture_output=True, text=True).stdout
    assert "gpu-a" in table and "Ready" in table


def test_raycluster_pods_become_real_ray_nodes_and_workers_to_delete_kills_one(testbed, ns, pool, core, kube):
    pool.add({"cpu": "cpu16", "g1": "h100x8", "g2": "h100x8"})
    rc = m.raycluster("rc", ns, [m.worker_group("gpu", replicas=2, pool=pool.name)], pool=pool.name)
    apply(kube, rc)

    def two_running_workers():
        ws = [p for p in pods(core, ns, "ray.io/node-type=worker") if p["status"].get("phase") == "Running"]
        return ws if len(ws) == 2 else None
    workers = wait_for("2 worker pods Running", two_running_workers, 120, log=testbed.logs / "ray-operator.log")
    assert {p["spec"]["nodeName"] for p in workers} <= set(pool.nodes)
    names = sorted(p["metadata"]["name"] for p in workers)

    addr = ray_address(testbed, ns, "rc")

    def ray_workers():
        nodes = [n for n in alive_ray_nodes(addr) if n.ray_node_type_name == "gpu"]
        return nodes if len(nodes) == 2 else None
    rws = wait_for("2 alive Ray worker nodes", ray_workers, 120, log=testbed.logs / "bridge.log")
    assert sorted(n.instance_id for n in rws) == names
    assert all(n.total_resources()["GPU"] == 8 for n in rws)

    status = json.loads(subprocess.run([sys.executable, "-m", "raygpu.cli", "testbed", "status", "--json"],
                                       check=True, capture_output=True, text=True).stdout)
    assert status["kubeconfig"] == str(testbed.kubeconfig)
    assert any(c["address"] == addr for c in status["ray_clusters"])
    assert status["components"]["kube-apiserver"]["version"] == components.KUBERNETES[testbed.kubernetes]
    assert all(c["alive"] and c["pid"] > 0 for c in status["components"].values())
    # The operator that made these pods is the pinned one, not a testbed left running with another build:
    # KubeRay >= 1.6 stamps its version on the head pod (upgrade-strategy hash); 1.5 stamps nothing.
    want = components.VERSIONS["kuberay"]
    [head] = pods(core, ns, "ray.io/node-type=head")
    stamped = (head["metadata"].get("annotations") or {}).get("ray.io/kuberay-version")
    newer = tuple(int(x) for x in want.lstrip("v").split(".")[:2]) >= (1, 6)
    assert stamped == (want if newer else None)

    victim = names[0]
    crd = kube.resources.get(api_version="ray.io/v1", kind="RayCluster")
    crd.patch(name="rc", namespace=ns, content_type="application/merge-patch+json", body={"spec": {
        "workerGroupSpecs": [{**rc["spec"]["workerGroupSpecs"][0], "replicas": 1,
                              "scaleStrategy": {"workersToDelete": [victim]}}]}})
    wait_for(f"pod {victim} deleted by KubeRay",
             lambda: victim not in {p["metadata"]["name"] for p in pods(core, ns, "ray.io/node-type=worker")}, 90)
    wait_for(f"Ray node of {victim} dead",
             lambda: victim not in {n.instance_id for n in alive_ray_nodes(addr)}, 90, log=testbed.logs / "bridge.log")
    assert names[1] in {n.instance_id for n in alive_ray_nodes(addr)}


def test_garbage_collector_removes_owned_objects(testbed, ns, core):
    owner = core.create_namespaced_config_map(ns, {"metadata": {"name": "owner"}})
    core.create_namespaced_config_map(ns, {"metadata": {"name": "dependent", "ownerReferences": [{
        "apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": owner.metadata.uid}]}})
    core.delete_namespaced_config_map("owner", ns)

    def gone():
        try:
            core.read_namespaced_config_map("dependent", ns)
            return False
        except client.ApiException as e:
            return e.status == 404
    wait_for("garbage collection of the dependent ConfigMap", gone, 60,
             log=testbed.logs / "kube-controller-manager.log")


def test_rbac_is_enforced_for_a_minted_service_account_token(testbed, ns, core, tmp_path):
    from raygpu.testing.kube import api_client
    core.create_namespaced_service_account(ns, {"metadata": {"name": "probe"}})
    tok = core.create_namespaced_service_account_token("probe", ns, {"spec": {"expirationSeconds": 600}})
    kc = testbed.kubeconfig_for_token(tok.status.token, "probe", tmp_path / "probe.kubeconfig")
    sa_core = client.CoreV1Api(api_client(kc))
    try:
        sa_core.list_namespaced_pod(ns)
        raise AssertionError("a ServiceAccount without a RoleBinding listed pods")
    except client.ApiException as e:
        assert e.status == 403
    rbac = client.RbacAuthorizationV1Api(api_client(testbed.kubeconfig))
    rbac.create_namespaced_role(ns, {"metadata": {"name": "pods-reader"}, "rules": [
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]}]})
    rbac.create_namespaced_role_binding(ns, {"metadata": {"name": "probe-pods"}, "roleRef": {
        "apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "pods-reader"},
        "subjects": [{"kind": "ServiceAccount", "name": "probe", "namespace": ns}]})
    assert wait_for("RoleBinding takes effect", lambda: sa_core.list_namespaced_pod(ns) is not None, 30)
