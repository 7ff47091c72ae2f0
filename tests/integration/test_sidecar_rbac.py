"""The sidecar's identity on the testbed, as deploy/ ships it.

A RayCluster built from deploy/examples/raycluster-with-sidecar.yaml's head template, the ServiceAccount,
Role and RoleBinding of deploy/sidecar for it, the admission policies of deploy/sidecar-policy, and a
token minted for the ServiceAccount: with that token the sidecar does its whole job (scale-down, the
garbage collector's group removal and ConfigMap delete), and the same token is refused everything else.
With deploy/sidecar-scale-up bound as well, the same identity does gang scale-up for an unmodified driver.
"""

from __future__ import annotations

import copy
import time
from pathlib import Path

import pytest
import yaml
from kubernetes import client

from raygpu.adapters.kube import KubeAdapter
from raygpu.model.labels import LABEL_CLUSTER, LABEL_POOL, LABEL_RESERVATION, LABEL_TESTBED_SHAPE
from raygpu.testing import manifests as m
from raygpu.testing.kube import api_client, apply, delete
from tests.integration.gang_helpers import nothing_left
from tests.integration.scale_up_helpers import CLUSTER, PLAIN_PG, scale_up_cluster
from tests.integration.sidecar_helpers import (GPU_RES, ON_5S, Driver, Sidecar, _ready, _spec_groups, _workers,
                                               refusals)
from tests.integration.util import pods, wait_for

EXAMPLE = Path(__file__).resolve().parents[2] / "deploy" / "examples" / "raycluster-with-sidecar.yaml"
TOKEN_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
RC_POLICY, CM_POLICY = "raygpu-sidecar-rayclusters", "raygpu-sidecar-configmaps"


def example_cluster(name: str, ns: str, pool: str, workers: list[dict]) -> dict:
    """The example RayCluster with its head template as shipped, placed on ``pool``'s CPU node."""
    rc = yaml.safe_load(EXAMPLE.read_text())
    rc["metadata"] = {"name": name, "namespace": ns, "annotations": dict(ON_5S)}
    head = rc["spec"]["headGroupSpec"]["template"]["spec"]
    head["nodeSelector"] = {LABEL_POOL: pool, LABEL_TESTBED_SHAPE: "cpu16"}
    head["containers"][0]["resources"] = {"limits": {"cpu": "2", "memory": "8Gi"},
                                          "requests": {"cpu": "2", "memory": "8Gi"}}
    rc["spec"]["workerGroupSpecs"] = workers
    return rc


def refused(call, *, status: int | tuple[int, ...], mentions: str = "") -> str:
    """``call()`` fails with ``status``; returns the error body (which must mention ``mentions``)."""
    with pytest.raises(client.ApiException) as exc:
        call()
    body = exc.value.body.decode() if isinstance(exc.value.body, bytes) else str(exc.value.body)
    assert exc.value.status in ((status,) if isinstance(status, int) else status), body
    assert mentions in body, body
    return body


def test_the_sidecar_token_does_its_job_and_nothing_else(testbed, ns, pool, kube, core, tmp_path):
    policy = m.sidecar_policy_objects()
    try:
        for obj in policy:
            apply(kube, obj)
        _run(testbed, ns, pool, kube, core, tmp_path)
    finally:
        for obj in policy:
            delete(kube, obj["apiVersion"], obj["kind"], obj["metadata"]["name"])


def _run(testbed, ns, pool, kube, core, tmp_path) -> None:
    for obj in m.sidecar_deploy_objects(ns, "rc"):
        apply(kube, obj)
    tok = core.create_namespaced_service_account_token("raygpu-sidecar", ns, {"spec": {"expirationSeconds": 900}})
    kc = testbed.kubeconfig_for_token(tok.status.token, "raygpu-sidecar", tmp_path / "sa.kubeconfig")
    sa = api_client(kc)
    sa_core, sa_custom = client.CoreV1Api(sa), client.CustomObjectsApi(sa)
    wait_for("the RoleBinding takes effect", lambda: sa_core.list_namespaced_pod(ns) is not None, 30)

    pool.add({"cpu": "cpu16", "g1": "h100x8"})
    orphan = m.worker_group("rg-orphan", replicas=0, pool=pool.name, gpus=GPU_RES)
    orphan["template"]["metadata"] = {"labels": {LABEL_RESERVATION: "rg-orphan"}}  # provably raygpu's
    apply(kube, example_cluster("rc", ns, pool.name, [m.worker_group("gpu", replicas=1, pool=pool.name,
                                                                     gpus=GPU_RES), orphan]))
    other = m.raycluster("other", ns, [], pool=pool.name)
    other["spec"]["suspend"] = True  # no pods: only its object matters
    apply(kube, other)

    # KubeRay built the head pod from the template as given: no token for ray-head, none automounted
    head = wait_for("the head pod", lambda: pods(core, ns, "ray.io/cluster=rc,ray.io/node-type=head"), 60,
                    log=testbed.logs / "ray-operator.log")[0]
    spec = head["spec"]
    assert spec["serviceAccountName"] == "raygpu-sidecar" and spec["automountServiceAccountToken"] is False
    by_name = {c["name"]: c for c in spec["containers"]}
    assert not [vm for vm in by_name["ray-head"].get("volumeMounts") or []
                if vm["mountPath"].startswith("/var/run/secrets") or vm["name"] == "raygpu-sidecar-token"]
    assert {vm["mountPath"]: vm["name"] for vm in by_name["raygpu-sidecar"]["volumeMounts"]}[TOKEN_DIR] \
        == "raygpu-sidecar-token"

    addr, names = _ready(testbed, core, ns, "rc", 1)
    uid = kube.resources.get(api_version="ray.io/v1", kind="RayCluster").get(name="rc", namespace=ns).metadata.uid
    core.create_namespaced_config_map(ns, {"metadata": {
        "name": "rc-rg-orphan", "labels": {LABEL_RESERVATION: "rg-orphan", LABEL_CLUSTER: "rc"},
        "ownerReferences": [{"apiVersion": "ray.io/v1", "kind": "RayCluster", "name": "rc", "uid": uid}],
        "annotations": {"raygpu.io/reservation-state": "reserved", "raygpu.io/heartbeat-at": f"{time.time() - 600:.0f}"}},
        "data": {"plan.json": "{}"}})
    core.create_namespaced_config_map(ns, {"metadata": {"name": "bystander"}, "data": {"k": "v"}})
    core.create_namespaced_secret(ns, {"metadata": {"name": "secret"}, "stringData": {"password": "x"}})

    def rc_patch(ops: list[dict], name: str = "rc", dry_run: str | None = None):
        kw = {"dry_run": dry_run} if dry_run else {}  # a JSON patch, as the sidecar sends (the client's default is a merge patch)
        return lambda: sa_custom.patch_namespaced_custom_object("ray.io", "v1", ns, "rayclusters", name, ops,
                                                                _content_type="application/json-patch+json", **kw)

    def policy_denies() -> bool:  # dry runs pass through admission and change nothing
        try:
            rc_patch([{"op": "add", "path": "/metadata/labels", "value": {"x": "y"}}], dry_run="All")()
            return False
        except client.ApiException as e:
            return RC_POLICY in str(e.body)
    wait_for("the RayCluster policy takes effect", policy_denies, 30)
    wait_for("the ConfigMap policy takes effect", lambda: _denied(
        lambda: sa_core.delete_namespaced_config_map("bystander", ns, dry_run="All"), CM_POLICY), 30)

    # (a) the sidecar's whole job under that token, the policies on: scale down, release the orphan
    side = Sidecar(testbed, ns, "rc", addr, tmp_path / "sidecar.log", "--heartbeat-timeout-s", "5",
                   "--debug-heartbeat-timeout-floor-s", "0", kubeconfig=kc)  # no driver beats: age it in seconds
    try:
        side.wait("the idle worker deleted", lambda: _workers(core, ns) == [], 90)
        side.wait("the orphan reservation released", lambda: side.records("released", reservation="rc-rg-orphan"), 60)
        assert "rg-orphan" not in _spec_groups(kube, ns)  # the group removal passed the policy
        assert [c.metadata.name for c in core.list_namespaced_config_map(ns).items
                if c.metadata.name in ("rc-rg-orphan", "bystander")] == ["bystander"]
        assert not refusals(side.lines), refusals(side.lines)
        assert side.records("cycle", outcome="applied")
    finally:
        side.stop()

    # (b) RBAC: another RayCluster of the namespace, an unnamed list, secrets
    for what, call in {
        "get another RayCluster": lambda: sa_custom.get_namespaced_custom_object("ray.io", "v1", ns, "rayclusters",
                                                                                 "other"),
        "patch another RayCluster": rc_patch([{"op": "replace", "path": "/spec/suspend", "value": False}], "other"),
        "list every RayCluster": lambda: sa_custom.list_namespaced_custom_object("ray.io", "v1", ns, "rayclusters"),
        "list secrets": lambda: sa_core.list_namespaced_secret(ns),
        "read a secret": lambda: sa_core.read_namespaced_secret("secret", ns),
        "create a pod": lambda: sa_core.create_namespaced_pod(ns, {"metadata": {"name": "x"}, "spec": {
            "containers": [{"name": "c", "image": "busybox"}]}}),
    }.items():
        assert "forbidden" in refused(call, status=403).lower(), what
    listed = sa_custom.list_namespaced_custom_object("ray.io", "v1", ns, "rayclusters",
                                                     field_selector="metadata.name=rc")
    assert [i["metadata"]["name"] for i in listed["items"]] == ["rc"]

    # (c) the admission policy: what RBAC allows on its own RayCluster, beyond the sidecar's writes
    groups = [g["groupName"] for g in kube.resources.get(api_version="ray.io/v1", kind="RayCluster")
              .get(name="rc", namespace=ns).to_dict()["spec"]["workerGroupSpecs"]]
    gpu = groups.index("gpu")
    extra = copy.deepcopy(_spec_groups(kube, ns)["gpu"]) | {"groupName": "extra", "replicas": 0}
    for what, ops in {
        "rewrite a worker pod template": [{"op": "replace", "value": "busybox",
                                           "path": f"/spec/workerGroupSpecs/{gpu}/template/spec/containers/0/image"}],
        "rewrite the head pod template": [{"op": "replace", "value": "busybox",
                                           "path": "/spec/headGroupSpec/template/spec/containers/0/image"}],
        "label the RayCluster": [{"op": "add", "path": "/metadata/labels", "value": {"x": "y"}}],
        "scale a group up": [{"op": "replace", "path": f"/spec/workerGroupSpecs/{gpu}/replicas", "value": 1}],
        "raise a group's minimum": [{"op": "replace", "path": f"/spec/workerGroupSpecs/{gpu}/minReplicas", "value": 1}],
        "add a worker group": [{"op": "add", "path": "/spec/workerGroupSpecs/-", "value": extra}],
        "remove a user's worker group": [{"op": "remove", "path": f"/spec/workerGroupSpecs/{gpu}"}],
        "turn autoscaling on": [{"op": "replace", "path": "/spec/enableInTreeAutoscaling", "value": True}],
    }.items():
        refused(rc_patch(ops), status=(403, 422), mentions=RC_POLICY)
    assert _spec_groups(kube, ns)["gpu"]["template"]["spec"]["containers"][0]["image"] != "busybox"
    rc_patch([{"op": "replace", "path": f"/spec/workerGroupSpecs/{gpu}/scaleStrategy",
               "value": {"workersToDelete": []}}])()  # what the sidecar writes is allowed
    assert _spec_groups(kube, ns)["gpu"]["scaleStrategy"].get("workersToDelete", []) == []
    refused(lambda: sa_core.delete_namespaced_config_map("bystander", ns), status=(403, 422), mentions=CM_POLICY)
    assert core.read_namespaced_config_map("bystander", ns).data == {"k": "v"}


def _denied(call, policy: str) -> bool:
    try:
        call()
        return False
    except client.ApiException as e:
        return policy in str(e.body)


def test_gang_scale_up_works_under_the_shipped_identity_and_policy_and_nothing_more(testbed, ns, pool, kube, core,
                                                                                    tmp_path):
    """deploy/sidecar + deploy/sidecar-scale-up + deploy/sidecar-policy, a token of the ServiceAccount: an
    UNMODIFIED driver's pending placement group gets its gang from the sidecar, runs and leaves nothing; the
    policy lets the sidecar append a reservation group only as a copy of a user group's pods."""
    policy = m.sidecar_policy_objects()
    try:
        for obj in policy:
            apply(kube, obj)
        _run_scale_up(testbed, ns, pool, kube, core, tmp_path)
    finally:
        for obj in policy:
            delete(kube, obj["apiVersion"], obj["kind"], obj["metadata"]["name"])


def _run_scale_up(testbed, ns, pool, kube, core, tmp_path) -> None:
    for obj in m.sidecar_deploy_objects(ns, CLUSTER) + m.sidecar_scale_up_objects(ns):
        apply(kube, obj)
    tok = core.create_namespaced_service_account_token("raygpu-sidecar", ns, {"spec": {"expirationSeconds": 900}})
    kc = testbed.kubeconfig_for_token(tok.status.token, "raygpu-sidecar", tmp_path / "sa.kubeconfig")
    sa_custom = client.CustomObjectsApi(api_client(kc))
    addr = scale_up_cluster(testbed, ns, pool, kube, gpu_nodes=4)

    def rc_patch(ops: list[dict]):  # a dry run passes through admission and changes nothing
        return lambda: sa_custom.patch_namespaced_custom_object(
            "ray.io", "v1", ns, "rayclusters", CLUSTER, ops, _content_type="application/json-patch+json",
            dry_run="All")

    def policy_denies() -> bool:
        try:
            rc_patch([{"op": "add", "path": "/metadata/labels", "value": {"x": "y"}}])()
            return False
        except client.ApiException as e:
            return RC_POLICY in str(e.body)
    wait_for("the RayCluster policy takes effect", policy_denies, 30)

    def reservation_group(name: str, **spec) -> dict:
        g = copy.deepcopy(_spec_groups(kube, ns, CLUSTER)["gpu"]) | {"groupName": name, "replicas": 0}
        g["template"].setdefault("metadata", {}).setdefault("labels", {})[LABEL_RESERVATION] = name
        g["template"]["spec"].update(spec)
        return g
    add = lambda g: [{"op": "add", "path": "/spec/workerGroupSpecs/-", "value": g}]  # noqa: E731
    rc_patch(add(reservation_group("rg-copy", schedulerName="scheduler-plugins-scheduler")))()  # allowed
    image = _spec_groups(kube, ns, CLUSTER)["gpu"]["template"]["spec"]["containers"]
    other = [dict(image[0], image="busybox")] + image[1:]
    for what, group in {
        "a reservation group running another image": reservation_group("rg-rogue", containers=other),
        "a reservation group with a host path": reservation_group("rg-rogue", volumes=[
            {"name": "h", "hostPath": {"path": "/"}}]),
        "a group labelled with another group's name": reservation_group("rg-rogue") | {"groupName": "rg-other"},
        "a group named unlike a reservation": reservation_group("gpu2"),
    }.items():
        refused(rc_patch(add(group)), status=(403, 422), mentions=RC_POLICY)

    admin = KubeAdapter(str(testbed.kubeconfig))
    side = Sidecar(testbed, ns, CLUSTER, addr, tmp_path / "sidecar.log", kubeconfig=kc)
    driver = Driver(PLAIN_PG, addr, tmp_path / "driver.log")
    try:
        pg_id = driver.next("pg", 120)
        reserved = side.wait("the sidecar reserves a gang for the pending placement group",
                             lambda: side.records("scale-up-reserved", placement_group=pg_id), 90)
        assert reserved[0]["pods"] == 4, reserved
        assert driver.next("ready", 300) is True, driver.log_path.read_text()[-3000:]
        assert len(set(driver.next("nodes", 150))) == 4
        assert driver.next("done", 60) is True
        side.wait("the reservation released once the placement group is gone",
                  lambda: side.records("released", reason="PlacementGroupGone"), 120)
        wait_for("nothing left", lambda: nothing_left(admin, ns, CLUSTER), 120)
        assert not refusals(side.lines), refusals(side.lines)
        assert len(side.records("scale-up-reserved")) == 1
    finally:
        driver.stop()
        side.stop()
