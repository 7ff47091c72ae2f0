"""Issue 24 must-show 2: a driver that loses API access while its Ray job runs keeps its gang.

A driver authenticated only by a token minted for deploy/driver's ServiceAccount makes a ready 2 x 8-GPU gang
and holds its bundles with two Ray actors; the sidecar runs in mode ``on`` with a short heartbeat timeout.
Then the driver's RoleBinding is deleted: its heartbeats are refused (403), as when its ``kubectl create token``
token expires. Ray still says its job is alive and its placement group CREATED, so the sidecar keeps every pod
for more than three heartbeat timeouts (verdict ``RaySaysAlive``), and the driver says once that it lost
access. When the job ends (its own release is refused too; Ray removes its placement group with the job), the
sidecar releases the reservation on Ray's word and nothing is left.
"""

from __future__ import annotations

import textwrap
import time
from pathlib import Path

from kubernetes import client

from raygpu.adapters.kube import KubeAdapter
from raygpu.gang.api import HEARTBEAT_EVERY_S
from raygpu.model.labels import LABEL_RESERVATION
from raygpu.testing import manifests as m
from raygpu.testing.kube import api_client, apply
from tests.integration.gang_helpers import nothing_left
from tests.integration.sidecar_helpers import BRIDGE_WAIT_S, ON_5S, Driver, Sidecar
from tests.integration.util import alive_ray_nodes, holds_for, ray_address, wait_for

CLUSTER = "c"
ACCOUNT = "raygpu-driver"
# The shortest the sidecar accepts (three driver heartbeats). On a loaded box a beating driver can still read as
# quiet for a moment (its watchdog's Ray calls delay a beat): Ray's word keeps it then too.
BEAT_TIMEOUT_S = 3 * HEARTBEAT_EVERY_S
LOST = "lost access to the Kubernetes API"
DRIVER = textwrap.dedent("""
    import json, os, sys, ray, raygpu
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy
    ray.init(address=sys.argv[1], logging_level="ERROR", log_to_driver=False)
    say = lambda **kw: print(json.dumps(kw), flush=True)
    pg = raygpu.placement_group([{"GPU": 8}] * 2, strategy="STRICT_SPREAD", cluster="c", namespace=NS,
                                backend="none", timeout_s=150, name="cut", kubeconfig=KUBECONFIG,
                                progress=lambda m: print("progress:", m, file=sys.stderr, flush=True))
    say(gang=pg.plan.gang_name)
    say(ready=pg.wait(170))

    @ray.remote(num_gpus=8, num_cpus=0)
    class Holder:
        def pid(self):
            return os.getpid()
    holders = [Holder.options(scheduling_strategy=PlacementGroupSchedulingStrategy(
        pg.placement_group, placement_group_bundle_index=i)).remote() for i in range(2)]
    say(pids=ray.get([h.pid.remote() for h in holders], timeout=90))
    sys.stdin.read()  # the job runs until the test closes stdin
    try:
        raygpu.remove_placement_group(pg)
        say(removed="ok")
    except Exception as e:  # refused without API access: Ray removes the PG with the job, the sidecar the rest
        say(removed=f"{type(e).__name__}: {e}")
""")


def reserved_pods(admin: KubeAdapter, ns: str) -> list[str]:
    return sorted(p.name for p in admin.ray_pods(ns, CLUSTER) if LABEL_RESERVATION in p.labels
                  and not p.deleting)


def group_spec(admin: KubeAdapter, ns: str, group: str):
    return admin.get_raycluster(ns, CLUSTER).group(group)


def test_a_driver_that_loses_api_access_keeps_its_running_gang_until_its_job_ends(testbed, ns, pool, kube, core,
                                                                                 tmp_path):
    t0 = time.monotonic()
    admin = KubeAdapter(str(testbed.kubeconfig))
    driver_objs = m.driver_deploy_objects(ns, CLUSTER)
    for obj in driver_objs:
        apply(kube, obj)
    token = core.create_namespaced_service_account_token(ACCOUNT, ns, {"spec": {"expirationSeconds": 1800}})
    driver_kc = testbed.kubeconfig_for_token(token.status.token, ACCOUNT, tmp_path / "driver.kubeconfig")
    driver_core = client.CoreV1Api(api_client(driver_kc))
    wait_for("the driver's RoleBinding takes effect", lambda: driver_core.list_namespaced_pod(ns) is not None, 30)
    pool.add({"cpu": "cpu16", "g1": "h100x8", "g2": "h100x8"})
    apply(kube, m.raycluster(CLUSTER, ns, [m.worker_group("gpu", replicas=0, pool=pool.name)], pool=pool.name,
                             annotations={**ON_5S, "raygpu.io/gang-template": "gpu"}))
    addr = ray_address(testbed, ns, CLUSTER, timeout_s=BRIDGE_WAIT_S)
    wait_for("the Ray head's GCS answers", lambda: bool(alive_ray_nodes(addr)), BRIDGE_WAIT_S,
             log=testbed.logs / "bridge.log")
    side = Sidecar(testbed, ns, CLUSTER, addr, tmp_path / "sidecar.log", "--heartbeat-timeout-s",
                   f"{BEAT_TIMEOUT_S:g}")
    script = DRIVER.replace("NS", repr(ns)).replace("KUBECONFIG", repr(str(driver_kc)))
    driver = Driver(script, addr, tmp_path / "driver.log")
    try:
        gang = driver.next("gang", 120)
        assert driver.next("ready", 240) is True, driver.log_path.read_text()[-3000:]
        assert len(driver.next("pids", 120)) == 2
        pods = reserved_pods(admin, ns)
        group = admin.get(  # the reservation's worker group, as its state ConfigMap names it
            "v1", "ConfigMap", gang, ns)["metadata"]["labels"][LABEL_RESERVATION]
        assert len(pods) == 2 and group_spec(admin, ns, group).replicas == 2, pods
        side.wait("the sidecar judges the gang live", lambda: side.records("gc-decision", reservation=gang,
                                                                           reason="Live"), 60)

        # the driver loses API access: its RoleBinding goes (as when its token expires)
        binding = next(o for o in driver_objs if o["kind"] == "RoleBinding")
        admin.delete("rbac.authorization.k8s.io/v1", "RoleBinding", binding["metadata"]["name"], ns)
        authz = client.AuthorizationV1Api(api_client(testbed.kubeconfig))
        wait_for("the driver may no longer patch ConfigMaps", lambda: not authz.create_subject_access_review({
            "spec": {"user": f"system:serviceaccount:{ns}:{ACCOUNT}",
                     "groups": ["system:serviceaccounts", f"system:serviceaccounts:{ns}", "system:authenticated"],
                     "resourceAttributes": {"namespace": ns, "verb": "patch", "resource": "configmaps"}}}
        ).status.allowed, 30)
        wait_for("the driver says it lost API access", lambda: LOST in driver.log_path.read_text(),
                 HEARTBEAT_EVERY_S + 20)
        def verdict() -> str:  # the sidecar's latest verdict on the gang (logged when it changes)
            return side.records("gc-decision", reservation=gang)[-1]["reason"]
        side.wait("the sidecar keeps the quiet gang on Ray's word", lambda: verdict() == "RaySaysAlive",
                  HEARTBEAT_EVERY_S + BEAT_TIMEOUT_S + 30)

        def kept() -> bool:
            spec = group_spec(admin, ns, group)
            return (reserved_pods(admin, ns) == pods and spec is not None and spec.replicas == 2
                    and not spec.workers_to_delete and admin.get("v1", "ConfigMap", gang, ns) is not None)
        # the driver's last beat landed before it said it lost access: from here the heartbeat is quiet
        holds_for("every pod of the gang kept for three heartbeat timeouts", kept, 3 * BEAT_TIMEOUT_S, interval_s=1)
        assert verdict() == "RaySaysAlive"
        assert not side.records("gc-decision", reservation=gang, action="release"), side.records("gc-decision")
        said = [line for line in driver.log_path.read_text().splitlines() if line.startswith("progress:")
                and LOST in line]
        assert len(said) == 1, said  # once, however many beats were refused

        # the job ends: the driver's own release is refused, Ray removes its PG with the job, the sidecar the rest
        driver.proc.stdin.close()
        removed = driver.next("removed", 60)  # refused (403), or handed to the finisher, which is refused too
        assert driver.proc.wait(60) is not None
        side.wait("the reservation released by the sidecar", lambda: side.records("released", reservation=gang),
                  90)
        reasons = {r["reason"] for r in side.records("gc-decision", reservation=gang, action="release")}
        assert reasons and reasons <= {"PlacementGroupGone", "OwnerJobDead"}, reasons  # on Ray's word
        wait_for("nothing left", lambda: nothing_left(admin, ns, CLUSTER), 90)
        print(f"the driver's own remove_placement_group: {removed}")
    finally:
        driver.stop()
        side.stop()
    print(f"wall time {time.monotonic() - t0:.0f}s")
