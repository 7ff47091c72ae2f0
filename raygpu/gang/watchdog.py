"""The watchdog of a gang placement group: one thread that follows its reservation until ready or released.

Each step (every ``WATCH_EVERY_S``, backing off to ``WATCH_BACKOFF_MAX_S`` after failed writes) observes
the reserved pods, runs the starvation guard's step (gang/guard.py) or the backfill's (gang/backfill.py), creates the Ray placement group once
the reserved Ray nodes joined, records its id, marks the reservation ready, heartbeats the state ConfigMap,
and rolls back past the deadline. Split out of gang/api.py (the handle and its release), unchanged.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Callable

from raygpu.errors import ForbiddenError, NotFoundError
from raygpu.gang.ray_calls import RayDisconnected
from raygpu.model.gang import ReservationState
from raygpu.model.labels import LABEL_RESERVATION

HEARTBEAT_EVERY_S = 10.0
WATCH_EVERY_S = 0.5  # the watchdog's step
WATCH_BACKOFF_MAX_S = 4.0  # after failed writes the step doubles up to this, never more
# A lost API access is logged as a warning too: ``progress`` is silent by default, and the driver must say it
log = logging.getLogger(__name__)


class Watchdog:
    """The watchdog steps of GangPlacementGroup (gang/api.py), which holds the state they use."""

    _api_access_lost = False  # a heartbeat got 401/403 and the driver said so (once); reset by the next beat that lands

    def _reserved_ray_nodes(self) -> int:
        group = self.plan.reservation_group
        return sum(1 for n in self._ray.nodes()
                   if n.get("Alive") and (n.get("Labels") or {}).get(LABEL_RESERVATION) == group)

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

    def _watch(self) -> None:
        failures = 0
        while not self._stop.is_set():
            outcome = self._step()
            if outcome == "done":
                return
            failures = 0 if outcome == "ok" else failures + 1
            self._stop.wait(min(WATCH_EVERY_S * 2 ** failures, WATCH_BACKOFF_MAX_S))

    def _attempt(self, what: str, action: Callable[[], Any]) -> bool:
        try:
            action()
            return True
        except Exception as e:  # noqa: BLE001 - the watchdog must not die; the next step tries again
            self._progress(f"watchdog: {what} failed, retrying: {e}")
            return False

    def _step(self) -> str:
        """One watchdog step: "ok", "retry" (a write failed: the next step tries it again) or "done".

        Each lifecycle write (a transition, the PG id, the heartbeat) is
        attempted on its own, so one that fails neither skips the others nor
        the deadline; the in-memory state only follows a write that landed.
        READY needs the PG id recorded (the sidecar's GC checks the PG by it).
        Past the deadline and not READY: roll back, "done".
        """
        rsv, ok = self.reservation, True
        if not self._ray.connected():  # ray.shutdown() without remove(): the job ended, Ray removed its PG
            gone = "the Ray driver disconnected (ray.shutdown()) before removing its placement group"
            self._attempt("releasing after the driver disconnected", lambda: self._finish(gone, blocking=False))
            return "done"
        if rsv.state in (ReservationState.RESERVED, ReservationState.ADMITTED):
            before = rsv.state
            ok &= self._attempt("observing the pods", rsv.observe)
            if rsv.state != before:
                self._progress(f"reservation {rsv.plan.reservation_group}: {rsv.state.value}")
        if self.guard is not None and not self.guard.done:
            ok &= self._attempt("guard step", lambda: self.guard.step(rsv.state))
        if self.backfill is not None and not self.backfill.done:
            ok &= self._attempt("backfill step", lambda: self.backfill.step(rsv.state))
        if rsv.state == ReservationState.BOUND and self.placement_group is None:
            ok &= self._attempt("creating the placement group", lambda: self._reserved_ray_nodes()
                                >= rsv.plan.pod_count and self._create_ray_pg())
        if self.placement_group is not None and not self._pg_removed and not self._pg_recorded:
            ok &= self._attempt("recording the placement group id", self._record_pg)
        if rsv.state == ReservationState.BOUND and self._pg_recorded:
            ok &= self._attempt("marking the reservation ready", self._mark_ready)
        failed = self.guard.failed if self.guard is not None else None  # the hold ran out after its swap
        if rsv.state == ReservationState.FAILED:  # observe() found the gang cannot hold (its note says why)
            failed = rsv.history[-1] if rsv.history else "failed"
        if rsv.state != ReservationState.READY and (self._clock() > self._deadline or failed):
            try:
                self._finish(failed or f"not ready within timeout_s={rsv.request.timeout_s:g} (state {rsv.state.value})",
                             blocking=False)
            except Exception as e:  # noqa: BLE001 - reported; remove() again, or the sidecar's GC, finishes it
                self._progress(f"watchdog: rollback of {rsv.plan.reservation_group} failed ({e}); remove() tries "
                               "again, else the sidecar's garbage collection finishes it")
            return "done"
        if self._clock() - self._last_beat_s > HEARTBEAT_EVERY_S:
            try:
                rsv.heartbeat(time.time())
                self._last_beat_s = self._clock()
                if self._api_access_lost:
                    self._api_access_lost = False
                    self._progress(f"watchdog: the Kubernetes API accepts this driver's heartbeat of reservation "
                                   f"{rsv.plan.reservation_group} again")
            except ForbiddenError as e:  # token expired, RoleBinding revoked: say it once, keep beating quietly
                if not self._api_access_lost:
                    self._api_access_lost = True
                    note = self._api_access_lost_note(e)
                    log.warning(note)
                    self._progress(note)
                ok = False
            except NotFoundError:  # the state ConfigMap is gone: someone released it (the sidecar's GC?)
                gone = "the reservation's state ConfigMap was deleted (by the sidecar's garbage collection?)"
                if rsv.state != ReservationState.READY:  # waiting for nothing: roll back now, not at the deadline
                    self._attempt("releasing what is left", lambda: self._finish(gone, blocking=False))
                    return "done"
                self._progress(f"watchdog: {gone}; the running placement group is left alone, remove() releases "
                               "what is left")  # a running job is never broken by us; no more beats
                return "done"
            except Exception as e:  # noqa: BLE001 - the watchdog must not die; the next step tries again
                self._progress(f"watchdog: heartbeat failed, retrying: {e}")
                ok = False
        return "ok" if ok else "retry"

    def _api_access_lost_note(self, e: ForbiddenError) -> str:
        """What the driver says, once, when the API server refuses its heartbeat (401/403)."""
        group = self.reservation.plan.reservation_group
        return (f"watchdog: this driver lost access to the Kubernetes API: its heartbeat of reservation {group} "
                f"was refused ({e}); its token expired or its RoleBinding was revoked. The gang is kept: the "
                "sidecar's garbage collection takes Ray's word (this job alive, its placement group CREATED) over "
                "the heartbeat, and releases the reservation once the job ends. The heartbeat is retried quietly; "
                "remove_placement_group() needs API access again (else the sidecar releases it when the job ends).")

    def _record_pg(self) -> None:
        self.reservation.record_placement_group(self.placement_group.id.hex())
        self._pg_recorded = True

    def _mark_ready(self) -> None:
        if self._ray.placement_group_table(self.placement_group).get("state") == "CREATED":
            self.reservation.transition(ReservationState.READY, "all bundles placed on the reserved Ray nodes")
            self._progress(f"placement group {self.reservation.request.name} ready on "
                           f"{self.plan.pod_count} reserved pods")
