"""``raygpu.placement_group``: a Ray placement group backed by a Kubernetes gang reservation.

Flow (one call): plan the pods the bundles need -> reserve them as one
all-or-nothing gang (state ConfigMap, PodGroup or Kueue group, one tested
RayCluster patch adding a worker group of exactly those pods) -> once the
reserved pods' Ray nodes have joined, create the Ray placement group pinned
to them with ``bundle_label_selector`` on the Ray node label
``raygpu.io/reservation``. A watchdog thread follows the
reservation (reserved -> admitted -> bound -> ready) and rolls everything back
if it is not ready within ``timeout_s``. ``remove_placement_group``, the
context manager, interpreter exit and Ctrl-C all release it; a driver killed
outright is collected by the sidecar's garbage collection.

Ctrl-C and interpreter exit are bounded: within ``EXIT_BUDGET_S`` the Ray PG
is removed, the state made terminal and the worker group scaled to zero; the
wait for the pods to terminate and the emptied group's removal are handed to
a detached ``python -m raygpu.gang.finisher`` (and, should that die too, to
the sidecar's garbage collection), so the prompt comes back at once.
"""

from __future__ import annotations

import atexit
import os
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Iterator

from raygpu.adapters.kube import KubeAdapter
from raygpu.errors import PermanentError
from raygpu.gang.reservation import GROUP_DRAINING, RELEASE_DRAIN_S, Reservation, reserve
from raygpu.model.gang import GangPlan, GangRequest, ReservationState
from raygpu.model.labels import LABEL_RESERVATION
from raygpu.plan.gang import plan_gang

HEARTBEAT_EVERY_S = 10.0
WATCH_EVERY_S = 0.5  # the watchdog's step
EXIT_BUDGET_S = 5.0  # Ctrl-C / interpreter exit: the most the release may delay the prompt
WATCHDOG_JOIN_S = 5.0  # a release first waits this long for the watchdog's step in flight
EXIT_DRAIN_S = 3.0  # ... of which waiting for the pods to go; the finisher waits for the rest
_LIVE: set["GangPlacementGroup"] = set()
_LIVE_LOCK = threading.Lock()


def _request(bundles, strategy, cluster, namespace, backend, timeout_s, name, queue, owner_job=None) -> GangRequest:
    import uuid
    return GangRequest(name=name or f"pg-{uuid.uuid4().hex[:8]}", cluster=cluster, namespace=namespace,
                       bundles=bundles, strategy=strategy, backend=backend, timeout_s=timeout_s, queue=queue,
                       owner_job=owner_job)


def plan_placement_group(bundles: list[dict[str, float]], strategy: str = "PACK", *, cluster: str,
                         namespace: str = "default", backend: str | None = None, timeout_s: float = 600,
                         name: str | None = None, queue: str | None = None,
                         kubeconfig: str | None = None) -> GangPlan:
    """Dry run: read the RayCluster and return the plan. Creates nothing, writes nothing.

    Raises InfeasibleError (which bundle, which resource, which limit) or
    PermanentError (bad input, unknown cluster or backend).
    """
    kube = KubeAdapter(kubeconfig)
    req = _request(bundles, strategy, cluster, namespace, backend, timeout_s, name or "dry-run", queue)
    return plan_gang(req, kube.get_raycluster(namespace, cluster))


@dataclass(frozen=True)
class RayCalls:
    """The Ray calls a GangPlacementGroup makes, on the driver's own Ray connection.

    ``RayCalls.real()`` are Ray's own; tests pass fakes to drive the watchdog
    deterministically without a Ray cluster.
    """

    placement_group: Callable[..., Any]  # ray.util.placement_group
    placement_group_table: Callable[[Any], dict]  # ray.util.placement_group.placement_group_table
    remove_placement_group: Callable[[Any], None]  # ray.util.remove_placement_group
    nodes: Callable[[], list[dict]]  # ray.nodes

    @classmethod
    def real(cls) -> "RayCalls":
        import ray
        from ray.util import placement_group as ray_pg
        from ray.util import remove_placement_group
        from ray.util.placement_group import placement_group_table
        return cls(ray_pg, placement_group_table, remove_placement_group, ray.nodes)


class GangPlacementGroup:
    """A Ray placement group whose bundles sit on pods reserved for it as one gang.

    ``ray_calls`` (default: Ray's own), ``clock`` (monotonic seconds, for the
    deadline and the heartbeat period) and ``start_watchdog=False`` (the caller
    runs ``_step()`` itself) exist for tests.
    """

    def __init__(self, reservation: Reservation, progress: Callable[[str], None],
                 kubeconfig: str | None = None, *, ray_calls: RayCalls | None = None,
                 clock: Callable[[], float] = time.monotonic, start_watchdog: bool = True) -> None:
        self.reservation = reservation
        self._ray = ray_calls or RayCalls.real()
        self._clock = clock
        self._kubeconfig = kubeconfig  # for the finisher, which builds its own client the same way
        self.placement_group: Any = None  # the Ray PG, created once the reserved Ray nodes joined
        self._pg_created = threading.Event()
        self._progress = progress
        self._stop = threading.Event()
        self._released = False
        self._done = threading.Event()  # set once a release/rollback has finished
        self._lock = threading.Lock()
        self.error: str | None = None
        self._deadline = clock() + reservation.request.timeout_s
        self._last_beat_s = float("-inf")
        self._thread = threading.Thread(target=self._watch, name=f"raygpu-{reservation.plan.gang_name}", daemon=True)
        if start_watchdog:
            self._thread.start()

    # ---------------------------------------------------------------- API
    @property
    def plan(self) -> GangPlan:
        return self.reservation.plan

    @property
    def state(self) -> ReservationState:
        return self.reservation.state

    def ready(self):
        """The Ray ObjectRef that resolves when every bundle is placed (``ray.get(pg.ready())``).

        Blocks until the Ray placement group exists (it is created once the
        reserved pods' Ray nodes have joined). Raises PermanentError if the
        reservation was rolled back first (timeout); after that the ref raises
        instead of hanging.
        """
        while not self._pg_created.wait(0.2):
            if self._done.is_set():
                raise PermanentError(f"reservation {self.plan.reservation_group} rolled back: {self.error}")
        return self.placement_group.ready()

    def wait(self, timeout_s: float | None = None) -> bool:
        """Block until ready (True) or until ``timeout_s``/rollback (False)."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while not self._released:
            if self.state == ReservationState.READY:
                return True
            if deadline is not None and time.monotonic() > deadline:
                return False
            time.sleep(0.2)
        self._done.wait(None if deadline is None else max(0.0, deadline - time.monotonic()))
        return False

    def remove(self) -> None:
        """Remove the Ray placement group and release the reservation. Idempotent.

        Waits up to ``RELEASE_DRAIN_S`` for the reserved pods to go, then
        removes their worker group; pods that outlive the wait are left to the
        sidecar's garbage collection (the state is terminal by then).
        """
        self._finish(None)

    def interrupt(self, reason: str = "interrupted (Ctrl-C)", budget_s: float = EXIT_BUDGET_S) -> None:
        """Release within ``budget_s`` seconds, for Ctrl-C and interpreter exit. Idempotent.

        Removes the Ray placement group, makes the state terminal and scales
        the worker group to zero, waiting at most ``EXIT_DRAIN_S`` for the
        pods; whatever is left (pods terminating, the emptied group, the state
        ConfigMap) is finished by a detached ``python -m raygpu.gang.finisher``.
        A Kubernetes request that hangs past the budget is abandoned, not
        waited for: the finisher, or the sidecar's garbage collection, completes it.
        """
        self._finish(reason, budget_s=budget_s)

    # ------------------------------------------------------------- watchdog
    def _reserved_ray_nodes(self) -> int:
        group = self.plan.reservation_group
        return sum(1 for n in self._ray.nodes()
                   if n.get("Alive") and (n.get("Labels") or {}).get(LABEL_RESERVATION) == group)

    def _create_ray_pg(self) -> None:
        """The Ray PG, pinned by ``bundle_label_selector`` to the reserved Ray nodes (all present now:
        a PG created before its nodes exist can sit PENDING long after they join)."""
        req = self.reservation.request
        selector = {LABEL_RESERVATION: self.plan.reservation_group}
        self.placement_group = self._ray.placement_group(
            [dict(b.resources) for b in req.bundles], strategy=req.strategy.value, name=req.name,
            bundle_label_selector=[dict(selector) for _ in req.bundles])
        self.reservation.record_placement_group(self.placement_group.id.hex())
        self._pg_created.set()

    def _watch(self) -> None:
        while not self._stop.is_set():
            if not self._step():
                return
            self._stop.wait(WATCH_EVERY_S)

    def _step(self) -> bool:
        """One watchdog step; False once the reservation was rolled back (the watchdog then ends)."""
        try:
            rsv = self.reservation
            if rsv.state in (ReservationState.RESERVED, ReservationState.ADMITTED):
                before = rsv.state
                rsv.observe()
                if rsv.state != before:
                    self._progress(f"reservation {rsv.plan.reservation_group}: {rsv.state.value}")
            if rsv.state == ReservationState.BOUND and self.placement_group is None:
                if self._reserved_ray_nodes() >= rsv.plan.pod_count:
                    self._create_ray_pg()
                    self._progress(f"reservation {rsv.plan.reservation_group}: {rsv.plan.pod_count} Ray nodes "
                                   f"joined; placement group created on them")
            if rsv.state == ReservationState.BOUND and self.placement_group is not None:
                if self._ray.placement_group_table(self.placement_group).get("state") == "CREATED":
                    rsv.transition(ReservationState.READY, "all bundles placed on the reserved Ray nodes")
                    self._progress(f"placement group {rsv.request.name} ready on "
                                   f"{rsv.plan.pod_count} reserved pods")
            if rsv.state != ReservationState.READY and self._clock() > self._deadline:
                self._finish(f"not ready within timeout_s={rsv.request.timeout_s:g} (state {rsv.state.value})")
                return False
            if self._clock() - self._last_beat_s > HEARTBEAT_EVERY_S:
                rsv.heartbeat(time.time())
                self._last_beat_s = self._clock()
        except Exception as e:  # noqa: BLE001 - the watchdog must not die silently
            self._progress(f"watchdog: {e}")
        return True

    def _finish(self, failure: str | None, budget_s: float | None = None) -> None:
        """Release once: synchronously (``budget_s`` None), or bounded by ``budget_s`` with a hand-off."""
        with self._lock:
            if self._released:
                return
            self._released = True
        self._stop.set()
        self.error = failure
        if threading.current_thread() is not self._thread and self._thread.is_alive():  # a step in flight ends first
            self._thread.join(WATCHDOG_JOIN_S if budget_s is None else min(0.5, budget_s))
        if budget_s is None:
            self._release(failure, RELEASE_DRAIN_S)
            return
        outcome: list[str] = []
        worker = threading.Thread(target=lambda: outcome.append(self._release(failure, min(EXIT_DRAIN_S, budget_s))),
                                  name=f"raygpu-release-{self.plan.gang_name}", daemon=True)
        worker.start()
        worker.join(budget_s)
        if outcome != ["done"]:  # pods still terminating, a request still hanging, or the release failed
            self._hand_off(outcome[0] if outcome else f"not done within {budget_s:g} s")
            self._done.set()

    def _release(self, failure: str | None, drain_timeout_s: float) -> str:
        """Remove the Ray PG, then the reservation; returns "done", "draining" or the error."""
        result = "done"
        if self.placement_group is not None:
            try:
                self._ray.remove_placement_group(self.placement_group)
            except Exception:  # noqa: BLE001 - Ray may be gone at exit; the reservation still goes
                pass
        try:
            if self.reservation.release(failed=failure, drain_timeout_s=drain_timeout_s) == GROUP_DRAINING:
                result = "draining"
        except Exception as e:  # noqa: BLE001 - reported; the caller decides who finishes
            result = f"release failed: {e}"
            if drain_timeout_s >= RELEASE_DRAIN_S:
                raise
        finally:
            if result == "done" or drain_timeout_s >= RELEASE_DRAIN_S:
                self._done.set()
        self._progress(f"reservation {self.plan.reservation_group} "
                       f"{'rolled back: ' + failure if failure else 'released'}"
                       + ("" if result == "done" else f" ({result})"))
        with _LIVE_LOCK:
            _LIVE.discard(self)
        return result

    def _hand_off(self, why: str) -> None:
        """Start the detached finisher for what the bounded release left; never raises."""
        ns, name = self.plan.namespace, self.plan.gang_name
        cmd = [sys.executable, "-m", "raygpu.gang.finisher", "--namespace", ns, "--cluster", self.plan.cluster,
               "--reservation", name]
        if self._kubeconfig:
            cmd += ["--kubeconfig", self._kubeconfig]
        log_path = os.path.join(tempfile.gettempdir(), f"raygpu-finisher-{ns}-{name}.log")
        try:
            with open(log_path, "ab") as log:
                subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True,
                                 close_fds=True)
            self._progress(f"reservation {self.plan.reservation_group}: {why}; the rest is finished in the "
                           f"background (log {log_path}), else by the sidecar's garbage collection")
        except Exception as e:  # noqa: BLE001 - at exit nothing may raise; the sidecar's GC is the backstop
            self._progress(f"reservation {self.plan.reservation_group}: {why}; could not start the finisher "
                           f"({e}): the sidecar's garbage collection finishes the release")


def placement_group(bundles: list[dict[str, float]], strategy: str = "PACK", *, cluster: str,
                    namespace: str = "default", backend: str | None = None, timeout_s: float = 600,
                    name: str | None = None, queue: str | None = None, kubeconfig: str | None = None,
                    progress: Callable[[str], None] | None = None) -> GangPlacementGroup:
    """Create a Ray placement group whose bundles get their own all-or-nothing Kubernetes gang.

    Call inside a Ray driver (``ray.init`` done) of RayCluster ``namespace/cluster``.
    ``backend`` (coscheduling|kueue|volcano|none) and ``queue`` default to the
    cluster's ``raygpu.io/gang-backend`` / ``raygpu.io/queue`` annotations.
    Returns once the gang is reserved; ``ray.get(pg.ready())`` (or ``pg.wait()``)
    waits for the pods, their Ray nodes and the placement group on them.

    Raises InfeasibleError / PermanentError before anything is created for
    requests that cannot be planned (too big a bundle, unknown strategy,
    backend or cluster, non-positive amounts).
    """
    import ray
    if not ray.is_initialized():
        raise PermanentError("raygpu.placement_group needs a connected Ray driver: call ray.init(address=...) first")
    say = progress or (lambda m: None)
    job = ray.get_runtime_context().get_job_id()
    req = _request(bundles, strategy, cluster, namespace, backend, timeout_s, name, queue, owner_job=job)
    kube = KubeAdapter(kubeconfig)
    rsv = reserve(kube, req, time.time(), progress=say)
    gpg = GangPlacementGroup(rsv, say, kubeconfig)
    with _LIVE_LOCK:
        _LIVE.add(gpg)
    return gpg


def remove_placement_group(pg: GangPlacementGroup) -> None:
    """Remove the Ray placement group and release its Kubernetes reservation (idempotent)."""
    pg.remove()


@contextmanager
def gang_placement_group(bundles: list[dict[str, float]], strategy: str = "PACK", **kwargs: Any
                         ) -> Iterator[GangPlacementGroup]:
    """``with raygpu.gang_placement_group(...) as pg:`` - always released on exit, error or Ctrl-C."""
    pg = placement_group(bundles, strategy, **kwargs)
    try:
        yield pg
    except KeyboardInterrupt:
        pg.interrupt()
        raise
    finally:
        pg.remove()  # a no-op after interrupt()


@atexit.register
def _release_all() -> None:
    """At interpreter exit (also after an uncaught Ctrl-C): release every live PG within one budget."""
    with _LIVE_LOCK:
        live = list(_LIVE)
    deadline = time.monotonic() + EXIT_BUDGET_S
    workers = [threading.Thread(target=pg.interrupt, args=("driver exited before removing its placement group",
                                                           EXIT_BUDGET_S), daemon=True) for pg in live]
    for w in workers:
        w.start()
    for w in workers:
        w.join(max(0.0, deadline - time.monotonic()) + 1.0)  # each interrupt() keeps its own budget
