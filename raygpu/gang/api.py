"""``raygpu.placement_group``: a Ray placement group backed by a Kubernetes gang reservation.

The handle, in one module: ``GangPlacementGroup`` (its blocking and async methods, its release), the
``Watchdog`` each handle owns, the ``RayCalls`` it makes on the driver's connection, and the calls that
make one (``placement_group``, ``gang_placement_group``, ``placement_group_async``,
``gang_placement_group_async``). The dry run is ``raygpu.gang.requests.plan_placement_group``.

Flow (one call): plan the pods the bundles need -> reserve them as one all-or-nothing gang (state
ConfigMap, PodGroup or Kueue group, one tested RayCluster patch adding a worker group of exactly those
pods) -> once the reserved pods' Ray nodes have joined, create the Ray placement group pinned to them with
``bundle_label_selector`` on the Ray node label ``raygpu.io/reservation``. The handle's watchdog thread
follows the reservation (reserved -> admitted -> bound -> ready) and rolls everything back if it is not
ready within ``timeout_s``. ``remove_placement_group``, the context manager, interpreter exit and Ctrl-C
all release it; a driver killed outright is collected by the sidecar's garbage collection. Ctrl-C and
interpreter exit are bounded (``EXIT_BUDGET_S``); what is left goes to a detached
``python -m raygpu.gang.finisher``, then the sidecar's GC. Guarded reservations (the starvation guard):
``raygpu.guard.holder``; backfill: ``raygpu.guard.backfill``.

Asyncio drivers (Ray Serve, asyncio apps) use the async face, which never blocks the event loop: waiting
is ``await asyncio.sleep`` between looks at the handle's state (which the watchdog thread keeps current),
and the Kubernetes work (reserve, release) runs in a worker thread. Its contracts are those of the
blocking calls, with the same deadlines and errors:

    pg = await raygpu.placement_group_async([{"GPU": 8}] * 2, cluster="rc")
    await pg.ready_async()            # like ray.get(pg.ready())
    ...
    await pg.remove_async()

    async with raygpu.gang_placement_group_async([{"GPU": 8}] * 2, cluster="rc") as pg:
        await pg.ready_async()

Cancelling a task that awaits ``placement_group_async`` does not leak the reservation: one that was
already being made is released as soon as it exists. Cancelling ``ready_async``/``wait_async`` only
stops waiting (the reservation is the caller's to remove, as with a blocking wait).
"""

from __future__ import annotations

import asyncio
import atexit
import functools
import inspect
import logging
import threading
import time
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from typing import Any, AsyncIterator, Callable, Iterator

from raygpu.adapters.kube import KubeAdapter
from raygpu.adapters.ray_extra import import_ray
from raygpu.errors import ForbiddenError, NotFoundError, PermanentError
from raygpu.gang.requests import gang_request
from raygpu.gang.reservation import EXIT_DRAIN_S, RELEASE_DRAIN_S, GroupOutcome, Reservation, reserve
from raygpu.guard.backfill import Backfill
from raygpu.guard.holder import Guard
from raygpu.model.gang import GangPlan, ReservationState
from raygpu.model.labels import LABEL_RESERVATION

EXIT_BUDGET_S = 5.0  # Ctrl-C / interpreter exit: the most the release may delay the prompt
WATCHDOG_JOIN_S = 5.0  # a release first waits this long for the watchdog's step in flight
HEARTBEAT_EVERY_S = 10.0
WATCH_EVERY_S = 0.5  # the watchdog's step
WATCH_BACKOFF_MAX_S = 4.0  # after failed writes the step doubles up to this, never more
POLL_S = 0.1  # how often an awaiting coroutine looks at the handle's state
WAIT_LINE_EVERY_S = 30.0  # while not ready, the watchdog says how the wait goes this often (one INFO line)
# Every progress line is logged here at INFO (a lost API access at WARNING), callback or not: a driver that
# calls logging.basicConfig(level=logging.INFO) sees a wait of minutes go by (docs/gang.md "Logs").
log = logging.getLogger(__name__)
_LIVE: set["GangPlacementGroup"] = set()
_LIVE_LOCK = threading.Lock()


# ---------------------------------------------------------------- progress: the log and the caller's callback

@dataclass(frozen=True)
class Progress:
    """Where a reservation's progress lines go: the ``raygpu.gang.api`` logger (INFO; ``warning``: WARNING),
    then the caller's ``progress`` callback, if any. Called as ``say(message)``, like a bare callback."""

    callback: Callable[[str], None] | None = None

    def __call__(self, message: str) -> None:
        self.say(message, logging.INFO)

    def warning(self, message: str) -> None:
        self.say(message, logging.WARNING)

    def say(self, message: str, level: int) -> None:
        log.log(level, message, stacklevel=3)  # the record names who said it, not this class
        if self.callback is not None:
            self.callback(message)

    @classmethod
    def of(cls, progress: Callable[[str], None] | None) -> "Progress":
        return progress if isinstance(progress, Progress) else cls(progress)


# ---------------------------------------------------------------- the Ray calls, on the driver's connection

class RayDisconnected(RuntimeError):
    """This process's Ray driver is not connected (the user called ``ray.shutdown()``, or the interpreter is
    exiting and Ray's own atexit hook ran first). Ray's placement-group calls would then ``ray.init()`` a new
    local Ray instance on their own (``auto_init_ray``), from our watchdog thread: never call them then. A
    driver's placement groups are not detached, so Ray removed them with the job."""


def _connected(call: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(call)
    def guarded(*args: Any, **kwargs: Any) -> Any:
        import ray
        if not ray.is_initialized():
            raise RayDisconnected("this driver is no longer connected to Ray (ray.shutdown() or exit)")
        return call(*args, **kwargs)
    return guarded


@dataclass(frozen=True)
class RayCalls:
    """The Ray calls a GangPlacementGroup makes on the driver's connection: ``real()`` Ray's, or a test's fakes.
    Each raises RayDisconnected once the driver is disconnected."""

    placement_group: Callable[..., Any]  # ray.util.placement_group
    placement_group_table: Callable[[Any], dict]  # ray.util.placement_group.placement_group_table
    remove_placement_group: Callable[[Any], None]  # ray.util.remove_placement_group
    nodes: Callable[[], list[dict]]  # ray.nodes
    connected: Callable[[], bool] = lambda: True  # ray.is_initialized

    @classmethod
    def real(cls) -> "RayCalls":
        """Ray's own calls. Raises MissingExtraError when Ray is not installed (the ``ray`` extra)."""
        ray = import_ray("a raygpu placement group")
        from ray.util import placement_group as ray_pg
        from ray.util import remove_placement_group
        from ray.util.placement_group import placement_group_table
        return cls(_connected(ray_pg), _connected(placement_group_table), _connected(remove_placement_group),
                   _connected(ray.nodes), ray.is_initialized)


# ---------------------------------------------------------------- the handle

class GangPlacementGroup:
    """A Ray placement group whose bundles sit on pods reserved for it as one gang.

    Blocking (``ready``/``wait``/``remove``/``interrupt``) and asyncio (``ready_async``/``wait_async``/
    ``remove_async``/``interrupt_async``) methods on one object. It owns its ``watchdog`` (a ``Watchdog``,
    one thread) and its Ray placement group, which the watchdog creates and a release removes.
    ``ray_calls`` (default: Ray's own), ``clock`` (monotonic seconds, for the
    deadline and the heartbeat period) and ``start_watchdog=False`` (the caller
    runs ``watchdog.step()`` itself) exist for tests.
    """

    def __init__(self, reservation: Reservation, progress: Callable[[str], None] | None,
                 kubeconfig: str | None = None, *, ray_calls: RayCalls | None = None,
                 clock: Callable[[], float] = time.monotonic, start_watchdog: bool = True) -> None:
        self.reservation = reservation
        self._ray = ray_calls or RayCalls.real()
        self._clock = clock
        self._kubeconfig = kubeconfig  # for the finisher, which builds its own client the same way
        self.placement_group: Any = None  # the Ray PG, created once the reserved Ray nodes joined
        self._pg_created = threading.Event()
        self._pg_lock = threading.Lock()  # held while the Ray PG is created or removed
        self._pg_removed = False  # the Ray PG was removed (it is never created again)
        self._progress = Progress.of(progress)  # logged at INFO, and the caller's callback if any
        self._released = False  # a release began: no Ray PG is created any more, the watchdog stops
        self._release_complete = False  # released (or handed to the finisher): remove() is a no-op
        self._done = threading.Event()  # set once a release attempt has ended, successful or not
        self._lock = threading.Lock()  # one release attempt at a time
        self.error: str | None = None
        self._deadline = clock() + reservation.request.timeout_s
        self.guard = Guard.of(reservation, clock, self._progress)  # the starvation guard (guard/holder.py), or None
        self.backfill = Backfill.of(reservation, clock, self._progress)  # an unguarded hinted gang (guard/backfill.py)
        self.watchdog = Watchdog(self, clock)
        if start_watchdog:
            self.watchdog.start()

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

    # -- the async face: the same contracts, never blocking the event loop

    async def ready_async(self, poll_s: float = POLL_S) -> Any:
        """Wait, without blocking the loop, until every bundle is placed; the Ray PG's ready value.

        ``await pg.ready_async()`` is ``ray.get(pg.ready())`` for asyncio: it waits for the Ray placement
        group to exist (the reserved pods' Ray nodes joined), then awaits Ray's ready ObjectRef. Raises
        PermanentError as ``ready()`` does: once a release or rollback began, or past the reservation's
        deadline plus the watchdog's join time.
        """
        while not self._released and not self._pg_created.is_set():
            if self._overdue():
                raise self._not_ready_error()
            await asyncio.sleep(poll_s)
        if self._released:
            raise self._released_error()
        ref = self.placement_group.ready()
        return await ref if inspect.isawaitable(ref) else ref

    async def wait_async(self, timeout_s: float | None = None, poll_s: float = POLL_S) -> bool:
        """``wait()`` for asyncio: True once the state ConfigMap says ready; False on ``timeout_s``, a
        rollback or the reservation's deadline. Never waits past the deadline plus the join time."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout_s is None else loop.time() + timeout_s
        while not self._released:
            if self.state == ReservationState.READY:
                return True
            if (deadline is not None and loop.time() > deadline) or self._overdue():
                return False
            await asyncio.sleep(poll_s)
        while not self._done.is_set() and (deadline is None or loop.time() < deadline):
            await asyncio.sleep(poll_s)  # the release attempt in flight ends (as wait() waits for it)
        return False

    async def remove_async(self) -> None:
        """``remove()`` in a worker thread: the placement group and the reservation released (idempotent).
        Raises the release's error, as ``remove()`` does; awaiting it again tries again."""
        await asyncio.to_thread(self.remove)

    async def interrupt_async(self, reason: str = "cancelled") -> None:
        """``interrupt()`` in a worker thread: released within its budget, the rest left to the finisher."""
        await asyncio.to_thread(self.interrupt, reason)

    # -- waiting: shared by both faces

    def _overdue(self) -> bool:  # past the deadline by more than a watchdog step may take, not ready
        return self.state != ReservationState.READY and self._clock() > self._deadline + WATCHDOG_JOIN_S

    def _not_ready_error(self) -> PermanentError:
        return PermanentError(f"reservation {self.plan.reservation_group} not ready within timeout_s="
                              f"{self.reservation.request.timeout_s:g} (state {self.state.value}); "
                              "the watchdog rolls it back")

    def _released_error(self) -> PermanentError:
        return PermanentError(f"reservation {self.plan.reservation_group} "
                              + (f"rolled back: {self.error}" if self.error else "released"))

    # -- the Ray placement group: created by the watchdog, removed by a release

    def _create_ray_pg(self) -> None:
        """The Ray PG, pinned by ``bundle_label_selector`` to the reserved Ray nodes (all present now:
        a PG created before its nodes exist can sit PENDING long after they join).

        Created under ``_pg_lock``, and only while no release has begun; a
        release that began while Ray was creating it and gave up waiting for
        the lock finds the PG removed here.
        """
        req = self.reservation.request
        selector = {LABEL_RESERVATION: self.plan.reservation_group}
        with self._pg_lock:
            if self._released or self.placement_group is not None:
                return
            self.placement_group = self._ray.placement_group(
                [dict(b.resources) for b in req.bundles], strategy=req.strategy.value, name=req.name,
                bundle_label_selector=[dict(selector) for _ in req.bundles])
            if self._released:
                self._remove_ray_pg_locked()
                return
        self._pg_created.set()
        self._progress(f"reservation {self.plan.reservation_group}: {self.plan.pod_count} Ray nodes joined; "
                       f"placement group created on them")

    def _remove_ray_pg(self, wait_s: float) -> None:
        """Remove the Ray PG if one exists, once; waits up to ``wait_s`` for a creation in flight (after that
        the watchdog removes what it creates, since ``_released`` is set)."""
        if self._pg_lock.acquire(timeout=max(0.0, wait_s)):
            self._remove_ray_pg_locked()  # never raises
            self._pg_lock.release()

    def _remove_ray_pg_locked(self) -> None:
        if self.placement_group is not None and not self._pg_removed:
            self._pg_removed = True
            try:  # after ray.shutdown() (Ray's atexit hook included) Ray removed it with the job: not an error
                self._ray.remove_placement_group(self.placement_group)
            except Exception as e:  # noqa: BLE001 - Ray may be gone at exit; the reservation still goes
                if not isinstance(e, RayDisconnected):
                    self._progress(f"removing the Ray placement group failed: {e}")

    # -- the release

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
            self.watchdog.stop(WATCHDOG_JOIN_S if budget_s is None else min(0.5, budget_s))  # step in flight
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
        if self.guard is not None:  # its blockers also go with its ticket (ownerReference), or the next holder
            _attempt(self._progress, "ending the guard", lambda: self.guard.release(failure or "released"))
        if self.backfill is not None:  # its ask goes; else the holder deletes it once it looks unchanged for 30 s
            _attempt(self._progress, "withdrawing the backfill ask", self.backfill.release)
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


def _attempt(progress: Callable[[str], None], what: str, action: Callable[[], Any]) -> bool:
    try:
        action()
        return True
    except Exception as e:  # noqa: BLE001 - the watchdog must not die; the next step tries again
        progress(f"watchdog: {what} failed, retrying: {e}")
        return False


# ---------------------------------------------------------------- the watchdog a handle owns

def _api_access_lost_note(group: str, e: ForbiddenError) -> str:
    """What the driver says, once, when the API server refuses its heartbeat (401/403)."""
    return (f"watchdog: this driver lost access to the Kubernetes API: its heartbeat of reservation {group} "
            f"was refused ({e}); its token expired or its RoleBinding was revoked. The gang is kept: the "
            "sidecar's garbage collection takes Ray's word (this job alive, its placement group CREATED) over "
            "the heartbeat, and releases the reservation once the job ends. The heartbeat is retried quietly; "
            "remove_placement_group() needs API access again (else the sidecar releases it when the job ends).")


class Watchdog:
    """One thread that follows its handle's reservation until ready or released.

    Each step (every ``WATCH_EVERY_S``, backing off to ``WATCH_BACKOFF_MAX_S`` after failed writes) observes
    the reserved pods, runs the starvation guard's step (guard/holder.py) or the backfill's (guard/backfill.py),
    has the handle create the Ray placement group once the reserved Ray nodes joined, records its id, marks
    the reservation ready, heartbeats the state ConfigMap, says how the wait goes every ``WAIT_LINE_EVERY_S``
    until ready (one progress line), and rolls back (the handle's release) past the deadline. It stops when a release begins (``stop``). ``clock``: monotonic seconds, the handle's.
    """

    def __init__(self, pg: GangPlacementGroup, clock: Callable[[], float]) -> None:
        self._pg = pg
        self._clock = clock
        self._stop = threading.Event()
        self._pg_recorded = False  # the Ray PG's id is on the state ConfigMap
        self._last_beat_s = float("-inf")
        self._last_wait_line_s = clock()  # the first wait line comes WAIT_LINE_EVERY_S after the reservation
        self._ray_nodes_joined = 0  # the reserved Ray nodes alive at the last look (once the pods are bound)
        self._api_access_lost = False  # a heartbeat got 401/403 and the driver said so (once); reset by the next beat that lands
        self.thread = threading.Thread(target=self._run, name=f"raygpu-{pg.plan.gang_name}", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def stop(self, join_s: float) -> None:
        """Stop stepping; from another thread, wait up to ``join_s`` for the step in flight."""
        self._stop.set()
        if threading.current_thread() is not self.thread and self.thread.is_alive():
            self.thread.join(join_s)

    def _run(self) -> None:
        failures = 0
        while not self._stop.is_set():
            outcome = self.step()
            if outcome == "done":
                return
            failures = 0 if outcome == "ok" else failures + 1
            self._stop.wait(min(WATCH_EVERY_S * 2 ** failures, WATCH_BACKOFF_MAX_S))

    def step(self) -> str:
        """One watchdog step: "ok", "retry" (a write failed: the next step tries it again) or "done".

        Each lifecycle write (a transition, the PG id, the heartbeat) is
        attempted on its own, so one that fails neither skips the others nor
        the deadline; the in-memory state only follows a write that landed.
        READY needs the PG id recorded (the sidecar's GC checks the PG by it).
        Past the deadline and not READY: roll back, "done".
        """
        pg, say = self._pg, self._pg._progress
        rsv, ok = pg.reservation, True
        if not pg._ray.connected():  # ray.shutdown() without remove(): the job ended, Ray removed its PG
            gone = "the Ray driver disconnected (ray.shutdown()) before removing its placement group"
            _attempt(say, "releasing after the driver disconnected", lambda: pg._finish(gone, blocking=False))
            return "done"
        if rsv.state in (ReservationState.RESERVED, ReservationState.ADMITTED):
            before = rsv.state
            ok &= _attempt(say, "observing the pods", rsv.observe)
            if rsv.state != before:
                say(f"reservation {rsv.plan.reservation_group}: {rsv.state.value}")
        if pg.guard is not None and not pg.guard.done:
            ok &= _attempt(say, "guard step", lambda: pg.guard.step(rsv.state))
        if pg.backfill is not None and not pg.backfill.done:
            ok &= _attempt(say, "backfill step", lambda: pg.backfill.step(rsv.state))
        if rsv.state == ReservationState.BOUND and pg.placement_group is None:
            ok &= _attempt(say, "creating the placement group", lambda: self._reserved_ray_nodes()
                           >= rsv.plan.pod_count and pg._create_ray_pg())
        if pg.placement_group is not None and not pg._pg_removed and not self._pg_recorded:
            ok &= _attempt(say, "recording the placement group id", self._record_pg)
        if rsv.state == ReservationState.BOUND and self._pg_recorded:
            ok &= _attempt(say, "marking the reservation ready", self._mark_ready)
        failed = pg.guard.failed if pg.guard is not None else None  # the hold ran out after its swap
        if rsv.state == ReservationState.FAILED:  # observe() found the gang cannot hold (its note says why)
            failed = rsv.history[-1] if rsv.history else "failed"
        if rsv.state != ReservationState.READY and (self._clock() > pg._deadline or failed):
            try:
                pg._finish(failed or f"not ready within timeout_s={rsv.request.timeout_s:g} (state {rsv.state.value})",
                           blocking=False)
            except Exception as e:  # noqa: BLE001 - reported; remove() again, or the sidecar's GC, finishes it
                say(f"watchdog: rollback of {rsv.plan.reservation_group} failed ({e}); remove() tries "
                    "again, else the sidecar's garbage collection finishes it")
            return "done"
        if rsv.state != ReservationState.READY and self._clock() - self._last_wait_line_s >= WAIT_LINE_EVERY_S:
            self._last_wait_line_s = self._clock()
            say(self._wait_line())
        if self._clock() - self._last_beat_s > HEARTBEAT_EVERY_S:
            try:
                rsv.heartbeat(time.time())
                self._last_beat_s = self._clock()
                if self._api_access_lost:
                    self._api_access_lost = False
                    say(f"watchdog: the Kubernetes API accepts this driver's heartbeat of reservation "
                        f"{rsv.plan.reservation_group} again")
            except ForbiddenError as e:  # token expired, RoleBinding revoked: say it once, keep beating quietly
                if not self._api_access_lost:
                    self._api_access_lost = True
                    note = _api_access_lost_note(rsv.plan.reservation_group, e)
                    say.warning(note)
                ok = False
            except NotFoundError:  # the state ConfigMap is gone: someone released it (the sidecar's GC?)
                gone = "the reservation's state ConfigMap was deleted (by the sidecar's garbage collection?)"
                if rsv.state != ReservationState.READY:  # waiting for nothing: roll back now, not at the deadline
                    _attempt(say, "releasing what is left", lambda: pg._finish(gone, blocking=False))
                    return "done"
                say(f"watchdog: {gone}; the running placement group is left alone, remove() releases "
                    "what is left")  # a running job is never broken by us; no more beats
                return "done"
            except Exception as e:  # noqa: BLE001 - the watchdog must not die; the next step tries again
                say(f"watchdog: heartbeat failed, retrying: {e}")
                ok = False
        return "ok" if ok else "retry"

    def _wait_line(self) -> str:
        """How the wait goes, in one line: the state, the time waited of ``timeout_s``, what it waits for."""
        pg = self._pg
        rsv, n = pg.reservation, pg.plan.pod_count
        timeout_s = rsv.request.timeout_s
        waited_s = self._clock() - (pg._deadline - timeout_s)
        if rsv.state == ReservationState.BOUND:
            present, _, _ = rsv.pods_seen
            what = f"{present} pods Running; {self._ray_nodes_joined}/{n} of their Ray nodes joined" + (
                "" if pg.placement_group is None else "; the placement group is created, its bundles not yet placed")
        else:
            present, scheduled, running = rsv.pods_seen
            what = f"{present}/{n} pods exist, {scheduled} scheduled, {running} Running"
        return (f"reservation {pg.plan.reservation_group}: still {rsv.state.value} after {waited_s:.0f} s of "
                f"timeout_s={timeout_s:g} ({what})")

    def _reserved_ray_nodes(self) -> int:
        group = self._pg.plan.reservation_group
        self._ray_nodes_joined = sum(1 for n in self._pg._ray.nodes()
                   if n.get("Alive") and (n.get("Labels") or {}).get(LABEL_RESERVATION) == group)
        return self._ray_nodes_joined

    def _record_pg(self) -> None:
        self._pg.reservation.record_placement_group(self._pg.placement_group.id.hex())
        self._pg_recorded = True

    def _mark_ready(self) -> None:
        pg = self._pg
        if pg._ray.placement_group_table(pg.placement_group).get("state") == "CREATED":
            pg.reservation.transition(ReservationState.READY, "all bundles placed on the reserved Ray nodes")
            pg._progress(f"placement group {pg.reservation.request.name} ready on "
                         f"{pg.plan.pod_count} reserved pods")


# ---------------------------------------------------------------- making one: blocking and async

def placement_group(bundles: list[dict[str, float]], strategy: str | None = None, *, cluster: str,
                    namespace: str = "default", backend: str | None = None, timeout_s: float = 600,
                    name: str | None = None, queue: str | None = None, kubeconfig: str | None = None,
                    progress: Callable[[str], None] | None = None, guard: bool | None = None,
                    expected_runtime_s: float | None = None, topology_strategy: dict | None = None,
                    request_timeout_s: float | None = None, scheduler_name: str | None = None) -> GangPlacementGroup:
    """Create a Ray placement group whose bundles get their own all-or-nothing Kubernetes gang.

    Call inside a Ray driver (``ray.init`` done) of RayCluster ``namespace/cluster``. ``backend``
    (coscheduling|kueue|volcano|workload|none) and ``queue`` default to the cluster's ``raygpu.io/gang-backend`` /
    ``raygpu.io/queue`` annotations. Returns once the gang is reserved; ``ray.get(pg.ready())`` (or
    ``pg.wait()``) waits for the pods, their Ray nodes and the placement group on them.
    ``guard`` (default: annotation ``raygpu.io/guard``, off): docs/guard.md. ``expected_runtime_s`` (seconds > 0,
    finite): how long the job will hold the placement group; on its pods, it tells a guard's hold when they
    end, and lets an unguarded gang backfill onto nodes a guard holds when it ends before the hold starts.
    ``strategy`` or Ray's ``topology_strategy`` (e.g. ``{"topology.kubernetes.io/zone": "STRICT_PACK"}``): docs/gang.md.
    ``request_timeout_s`` (finite, in (0, 600]; default ``$RAYGPU_REQUEST_TIMEOUT_S``, else 15): the deadline of
    the first contact with Kubernetes (the kubeconfig's exec credential plugin, then API discovery); past it a
    TransientError says which step hung, and nothing was created.
    ``progress`` (optional): called with each progress line (the plan, each state, a wait line every
    ``WAIT_LINE_EVERY_S`` until ready, the release); every line is also logged at INFO on ``raygpu.gang.api``.
    ``scheduler_name`` (backend coscheduling only): the schedulerName of the scheduler profile that runs the
    Coscheduling plugin, a DNS-1123 subdomain name (default: annotation ``raygpu.io/gang-scheduler-name``, else
    ``scheduler-plugins-scheduler``); the reserved pods ask for it.
    Raises InfeasibleError / PermanentError before anything is created for requests that cannot be planned
    (too big a bundle, unknown strategy, backend or cluster, non-positive amounts, a bad guard or runtime
    hint, a bad scheduler name or one given for a backend other than coscheduling, the guard without backend
    none or without raygpu's blocker PriorityClass), and MissingExtraError (a PermanentError) first of all
    when Ray is not installed: it names the extra, ``pip install "raygpu[ray]"``.
    """
    ray = import_ray("raygpu.placement_group")
    if not ray.is_initialized():
        raise PermanentError("raygpu.placement_group needs a connected Ray driver: call ray.init(address=...) first")
    say = Progress.of(progress)  # every line also logged at INFO (logger raygpu.gang.api)
    job = ray.get_runtime_context().get_job_id()
    req = gang_request(bundles, strategy, cluster, namespace, backend, timeout_s, name, queue, job, guard,
                       expected_runtime_s, topology_strategy, scheduler_name)
    kube = KubeAdapter(kubeconfig, first_contact_timeout_s=request_timeout_s)
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


async def placement_group_async(bundles: list[dict[str, float]], strategy: str | None = None,
                                **kwargs: Any) -> GangPlacementGroup:
    """``raygpu.placement_group(...)`` for asyncio: the reservation is made in a worker thread.

    Same arguments, result and errors. If the awaiting task is cancelled while the reservation is being
    made, the reservation is released (``interrupt()``) as soon as it exists, and the cancellation raised.
    """
    fut = asyncio.get_running_loop().run_in_executor(None, functools.partial(placement_group, bundles, strategy,
                                                                             **kwargs))
    try:
        return await asyncio.shield(fut)
    except asyncio.CancelledError:
        fut.add_done_callback(_release_when_made)
        raise


def _release_when_made(fut: asyncio.Future[GangPlacementGroup]) -> None:
    if fut.cancelled() or fut.exception() is not None:
        return
    pg = fut.result()
    threading.Thread(target=pg.interrupt, args=("the awaiting task was cancelled",), daemon=False,
                     name=f"raygpu-cancel-{pg.plan.gang_name}").start()


@asynccontextmanager
async def gang_placement_group_async(bundles: list[dict[str, float]], strategy: str | None = None,
                                     **kwargs: Any) -> AsyncIterator[GangPlacementGroup]:
    """``async with raygpu.gang_placement_group_async(...) as pg:`` - released on exit, error or cancellation
    (a cancellation releases within the interrupt budget, as Ctrl-C does for the blocking form)."""
    pg = await placement_group_async(bundles, strategy, **kwargs)
    try:
        yield pg
    except (asyncio.CancelledError, KeyboardInterrupt):
        await asyncio.shield(pg.interrupt_async("the awaiting task was cancelled"))
        raise
    finally:
        await asyncio.shield(pg.remove_async())  # a no-op after interrupt


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
