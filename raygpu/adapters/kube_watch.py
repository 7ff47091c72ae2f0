"""A small watch-backed cache of one RayCluster, its pods and its reservation ConfigMaps.

Each kind is kept by one daemon thread: LIST once (take the list's
resourceVersion), then WATCH from it with ``kubernetes.watch.Watch`` (raw
dicts, no model deserialization), re-watching when the server closes the
stream. A ``410 Gone`` (the version fell out of the watch cache) or any other
failure drops the kind to "not synced" and re-LISTs, with a bounded back-off.
So the sidecar issues a LIST only at start and on resync, never per cycle.

Promises:

* ``view()`` returns frozen models (``RayClusterView``, ``K8sPodView``,
  ``ReservationRecord``), never raw dicts, and says whether every kind is
  synced; a cycle must not plan from an unsynced view.
* Objects are replaced whole per event; what ``view()`` returns is a
  consistent copy of each kind (kinds are not consistent with each other:
  the planner tolerates that, and the RayCluster patch tests its version).
* ``assume_cluster`` records a RayCluster this process just wrote, so the next
  cycle plans from it before the watch delivers it ("assume then apply").
* One object that does not parse never stops a kind from syncing: a bad value
  takes its safe default (the view's ``problems``), an object that cannot be
  parsed at all is left out (and a stale copy of it dropped). Each distinct
  problem goes once to ``on_problem(message)`` (default: a logged warning); the
  sidecar turns it into a Warning Event on the RayCluster.
"""

from __future__ import annotations

import json
import logging
import random
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from raygpu.adapters.kube import _convert, pod_view
from raygpu.model.gc import ReservationRecord
from raygpu.model.labels import LABEL_CLUSTER, LABEL_RESERVATION, dns_label
from raygpu.model.raycluster import RayClusterView
from raygpu.model.views import K8sPodView

log = logging.getLogger("raygpu.sidecar.cache")

# The server closes each watch after 5-10 min (client-go's jittered minWatchTimeout); we re-watch from the
# last version. Bookmarks arrive about once a minute, so a read silent for WATCH_READ_TIMEOUT_S means a dead
# connection: re-watch. (A 60 s timeout tripled the sidecar's steady API load: benchmarks/bench_api_load.py.)
WATCH_TIMEOUT_S = 300
WATCH_READ_TIMEOUT_S = 150
MAX_BACKOFF_S = 30.0
LIST_TIMEOUT_S = 30  # connect/read timeout of a LIST


@dataclass
class _Kind:
    """One LIST+WATCH: ``list_fn(*args, **kwargs)`` is a kubernetes client list method."""

    name: str
    list_fn: Callable[..., Any]
    args: tuple
    kwargs: dict
    parse: Callable[[dict[str, Any]], Any]
    items: dict[str, Any] = field(default_factory=dict)  # object name -> parsed object
    synced: bool = False
    error: str | None = None
    lists: int = 0  # LIST calls made (start + resyncs)
    resource_version: str = ""
    skipped: dict[str, str] = field(default_factory=dict)  # object name -> why it could not be parsed


@dataclass(frozen=True)
class CacheView:
    """What the cache holds at one instant."""

    cluster: RayClusterView | None
    pods: tuple[K8sPodView, ...]
    reservations: tuple[ReservationRecord, ...]
    synced: bool
    errors: tuple[str, ...] = ()
    skipped: tuple[str, ...] = ()  # "<kind> <name>: <why>" of each object left out because it did not parse


class ClusterCache:
    """Watches RayCluster ``namespace/name``, its pods (label ``ray.io/cluster``) and its reservation ConfigMaps."""

    def __init__(self, api_client: Any, namespace: str, name: str,
                 on_problem: Callable[[str], None] | None = None) -> None:
        """``on_problem(message)`` hears once of each distinct value or object that did not parse."""
        from kubernetes import client
        core, custom = client.CoreV1Api(api_client), client.CustomObjectsApi(api_client)
        self.namespace, self.name = namespace, name
        self._on_problem = on_problem or (lambda message: log.warning("unparsable object: %s", message))
        self._reported: set[str] = set()
        self._report_lock = threading.Lock()
        self._lock = threading.Condition()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._assumed: tuple[RayClusterView, str] | None = None  # (what we wrote, version it replaced)
        self.kinds = {
            "raycluster": _Kind("raycluster", custom.list_namespaced_custom_object,
                                ("ray.io", "v1", namespace, "rayclusters"),
                                {"field_selector": f"metadata.name={name}"}, RayClusterView.from_k8s),
            "pods": _Kind("pods", core.list_namespaced_pod, (namespace,),
                          {"label_selector": f"ray.io/cluster={name}"}, _pod),
            "reservations": _Kind("reservations", core.list_namespaced_config_map, (namespace,),
                                  {"label_selector": f"{LABEL_RESERVATION},{LABEL_CLUSTER}={dns_label(name)}"},
                                  ReservationRecord.from_configmap),
        }

    # ------------------------------------------------------------- lifecycle
    def start(self) -> "ClusterCache":
        for kind in self.kinds.values():
            t = threading.Thread(target=self._run, args=(kind,), name=f"raygpu-watch-{kind.name}", daemon=True)
            t.start()
            self._threads.append(t)
        return self

    def stop(self) -> None:
        self._stop.set()
        with self._lock:
            self._lock.notify_all()

    def wait_synced(self, timeout_s: float) -> bool:
        """Block until every kind has been listed once (True) or ``timeout_s`` passed (False)."""
        deadline = time.monotonic() + timeout_s
        with self._lock:
            while not all(k.synced for k in self.kinds.values()):
                left = deadline - time.monotonic()
                if left <= 0 or self._stop.is_set():
                    return False
                self._lock.wait(min(left, 0.5))
        return True

    # ------------------------------------------------------------------ read
    def view(self) -> CacheView:
        with self._lock:
            rc = self._cluster_locked()
            pods = tuple(sorted(self.kinds["pods"].items.values(), key=lambda p: p.name))
            res = tuple(sorted(self.kinds["reservations"].items.values(), key=lambda r: r.name))
            errors = tuple(f"{k.name}: {k.error}" for k in self.kinds.values() if k.error)
            skipped = tuple(f"{k.name} {n}: {why}" for k in self.kinds.values() for n, why in sorted(k.skipped.items()))
            return CacheView(rc, pods, res, all(k.synced for k in self.kinds.values()), errors, skipped)

    def _cluster_locked(self) -> RayClusterView | None:
        """The watched RayCluster, or the one we wrote while the watch still shows the version we wrote over."""
        watched = self.kinds["raycluster"].items.get(self.name)
        if self._assumed is None:
            return watched
        written, planned_from = self._assumed
        if watched is not None and watched.resource_version == planned_from:
            return written  # the watch has not delivered our write yet
        self._assumed = None  # caught up (our write, or something newer): trust the watch again
        return watched

    def assume_cluster(self, written: RayClusterView, planned_from_rv: str) -> None:
        """Plan from ``written`` (what our patch returned) while the watch still shows ``planned_from_rv``."""
        with self._lock:
            self._assumed = (written, planned_from_rv)

    def wait_cluster_change(self, resource_version: str, timeout_s: float) -> bool:
        """Block until the cached RayCluster's version differs from ``resource_version`` (True) or timeout."""
        deadline = time.monotonic() + timeout_s
        with self._lock:
            while True:
                rc = self._cluster_locked()
                if rc is None or rc.resource_version != resource_version:
                    return True
                left = deadline - time.monotonic()
                if left <= 0 or self._stop.is_set():
                    return False
                self._lock.wait(min(left, 0.5))

    def list_calls(self) -> dict[str, int]:
        with self._lock:
            return {k.name: k.lists for k in self.kinds.values()}

    # ----------------------------------------------------------- the threads
    def _run(self, kind: _Kind) -> None:
        backoff_s = 0.5
        while not self._stop.is_set():
            try:
                self._list(kind)
                backoff_s = 0.5
                self._watch(kind)  # returns on stop; raises to resync
            except Exception as e:  # noqa: BLE001 - a watch must never kill the sidecar
                gone = getattr(e, "status", None) == 410
                err = "410 Gone: resyncing" if gone else str(_convert(e, f"watch {kind.name}"))
                with self._lock:
                    kind.synced, kind.error = False, None if gone else err
                    self._lock.notify_all()
                if gone:
                    log.info("watch of %s expired (410 Gone); re-listing", kind.name)
                    continue
                log.warning("watch of %s failed: %s; retrying in %.1fs", kind.name, err, backoff_s)
                self._stop.wait(backoff_s)
                backoff_s = min(MAX_BACKOFF_S, backoff_s * 2)

    def _list(self, kind: _Kind) -> None:
        resp = kind.list_fn(*kind.args, **kind.kwargs, _preload_content=False, _request_timeout=LIST_TIMEOUT_S)
        body = json.loads(resp.data)
        items: dict[str, Any] = {}
        skipped: dict[str, str] = {}
        problems = [m for obj in body.get("items") or [] for m in self._parse_into(kind, obj, items, skipped)]
        self._report(problems)
        with self._lock:
            kind.items, kind.skipped, kind.synced, kind.error = items, skipped, True, None
            kind.resource_version = body["metadata"]["resourceVersion"]
            kind.lists += 1
            self._lock.notify_all()

    def _watch(self, kind: _Kind) -> None:
        from kubernetes import watch
        while not self._stop.is_set():
            w = watch.Watch()
            for ev in w.stream(kind.list_fn, *kind.args, **kind.kwargs, resource_version=kind.resource_version,
                               timeout_seconds=int(WATCH_TIMEOUT_S * (1 + random.random())),
                               allow_watch_bookmarks=True, deserialize=False,
                               _request_timeout=(LIST_TIMEOUT_S, WATCH_READ_TIMEOUT_S)):
                if self._stop.is_set():
                    w.stop()
                    return
                obj = ev.get("object") or {}
                md = obj.get("metadata") or {}
                problems: list[str] = []
                with self._lock:
                    if md.get("resourceVersion"):
                        kind.resource_version = md["resourceVersion"]
                    if ev["type"] == "DELETED":
                        kind.items.pop(md.get("name"), None)
                        kind.skipped.pop(md.get("name"), None)
                    elif ev["type"] in ("ADDED", "MODIFIED"):
                        problems = self._parse_into(kind, obj, kind.items, kind.skipped)
                    self._lock.notify_all()
                self._report(problems)  # outside the lock: the sidecar's reporter writes an Event

    def _parse_into(self, kind: _Kind, obj: dict[str, Any], items: dict[str, Any],
                    skipped: dict[str, str]) -> list[str]:
        """Parse one object into ``items``; one that does not parse is left out and named in ``skipped``.

        Returns the messages to report: why it was left out, or each value that took a default.
        """
        name = str((obj.get("metadata") or {}).get("name", "?"))
        try:
            parsed = kind.parse(_with_namespace(obj, self.namespace))
        except Exception as e:  # noqa: BLE001 - one bad object must not stop the kind from syncing
            items.pop(name, None)  # never plan from a stale copy of it either
            skipped[name] = f"{type(e).__name__}: {e}"
            return [f"{kind.name} {self.namespace}/{name} left out: cannot parse it: {skipped[name]}"]
        items[name] = parsed
        skipped.pop(name, None)
        return [p.message for p in getattr(parsed, "problems", ())]

    def _report(self, messages: list[str]) -> None:
        """Hand each message not reported before to ``on_problem``; never raises."""
        for message in messages:
            with self._report_lock:
                if message in self._reported:
                    continue
                self._reported.add(message)
            try:
                self._on_problem(message)
            except Exception as e:  # noqa: BLE001 - reporting must not stop the watch
                log.warning("reporting a parse problem failed: %s (%s)", e, message)


def _with_namespace(obj: dict[str, Any], namespace: str) -> dict[str, Any]:
    obj.setdefault("metadata", {}).setdefault("namespace", namespace)
    return obj


def _pod(obj: dict[str, Any]) -> K8sPodView:
    return pod_view(obj)
