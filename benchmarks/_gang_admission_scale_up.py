"""The fifth policy of the gang-admission replay, ``scale-up``: unmodified jobs plus the sidecar's gang scale-up.

A model of the sidecar's gang scale-up (being built in ``raygpu/reclaim``; modelled here from its
specification, not imported), next to ``raygpu``, whose jobs call raygpu and get their reservation at once:

* **Jobs do not call raygpu.** A gang's placement group (PG) sits pending in Ray from its submission, and
  nothing is made for it until the sidecar acts. ASSUMPTION: the Ray autoscaler does not scale up for it
  (otherwise it would be the ``pods`` policy until the sidecar acts). The gang's wait counts from its
  submission, as in every policy.
* **The sidecar's cycle** runs every ``interval_s`` (10 s: ``raygpu sidecar --interval-s``'s default), at
  ``k * interval_s`` (every pool's sidecar on the same grid; arrivals are Poisson, so the phase does not
  matter). A PG is first seen at the first cycle at or after its submission and is acted on at the first
  cycle at least ``grace_s`` (10 s) after that: with the defaults, 10-20 s after submission at the
  earliest. This reaction delay is what ``raygpu`` does not pay.
* **Fits on existing free workers?** Never here: the replay has no idle Ray workers (a pod's GPUs go back
  when its job ends, in every policy), so every pending gang PG needs a reservation.
* **One reservation per PG at a time**: ``plan_gang`` on the free GPUs per node of the gang's pool at that
  cycle, the same reservation ``raygpu`` makes at submission; its pods join the pod queue and bind all
  together or none (``Sim.schedule``'s all-or-nothing gate) whenever they fit, as ``raygpu``'s do.
* **In-flight cap, oldest first.** Per cluster at most ``in_flight`` (4) reservations are made and not yet
  bound. A cluster is a pool: one RayCluster, and its sidecar, per node pool (the guard's scope; with
  ``--pools 1`` one for the whole cluster). A cycle gives the free slots to the PGs it may act on, oldest
  submission first; the others wait for a later cycle.
* **Timeout, rollback, back-off.** A reservation still not bound ``timeout_s`` (600 s) after it was made is
  rolled back at the cycle that finds it so (its pods are deleted; they held nothing) and its PG may get a
  new one ``backoff_s * 2**(n - 1)`` (30 s, doubling, at most ``backoff_cap_s`` = 600 s) after its n-th
  rollback, planned on the free GPUs of then.

Singles are placed as in every policy. Half-placed GPU-h stay 0 (all-or-nothing) and nothing is held idle.
Deterministic: no randomness beyond the jobs'. Cost: a cycle event every ``interval_s`` only while some PG
is pending or reserved, and a cycle that changes nothing does not run the scheduling pass.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass

import numpy as np

from benchmarks._common import percentile
from benchmarks._gang_admission_sim import Job, Sim, raygpu_cluster

CYCLE = 4  # event kind: one sidecar cycle (every pool's sidecar: same grid)
INTERVAL_S = 10.0  # raygpu sidecar --interval-s default (raygpu/commands/sidecar.py)
GRACE_S = 10.0  # a pending PG first seen at least this long ago may get a reservation
IN_FLIGHT = 4  # reservations made and not yet bound, per cluster (pool)
TIMEOUT_S = 600.0  # a reservation not bound after this is rolled back
BACKOFF_S, BACKOFF_CAP_S = 30.0, 600.0  # before the n-th retry: 30 s * 2**(n-1), at most 600 s
_EPS = 1e-6

# A gang PG's states in this model, and why each edge is taken.
TRANSITIONS: dict[str, set[str]] = {
    "pending": {"reserved"},  # a cycle >= grace after first seeing it (and after its back-off) had a free slot
    "reserved": {"bound", "pending"},  # its pods all bound at once; or the timeout passed: rolled back, back-off
    "bound": set(),  # the gang runs: the placement group is placed
}


@dataclass
class PendingPG:
    """One gang's placement group, as the sidecar tracks it."""

    job: Job
    seen_s: float  # the first cycle at or after its submission
    state: str = "pending"
    retry_s: float = 0.0  # no new reservation before this (back-off after a rollback)
    rollbacks: int = 0
    reserved_s: float | None = None  # when its reservation in flight was made
    first_reserved_s: float | None = None

    @property
    def key(self) -> tuple[float, int]:
        return self.job.arrive, self.job.jid  # oldest submission first

    def to(self, state: str) -> None:
        if state not in TRANSITIONS[self.state]:
            raise AssertionError(f"{self.job.name}: {self.state} -> {state} is not a transition")
        self.state = state


def backoff_s(rollbacks: int, base_s: float = BACKOFF_S, cap_s: float = BACKOFF_CAP_S) -> float:
    """Wait before the retry that follows the ``rollbacks``-th rollback (>= 1): base doubling, capped."""
    return min(base_s * 2.0 ** (rollbacks - 1), cap_s)


class ScaleUpSim(Sim):
    """``Sim`` with unmodified jobs and the sidecar's gang scale-up; see the module docstring."""

    def __init__(self, free: np.ndarray, jobs: list[Job], give_up_s: float, pools: np.ndarray | None = None, *,
                 interval_s: float = INTERVAL_S, grace_s: float = GRACE_S, in_flight: int = IN_FLIGHT,
                 timeout_s: float = TIMEOUT_S, backoff_s: float = BACKOFF_S,
                 backoff_cap_s: float = BACKOFF_CAP_S, packing: str = "first-fit") -> None:
        if interval_s <= 0 or grace_s < 0 or in_flight < 1 or timeout_s <= 0 or backoff_s < 0:
            raise ValueError("scale-up: interval_s > 0, grace_s >= 0, in_flight >= 1, timeout_s > 0, backoff_s >= 0")
        super().__init__("scale-up", free, jobs, give_up_s, pools, packing=packing)
        self.interval_s, self.grace_s, self.in_flight = interval_s, grace_s, in_flight
        self.timeout_s, self.backoff_s, self.backoff_cap_s = timeout_s, backoff_s, backoff_cap_s
        self.cluster = raygpu_cluster()  # the RayCluster plan_gang copies worker groups from
        for j in jobs:
            if j.gang:
                j.pods, j.gate = [], 0  # planned when the sidecar reserves, against the free GPUs of that cycle
        self.pending: list[PendingPG] = []  # gang PGs with no reservation, oldest submission first
        self.reserved: dict[int, PendingPG] = {}  # jid -> PG whose reservation is made and not yet bound
        self.in_flight_of: dict[int, int] = {}  # scope (pool) -> reservations in flight
        self.last_cycle_k = -1
        self.queued_cycle_k: int | None = None
        self.pgs: dict[int, PendingPG] = {}
        # (job name, made at, ended at, "bound" | "rolled back") of every reservation, in the order they ended
        self.history: list[tuple[str, float, float, str]] = []
        self.reservations = self.rollbacks = self.cycles = 0
        self.max_in_flight = 0  # most reservations in flight at once in one scope (<= in_flight)

    @staticmethod
    def scope(j: Job) -> int:
        return max(j.pool, 0)  # one RayCluster (and sidecar) per pool; one for all when there is one pool

    # ------------------------------------------------------------ the PG's timeline
    def on_arrive(self, j: Job) -> None:
        if not j.gang:
            self.waiting.append(j)  # singles: as in every policy
            return
        k = math.ceil(j.arrive / self.interval_s - 1e-12)
        pg = PendingPG(j, seen_s=k * self.interval_s)
        self.pgs[j.jid] = pg
        self.pending.append(pg)  # arrivals come in submission order: the list stays sorted
        self._queue_cycle()

    def start(self, j: Job) -> None:
        pg = self.reserved.pop(j.jid, None)
        if pg is not None:  # its reservation's pods all bound
            pg.to("bound")
            self.in_flight_of[self.scope(j)] -= 1
            self.history.append((j.name, pg.reserved_s, self.now, "bound"))
        super().start(j)

    def _queue_cycle(self) -> None:
        """One cycle event at the next grid time (this one's successor inside a cycle) while any PG waits."""
        if self.queued_cycle_k is not None or not (self.pending or self.reserved):
            return
        k = max(math.ceil(self.now / self.interval_s - 1e-12), self.last_cycle_k + 1)
        self.queued_cycle_k = k
        self.push(k * self.interval_s, CYCLE, 0)

    # ------------------------------------------------------------ the sidecar's cycle
    def on_other_event(self, kind: int, j: Job) -> bool:
        if kind != CYCLE:
            return False
        self.last_cycle_k, self.queued_cycle_k = self.queued_cycle_k, None
        self.cycles += 1
        changed = self._roll_back_timed_out()
        changed = self._reserve_oldest() or changed
        self._queue_cycle()
        return changed  # True: the scheduling pass binds what fits now

    def _roll_back_timed_out(self) -> bool:
        """1. Every reservation not bound ``timeout_s`` after it was made: delete its pods, back-off its PG."""
        late = [pg for pg in self.reserved.values() if self.now >= pg.reserved_s + self.timeout_s - _EPS]
        for pg in late:
            j = pg.job
            del self.reserved[j.jid]
            self.in_flight_of[self.scope(j)] -= 1
            self.waiting.remove(j)
            j.pods, j.gate = [], 0  # nothing was bound: nothing to give back
            pg.to("pending")
            pg.rollbacks += 1
            pg.retry_s = self.now + backoff_s(pg.rollbacks, self.backoff_s, self.backoff_cap_s)
            bisect.insort(self.pending, pg, key=lambda p: p.key)
            self.rollbacks += 1
            self.history.append((j.name, pg.reserved_s, self.now, "rolled back"))
        return bool(late)

    def _reserve_oldest(self) -> bool:
        """2. Nominate the PGs past grace and back-off, oldest first, while their cluster has a free slot;
        3. reserve each (plan_gang on its pool's free GPUs now): its pods join the queue, all-or-nothing."""
        made, keep = [], []
        for pg in self.pending:
            s = self.scope(pg.job)
            ripe = self.now >= pg.seen_s + self.grace_s - _EPS and self.now >= pg.retry_s - _EPS
            if ripe and self.in_flight_of.get(s, 0) < self.in_flight:
                made.append(pg)
                self.in_flight_of[s] = self.in_flight_of.get(s, 0) + 1
                self.max_in_flight = max(self.max_in_flight, self.in_flight_of[s])
            else:
                keep.append(pg)
        self.pending = keep
        for pg in made:
            j = pg.job
            pg.to("reserved")
            pg.reserved_s = self.now
            if pg.first_reserved_s is None:
                pg.first_reserved_s = self.now
            self.plan(j)  # j.pods, j.gate = all of them
            self.reserved[j.jid] = pg
            self.waiting.append(j)
            self.reservations += 1
        return bool(made)

    # ------------------------------------------------------------ metrics
    def extra_metrics(self) -> dict[str, object]:
        reaction = [pg.first_reserved_s - pg.job.arrive for pg in self.pgs.values() if pg.first_reserved_s is not None]
        return {"held_idle_gpu_h": 0.0, "pools": self.pools.count, "reservations": self.reservations,
                "rolled_back": self.rollbacks, "max_in_flight": self.max_in_flight, "sidecar_cycles": self.cycles,
                "reaction_p50_s": round(percentile(reaction, 50), 1),
                "reaction_p95_s": round(percentile(reaction, 95), 1),
                "scale_up": {"interval_s": self.interval_s, "grace_s": self.grace_s, "in_flight": self.in_flight,
                             "timeout_s": self.timeout_s, "backoff_s": self.backoff_s,
                             "backoff_cap_s": self.backoff_cap_s}}
