"""``raygpu.placement_group``: a Ray placement group backed by a Kubernetes gang reservation.

Flow (one call): plan the pods the bundles need -> reserve them as one all-or-nothing gang (state
ConfigMap, PodGroup or Kueue group, one tested RayCluster patch adding a worker group of exactly those
pods) -> once the reserved pods' Ray nodes have joined, create the Ray placement group pinned to them with
``bundle_label_selector`` on the Ray node label ``raygpu.io/reservation``. A watchdog thread follows the
reservation (reserved -> admitted -> bound -> ready) and rolls everything back if it is not ready within
``timeout_s``. ``remove_placement_group``, the context manager, interpreter exit and Ctrl-C all release
it; a driver killed outright is collected by the sidecar's garbage collection. Ctrl-C and interpreter exit
are bounded (``EXIT_BUDGET_S``); what is left goes to a detached ``python -m raygpu.gang.finisher``, then
the sidecar's GC. Guarded reservations (the starvation guard): ``raygpu.gang.guard``.
"""

from __future__ import annotations

import atexit
import threading
import time
from contextlib import contextmanager
from typing import Any, Callable, Iterator

from raygpu.adapters.kube import KubeAdapter
from raygpu.errors import PermanentError
from raygpu.gang.aio import AsyncFace, gang_placement_group_async, placement_group_async  # noqa: F401 - the async face
from raygpu.gang.backfill import Backfill
from raygpu.gang.guard import Guard
from raygpu.gang.ray_calls import RayCalls
from raygpu.gang.reservation import (EXIT_DRAIN_S, RELEASE_DRAIN_S, GroupOutcome, Reservation, gang_request,  # noqa: F401
                                    plan_placement_group, reserve)  # plan_placement_group: public here
from raygpu.gang.watchdog import HEARTBEAT_EVERY_S, WATCH_BACKOFF_MAX_S, WATCH_EVERY_S, Watchdog  # noqa: F401
from raygpu.model.gang import GangPlan, ReservationState

EXIT_BUDGET_S = 5.0  # Ctrl-C / interpreter exit: the most the release may delay the prompt
WATCHDOG_JOIN_S = 5.0  # a release first waits this long for the watchdog's step in flight
_LIVE: set["GangPlacementGroup"] = set()
_LIVE_LOCK = threading.Lock()


class GangPlacementGroup(Watchdog, AsyncFace):
    """A Ray placement group whose bundles sit on pods reserved for it as one gang.

    Asyncio drivers use the same object's ``ready_async``/``wait_async``/``remove_async`` (gang/aio.py);
    the watchdog thread's steps are in gang/watchdog.py.
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
        self._pg_lock = threading.Lock()  # held while the Ray PG is created or removed
        self._pg_recorded = self._pg_removed = False  # its id is on the state ConfigMap / it was removed
        self._progress = progress
        self._stop = threading.Event()
        self._released = False  # a release began: no Ray PG is created any more, the watchdog stops
        self._release_complete = False  # released (or handed to the finisher): remove() is a no-op
        self._done = threading.Event()  # set once a release attempt has ended, successful or not
        self._lock = threading.Lock()  # one release attempt at a time
        self.error: str | None = None
        self._deadline = clock() + reservation.request.timeout_s
        self._last_beat_s = float("-inf")
        self.guard = Guard.of(reservation, clock, progress)  # the starvation guard (gang/guard.py), or None
        self.backfill = Backfill.of(reservation, clock, progress)  # an unguarded hinted gang (gang/backfill.py)
        self._thread = threading.Thread(target=self._watch, name=f"raygpu-{reservation.plan.gang_name}", daemon=True)
        if start_watchdog:
            self._thread.start()

    @property
    def plan(self) -> GangPlan:
        return self.reservation.plan

    @property
    def state(self) -> ReservationState:
        return self.reservation.state

    def ready(self):
        """The Ray ObjectRef that resolves when every bundle is placed (``ray.get(pg.ready())``).

        Blocks until the Ray placement group exists (it is created once the
        reserved pods' Ray nodes have joined), at most until the reservation's
        deadline (``timeout_s`` after it was reserved) plus ``WATCHDOG_JOIN_S``,
        whatever fails meanwhile. Raises PermanentError once a release or
        rollback began (the PG is gone or going), or past that deadline.
        """
        while not self._released and not self._pg_created.wait(0.2):
            if self._overdue():
                raise self._not_ready_error()
        if self._released:
            raise self._released_error()
        return self.placement_group.ready()

    def wait(self, timeout_s: float | None = None) -> bool:
        """Block until ready (True) or until ``timeout_s``, a rollback or the reservation's deadline (False).

        Ready means the state ConfigMap says ``ready``. Never blocks past the
        reservation's deadline plus ``WATCHDOG_JOIN_S``, even with no timeout_s.
        """
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while not self._released:
            if self.state == ReservationState.READY:
                return True
            if (deadline is not None and time.monotonic() > deadline) or self._overdue():
                return False
            time.sleep(0.2)
        self._done.wait(None if deadline is None else max(0.0, deadline - time.monotonic()))
        return False

    def _overdue(self) -> bool:  # past the deadline by more than a watchdog step may take, not ready
        return self.state != ReservationState.READY and self._clock() > self._deadline + WATCHDOG_JOIN_S

    def remove(self) -> None:
        """Remove the Ray placement group and release the reservation. Idempotent.

        Waits up to ``RELEASE_DRAIN_S`` for the reserved pods to go, then
        removes their worker group; pods that outlive the wait are left to the
        sidecar's garbage collection (the state is terminal by then). Raises
        the error if the release failed: nothing is claimed released then, and
        calling ``remove()`` again tries again.
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

    def _finish(self, failure: str | None, budget_s: float | None = None, blocking: bool = True) -> None:
        """Release: synchronously (``budget_s`` None; raises on failure, leaving it retryable), or bounded by
        ``budget_s`` with a hand-off to the finisher. ``blocking=False`` (the watchdog) returns at once when
        another release attempt is under way. A no-op once released."""
        t_end = time.monotonic() + (budget_s if budget_s is not None else 0.0)
        got = self._lock.acquire(blocking=False) if not blocking else (
            self._lock.acquire() if budget_s is None else self._lock.acquire(timeout=budget_s))
        if not got:
            if budget_s is not None:  # a release is under way in another thread; the finisher backs it up
                self._hand_off("another release of it was still under way")
            return
        try:
            if self._release_complete:
                return
            if not self._released:
                self._released, self.error = True, failure
            self._stop.set()
            if threading.current_thread() is not self._thread and self._thread.is_alive():
                self._thread.join(WATCHDOG_JOIN_S if budget_s is None else min(0.5, budget_s))  # step in flight
            if budget_s is None:
                try:
                    self._release(failure, RELEASE_DRAIN_S, WATCHDOG_JOIN_S)
                finally:
                    self._done.set()
                return
            outcome: list[str] = []
            left_s = max(0.0, t_end - time.monotonic())
            worker = threading.Thread(target=lambda: outcome.append(_outcome(
                lambda: self._release(failure, min(EXIT_DRAIN_S, left_s), left_s))),
                name=f"raygpu-release-{self.plan.gang_name}", daemon=True)
            worker.start()
            worker.join(left_s)
            if outcome != ["done"]:  # pods still terminating, a request still hanging, or the release failed
                self._hand_off(outcome[0] if outcome else f"not done within {budget_s:g} s")
            self._release_complete = True  # done, or the finisher's (and the sidecar's GC's) to finish
            self._done.set()
        finally:
            self._lock.release()

    def _release(self, failure: str | None, drain_timeout_s: float, pg_wait_s: float) -> str:
        """Remove the Ray PG, then the reservation; returns "done" or "draining", raises on failure
        (then nothing is marked released and the next attempt starts over)."""
        self._remove_ray_pg(pg_wait_s)
        if self.guard is not None:  # its blockers also go with the state ConfigMap (ownerReference)
            self._attempt("ending the guard", lambda: self.guard.release(failure or "released"))
        result = "done"
        if self.reservation.release(failed=failure, drain_timeout_s=drain_timeout_s) is GroupOutcome.DRAINING:
            result = "draining"
        self._release_complete = True
        self._progress(f"reservation {self.plan.reservation_group} "
                       f"{'rolled back: ' + failure if failure else 'released'}"
                       + ("" if result == "done" else f" ({result})"))
        with _LIVE_LOCK:
            _LIVE.discard(self)
        return result

    def _hand_off(self, why: str) -> None:
        """Start the detached finisher for what the bounded release left; never raises."""
        from raygpu.gang.finisher import hand_off
        hand_off(self.plan, self._kubeconfig, why, self._progress)


def _outcome(release: Callable[[], str]) -> str:
    try:
        return release()
    except Exception as e:  # noqa: BLE001 - reported; the finisher or the sidecar's GC finishes
        return f"release failed: {e}"


def placement_group(bundles: list[dict[str, float]], strategy: str | None = None, *, cluster: str,
                    namespace: str = "default", backend: str | None = None, timeout_s: float = 600,
                    name: str | None = None, queue: str | None = None, kubeconfig: str | None = None,
                    progress: Callable[[str], None] | None = None, guard: bool | None = None,
                    expected_runtime_s: float | None = None, topology_strategy: dict | None = None) -> GangPlacementGroup:
    """Create a Ray placement group whose bundles get their own all-or-nothing Kubernetes gang.

    Call inside a Ray driver (``ray.init`` done) of RayCluster ``namespace/cluster``. ``backend``
    (coscheduling|kueue|volcano|workload|none) and ``queue`` default to the cluster's ``raygpu.io/gang-backend`` /
    ``raygpu.io/queue`` annotations. Returns once the gang is reserved; ``ray.get(pg.ready())`` (or
    ``pg.wait()``) waits for the pods, their Ray nodes and the placement group on them.
    ``guard`` (default: annotation ``raygpu.io/guard``, off): docs/guard.md. ``expected_runtime_s`` (seconds > 0,
    finite): how long the job will hold the placement group; on its pods, it tells a guard's hold when they
    end, and lets an unguarded gang backfill onto nodes a guard holds when it ends before the hold starts.
    ``strategy`` or Ray's ``topology_strategy`` (e.g. ``{"topology.kubernetes.io/zone": "STRICT_PACK"}``): docs/gang.md.
    Raises InfeasibleError / PermanentError before anything is created for requests that cannot be planned
    (too big a bundle, unknown strategy, backend or cluster, non-positive amounts, a bad guard or runtime
    hint, the guard without backend none or without raygpu's blocker PriorityClass).
    """
    import ray
    if not ray.is_initialized():
        raise PermanentError("raygpu.placement_group needs a connected Ray driver: call ray.init(address=...) first")
    say = progress or (lambda m: None)
    job = ray.get_runtime_context().get_job_id()
    req = gang_request(bundles, strategy, cluster, namespace, backend, timeout_s, name, queue, job, guard,
                       expected_runtime_s, topology_strategy)
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
def gang_placement_group(bundles: list[dict[str, float]], strategy: str | None = None, **kwargs: Any
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
