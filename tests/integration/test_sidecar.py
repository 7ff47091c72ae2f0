"""Issue 4: the idle-node reclaimer sidecar on the real testbed (KubeRay, kwok nodes, real Ray)."""

from __future__ import annotations

import signal
import time
import urllib.request

import pytest
import yaml
from kubernetes import client

from raygpu.adapters.kube import KubeAdapter
from raygpu.adapters.kube_watch import ClusterCache
from raygpu.reclaim.loop import CycleOutcome, Reclaimer, SidecarConfig
from raygpu.testing import manifests as m
from raygpu.testing.kube import api_client, apply
from tests.integration.sidecar_helpers import (
    BRIDGE_WAIT_S,
    DRIVER,
    GPU_RES,
    ON_5S,
    REPO,
    Driver,
    PodDeletions,
    Sidecar,
    _cluster,
    _events,
    _merge_patch,
    _ready,
    _spec_groups,
    _workers,
    refusals,
)
from tests.integration.util import alive_ray_nodes, holds_for, pods, wait_for
from tests.unit.test_deploy_image import expected_tag


# -------------------------------------------------------------------- tests
def test_idle_workers_go_bundle_holders_and_pending_pg_needs_stay(testbed, ns, pool, kube, core, tmp_path):
    """(1) the small idle worker goes after 5 s; the bundle holder and the worker a pending
    STRICT_SPREAD placement group needs stay, and the PG is then placed on it."""
    t0 = time.monotonic()
    pool.add({"cpu": "cpu16", "g1": "h100x8", "g2": "h100x8", "g3": "h100x8", "t1": "t4x1"})
    _cluster(kube, ns, pool.name, [
        m.worker_group("gpu", replicas=2, pool=pool.name, gpus=GPU_RES),
        m.worker_group("small", replicas=1, cpu="4", memory="16Gi", gpus={"nvidia.com/gpu": 1}, pool=pool.name)],
        ON_5S)
    addr, _ = _ready(testbed, core, ns, "rc", 3)
    small = _workers(core, ns, "small")
    by_node = lambda: {n.node_id: n.instance_id for n in alive_ray_nodes(addr)}  # noqa: E731

    driver = Driver(DRIVER, addr, tmp_path / "driver.log")
    side = None
    try:
        held = driver.next("held", 90)
        assert driver.next("wide_state", 30) == "PENDING"
        holder = by_node()[held[0]]
        deletions = PodDeletions(core, ns)
        side = Sidecar(testbed, ns, "rc", addr, tmp_path / "sidecar.log")

        side.wait("the idle 1-GPU worker deleted", lambda: _workers(core, ns, "small") == [], 60)
        reasons = {r["pod"]: r["reason"] for r in side.records("decision")}
        assert reasons[small[0]] == "Idle"
        assert reasons[holder] == "HoldsBundle"
        needed = [p for p in _workers(core, ns, "gpu") if p != holder]
        assert [reasons[p] for p in needed] == ["NeededByPendingPG"], reasons
        holds_for("both GPU workers stay", lambda: len(_workers(core, ns, "gpu")) == 2, 6)
        # no verdict on them was ever a delete; decisions are logged when they change, and a transient
        # keep for another reason (Ray view unreadable for a cycle under load, idle clock reset) is fine
        history = {p: [(r["action"], r["reason"]) for r in side.records("decision", pod=p)] for p in [holder, *needed]}
        assert all(a == "keep" for h in history.values() for a, _ in h), history
        assert all(any(r in ("HoldsBundle", "NeededByPendingPG") for _, r in h) for h in history.values()), history

        # a third GPU worker arrives (as the autoscaler or a gang reservation would add it): the PG fits now
        _merge_patch(kube, ns, {"spec": {"workerGroupSpecs": [
            {**_spec_groups(kube, ns)["gpu"], "replicas": 3}, _spec_groups(kube, ns)["small"]]}})
        wide = driver.next("wide", BRIDGE_WAIT_S)
        placed_on = {by_node()[n] for n in wide}
        assert set(needed) <= placed_on and holder not in placed_on
        holds_for("all 3 GPU workers stay (each holds a bundle)", lambda: len(_workers(core, ns, "gpu")) == 3, 5)
        assert deletions.counts == {small[0]: 1}
        scaled = _events(core, ns, "ScaledDown")
        assert len(scaled) == 1 and small[0] in scaled[0].message and "Idle" in scaled[0].message
        metrics = urllib.request.urlopen(f"http://127.0.0.1:{side.metrics_port}/metrics", timeout=5).read().decode()
        assert 'raygpu_reclaim_decisions_total{action="keep",reason="NeededByPendingPG"}' in metrics
        assert "raygpu_reclaim_gpus_reclaimed_total 1.0" in metrics
        assert "raygpu_reclaim_cycle_duration_seconds_count" in metrics
        assert "raygpu_reclaim_idle_gpu_seconds_total" in metrics
        assert side.signal(signal.SIGTERM) == 0
        assert side.records("stopped")
    finally:
        if side:
            side.stop()
        driver.stop()
    print(f"test (1) took {time.monotonic() - t0:.0f}s")


def test_a_concurrent_write_between_plan_and_patch_causes_a_replan(testbed, ns, pool, kube, core):
    """(2) the RayCluster changes between snapshot and patch: the patch fails its test, nothing is deleted,
    and the re-plan (from the new version) keeps the workers the writer now protects."""
    pool.add({"cpu": "cpu16", "g1": "h100x8"})
    _cluster(kube, ns, pool.name, [m.worker_group("gpu", replicas=1, pool=pool.name, gpus=GPU_RES)], ON_5S)
    addr, names = _ready(testbed, core, ns, "rc", 1)
    adapter = KubeAdapter(str(testbed.kubeconfig))
    cache = ClusterCache(adapter.api, ns, "rc").start()
    try:
        assert cache.wait_synced(30)
        reclaimer = Reclaimer(adapter, cache, SidecarConfig(namespace=ns, cluster="rc", ray_address=addr,
                                                            interval_s=0.5, startup_grace_s=0))
        stale_plans = []

        def concurrent_writer(plan):  # someone raises the group minimum after our snapshot
            stale_plans.append(plan)
            _merge_patch(kube, ns, {"spec": {"workerGroupSpecs": [{**_spec_groups(kube, ns)["gpu"],
                                                                   "minReplicas": 1}]}})
        seen = []

        def conflicted():
            seen.append(reclaimer.cycle(before_apply=concurrent_writer))
            return seen[-1] if seen[-1].outcome is CycleOutcome.CONFLICT else None
        try:
            report = wait_for("a plan that deletes, hit by a concurrent write", conflicted, 60)
        except Exception:
            last = seen[-1] if seen else None
            raise AssertionError(f"last cycle: {last and (last.outcome, last.error)}; "
                                 f"{last and last.plan and [(d.pod_name, d.reason, d.detail) for d in last.plan.decisions]}")
        stale = stale_plans[-1].deleted_pods
        assert stale and set(stale) <= set(names), "the stale plan would have deleted idle workers"
        assert report.replan_now
        replan = reclaimer.cycle()  # the immediate re-plan, from the writer's version
        assert replan.outcome is CycleOutcome.IDLE
        assert replan.plan.cluster_resource_version != stale_plans[-1].cluster_resource_version
        assert replan.plan.deleted_pods == ()
        assert {replan.plan.decision(n).reason.value for n in stale} == {"GroupMinimum"}
        reg = reclaimer.metrics.registry
        assert reg.get_sample_value("raygpu_reclaim_patch_conflicts_total") == 1
        holds_for("the worker stays, workersToDelete empty",
                  lambda: _workers(core, ns) == names
                  and not (_spec_groups(kube, ns)["gpu"].get("scaleStrategy") or {}).get("workersToDelete"), 4)
        # control: once the writer's minimum is lifted, the same reclaimer deletes them
        _merge_patch(kube, ns, {"spec": {"workerGroupSpecs": [{**_spec_groups(kube, ns)["gpu"], "minReplicas": 0}]}})
        # (KubeRay's status writes also move the resourceVersion: such conflicts just re-plan)
        wait_for("a plan applied after the minimum is lifted",
                 lambda: reclaimer.cycle().outcome is CycleOutcome.APPLIED, 30)
        wait_for("the worker deleted", lambda: _workers(core, ns) == [], 60)
    finally:
        cache.stop()


def test_sigkill_mid_cycle_and_restart_reach_the_same_end_state(testbed, ns, pool, kube, core, tmp_path):
    """(3) kill -9 between plan and patch, then right after the patch; the third sidecar finds the work
    done. The idle worker is deleted exactly once and KubeRay replaces it with none."""
    pool.add({"cpu": "cpu16", "g1": "h100x8"})
    _cluster(kube, ns, pool.name, [m.worker_group("a", replicas=1, pool=pool.name, gpus=GPU_RES)], ON_5S)
    addr, names = _ready(testbed, core, ns, "rc", 1)
    deletions = PodDeletions(core, ns)
    sidecars = []
    try:
        # 1. killed while paused between plan and patch: nothing written
        s1 = Sidecar(testbed, ns, "rc", addr, tmp_path / "s1.log", "--debug-pause-before-apply-s", "120")
        sidecars.append(s1)
        s1.wait("sidecar 1 plans to delete the idle worker", lambda: s1.records("decision", action="delete"), 60)
        assert s1.signal(signal.SIGKILL) == -signal.SIGKILL
        assert not s1.records("patch")
        assert _workers(core, ns) == names
        assert not any((g.get("scaleStrategy") or {}).get("workersToDelete") for g in _spec_groups(kube, ns).values())

        # 2. killed right after its patch landed (before or while it writes its Events)
        s2 = Sidecar(testbed, ns, "rc", addr, tmp_path / "s2.log")
        sidecars.append(s2)
        patch = s2.wait("sidecar 2 patches", lambda: s2.records("patch", status="applied"), 60)[0]
        s2.signal(signal.SIGKILL)
        assert sorted(patch["pods"]) == names

        # 3. a fresh sidecar: sees the deletions in flight or done, writes nothing
        s3 = Sidecar(testbed, ns, "rc", addr, tmp_path / "s3.log")
        sidecars.append(s3)
        wait_for("the worker deleted", lambda: _workers(core, ns) == [], 60, log=testbed.logs / "ray-operator.log")
        s3.wait("sidecar 3 ran 3 cycles", lambda: len(s3.records("cycle")) >= 3, 30)
        assert not s3.records("patch")
        assert all(r["outcome"] in ("nothing-to-do", "not-synced") for r in s3.records("cycle"))
        holds_for("no worker comes back", lambda: _workers(core, ns) == [], 4)
        assert deletions.counts == {n: 1 for n in names}, deletions.counts
        assert not (deletions.created - set(names)), f"KubeRay created replacements: {deletions.created}"
        groups = _spec_groups(kube, ns)
        assert groups["a"]["replicas"] == 0
        listed = [n for g in groups.values() for n in g["scaleStrategy"]["workersToDelete"]]
        assert sorted(listed) == names  # each once
        assert len(_events(core, ns, "ScaledDown")) <= 1  # from sidecar 2, if it lived long enough to write it
        assert s3.signal(signal.SIGTERM) == 0
    finally:
        for s in sidecars:
            s.stop()
        deletions.stop()


def test_runs_under_the_deployed_service_account_with_least_privilege(testbed, ns, pool, kube, core, tmp_path):
    """(4) the Role of deploy/sidecar is enough for the job (scale-down, Events, reservation GC) and
    denies deleting pods and reading secrets."""
    for obj in m.sidecar_deploy_objects(ns, "rc"):
        apply(kube, obj)
    tok = core.create_namespaced_service_account_token("raygpu-sidecar", ns, {"spec": {"expirationSeconds": 900}})
    kc = testbed.kubeconfig_for_token(tok.status.token, "raygpu-sidecar", tmp_path / "sa.kubeconfig")
    sa_core = client.CoreV1Api(api_client(kc))
    wait_for("the RoleBinding takes effect", lambda: sa_core.list_namespaced_pod(ns) is not None, 30)

    pool.add({"cpu": "cpu16", "g1": "h100x8"})
    _cluster(kube, ns, pool.name, [m.worker_group("gpu", replicas=1, pool=pool.name, gpus=GPU_RES)], ON_5S)
    addr, names = _ready(testbed, core, ns, "rc", 1)
    # a reservation whose driver was killed long ago (owned by the RayCluster, as reserve() makes it), a bystander
    uid = KubeAdapter(str(testbed.kubeconfig)).get_raycluster(ns, "rc").uid
    core.create_namespaced_config_map(ns, {"metadata": {
        "name": "rc-rg-orphan", "labels": {"raygpu.io/reservation": "rg-orphan", "raygpu.io/cluster": "rc"},
        "ownerReferences": [{"apiVersion": "ray.io/v1", "kind": "RayCluster", "name": "rc", "uid": uid}],
        "annotations": {"raygpu.io/reservation-state": "reserved", "raygpu.io/heartbeat-at": f"{time.time() - 600:.0f}"}},
        "data": {"plan.json": "{}"}})
    core.create_namespaced_config_map(ns, {"metadata": {"name": "bystander"}, "data": {"k": "v"}})
    core.create_namespaced_secret(ns, {"metadata": {"name": "secret"}, "stringData": {"password": "x"}})

    # the heartbeat's age counts from the sidecar's first sight of it (issue 14 item 11): a short timeout
    side = Sidecar(testbed, ns, "rc", addr, tmp_path / "sidecar.log", "--heartbeat-timeout-s", "5",
                   "--debug-heartbeat-timeout-floor-s", "0", kubeconfig=kc)  # no driver beats: age it in seconds
    try:
        side.wait("the idle worker deleted", lambda: _workers(core, ns) == [], 60)
        side.wait("the orphan reservation released", lambda: side.records("released", reservation="rc-rg-orphan"), 30)
        assert [c.metadata.name for c in core.list_namespaced_config_map(ns).items
                if c.metadata.name in ("rc-rg-orphan", "bystander")] == ["bystander"]
        assert _events(core, ns, "ScaledDown") and _events(core, ns, "ReservationReleased")
        assert not refusals(side.lines), refusals(side.lines)
    finally:
        side.stop()

    denied = {
        "delete a pod": lambda: sa_core.delete_namespaced_pod(pods(core, ns, "ray.io/node-type=head")[0]
                                                              ["metadata"]["name"], ns),
        "list secrets": lambda: sa_core.list_namespaced_secret(ns),
        "read a secret": lambda: sa_core.read_namespaced_secret("secret", ns),
        "create a pod": lambda: sa_core.create_namespaced_pod(ns, {"metadata": {"name": "x"}, "spec": {
            "containers": [{"name": "c", "image": "busybox"}]}}),
    }
    for what, call in denied.items():
        with pytest.raises(client.ApiException) as exc:
            call()
        assert exc.value.status == 403, what


def test_gc_never_touches_a_users_rg_group_or_configmaps_named_like_state(testbed, ns, pool, kube, core, tmp_path):
    """(6) issue 14 item 1: a user's own worker group rg-a100, a plain ConfigMap rc-rg-a100 (the name a state object
    would have) and a labelled look-alike without raygpu's ownerReference, in state released; the sidecar in mode
    on, its heartbeat timeout 2 s: after many cycles past every timeout, the group keeps its replica and its pod,
    both ConfigMaps exist, and no release of any kind was logged."""
    pool.add({"cpu": "cpu16", "g1": "h100x8"})
    _cluster(kube, ns, pool.name, [m.worker_group("rg-a100", replicas=1, min_replicas=0, pool=pool.name,
                                                  gpus=GPU_RES)], {"raygpu.io/reclaim": "on"})
    addr, names = _ready(testbed, core, ns, "rc", 1)
    core.create_namespaced_config_map(ns, {"metadata": {"name": "rc-rg-a100"}, "data": {"mine": "yes"}})
    core.create_namespaced_config_map(ns, {"metadata": {
        "name": "look-alike", "labels": {"raygpu.io/reservation": "rg-a100", "raygpu.io/cluster": "rc"},
        "annotations": {"raygpu.io/reservation-state": "released"}}, "data": {"mine": "yes"}})
    side = Sidecar(testbed, ns, "rc", addr, tmp_path / "sidecar.log", "--heartbeat-timeout-s", "2",
                   "--debug-heartbeat-timeout-floor-s", "0")  # no driver beats here: past the floor on purpose
    try:
        planned = lambda: [r for r in side.records("cycle") if r["outcome"] not in ("not-synced", "no-cluster")]  # noqa: E731
        side.wait("10 planned cycles (> 3 heartbeat timeouts at 1 s each)", lambda: len(planned()) >= 10, 90)
        assert side.proc.poll() is None
        assert all(r["outcome"] in ("nothing-to-do", "dry-run") for r in planned()), planned()
        assert not side.records("released") and not side.records("scaled-to-zero") and not side.records("draining")
        assert all(r["released"] == [] for r in side.records("cycle"))
        verdicts = {(r["reservation"], r["action"], r["reason"]) for r in side.records("gc-decision")}
        assert verdicts == {("rg-a100", "keep", "Unproven"), ("look-alike", "keep", "Unproven")}, verdicts
        group = _spec_groups(kube, ns)["rg-a100"]
        assert group["replicas"] == 1 and not (group.get("scaleStrategy") or {}).get("workersToDelete")
        assert _workers(core, ns, "rg-a100") == names
        assert {c.metadata.name for c in core.list_namespaced_config_map(ns).items} >= {"rc-rg-a100", "look-alike"}
        assert not _events(core, ns, "ReservationReleased") and not _events(core, ns, "ReservationScaledToZero")
    finally:
        side.stop()


def test_example_raycluster_with_sidecar_is_accepted_by_the_api_server(testbed, ns, kube):
    obj = yaml.safe_load((REPO / "deploy" / "examples" / "raycluster-with-sidecar.yaml").read_text())
    res = kube.resources.get(api_version="ray.io/v1", kind="RayCluster")
    out = res.create(body=obj, namespace=ns, query_params=[("dryRun", "All")]).to_dict()
    head = out["spec"]["headGroupSpec"]["template"]["spec"]
    assert head["serviceAccountName"] == "raygpu-sidecar"
    sidecar = next(c for c in head["containers"] if c["name"] == "raygpu-sidecar")
    assert sidecar["command"] == ["raygpu", "sidecar"] and sidecar["image"] == f"raygpu:{expected_tag()}"
    assert out["metadata"]["annotations"]["raygpu.io/reclaim"] == "on"


def test_bad_annotation_gives_an_event_and_dry_run_not_a_crash_loop(testbed, ns, pool, kube, core, tmp_path):
    """(5) raygpu.io/reclaim: yes-please -> one InvalidAnnotation Event per bad value, dry-run (nothing
    deleted), the process keeps cycling; fixing the value lets it reclaim."""
    pool.add({"cpu": "cpu16", "g1": "h100x8"})
    _cluster(kube, ns, pool.name, [m.worker_group("gpu", replicas=1, pool=pool.name, gpus=GPU_RES)],
             {"raygpu.io/reclaim": "yes-please", "raygpu.io/idle-timeout": "5s"})
    addr, names = _ready(testbed, core, ns, "rc", 1)
    side = Sidecar(testbed, ns, "rc", addr, tmp_path / "sidecar.log")
    try:
        side.wait("an InvalidAnnotation Event", lambda: _events(core, ns, "InvalidAnnotation"), 30)
        side.wait("a dry-run plan that would delete the idle worker",
                  lambda: side.records("decision", action="delete", mode="dry-run"), 60)
        cycles = len(side.records("cycle"))
        holds_for("the worker stays and the sidecar keeps cycling", lambda: _workers(core, ns) == names
                  and side.proc.poll() is None, 5)
        assert len(side.records("cycle")) >= cycles + 3
        (ev,) = _events(core, ns, "InvalidAnnotation")  # once for this value, over many cycles
        assert ev.type == "Warning" and "yes-please" in ev.message and "dry-run" in ev.message
        assert len(_events(core, ns, "ScaleDownDryRun")) == 1
        assert not side.records("patch")

        _merge_patch(kube, ns, {"metadata": {"annotations": {"raygpu.io/reclaim": "maybe"}}})
        side.wait("a second Event for the second bad value",
                  lambda: len(_events(core, ns, "InvalidAnnotation")) == 2, 30)
        assert _workers(core, ns) == names

        _merge_patch(kube, ns, {"metadata": {"annotations": {"raygpu.io/reclaim": "on"}}})
        side.wait("the worker deleted once the value is fixed", lambda: _workers(core, ns) == [], 60)
        assert len(_events(core, ns, "InvalidAnnotation")) == 2
    finally:
        side.stop()
