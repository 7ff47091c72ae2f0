"""Helpers of tests/integration/test_faults_sidecar.py: the two-proxy environment, a live gang held by Ray
actors, and what every test checks about it."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ray

import raygpu
from raygpu.adapters.kube import KubeAdapter
from raygpu.errors import ConflictError
from raygpu.model.labels import ANNOTATION_RESERVATION_STATE, LABEL_RESERVATION, LABEL_TESTBED_SHAPE
from raygpu.plan.common.patch import raycluster_patch, set_replicas
from raygpu.testing import manifests as m
from raygpu.testing.kube import apply
from tests.integration.gang_helpers import no_live_ray_pg, nothing_left
from tests.integration.sidecar_helpers import ON_5S, BRIDGE_WAIT_S, PodDeletions, Sidecar, _ready
from tests.integration.util import alive_ray_nodes, ray_address, wait_for


@dataclass
class Env:
    testbed: Any
    ns: str
    pool: Any
    core: Any
    tmp: Path
    drv: Any  # the driver's proxy
    side: Any  # the sidecar's proxy
    drv_kc: str
    side_kc: str
    kube: KubeAdapter = field(init=False)  # the test's own view: not through a proxy

    def __post_init__(self) -> None:
        self.kube = KubeAdapter(str(self.testbed.kubeconfig))


@dataclass
class Gang:
    pg: Any
    name: str  # the state ConfigMap
    pods: list[str]
    holders: list
    pids: list[int]


def make_cluster(env: Env, kube, *groups: dict, nodes: dict | None = None, connect: bool = True) -> str:
    """RayCluster 'c' (mode on, idle timeout 5 s): an 8-GPU template group at 0 replicas plus ``groups``, on a
    pool of 2 GPU nodes (+ ``nodes``). Returns the GCS address; ``connect``: ray.init this process to it."""
    env.pool.add({"cpu": "cpu16", "g1": "h100x8", "g2": "h100x8", **(nodes or {})})
    apply(kube, m.raycluster("c", env.ns, [m.worker_group("gpu", replicas=0, pool=env.pool.name), *groups],
                             pool=env.pool.name, annotations=ON_5S))
    n = sum(g["replicas"] for g in groups)
    addr = _ready(env.testbed, env.core, env.ns, "c", n)[0] if n else ray_address(env.testbed, env.ns, "c",
                                                                                  timeout_s=BRIDGE_WAIT_S)
    # the bridge records the head's address when it starts it; its GCS answers a moment later (a ray.init in
    # between once failed with "InvalidAuthToken"): wait until the GCS reports the head alive
    wait_for("the Ray head's GCS answers", lambda: bool(alive_ray_nodes(addr)), BRIDGE_WAIT_S,
             log=env.testbed.logs / "bridge.log")
    if connect:
        ray.init(address=addr, logging_level="ERROR", log_to_driver=False)
    return addr


def small_group(env: Env, name: str = "small", replicas: int = 1, min_replicas: int = 0) -> dict:
    """A 1-GPU worker group pinned to the pool's T4 node (else it may take a GPU of an H100 the gang needs)."""
    g = m.worker_group(name, replicas=replicas, min_replicas=min_replicas, cpu="4", memory="16Gi",
                       gpus={"nvidia.com/gpu": 1}, pool=env.pool.name)
    g["template"]["spec"]["nodeSelector"][LABEL_TESTBED_SHAPE] = "t4x1"
    return g


def reserved_pods(env: Env) -> list[str]:
    return sorted(p.name for p in env.kube.ray_pods(env.ns, "c") if LABEL_RESERVATION in p.labels)


def annotations(env: Env, name: str) -> dict:
    return ((env.kube.get("v1", "ConfigMap", name, env.ns) or {}).get("metadata") or {}).get("annotations") or {}


def live_gang(env: Env, name: str) -> Gang:
    """A ready 2 x 8-GPU gang through the driver's proxy, each bundle held by a Ray actor."""
    pg = raygpu.placement_group([{"GPU": 8}] * 2, strategy="STRICT_SPREAD", cluster="c", namespace=env.ns,
                                backend="none", timeout_s=150, name=name, kubeconfig=env.drv_kc)
    assert pg.wait(170), f"not ready: {pg.state} {pg.error}"
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    @ray.remote(num_gpus=8, num_cpus=0)
    class Holder:
        def pid(self) -> int:
            return os.getpid()
    holders = [Holder.options(scheduling_strategy=PlacementGroupSchedulingStrategy(
        pg.placement_group, placement_group_bundle_index=i)).remote() for i in range(2)]
    pids = ray.get([h.pid.remote() for h in holders], timeout=90)
    pods = reserved_pods(env)
    assert len(pods) == 2, pods
    return Gang(pg, pg.plan.gang_name, pods, holders, pids)


def intact(env: Env, gang: Gang) -> bool:
    """The same reserved pods, the state ConfigMap at ready, the Ray PG CREATED, the same actors answering."""
    table = ray.util.placement_group_table(gang.pg.placement_group)
    return (reserved_pods(env) == gang.pods and annotations(env, gang.name).get(ANNOTATION_RESERVATION_STATE) == "ready"
            and table["state"] == "CREATED" and ray.get([h.pid.remote() for h in gang.holders], timeout=20) == gang.pids)


def release_and_check(env: Env, gang: Gang, deletions: PodDeletions) -> None:
    """No reserved pod was deleted while the gang was ready; remove it; nothing is left."""
    assert not {p: n for p, n in deletions.counts.items() if p in gang.pods}, deletions.counts
    assert not (deletions.created & set(reserved_pods(env)) - set(gang.pods)), "a reserved pod was recreated"
    raygpu.remove_placement_group(gang.pg)
    wait_for("nothing left after the release", lambda: nothing_left(env.kube, env.ns, "c"), 90)
    assert no_live_ray_pg(gang.pg.reservation.request.name)


def scale_small_to_one(env: Env) -> bool:
    """One tested patch setting group ``small`` to 1 replica; False on a conflict (re-read and try again)."""
    view = env.kube.get_raycluster(env.ns, "c")
    try:
        env.kube.patch_raycluster(env.ns, "c", raycluster_patch(view.resource_version,
                                                                set_replicas(view.group_index("small"), 1, "small")))
    except ConflictError:
        return False
    return True


def no_release_written(side: Sidecar, gang: Gang) -> None:
    """Nothing of the gang was released; a release its (lagging) cache suggested was stopped by the live read,
    which found the heartbeat moved (docs/reliability.md: the live read before a HeartbeatLost release)."""
    decided = side.records("gc-decision", reservation=gang.name, action="release")
    deferred = side.records("release-deferred", reservation=gang.name)
    assert {r["reason"] for r in decided} <= {"HeartbeatLost"}, decided
    assert len(deferred) >= len(decided) and all("heartbeat moved" in r["why"] for r in deferred), deferred
    assert not side.records("released") and not side.records("draining") and not side.records("release-failed")


def no_release_decided(side: Sidecar, gang: Gang) -> None:
    verdicts = {(r["action"], r["reason"]) for r in side.records("gc-decision", reservation=gang.name)}
    assert verdicts == {("keep", "Live")}, verdicts
    assert not side.records("released") and not side.records("draining") and not side.records("release-failed")
