"""What the starvation guard's integration tests share: the guard namespace and PriorityClass, a busy tenant,
a watch of deletions, and the blockers of a scope."""

from __future__ import annotations

import random
import threading
import time
import uuid
from pathlib import Path

import yaml

from raygpu.model.labels import DEFAULT_GUARD_NAMESPACE, KEY_GUARD_SCOPE, LABEL_BLOCKER, LABEL_POOL, LABEL_TESTBED_SHAPE
from raygpu.testing.kube import apply
from tests.integration.util import pods

GUARD_NS = DEFAULT_GUARD_NAMESPACE
ROOT = Path(__file__).resolve().parents[2]
TENANT = "tenant"


def guard_setup(kube) -> None:
    """What an administrator applies once per cluster to turn the guard on: deploy/guard's PriorityClass and
    the guard namespace (its Roles too; the tests' drivers run as the testbed's admin)."""
    for f in ("priorityclasses.yaml", "rbac.yaml"):
        for obj in yaml.safe_load_all((ROOT / "deploy/guard" / f).read_text()):
            if obj["kind"] in ("PriorityClass", "Namespace"):
                apply(kube, obj)


def blockers(core, scope: str) -> list[dict]:
    """The blockers of ``scope`` standing in the guard namespace (not being deleted)."""
    return [p for p in pods(core, GUARD_NS, f"{KEY_GUARD_SCOPE}={scope},{LABEL_BLOCKER}")
            if not p["metadata"].get("deletionTimestamp")]


class Tenant(threading.Thread):
    """Keeps ``gpus`` + ``backlog`` 1-GPU pods alive: deletes each a random ``life_s`` after it runs, creates
    a new one whenever one ends. Records every pod it deleted."""

    def __init__(self, core, ns: str, pool: str, gpus: int, backlog: int, life_s: tuple[float, ...]) -> None:
        super().__init__(daemon=True)
        self.core, self.ns, self.pool, self.gpus, self.backlog, self.life_s = core, ns, pool, gpus, backlog, life_s
        self.deleted: set[str] = set()
        self.ends: dict[str, float] = {}
        self.stop = threading.Event()
        self.rng = random.Random(11)

    def pod(self) -> dict:
        return {"metadata": {"name": f"t-{uuid.uuid4().hex[:8]}", "labels": {"app": TENANT}},
                "spec": {"nodeSelector": {LABEL_POOL: self.pool, LABEL_TESTBED_SHAPE: "h100x8"},
                         "terminationGracePeriodSeconds": 0, "containers": [{"name": "w", "image": "busybox",
                         "resources": {"requests": {"cpu": "1", "nvidia.com/gpu": "1"},
                                       "limits": {"cpu": "1", "nvidia.com/gpu": "1"}}}]}}

    def run(self) -> None:
        while not self.stop.is_set():
            live = [p for p in pods(self.core, self.ns, f"app={TENANT}") if not p["metadata"].get("deletionTimestamp")]
            now = time.monotonic()
            for p in live:
                name = p["metadata"]["name"]
                if (p.get("status") or {}).get("phase") == "Running":
                    end = self.ends.setdefault(name, now + self.rng.uniform(*self.life_s))
                    if now >= end:
                        self.deleted.add(name)
                        self.core.delete_namespaced_pod(name, self.ns, grace_period_seconds=0)
            for _ in range(self.gpus + self.backlog - sum(p["metadata"]["name"] not in self.deleted for p in live)):
                self.core.create_namespaced_pod(self.ns, self.pod())
            self.stop.wait(0.3)

    def busy(self) -> bool:
        ps = pods(self.core, self.ns, f"app={TENANT}")
        return sum((p.get("status") or {}).get("phase") == "Running" for p in ps) >= self.gpus


class Deletions(threading.Thread):
    """Every pod DELETED in the namespace, by a watch."""

    def __init__(self, core, ns: str) -> None:
        super().__init__(daemon=True)
        self.core, self.ns, self.names, self.stop = core, ns, [], threading.Event()

    def run(self) -> None:
        from kubernetes import watch
        rv = None
        while not self.stop.is_set():
            w = watch.Watch()
            try:
                for ev in w.stream(self.core.list_namespaced_pod, self.ns, timeout_seconds=5, resource_version=rv):
                    rv = ev["object"].metadata.resource_version
                    if ev["type"] == "DELETED":
                        self.names.append(ev["object"].metadata.name)
            except Exception:  # noqa: BLE001 - a watch that ends (410) restarts from a fresh list
                rv = None
                self.stop.wait(1.0)


class BlockerWatch(threading.Thread):
    """Samples the scope's standing blockers in the guard namespace every 0.2 s: each change, as (time,
    {name: (node, its gang's tag)})."""

    def __init__(self, core, scope: str) -> None:
        super().__init__(daemon=True)
        self.core, self.scope, self.stop, self.samples = core, scope, threading.Event(), []

    def run(self) -> None:
        last = None
        while not self.stop.is_set():
            now = {p["metadata"]["name"]: (p["spec"].get("nodeName"), p["metadata"]["labels"][LABEL_BLOCKER])
                   for p in blockers(self.core, self.scope)}
            if now != last:
                self.samples.append((time.monotonic(), now))
                last = now
            self.stop.wait(0.2)

    def most_gangs(self) -> int:
        """The most gangs whose blockers stood at once."""
        return max((len({tag for _, tag in s.values()}) for _, s in self.samples), default=0)

    def gangs(self) -> set[str]:
        """Every gang (tag) whose blockers were seen."""
        return {tag for _, s in self.samples for _, tag in s.values()}

    def gone_since(self, t: float) -> float | None:
        """The first time after ``t`` at which no blocker stood, None if none yet."""
        return next((at for at, s in self.samples if at >= t and not s), None)
