"""Small random reclaimer worlds, drawn from any source of integers.

``random_world(pick)`` builds a :class:`~raygpu.testing.builders.reclaim.World`
and the ``ReclaimPolicy`` arguments to plan it with, from ``pick(lo, hi)`` (an
integer in ``[lo, hi]``). Hypothesis drives it in the property tests
(``pick = lambda lo, hi: draw(st.integers(lo, hi))``, so it shrinks), a seeded
``random.Random(seed).randint`` in the regression tables. Worlds stay small
(at most 5 workers, 3 placement groups of up to 4 bundles) so that an
exhaustive placement check is cheap, and they cover what the reclaimer must
get right: label selectors (``v``, ``!v``, ``in(..)``), every PG strategy,
rescheduling PGs with placed bundles, groups at ``maxReplicas`` or with a
minimum, busy workers with free GPUs, workers already listed or deleting,
reservation members, young pods, Ray nodes whose pod is gone.
"""

from __future__ import annotations

from typing import Callable

from raygpu.testing.builders.reclaim import World, world

Pick = Callable[[int, int], int]
STRATEGIES = ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD")
GPUS = (1, 2, 4, 8)
SELECTORS = ({}, {}, {"zone": "a"}, {"zone": "b"}, {"zone": "!a"}, {"zone": "in(a,b)"}, {"zone": "!in(a,c)"})
ZONES = (None, "a", "b", "c")
IDLE = (None, None, 300.0, 900.0, 900.0, 2000.0)  # None: busy
STATES = ("PENDING", "PENDING", "PENDING", "RESCHEDULING", "CREATED", "REMOVED")


def _bundles(pick, n: int) -> list[dict[str, float]]:
    """``n`` random bundles: GPUs of a common size, a CPU demand one time in four."""
    bundles = []
    for _ in range(n):
        b = {"GPU": float(_one(pick, GPUS))}
        if pick(0, 3) == 0:
            b["CPU"] = float(_one(pick, (1, 4, 8)))
        bundles.append(b)
    return bundles


def _one(pick: Pick, options: tuple):
    return options[pick(0, len(options) - 1)]


def random_world(pick: Pick) -> tuple[World, dict]:
    """A world and the ``ReclaimPolicy`` keyword arguments to plan it with."""
    w = world()
    groups = ["gpu", "small"][: pick(1, 2)]
    n_workers = pick(1, 5)
    members: dict[str, list[str]] = {g: [] for g in groups}
    names = [f"w{i}" for i in range(n_workers)]
    for name in names:
        members[_one(pick, tuple(groups))].append(name)
    hosts: list[str] = []  # workers with a Ray node
    pods: dict[str, list[str]] = {g: [] for g in groups}  # workers with a pod
    for name in names:
        group = next(g for g in groups if name in members[g])
        gpus = _one(pick, GPUS)
        idle_for_s = _one(pick, IDLE)
        free = None if idle_for_s is not None else float(pick(0, int(gpus)))
        zone = _one(pick, ZONES)
        has_pod = pick(0, 11) != 0
        has_ray = pick(0, 11) != 0 or not has_pod
        w.worker(name, group=group, gpus=gpus, idle_for_s=idle_for_s, free_gpus=free,
                 k8s_node=f"k{pick(0, n_workers)}", age_s=60 if pick(0, 11) == 0 else 3600,
                 ray=has_ray, pod=has_pod, deleting=pick(0, 14) == 0, cpus=_one(pick, (8, 16)),
                 labels={"raygpu.io/reservation": "r1"} if pick(0, 14) == 0 else None,
                 ray_labels={"zone": zone} if zone else None)
        hosts += [name] if has_ray else []
        pods[group] += [name] if has_pod else []
    for g in groups:  # after the workers: replicas count the pods, as KubeRay's would
        listed = tuple(n for n in pods[g] if pick(0, 9) == 0)
        replicas = len(pods[g]) - len(listed)
        w.group(g, replicas=replicas, min_replicas=pick(0, 2) if pick(0, 2) == 0 else 0, workers_to_delete=listed,
                max_replicas=replicas + pick(0, 1), gpus=_one(pick, GPUS))
    for _ in range(pick(0, 3)):
        state = _one(pick, STATES)
        n_bundles = pick(1, 4)
        bundles = _bundles(pick, n_bundles)
        selectors = [dict(_one(pick, SELECTORS)) for _ in range(n_bundles)] if pick(0, 1) else None
        on: list[str | None] | None = None
        if state != "PENDING" and hosts:
            on = [hosts[pick(0, len(hosts) - 1)] if pick(0, 1) else None for _ in range(n_bundles)]
            if state == "RESCHEDULING" and all(on):
                on[0] = None
        w.pg(bundles, state=state, strategy=_one(pick, STRATEGIES), selectors=selectors, on=on)
    if pick(0, 29) == 0:
        w.ray_down()
    policy: dict = {}
    if pick(0, 3) == 0:
        policy["live_reservations"] = frozenset()
    return w, policy


def pending_pg_world(nodes: int) -> World:
    """The scale case of issue 10: ``nodes`` Kubernetes nodes with 2 workers of 4 GPUs each (every 3rd idle
    for 700 s), one group that may double, and ``nodes // 10`` pending PACK PGs of 4 x {GPU: 8}."""
    w = world().group("gpu", max_replicas=4 * nodes, gpus=4)
    for i in range(2 * nodes):
        w.worker(f"w{i:05d}", k8s_node=f"k{i // 2:05d}", gpus=4, idle_for_s=700.0 if i % 3 == 0 else None)
    for _ in range(max(1, nodes // 10)):
        w.pg_pending([{"GPU": 8.0}] * 4)
    return w


def competing_world(pick: Pick) -> tuple[World, dict]:
    """A world where 2-4 pending or rescheduling PGs compete for the same few workers, most of them idle
    candidates: 2-6 workers (zones, some busy with free GPUs, some idle too briefly), PGs of 1-3 bundles with
    every strategy and selectors; groups at ``maxReplicas`` mostly, so that only the workers there can host
    them. For the joint placement property (tests/unit/test_reclaim_properties_joint.py)."""
    w = world()
    groups = ["gpu", "small"][: pick(1, 2)]
    names = [f"w{i}" for i in range(pick(2, 6))]
    hosts: list[str] = []
    members = {g: 0 for g in groups}
    for name in names:
        group = _one(pick, tuple(groups))
        members[group] += 1
        gpus = _one(pick, GPUS)
        idle_for_s = _one(pick, (None, 300.0, 900.0, 900.0, 900.0, 2000.0))
        free = None if idle_for_s is not None else float(pick(0, int(gpus)))
        zone = _one(pick, ZONES)
        w.worker(name, group=group, gpus=gpus, idle_for_s=idle_for_s, free_gpus=free,
                 k8s_node=f"k{pick(0, len(names))}", cpus=_one(pick, (8, 16)), ray_labels={"zone": zone} if zone else None)
        hosts.append(name)
    for g in groups:
        w.group(g, min_replicas=1 if pick(0, 5) == 0 else 0, gpus=_one(pick, GPUS),
                max_replicas=members[g] + (0 if pick(0, 3) else 1))  # mostly at maxReplicas: no growth
    for _ in range(pick(2, 4)):
        n_bundles = pick(1, 3)
        bundles = _bundles(pick, n_bundles)
        selectors = [dict(_one(pick, SELECTORS)) for _ in range(n_bundles)] if pick(0, 2) == 0 else None
        state, on = "PENDING", None
        if n_bundles > 1 and pick(0, 4) == 0:
            state = "RESCHEDULING"
            on = [hosts[pick(0, len(hosts) - 1)] if pick(0, 1) else None for _ in range(n_bundles)]
            on[0] = None
        w.pg(bundles, state=state, strategy=_one(pick, STRATEGIES), selectors=selectors, on=on)
    return w, {}
