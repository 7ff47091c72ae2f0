"""The watch cache (``raygpu.adapters.kube_watch``): LIST once, WATCH, resync on 410 Gone, assume our own writes."""

from __future__ import annotations

import json
import threading
import time


from raygpu.model.raycluster import RayClusterView
from raygpu.testing.builders.recorded import NS, RECORDED, RV0




# ------------------------------------------------------------ the watch cache
class FakeList:
    """A kubernetes-client list method: LISTs answer ``lists`` in turn; WATCHes play ``watches`` in turn.

    A watch step is "gone" (HTTP 410), a list of (type, object) events, or "block" (until released).
    """

    def __init__(self, lists: list[tuple[str, list[dict]]], watches: list) -> None:
        self.lists, self.watches, self.calls = list(lists), list(watches), []
        self.release = threading.Event()

    def __call__(self, *args, watch=None, resource_version=None, _preload_content=True, **kw):
        from types import SimpleNamespace
        self.calls.append(("watch" if watch else "list", resource_version))
        if not watch:
            rv, items = self.lists.pop(0) if len(self.lists) > 1 else self.lists[0]
            return SimpleNamespace(data=json.dumps({"metadata": {"resourceVersion": rv}, "items": items}))
        step = self.watches.pop(0) if self.watches else "block"
        if step == "gone":
            from kubernetes.client import ApiException
            raise ApiException(status=410, reason="Gone: too old resource version")
        if step == "block":
            self.release.wait(5)
            step = []
        body = "".join(json.dumps({"type": t, "object": o}) + "\n" for t, o in step).encode()
        return SimpleNamespace(stream=lambda amt=None, decode_content=False: iter([body] if body else []),
                               close=lambda: None, release_conn=lambda: None, status=200)


def _pod_obj(name: str, rv: str) -> dict:
    return {"metadata": {"name": name, "namespace": NS, "resourceVersion": rv,
                         "labels": {"ray.io/cluster": "rc", "ray.io/group": "gpu", "ray.io/node-type": "worker"}},
            "spec": {"containers": [{"name": "ray-worker"}]}, "status": {"phase": "Running"}}


def test_watch_cache_lists_once_watches_and_resyncs_on_410_gone():
    from kubernetes.client import ApiClient, Configuration

    from raygpu.adapters.kube_watch import ClusterCache
    cache = ClusterCache(ApiClient(Configuration()), NS, "rc")
    pods = FakeList([("10", [_pod_obj("a", "9")]), ("20", [_pod_obj("a", "9"), _pod_obj("b", "19")])],
                    ["gone", [("ADDED", _pod_obj("c", "21")), ("DELETED", _pod_obj("a", "22"))]])
    rc = FakeList([("5", [RECORDED])], [])
    cms = FakeList([("7", [])], [])
    cache.kinds["pods"].list_fn, cache.kinds["raycluster"].list_fn, cache.kinds["reservations"].list_fn = pods, rc, cms
    cache.start()
    try:
        assert cache.wait_synced(5)
        deadline = time.monotonic() + 5
        while ([p.name for p in cache.view().pods] != ["b", "c"] or len(pods.calls) < 5) \
                and time.monotonic() < deadline:
            time.sleep(0.02)
        view = cache.view()
        assert [p.name for p in view.pods] == ["b", "c"] and view.synced
        assert view.cluster.resource_version == str(RV0)
        # LIST at start, WATCH from its version, 410 -> LIST again, WATCH from the new version, go on from the last event
        assert pods.calls[:5] == [("list", None), ("watch", "10"), ("list", None), ("watch", "20"), ("watch", "22")]
        assert cache.list_calls() == {"raycluster": 1, "pods": 2, "reservations": 1}
    finally:
        cache.stop()
        for f in (pods, rc, cms):
            f.release.set()


def test_cache_serves_our_own_write_until_the_watch_catches_up():
    from kubernetes.client import ApiClient, Configuration

    from raygpu.adapters.kube_watch import ClusterCache
    cache = ClusterCache(ApiClient(Configuration()), NS, "rc")
    kind = cache.kinds["raycluster"]
    kind.items["rc"] = RayClusterView.from_k8s(RECORDED)
    at = lambda rv: {**RECORDED, "metadata": {**RECORDED["metadata"], "resourceVersion": str(rv)}}  # noqa: E731
    cache.assume_cluster(RayClusterView.from_k8s(at(RV0 + 1)), str(RV0))
    assert cache.view().cluster.resource_version == str(RV0 + 1)
    assert cache.wait_cluster_change(str(RV0), 0.1)
    kind.items["rc"] = RayClusterView.from_k8s(at(RV0 + 2))
    assert cache.view().cluster.resource_version == str(RV0 + 2)  # someone wrote after us: trust the watch


def test_one_unparsable_pod_neither_stops_the_sync_nor_hides_the_others():
    """A pod whose start command says --num-gpus=$(N) and one that cannot be parsed at all: the pod kind
    still syncs, every other pod is there, and each problem is reported once, naming the pod."""
    from kubernetes.client import ApiClient, Configuration

    from raygpu.adapters.kube_watch import ClusterCache
    reported: list[str] = []
    cache = ClusterCache(ApiClient(Configuration()), NS, "rc", on_problem=reported.append)
    odd = _pod_obj("odd", "8")
    odd["spec"]["containers"][0]["env"] = [{"name": "KUBERAY_GEN_RAY_START_CMD",
                                           "value": "ray start --num-gpus=$(N) --block"}]
    broken = {**_pod_obj("broken", "9"), "metadata": {**_pod_obj("broken", "9")["metadata"],
                                                      "creationTimestamp": "not a time"}}
    pods = FakeList([("10", [_pod_obj("a", "7"), odd, broken])], [[("MODIFIED", odd)]])
    rc, cms = FakeList([("5", [RECORDED])], []), FakeList([("7", [])], [])
    cache.kinds["pods"].list_fn, cache.kinds["raycluster"].list_fn, cache.kinds["reservations"].list_fn = pods, rc, cms
    cache.start()
    try:
        assert cache.wait_synced(5)
        deadline = time.monotonic() + 5
        while len(pods.calls) < 3 and time.monotonic() < deadline:  # the MODIFIED event was read
            time.sleep(0.02)
        view = cache.view()
        assert view.synced and [p.name for p in view.pods] == ["a", "odd"]
        assert {p.name: p.ray_start_num_gpus for p in view.pods} == {"a": None, "odd": None}
        assert view.skipped == (f"pods broken: ValueError: Invalid isoformat string: 'not a time'",)
        assert len(reported) == 2, reported  # the MODIFIED event repeats the problem: still reported once
        assert any(m.startswith(f"Pod {NS}/odd: env.KUBERAY_GEN_RAY_START_CMD --num-gpus='$(N)'") for m in reported)
        assert any(m.startswith(f"pods {NS}/broken left out") for m in reported)
    finally:
        cache.stop()
        for f in (pods, rc, cms):
            f.release.set()
