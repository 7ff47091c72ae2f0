"""Issue 16 item 3: the driver and the sidecar run as deploy/ ships them, and nothing they do is refused.

The ServiceAccounts, Roles and RoleBindings of deploy/driver and deploy/sidecar for RayCluster 'c', and a
token minted for each with the TokenRequest API: a driver authenticated only by its token runs gangs of every
backend (none: reserve, ready, remove; coscheduling, volcano, kueue: reserve, heartbeat, timeout rollback) and
a driver killed outright, while the sidecar, authenticated only by its own, reclaims an idle worker and
garbage-collects the dead driver's reservation. The API server's audit log (raygpu.testing.audit) then shows
no request of either identity refused, every verb the driver used granted by its Role, and every verb its
Role grants used but the two that only a failure path needs. Last, with one verb (create PodGroups) taken out
of the Role, the driver's placement_group fails with a ForbiddenError naming that permission, and leaves
nothing.
"""

from __future__ import annotations

import os
import signal
import textwrap
import time
from pathlib import Path

import pytest
import ray
from kubernetes import client

import raygpu
from raygpu.adapters.kube import KubeAdapter
from raygpu.gang.api import HEARTBEAT_EVERY_S
from raygpu.testing import audit
from raygpu.testing import manifests as m
from raygpu.testing.kube import api_client, apply
from tests.integration.gang_helpers import nothing_left
from tests.integration.sidecar_helpers import ON_5S, Driver, Sidecar, _ready, _workers, refusals
from tests.integration.util import wait_for

pytestmark = pytest.mark.k137  # the workload backend's verbs are proven used on 1.37 only

CLUSTER = "c"
VOLCANO_PODGROUP = ("scheduling.volcano.sh/v1beta1", "PodGroup")
# Granted, and needed only when something fails: get configmaps (the read-back after a create whose answer
# was lost, the finisher), create events (a raygpu.io/guard annotation that does not parse).
FAILURE_PATH_ONLY = {("get", "configmaps"), ("create", "events")}
# Granted for backend workload, whose API (scheduling.k8s.io Workload, PodGroup) only the 1.37 testbed serves:
# used there (.ci/run runs this test on both), unused on 1.34
WORKLOAD_ONLY = {(v, f"{r}.scheduling.k8s.io") for v in ("create", "delete") for r in ("workloads", "podgroups")}
DEAD_DRIVER = textwrap.dedent("""
    import json, sys, ray, raygpu
    ray.init(address=sys.argv[1], logging_level="ERROR", log_to_driver=False)
    pg = raygpu.placement_group([{"GPU": 8}] * 2, strategy="STRICT_SPREAD", cluster="c", namespace=NS,
                                backend="none", timeout_s=150, name="dead", kubeconfig=KUBECONFIG)
    print(json.dumps({"gang": pg.plan.gang_name}), flush=True)
    print(json.dumps({"ready": pg.wait(170)}), flush=True)
    sys.stdin.read()  # hold the gang until killed
""")


def user(ns: str, account: str) -> str:
    return f"system:serviceaccount:{ns}:{account}"


def identities(testbed, ns: str, kube, core, tmp_path: Path) -> tuple[Path, Path]:
    """Apply deploy/driver and deploy/sidecar for CLUSTER; (driver kubeconfig, sidecar kubeconfig), each holding
    only a token minted for that ServiceAccount."""
    out = []
    for account, objs in (("raygpu-driver", m.driver_deploy_objects(ns, CLUSTER)),
                          ("raygpu-sidecar", m.sidecar_deploy_objects(ns, CLUSTER))):
        for obj in objs:
            apply(kube, obj)
        tok = core.create_namespaced_service_account_token(account, ns, {"spec": {"expirationSeconds": 1800}})
        kc = testbed.kubeconfig_for_token(tok.status.token, account, tmp_path / f"{account}.kubeconfig")
        sa_core = client.CoreV1Api(api_client(kc))
        wait_for(f"{account}'s RoleBinding takes effect", lambda: sa_core.list_namespaced_pod(ns) is not None, 30)
        out.append(kc)
    return out[0], out[1]


def granted(rules: list[dict]) -> set[tuple[str, str]]:
    """(verb, resource as the audit log names it: ``<plural>[.<group>]``) for every rule."""
    return {(v, f"{r}.{g}" if g else r) for rule in rules for g in rule["apiGroups"] for r in rule["resources"]
            for v in rule["verbs"]}


def audited(testbed, core_as: client.CoreV1Api, ns: str, users: list[str], since_s: float) -> list[audit.Request]:
    """The audited requests of ``users`` since ``since_s``, once a marker request of the first user (a pod list
    made now) is in the log: every earlier request's last stage has been written by then."""
    marker_s = time.time()
    core_as.list_namespaced_pod(ns, label_selector="raygpu.io/audit-marker")

    def complete() -> list[audit.Request] | None:
        reqs = audit.read_requests(testbed.audit_log, users, since_s)
        marked = any(r.user == users[0] and r.verb == "list" and r.resource == "pods" and r.code is not None
                     and r.at_s >= marker_s - 1 for r in reqs)
        return reqs if marked else None
    return wait_for("the marker request in the audit log", complete, 30)


def test_driver_and_sidecar_as_shipped_are_refused_nothing(testbed, ns, pool, kube, core, tmp_path):
    driver_kc, sidecar_kc = identities(testbed, ns, kube, core, tmp_path)
    driver_user, sidecar_user = user(ns, "raygpu-driver"), user(ns, "raygpu-sidecar")
    workload_api = m.minor_at_least(testbed.kubernetes, "1.37")  # the testbed serves scheduling.k8s.io Workload
    admin = KubeAdapter(str(testbed.kubeconfig))
    pool.add({"cpu": "cpu16", "g1": "h100x8", "g2": "h100x8"})
    apply(kube, m.raycluster(CLUSTER, ns, [m.worker_group("gpu", replicas=0, pool=pool.name),
                                           m.worker_group("idle", replicas=1, pool=pool.name)],
                             pool=pool.name, annotations={**ON_5S, "raygpu.io/gang-template": "gpu"}))
    addr, _ = _ready(testbed, core, ns, CLUSTER, 1)
    t0 = time.time() - 1.0
    # a live driver beats every HEARTBEAT_EVERY_S (10 s): the timeout must exceed it, or the GC takes live gangs
    side = Sidecar(testbed, ns, CLUSTER, addr, tmp_path / "sidecar.log", "--heartbeat-timeout-s",
                   f"{3 * HEARTBEAT_EVERY_S:g}", kubeconfig=sidecar_kc)
    dead = None
    try:
        # (1) reclaim: the idle worker goes
        side.wait("the idle worker deleted", lambda: _workers(core, ns) == [], 90)
        ray.init(address=addr, logging_level="ERROR", log_to_driver=False)
        try:
            # (2) a gang reserved, ready and removed
            pg = raygpu.placement_group([{"GPU": 8}] * 2, strategy="STRICT_SPREAD", cluster=CLUSTER, namespace=ns,
                                        backend="none", timeout_s=150, name="ok", kubeconfig=str(driver_kc))
            try:
                assert pg.wait(170), f"not ready: {pg.state} {pg.error}"
            finally:
                raygpu.remove_placement_group(pg)
            wait_for("the ready gang released", lambda: nothing_left(admin, ns, CLUSTER), 90)
            # (3) every backend's gang objects: reserved, nudged by the heartbeat, rolled back at the timeout
            # (3 x 8 GPUs on 2 nodes under coscheduling; no Volcano scheduler; no LocalQueue 'lq')
            waiting = [raygpu.placement_group([{"GPU": 8}] * n, strategy="STRICT_SPREAD", cluster=CLUSTER,
                                              namespace=ns, backend=backend, queue=queue, timeout_s=20,
                                              name=f"late-{backend}", kubeconfig=str(driver_kc))
                       for backend, n, queue in (("coscheduling", 3, None), ("volcano", 1, None), ("kueue", 1, "lq"))
                       + ((("workload", 3, None),) if workload_api else ())]
            assert admin.get(*VOLCANO_PODGROUP, waiting[1].plan.gang_name, ns), "the Volcano PodGroup exists"
            for pg in waiting:
                assert not pg.wait(60) and pg.state.value == "rolled_back", (pg.plan.backend, pg.state, pg.error)
                raygpu.remove_placement_group(pg)  # a no-op after the rollback
            wait_for("the rolled-back gangs leave nothing", lambda: nothing_left(admin, ns, CLUSTER)
                     and not admin.list(*VOLCANO_PODGROUP, ns), 90)
        finally:
            ray.shutdown()
        # (4) a driver killed outright: the sidecar's garbage collection releases its ready gang
        script = DEAD_DRIVER.replace("NS", repr(ns)).replace("KUBECONFIG", repr(str(driver_kc)))
        dead = Driver(script, addr, tmp_path / "dead-driver.log")
        gang = dead.next("gang", 120)
        assert dead.next("ready", 240) is True
        os.kill(dead.proc.pid, signal.SIGKILL)
        assert dead.proc.wait(10) == -signal.SIGKILL
        side.wait("the dead driver's reservation released", lambda: side.records("released", reservation=gang), 180)
        wait_for("nothing left of it", lambda: nothing_left(admin, ns, CLUSTER), 90)
        assert not refusals(side.lines), refusals(side.lines)
    finally:
        side.stop()
        if dead:
            dead.stop()

    driver_core = client.CoreV1Api(api_client(driver_kc))
    reqs = audited(testbed, driver_core, ns, [driver_user, sidecar_user], t0)
    refused = [(r.user, r.verb, r.resource, r.code) for r in reqs if r.code in (401, 403)]
    assert not refused, refused
    used = {(r.verb, r.resource) for r in reqs if r.user == driver_user and not r.resource.startswith("/")}
    role_rules = next(o for o in m.driver_deploy_objects(ns, CLUSTER) if o["kind"] == "Role")["rules"]
    # what every authenticated identity may do without any Role (read from this server, not assumed): the
    # driver's SelfSubjectAccessReview (gang/free.py, may it list nodes?) is granted by system:basic-user
    basic = granted(admin.get("rbac.authorization.k8s.io/v1", "ClusterRole", "system:basic-user")["rules"])
    assert used <= granted(role_rules) | basic, used - granted(role_rules) - basic
    unused_ok = FAILURE_PATH_ONLY | (set() if workload_api else WORKLOAD_ONLY)
    assert granted(role_rules) - used <= unused_ok, f"granted, never used: {granted(role_rules) - used}"
    sidecar_used = {(r.verb, r.resource) for r in reqs if r.user == sidecar_user}
    assert {("patch", "rayclusters.ray.io"), ("delete", "configmaps")} <= sidecar_used, sidecar_used

    # (5) one verb taken away (create scheduler-plugins PodGroups): refused, named, and nothing left behind
    role = next(o for o in m.driver_deploy_objects(ns, CLUSTER) if o["kind"] == "Role")
    [pg_rule] = [r for r in role["rules"] if r["apiGroups"] == ["scheduling.x-k8s.io"]]
    pg_rule["verbs"] = [v for v in pg_rule["verbs"] if v != "create"]
    kube.resources.get(api_version="rbac.authorization.k8s.io/v1", kind="Role").replace(body=role, namespace=ns)
    authz = client.AuthorizationV1Api(api_client(testbed.kubeconfig))
    wait_for("the narrower Role takes effect", lambda: not authz.create_subject_access_review({"spec": {
        "user": driver_user, "groups": ["system:serviceaccounts", f"system:serviceaccounts:{ns}", "system:authenticated"],
        "resourceAttributes": {"namespace": ns, "verb": "create", "group": "scheduling.x-k8s.io",
                               "resource": "podgroups"}}}).status.allowed, 30)
    rv = admin.get_raycluster(ns, CLUSTER).resource_version
    t1 = time.time() - 1.0
    ray.init(address=addr, logging_level="ERROR", log_to_driver=False)
    try:
        with pytest.raises(raygpu.ForbiddenError) as err:
            raygpu.placement_group([{"GPU": 8}], cluster=CLUSTER, namespace=ns, backend="coscheduling",
                                   timeout_s=60, name="denied", kubeconfig=str(driver_kc))
    finally:
        ray.shutdown()
    e = err.value
    assert (e.verb, e.resource, e.namespace) == ("create", "podgroups.scheduling.x-k8s.io", ns), str(e)
    assert f"missing permission: create podgroups.scheduling.x-k8s.io in namespace {ns}" in str(e), str(e)
    assert nothing_left(admin, ns, CLUSTER) is not None, "the state ConfigMap was left behind"
    assert admin.get_raycluster(ns, CLUSTER).resource_version == rv, "the RayCluster was written"
    denied = [(r.verb, r.resource, r.code) for r in audited(testbed, driver_core, ns, [driver_user], t1)
              if r.code == 403]
    assert denied == [("create", "podgroups.scheduling.x-k8s.io", 403)], denied  # the log shows refusals
