"""The fourth policy of the gang-admission replay, ``raygpu+guard``: raygpu's shapes plus the starvation guard.

A model of issue 11 item 2 (the Kubernetes-layer guard), not its code:

* **One reservation per scope.** A scope is a node pool
  (``benchmarks._gang_admission_pools``; with ``--pools 1`` the whole cluster,
  one namespace/queue). In each scope the oldest waiting gang of that pool (by
  when it joined the queue) is elected, as a Lease would elect it, only when the
  scope has no reservation. So at most one gang per scope ever holds capacity it
  cannot use yet.
* **Nodes it needs** (among its pool's). Each of its pods (largest first) goes
  to the node where it would fit soonest: the time at which the node's free
  GPUs plus the GPUs of running jobs *with a known end* ending by then cover it
  (EASY backfill's reservation). Which ends are known is the backfill mode's
  (below). A pod no node can estimate goes to the node with the most GPUs free
  now, and the reservation then has no estimated start.
* **Holding, as raygpu's blocker pods do** (raygpu/gang/guard.py: one pod per
  reserved node whose anti-affinity keeps every other tenant's new pods off
  it; running pods are never touched). Every GPU that is or becomes free on a
  reserved node, up to what the gang needs there, is held; held GPUs count as
  *held idle*. When all are held, the gang's pods go in and it starts. If the gang fits
  elsewhere in its pool first, it starts there and the holds are released.
* **Backfill** (``backfill=``): a waiting job may use held GPUs (of any
  reservation whose nodes it may use) only when its runtime hint says it ends
  by that reservation's estimated start. ASSUMPTION: a hint, where there is
  one, is the job's exact trace duration (the simulator knows it); real hints
  are rougher.

  - ``all``: every job has a hint; every running job's end is known (the
    simulator's original rule).
  - ``gangs``: the product's rule: only raygpu gangs carry a hint
    (``expected_runtime_s=``) and only they backfill; singles of other tenants
    are never let onto held nodes, and their ends are unknown (they set no
    ``activeDeadlineSeconds`` here), so a reservation has an estimated start
    only when every GPU it waits for belongs to a running gang.
  - ``none``: no hints, no backfill, nodes by most GPUs free now (``--no-hints``).
* **max-hold.** A reservation that has not started its gang by its deadline
  releases every hold, and the gang rejoins the back of the queue (an Event
  in the real guard). Deadline: with a start estimate, ``max(created,
  estimated start) + max_hold_s`` (the bound catches wrong hints and lost
  nodes); without, ``created + max_hold_s``.

Half-placed GPU-h stay 0 (all-or-nothing); the held GPUs are reported apart.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from benchmarks._gang_admission_sim import Job, Sim, fit_all

TIMEOUT = 3  # event kind: a reservation's max-hold deadline
BACKFILL = ("all", "gangs", "none")


@dataclass
class Reservation:
    job: Job
    where: list[int]  # node of each of the gang's pods
    need: np.ndarray  # GPUs the gang needs per node
    est_start_s: float  # math.inf when it cannot be estimated
    created_s: float
    deadline_s: float


class GuardSim(Sim):
    """``Sim`` with the guard; see the module docstring."""

    def __init__(self, free: np.ndarray, jobs: list[Job], give_up_s: float, max_hold_s: float = 900.0,
                 hints: bool = True, backfill: str | None = None, pools: np.ndarray | None = None) -> None:
        super().__init__("raygpu+guard", free, jobs, give_up_s, pools)
        backfill = backfill or ("all" if hints else "none")
        if backfill not in BACKFILL:
            raise ValueError(f"backfill must be one of {BACKFILL}, got {backfill!r}")
        self.held = np.zeros_like(self.free)
        self.rsv: dict[int, Reservation] = {}  # scope (pool) -> its one reservation
        self.max_hold_s, self.backfill, self.hints = max_hold_s, backfill, backfill != "none"
        self.held_idle_gpu_s = 0.0
        self.reservations = self.timeouts = self.backfilled = self.swapped = 0
        self.max_reservations = 0  # most reservations at once (<= the number of pools)

    # ------------------------------------------------------------ metrics
    def account(self, dt: float) -> None:
        super().account(dt)
        self.held_idle_gpu_s += dt * int(self.held.sum())

    def extra_metrics(self) -> dict[str, object]:
        return {"held_idle_gpu_h": round(self.held_idle_gpu_s / 3600, 1), "reservations": self.reservations,
                "reservation_timeouts": self.timeouts, "backfilled": self.backfilled,
                "started_by_reservation": self.swapped, "hints": self.hints, "backfill": self.backfill,
                "pools": self.pools.count, "max_reservations_at_once": self.max_reservations,
                "max_hold_s": self.max_hold_s}

    @staticmethod
    def scope(j: Job) -> int:
        return max(j.pool, 0)  # a gang that may go anywhere is in the one scope of a one-pool cluster

    def known_end(self, j: Job) -> bool:
        """Whether the guard knows when running job ``j`` ends (its runtime hint)."""
        return self.backfill == "all" or (self.backfill == "gangs" and j.gang)

    def may_backfill(self, j: Job) -> bool:
        return self.backfill == "all" or (self.backfill == "gangs" and j.gang)

    # ------------------------------------------------------------ the reservation
    def _avail_times(self, estimate: bool) -> np.ndarray:
        """``T[n, x]``: earliest time node ``n`` has ``x`` GPUs free for the gang (inf above its size).

        ``estimate``: from the known ends of running jobs (inf where unknown); else now + the GPUs missing now
        (a ranking by the most GPUs free now, no estimate)."""
        top = int(self.cap.max())
        x = np.arange(top + 1)[None, :]
        have = self.free[:, None]
        if not estimate:
            t = np.where(x <= have, self.now, self.now + (x - have).astype(float))
            return np.where(x <= self.cap[:, None], t, math.inf)
        t = np.where(x <= have, self.now, math.inf)
        ends: list[tuple[int, float, int]] = [(n, end, g) for jid, end in self.running.items()
                                              if self.known_end(self.jobs[jid]) for n, g in self.jobs[jid].placed]
        ends.sort()
        got = self.free.astype(np.int64).copy()
        for n, end, g in ends:  # releases per node in end order: x <= got[n] is reached at `end`
            lo, got[n] = got[n] + 1, got[n] + g
            t[n, lo:min(got[n], top) + 1] = np.minimum(t[n, lo:min(got[n], top) + 1], end)
        return t

    def _elect(self, pool: int) -> None:
        gangs = [j for j in self.waiting if j.gang and j.start is None and self.scope(j) == pool]
        if not gangs:
            return
        j = min(gangs, key=lambda j: (j.queued, j.jid))
        mask = self.pools.nodes(j.pool)
        t = self._avail_times(estimate=self.hints)
        rank = t if self.backfill == "all" else self._avail_times(estimate=False)  # fallback order
        if mask is not None:
            t, rank = np.where(mask[:, None], t, math.inf), np.where(mask[:, None], rank, math.inf)
        top = t.shape[1] - 1
        rows = np.arange(len(self.free))
        assigned = np.zeros_like(self.free)
        where = []
        for g in sorted(j.pods, reverse=True):
            want = np.minimum(assigned + g, top)
            when = np.where(assigned + g <= top, t[rows, want], math.inf)
            if not math.isfinite(when.min()):  # no known end makes room: the node with most GPUs free now
                when = np.where(assigned + g <= top, rank[rows, want], math.inf)
            n = int(np.argmin(when))
            if not math.isfinite(when[n]):
                return  # no node can ever hold this pod (not in this pool's shape)
            where.append(n)
            assigned[n] += g
        est = float(max(t[n, assigned[n]] for n in set(where))) if self.hints else math.inf
        deadline = (max(self.now, est) if math.isfinite(est) else self.now) + self.max_hold_s
        order = sorted(range(len(j.pods)), key=lambda i: -j.pods[i])
        pod_nodes = [0] * len(j.pods)
        for i, n in zip(order, where):
            pod_nodes[i] = n
        self.rsv[pool] = Reservation(j, pod_nodes, assigned, est, self.now, deadline)
        self.reservations += 1
        self.max_reservations = max(self.max_reservations, len(self.rsv))
        self.push(deadline, TIMEOUT, j.jid)
        self._top_up()

    def _top_up(self) -> None:
        """Hold every free GPU of a reserved node, up to what the gang needs there; swap when all are held."""
        for pool, r in list(self.rsv.items()):
            take = np.minimum(np.maximum(r.need - self.held, 0), self.free)
            self.free -= take
            self.held += take
            if (self.held[r.need > 0] >= r.need[r.need > 0]).all():  # every GPU held: the gang's pods go in
                j = r.job
                self.held -= r.need
                j.placed = [(n, g) for n, g in zip(r.where, j.pods)]
                j.pods = []
                del self.rsv[pool]
                self.swapped += 1
                self.start(j)

    def _release(self, pool: int) -> None:
        r = self.rsv.pop(pool)
        mine = r.need > 0  # held GPUs are only ever on the reservation's nodes
        self.free[mine] += self.held[mine]
        self.held[mine] = 0

    def on_other_event(self, kind: int, j: Job) -> bool:
        r = self.rsv.get(self.scope(j))
        if kind != TIMEOUT or r is None or r.job is not j or self.now < r.deadline_s - 1e-6:
            return False  # a stale deadline: that reservation already ended
        self._release(self.scope(j))
        self.timeouts += 1
        j.queued = self.now  # back of the queue: the next oldest gang gets its turn
        self.waiting.remove(j)
        self.waiting.append(j)
        return True

    # ------------------------------------------------------------ scheduling pass
    def _place_all(self, j: Job, where: list[int]) -> None:
        for n in where:
            g = j.pods[0]
            short = max(g - int(self.free[n]), 0)  # backfill onto held GPUs: they pass to this job
            self.held[n] -= short
            self.free[n] += short
            self.place(j, 0, n)
        j.gate = 0
        self.start(j)

    def _backfill_room(self, j: Job) -> np.ndarray | None:
        """Held GPUs ``j`` may use: of reservations it ends before (by its hint) on nodes it may use; or None."""
        if not self.may_backfill(j) or self.held.max() <= 0:
            return None
        room = None
        for r in self.rsv.values():
            if math.isfinite(r.est_start_s) and self.now + j.dur <= r.est_start_s:  # no estimate: no backfill
                part = np.where(r.need > 0, self.held, 0)
                room = part if room is None else room + part
        return None if room is None else self.avail(j, room)

    def schedule(self) -> None:
        self._top_up()
        still = []
        for j in self.waiting:
            if j.start is not None:  # started by the swap
                continue
            r = self.rsv.get(self.scope(j)) if j.gang else None
            if r is not None and j is r.job:
                if fit_all(self.avail(j, self.free + self.held), j.pods) is not None:  # fits now anyway: no need to wait
                    self._release(self.scope(j))
                    self._place_all(j, fit_all(self.avail(j), j.pods) or [])
                else:
                    still.append(j)
                continue
            where = fit_all(self.avail(j), j.pods) if self.free.max() > 0 else None
            room = self._backfill_room(j) if where is None else None
            if room is not None:
                where = fit_all(self.avail(j) + room, j.pods)
                self.backfilled += where is not None
            if where is None:
                still.append(j)
            else:
                self._place_all(j, where)
        self.waiting = still
        for pool in range(self.pools.count):
            if pool not in self.rsv:
                self._elect(pool)
        self.waiting = [j for j in self.waiting if j.start is None]  # the elected gang may have started at once
