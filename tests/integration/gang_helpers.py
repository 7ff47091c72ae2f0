"""What a reservation could leave behind, and the fault proxy's paths and predicates (test_gang, test_faults,
test_faults_sidecar)."""

from __future__ import annotations

import time
from typing import Callable, Iterable

from raygpu.adapters.kube import KubeAdapter
from raygpu.testing.leftovers import reservation_leftovers as leftovers

CM_PATH = r"/api/v1/namespaces/[^/]+/configmaps(/[^/]+)?"  # a ConfigMap, or the collection (LIST, WATCH, POST)
RC_PATH = r"/apis/ray.io/v1/namespaces/[^/]+/rayclusters/[^/]+"  # one RayCluster


def nothing_left(kube: KubeAdapter, ns: str, cluster: str, keep: Iterable[str] = ()) -> dict | None:
    """None while something is left (for wait_for), else the empty leftovers."""
    left = leftovers(kube, ns, cluster, keep)
    return left if not any(left.values()) else None


def no_live_ray_pg(name: str) -> bool:
    """No Ray placement group named ``name`` but REMOVED ones (needs a connected Ray driver)."""
    import ray
    return all(t["state"] == "REMOVED" for t in ray.util.placement_group_table().values() if t["name"] == name)


def body_has(*parts: bytes) -> Callable:
    """A faultproxy ``when`` predicate: the request body contains every one of ``parts``."""
    return lambda req: all(p in req.body for p in parts)


def seen_after(proxy, start: int, pred: Callable, timeout_s: float) -> tuple[int, object]:
    """(index, entry) of the first finished entry of ``proxy.log[start:]`` for which ``pred`` holds; polls until
    ``timeout_s``, then raises AssertionError quoting the entries since ``start``."""
    deadline = time.monotonic() + timeout_s
    while True:
        log = proxy.log
        for i in range(start, len(log)):
            if log[i].done and pred(log[i]):
                return i, log[i]
        if time.monotonic() > deadline:
            raise AssertionError(f"faultproxy: no such request within {timeout_s}s after entry {start}: "
                                 f"{[(s.verb, s.path, s.action, s.status) for s in log[start:]][-40:]}")
        time.sleep(0.1)
