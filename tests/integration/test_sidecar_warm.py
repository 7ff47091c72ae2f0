"""Issue 12 item 4: ``raygpu.io/idle-timeout: auto`` on the real testbed (KubeRay, kwok nodes, real Ray).

Two RayClusters side by side, the same burst (one placement group of one 1-GPU
worker, held, then removed): ``auto``, started from a learned history (as after a
sidecar restart: the policy needs 30 one-minute rises before it trusts a
quantile), keeps its idle worker warm with reason ``KeepWarm``; ``10s`` deletes
its worker. The state ConfigMap then holds the history plus what this burst
taught: the measured start-up of the real pod and the demand it caused.
Decisions and state are asserted, never a speed.
"""

from __future__ import annotations

import json
import textwrap
import time

from raygpu.model.labels import WARM_STATE_KEY, warm_state_name
from raygpu.model.warm import GroupHistory, decode_history
from raygpu.testing import manifests as m
from raygpu.testing.builders.warm import warm_state_configmap
from raygpu.testing.kube import apply
from tests.integration.sidecar_helpers import BRIDGE_WAIT_S, Driver, Sidecar, _events, _merge_patch
from tests.integration.util import holds_for, pods, ray_address

ONE_GPU = {"nvidia.com/gpu": 1}
SEED_STARTUP_S = 20.0
BURST = textwrap.dedent("""
    import json, sys, ray
    from ray.util.placement_group import placement_group, remove_placement_group
    ray.init(address=sys.argv[1], logging_level="ERROR", log_to_driver=False)
    say = lambda **kw: print(json.dumps(kw), flush=True)
    pg = placement_group([{"GPU": 1}])
    say(created=True)
    ray.get(pg.ready(), timeout=240)
    say(ready=True)
    sys.stdin.readline()  # hold it until the test says
    remove_placement_group(pg)
    say(removed=True)
    sys.stdin.read()
""")


def _workers(core, ns: str, cluster: str) -> list[str]:
    return sorted(p["metadata"]["name"] for p in pods(core, ns, f"ray.io/cluster={cluster},ray.io/node-type=worker")
                  if not p["metadata"].get("deletionTimestamp"))


def _state(core, ns: str, cluster: str):
    cm = core.read_namespaced_config_map(warm_state_name(cluster), ns)
    return decode_history(cm.data[WARM_STATE_KEY]).groups["gpu"]


def test_auto_keeps_a_learned_warm_worker_that_a_short_timeout_deletes(testbed, ns, pool, kube, core, tmp_path):
    pool.add({"cpu": "cpu16", "t1": "t4x1", "t2": "t4x1"})
    group = lambda: m.worker_group("gpu", replicas=0, max_replicas=1, cpu="1", memory="4Gi",  # noqa: E731
                                   gpus=ONE_GPU, pool=pool.name)
    apply(kube, m.raycluster("auto", ns, [group()], pool=pool.name, annotations={
        "raygpu.io/reclaim": "on", "raygpu.io/idle-timeout": "auto"}))
    apply(kube, m.raycluster("short", ns, [group()], pool=pool.name, annotations={
        "raygpu.io/reclaim": "on", "raygpu.io/idle-timeout": "10s"}))
    # a learned history: one worker needed every third minute for an hour, pods starting in 20 s
    uid = kube.resources.get(api_version="ray.io/v1", kind="RayCluster").get(name="auto", namespace=ns).metadata.uid
    t_seed = (int(time.time() // 60) - 2) * 60.0
    seeded = tuple((t_seed - (59 - i) * 60.0, [0, 0, 1][i % 3]) for i in range(60))
    core.create_namespaced_config_map(ns, warm_state_configmap(ns, "auto", uid, {
        "gpu": GroupHistory(demand=seeded, startup_s=(SEED_STARTUP_S,))}))

    addr = {c: ray_address(testbed, ns, c, timeout_s=BRIDGE_WAIT_S) for c in ("auto", "short")}
    sides = {c: Sidecar(testbed, ns, c, addr[c], tmp_path / f"{c}-sidecar.log") for c in addr}
    drivers = {}
    try:
        auto, short = sides["auto"], sides["short"]
        warm = auto.wait("auto's target from the stored history", lambda: [
            r for r in auto.records("warm", group="gpu") if r["warm"] is not None], 60)[0]
        assert warm["warm"] == 1 and warm["window_s"] == 60, warm  # a 20 s start-up is measured over one step
        assert "keep 1 warm = q0.8" in warm["reason"] and "start-up 20s" in warm["reason"], warm
        assert not short.records("warm")  # a fixed timeout learns nothing

        # the burst: one PG per cluster, the worker it needs added as the autoscaler would
        for c in addr:
            drivers[c] = Driver(BURST, addr[c], tmp_path / f"{c}-driver.log")
            assert drivers[c].next("created", 60)
            _merge_patch(kube, ns, {"spec": {"workerGroupSpecs": [{**group(), "replicas": 1}]}}, name=c)
        for c in addr:
            assert drivers[c].next("ready", BRIDGE_WAIT_S)
        kept = _workers(core, ns, "auto")
        assert len(kept) == 1 and len(_workers(core, ns, "short")) == 1
        for d in drivers.values():
            d.proc.stdin.write("\n")
            d.proc.stdin.flush()
        for d in drivers.values():
            assert d.next("removed", 60)

        # 10s deletes its idle worker; auto keeps its one, as the learned target says
        short.wait("the 10s cluster's idle worker deleted", lambda: _workers(core, ns, "short") == [], 90)
        assert {r["reason"] for r in short.records("decision", action="delete")} == {"Idle"}
        holds_for("auto's worker stays warm well past 10 s idle", lambda: _workers(core, ns, "auto") == kept, 20)
        decisions = auto.records("decision", pod=kept[0])
        assert decisions and decisions[-1]["action"] == "keep" and decisions[-1]["reason"] == "KeepWarm", decisions
        assert not auto.records("decision", action="delete"), auto.records("decision", action="delete")
        assert any("keep 1 warm" in e.message for e in _events(core, ns, "WarmTarget", name="auto"))

        # the state ConfigMap: the seeded history, then what this burst taught
        def learned():
            h = _state(core, ns, "auto")
            return h if len(h.startup_s) == 2 and any(t > t_seed and n >= 1 for t, n in h.demand) else None
        h = auto.wait("the burst's start-up and demand written to the state ConfigMap", learned, 60)
        assert h.demand[:len(seeded)] == seeded
        assert h.startup_s[0] == SEED_STARTUP_S and 0 < h.startup_s[1] < BRIDGE_WAIT_S, h.startup_s
        cm = core.read_namespaced_config_map(warm_state_name("auto"), ns)
        assert [(r.kind, r.name, r.uid) for r in cm.metadata.owner_references] == [("RayCluster", "auto", uid)]
        assert json.loads(cm.data[WARM_STATE_KEY])["version"] == 1
        assert warm_state_name("short") not in {c.metadata.name for c in core.list_namespaced_config_map(ns).items}
    finally:
        for d in drivers.values():
            d.stop()
        for s in sides.values():
            s.stop()
