"""Issue 14, must-show 1: a live gang next to the sidecar in mode ``on``, with the API server failing under both.

Two fault proxies (raygpu.testing.faultproxy) sit in front of the testbed's kube-apiserver: the driver
(raygpu.placement_group) talks through one, the sidecar (``raygpu sidecar``, idle timeout 5 s) through the
other, so a rule breaks exactly one side. A gang of 2 x 8 GPUs is made ready and two Ray actors hold its
bundles. Each test breaks one family of requests and checks, every time: the fault was really injected (the
proxy's log), the gang keeps the same pods (never deleted while ready, never recreated) and its actors, and
once released nothing is left (no worker group, state ConfigMap, PodGroup, reserved pod or Ray PG).
A failed test keeps its whole output under its tmp_path (``keep_on_failure``): the sidecar's log, the driver's,
and each proxy's log of every request; the failure report names each file with its last lines.
"""

from __future__ import annotations

import os
import signal
import textwrap
import time
from pathlib import Path

import pytest
import ray

import raygpu
from raygpu.adapters.kube import REQUEST_TIMEOUT
from raygpu.errors import RayGpuError
from raygpu.gang.api import HEARTBEAT_EVERY_S, WATCH_BACKOFF_MAX_S, WATCHDOG_JOIN_S
from raygpu.gang.reservation import RELEASE_DRAIN_S
from raygpu.model.labels import ANNOTATION_HEARTBEAT, ANNOTATION_RESERVATION_STATE, LABEL_CLUSTER, LABEL_RESERVATION
from raygpu.testing.controlplane import ADMIN_TOKEN
from raygpu.testing.faultproxy import EndWatch, Fail, Hang, Reset, Rule, start_for
from tests.integration.gang_helpers import CM_PATH, RC_PATH, body_has, no_live_ray_pg, nothing_left, seen_after
from tests.integration.sidecar_fault_helpers import (Env, annotations, intact, live_gang, make_cluster, no_release_decided,
                                                     no_release_written, release_and_check, reserved_pods,
                                                     scale_small_to_one, small_group)
from tests.integration.sidecar_helpers import BRIDGE_WAIT_S, Driver, PodDeletions, Sidecar, _workers
from tests.integration.util import holds_for, wait_for

HEARTBEAT = ANNOTATION_HEARTBEAT.encode()
CM_LIST = r"/api/v1/namespaces/[^/]+/configmaps"


@pytest.fixture
def env(testbed, ns, pool, core, tmp_path, keep_on_failure):
    """On failure, both proxies' logs join the sidecar's and the driver's under tmp_path, and the report names
    each file (a failure here was once never reproduced: the next one must be readable)."""
    with start_for(testbed) as drv, start_for(testbed) as side:
        keep_on_failure("driver-proxy.log", drv.write_log)
        keep_on_failure("sidecar-proxy.log", side.write_log)
        yield Env(testbed, ns, pool, core, tmp_path, drv, side,
                  str(drv.kubeconfig_for_token(ADMIN_TOKEN, tmp_path / "driver.kubeconfig")),
                  str(side.kubeconfig_for_token(ADMIN_TOKEN, tmp_path / "sidecar.kubeconfig")))
    if ray.is_initialized():
        ray.shutdown()


# ------------------------------------------------------------------------ a
OUTAGE_S = 25.0  # every heartbeat PATCH fails this long: two beats and their retries
# The GC's grace is its heartbeat timeout on its own clock, counted from when it saw the last beat change. Beats
# come every HEARTBEAT_EVERY_S; after the outage the watchdog's next try is at most WATCH_BACKOFF_MAX_S away.
# So the quiet time the sidecar sees is about OUTAGE_S + WATCH_BACKOFF_MAX_S: a timeout a few seconds above it
# tests that edge (a watchdog that waited a whole period after a failure would lose the gang here).
# The sidecar sees a beat only when its watch delivers it and its next cycle (1 s) runs: on this 2-core box under
# load that lags by up to several seconds at each end of the quiet time, hence the 10 s above the driver's side.
BEAT_TIMEOUT_S = OUTAGE_S + WATCH_BACKOFF_MAX_S + 10


def test_heartbeats_failing_for_longer_than_a_period_do_not_release_a_live_gang(env, kube):
    make_cluster(env, kube)
    gang = live_gang(env, "beat")
    deletions = PodDeletions(env.core, env.ns)
    side = Sidecar(env.testbed, env.ns, "c", ray.get_runtime_context().gcs_address, env.tmp / "sidecar.log",
                   "--heartbeat-timeout-s", f"{BEAT_TIMEOUT_S:g}", kubeconfig=Path(env.side_kc))
    try:
        side.wait("the sidecar judges the gang live", lambda: side.records("gc-decision", reservation=gang.name), 30)
        is_beat = lambda s: s.verb == "PATCH" and HEARTBEAT in s.body  # noqa: E731
        seen_after(env.drv, len(env.drv.log), lambda s: is_beat(s) and s.status == 200, HEARTBEAT_EVERY_S + 5)
        t_last = time.monotonic()  # a beat just landed: the outage starts now
        rule = env.drv.add(Rule(verb="PATCH", path=CM_PATH, action=Fail(503), body_contains=ANNOTATION_HEARTBEAT))
        holds_for("the gang intact while every heartbeat fails", lambda: intact(env, gang), OUTAGE_S, interval_s=1)
        env.drv.clear()
        failed = [s for s in env.drv.log if s.rule is rule and s.done]
        assert len(failed) >= 2 and all(s.status == 503 and s.upstream_status is None for s in failed), failed
        seen_after(env.drv, len(env.drv.log), lambda s: is_beat(s) and s.status == 200, WATCH_BACKOFF_MAX_S + 5)
        quiet_s = time.monotonic() - t_last
        assert 2 * HEARTBEAT_EVERY_S < quiet_s < BEAT_TIMEOUT_S, quiet_s
        # past the moment a GC that lost the beat would have released it, plus a few cycles
        holds_for("the gang intact past the heartbeat timeout", lambda: intact(env, gang),
                  max(3.0, t_last + BEAT_TIMEOUT_S + 3 - time.monotonic()), interval_s=1)
        no_release_written(side, gang)
        release_and_check(env, gang, deletions)
    finally:
        side.stop()
        deletions.stop()


# ------------------------------------------------------------------------ b
def test_the_sidecars_failed_lost_and_hung_patches_never_touch_the_gang(env, kube):
    make_cluster(env, kube, small_group(env), nodes={"t1": "t4x1"})
    gang = live_gang(env, "patched")
    small = _workers(env.core, env.ns, "small")
    deletions = PodDeletions(env.core, env.ns)
    mine = body_has(b'"small"')  # the sidecar's scale-down of the idle 1-GPU worker (its group-name test)
    hang = env.side.add(Rule(verb="PATCH", path=RC_PATH, action=Hang(), times=1, when=mine))
    fail = env.side.add(Rule(verb="PATCH", path=RC_PATH, action=Fail(500), times=1, when=mine))
    lost = env.side.add(Rule(verb="PATCH", path=RC_PATH, action=Fail(500, forward=True), times=1, when=mine))
    side = Sidecar(env.testbed, env.ns, "c", ray.get_runtime_context().gcs_address, env.tmp / "sidecar.log",
                   kubeconfig=Path(env.side_kc))
    try:
        wait_for("the sidecar's scale-down hangs", lambda: any(s.rule is hang for s in env.side.log), 60)
        n = len(env.side.log)
        holds_for("no other write while the patch hangs", lambda: not any(s.verb == "PATCH" for s in env.side.log[n:])
                  and _workers(env.core, env.ns, "small") == small and reserved_pods(env) == gang.pods, 4)
        env.side.release()  # the connection closes without an answer
        assert env.side.wait_seen(lambda s: s.rule is hang, 10).status is None
        assert env.side.wait_seen(lambda s: s.rule is fail, 30).upstream_status is None
        got = env.side.wait_seen(lambda s: s.rule is lost, 30)
        assert (got.status, got.upstream_status) == (500, 200), got  # it landed; the sidecar heard it failed
        wait_for("the idle worker deleted by the patch whose answer was lost",
                 lambda: _workers(env.core, env.ns, "small") == [], 60)
        # The proxy forwards the lost patch, then answers 500: KubeRay may delete the worker before the sidecar
        # has read that answer and logged its third patch, so wait for the line before judging it.
        side.wait("the sidecar logs its third patch", lambda: len(side.records("patch")) >= 3, 30)
        assert [r["status"] for r in side.records("patch")][:3] == ["failed"] * 3, side.records("patch")
        landed = [s for s in env.side.log if s.verb == "PATCH" and s.upstream_status == 200]
        assert len(landed) == 1 and not any(p.encode() in s.body for s in landed for p in gang.pods), landed
        assert intact(env, gang)

        # the faults are spent: the same sidecar still reclaims a new idle worker, with one clean patch
        wait_for("the test scales the small group back to 1 (KubeRay's status writes may move the version)",
                 lambda: scale_small_to_one(env), 30)
        new = wait_for("a new small worker", lambda: [p for p in _workers(env.core, env.ns, "small")
                                                       if p not in small] or None, 60)
        side.wait("the new idle worker reclaimed", lambda: side.records("patch", status="applied"), BRIDGE_WAIT_S)
        wait_for("the new idle worker deleted", lambda: _workers(env.core, env.ns, "small") == [], 60)
        assert deletions.wait_deleted(small + new, 30) == {p: 1 for p in small + new}, deletions.counts
        assert intact(env, gang)
        no_release_decided(side, gang)
        release_and_check(env, gang, deletions)
    finally:
        side.stop()
        deletions.stop()


# ------------------------------------------------------------------------ c
WATCH_BEAT_TIMEOUT_S = 2 * HEARTBEAT_EVERY_S  # two beats: a stale cache releases the gang, a fresh one never
HANG_S = WATCH_BEAT_TIMEOUT_S + HEARTBEAT_EVERY_S + 2  # the ConfigMap watch hangs longer than that timeout


def test_ended_reset_and_hung_watches_never_make_the_sidecar_act_on_a_stale_cache(env, kube):
    """Every watch of the sidecar ends after 2 s, the first three are reset; then its ConfigMap watch hangs
    (no answer) for longer than its heartbeat timeout while the driver keeps beating. The sidecar resumes or
    re-lists, and a heartbeat it could not see through the hung watch never reads as lost."""
    make_cluster(env, kube)
    gang = live_gang(env, "watched")
    deletions = PodDeletions(env.core, env.ns)
    # Every watch is reset until each kind has re-listed: urllib3 retries a reset GET up to 3 times on its own,
    # so only the 4th reset in a row reaches the cache, which then re-lists (a clean end only re-watches).
    reset = env.side.add(Rule(action=Reset(), verb="GET", watch=True))
    side = Sidecar(env.testbed, env.ns, "c", ray.get_runtime_context().gcs_address, env.tmp / "sidecar.log",
                   "--heartbeat-timeout-s", f"{WATCH_BEAT_TIMEOUT_S:g}",
                   "--debug-heartbeat-timeout-floor-s", "0", kubeconfig=Path(env.side_kc))  # two beats, on purpose
    try:
        def lists() -> dict[str, int]:
            out: dict[str, int] = {}
            for s in env.side.log:
                if (s.verb == "GET" and "watch=" not in s.query and s.done and s.status == 200
                        and s.path.endswith(("/pods", "/rayclusters", "/configmaps"))):
                    out[s.path] = out.get(s.path, 0) + 1
            return out
        try:
            wait_for("each of the three kinds listed, its watches reset, and re-listed",
                     lambda: len(lists()) == 3 and min(lists().values()) >= 2, 90)
        except Exception as e:
            summary = [(s.verb, s.path.rsplit("/", 1)[-1], s.query[:60], s.action[:20], s.status) for s in env.side.log]
            raise AssertionError(f"{e}\nlists: {lists()}\nproxy log (last 40 of {len(summary)}): {summary[-40:]}\n"
                                 f"sidecar: {side.lines[-15:]}") from None
        assert all(s.status is None for s in env.side.log if s.rule is reset)
        env.side.clear()
        n = len(env.side.log)
        env.side.add(Rule(action=EndWatch(after_s=2)))
        wait_for("watches ended cleanly and resumed", lambda: sum(
            1 for s in env.side.log[n:] if s.done and s.events is not None and s.status == 200) >= 6, 60)
        side.wait("the sidecar plans again from a synced cache",
                  lambda: side.records("gc-decision", reservation=gang.name), 30)

        env.side.clear()
        hang = env.side.add(Rule(action=Hang(), verb="GET", path=CM_LIST, watch=True, times=1))
        env.side.add(Rule(action=EndWatch(after_s=2)))
        wait_for("the sidecar's ConfigMap watch hangs", lambda: any(s.rule is hang for s in env.side.log), 30)
        beat_before = annotations(env, gang.name).get(ANNOTATION_HEARTBEAT)
        holds_for("the gang intact while the sidecar cannot see its heartbeats", lambda: intact(env, gang), HANG_S,
                  interval_s=1)
        assert annotations(env, gang.name).get(ANNOTATION_HEARTBEAT) != beat_before, "no heartbeat during the hang"
        n = len(env.side.log)
        env.side.release()
        # the hung watch's connection closes with no answer: urllib3 retries the GET at once, so the watch
        # resumes from its last resourceVersion (the API server replays what it missed) instead of re-listing
        seen_after(env.side, n, lambda s: s.verb == "GET" and s.path.endswith("/configmaps") and s.status == 200, 30)
        holds_for("the gang intact after the watch resumed", lambda: intact(env, gang), 3, interval_s=1)
        # the stale cache may well judge the heartbeat lost (that is the hazard): the live read must stop it
        no_release_written(side, gang)
        release_and_check(env, gang, deletions)
    finally:
        side.stop()
        deletions.stop()


# ------------------------------------------------------------------------ d
def test_release_writes_that_fail_once_leave_nothing_behind(env, kube):
    """503 once on the scale-to-zero patch and once on the state ConfigMap's delete of remove_placement_group:
    each remove() raises at once, claiming nothing; the sidecar's GC (the Ray PG is gone) finishes the release."""
    make_cluster(env, kube)
    gang = live_gang(env, "unreleased")
    deletions = PodDeletions(env.core, env.ns)
    group = gang.pg.plan.reservation_group
    side = Sidecar(env.testbed, env.ns, "c", ray.get_runtime_context().gcs_address, env.tmp / "sidecar.log",
                   kubeconfig=Path(env.side_kc))
    scale = env.drv.add(Rule(verb="PATCH", path=RC_PATH, action=Fail(503), times=1,
                             when=body_has(group.encode(), b"workersToDelete")))
    delete = env.drv.add(Rule(verb="DELETE", path=CM_PATH, action=Fail(503), times=1, when=lambda r: r.path.endswith(
        "/" + gang.name)))
    try:
        side.wait("the sidecar judges the gang live", lambda: side.records("gc-decision", reservation=gang.name), 30)
        assert intact(env, gang) and not deletions.counts
        t0 = time.monotonic()
        with pytest.raises(RayGpuError, match="503"):
            raygpu.remove_placement_group(gang.pg)
        assert time.monotonic() - t0 < 2 * WATCHDOG_JOIN_S + REQUEST_TIMEOUT[1], "remove() outlived its bound"
        assert env.drv.wait_seen(lambda s: s.rule is scale, 5).status == 503
        t0 = time.monotonic()
        with pytest.raises(RayGpuError, match="503"):
            raygpu.remove_placement_group(gang.pg)  # again, as documented: it gets as far as the delete
        assert time.monotonic() - t0 < 2 * WATCHDOG_JOIN_S + RELEASE_DRAIN_S + 2 * REQUEST_TIMEOUT[1]
        assert env.drv.wait_seen(lambda s: s.rule is delete, 5).upstream_status is None
        wait_for("the sidecar's GC finishes the release", lambda: nothing_left(env.kube, env.ns, "c"), 90)
        gc = {r["reason"] for r in side.records("gc-decision", reservation=gang.name, action="release")}
        assert gc == {"PlacementGroupGone"}, gc
        assert any(s.verb == "DELETE" and s.path.endswith("/" + gang.name) and s.upstream_status == 200
                   for s in env.side.log), "the state ConfigMap was not deleted by the sidecar"
        raygpu.remove_placement_group(gang.pg)  # now a clean no-op: nothing left to release
        assert no_live_ray_pg("unreleased")
    finally:
        side.stop()
        deletions.stop()


# ------------------------------------------------------------------------ e
DRIVER = textwrap.dedent("""
    import json, sys, ray, raygpu
    address, ns, kubeconfig = sys.argv[1], NS, KUBECONFIG
    ray.init(address=address, logging_level="ERROR", log_to_driver=False)
    pg = raygpu.placement_group([{"GPU": 8}] * 2, strategy="STRICT_SPREAD", cluster="c", namespace=ns,
                                backend="none", timeout_s=150, name="dead", kubeconfig=kubeconfig)
    print(json.dumps({"gang": pg.plan.gang_name}), flush=True)
    print(json.dumps({"ready": pg.wait(170)}), flush=True)
    sys.stdin.read()  # hold the gang until killed
""")
READ_FAULT_S = 15.0


def test_a_killed_drivers_gang_is_released_after_read_faults_and_nothing_else_is_touched(env, kube):
    """kill -9 the driver of a ready gang while every read of the sidecar fails (503 on each GET, watches ended
    every 2 s so that they are re-made into the fault): nothing is released meanwhile; once the reads heal the GC
    releases the dead driver's reservation and leaves a user's rg-user group (with its pod) and ConfigMaps named
    and labelled like ours alone."""
    addr = make_cluster(env, kube, small_group(env, "rg-user", min_replicas=1), nodes={"t1": "t4x1"},
                        connect=False)
    user_pod = _workers(env.core, env.ns, "rg-user")
    uid = env.kube.get_raycluster(env.ns, "c").uid
    env.core.create_namespaced_config_map(env.ns, {"metadata": {"name": "c-rg-user"}, "data": {"mine": "yes"}})
    env.core.create_namespaced_config_map(env.ns, {"metadata": {
        "name": "look-alike", "labels": {LABEL_RESERVATION: "rg-user", LABEL_CLUSTER: "c"},
        "annotations": {ANNOTATION_RESERVATION_STATE: "released"}}, "data": {"mine": "yes"}})
    script = DRIVER.replace("NS", repr(env.ns)).replace("KUBECONFIG", repr(str(env.testbed.kubeconfig)))
    driver = Driver(script, addr, env.tmp / "driver.log")
    side = None
    try:
        gang_name = driver.next("gang", 120)
        assert driver.next("ready", 240) is True
        pods = reserved_pods(env)
        assert len(pods) == 2, pods
        deletions = PodDeletions(env.core, env.ns)
        env.side.add(Rule(action=EndWatch(after_s=2)))
        side = Sidecar(env.testbed, env.ns, "c", addr, env.tmp / "sidecar.log", kubeconfig=Path(env.side_kc))
        side.wait("the sidecar judges the gang live", lambda: side.records("gc-decision", reservation=gang_name), 60)
        env.side.clear()
        reads = env.side.add(Rule(action=Fail(503), verb="GET"))
        env.side.add(Rule(action=EndWatch(after_s=2)))
        os.kill(driver.proc.pid, signal.SIGKILL)
        assert driver.proc.wait(10) == -signal.SIGKILL
        assert not deletions.counts, "a reserved pod went before the driver died"
        holds_for("nothing released while the sidecar cannot read", lambda: reserved_pods(env) == pods
                  and annotations(env, gang_name), READ_FAULT_S, interval_s=1)
        failed = [s for s in env.side.log if s.rule is reads and s.done]
        assert failed and all(s.status == 503 and s.upstream_status is None for s in failed)
        env.side.clear()
        wait_for("the dead driver's reservation released", lambda: nothing_left(env.kube, env.ns, "c",
                                                                                keep=["rg-user", "look-alike"]), 120)
        reasons = {r["reason"] for r in side.records("gc-decision", reservation=gang_name, action="release")}
        assert reasons and reasons <= {"PlacementGroupGone", "OwnerJobDead"}, reasons
        assert _workers(env.core, env.ns, "rg-user") == user_pod and not deletions.counts.get(user_pod[0])
        group = env.kube.get_raycluster(env.ns, "c").group("rg-user")
        assert group is not None and group.replicas == 1
        assert {c.metadata.name for c in env.core.list_namespaced_config_map(env.ns).items} >= {"c-rg-user",
                                                                                               "look-alike"}
        assert uid == env.kube.get_raycluster(env.ns, "c").uid
        assert {p: 1 for p in pods} == deletions.wait_deleted(pods, 30), deletions.counts
        deletions.stop()
    finally:
        if side:
            side.stop()
        driver.stop()
