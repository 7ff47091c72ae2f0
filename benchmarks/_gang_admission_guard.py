"""The fourth policy of the gang-admission replay, ``raygpu+guard``: raygpu's shapes plus the starvation guard.

A model of issue 11 item 2 (the Kubernetes-layer guard), not its code:

* **One reservation per scope.** The whole simulated cluster is one scope
  (one namespace/queue); the oldest waiting gang (by when it joined the
  queue) is elected, as a Lease would elect it, only when no reservation
  exists. So at most one gang ever holds capacity it cannot use yet.
* **Nodes it needs.** Each of its pods (largest first) goes to the node
  where it would fit soonest. With runtime hints: the time at which the
  node's free GPUs plus the GPUs of running jobs ending by then cover it
  (EASY backfill's reservation); without: the node with the most GPUs free now.
* **Holding, as raygpu's blocker pods do** (raygpu/gang/guard.py: one pod per
  reserved node whose anti-affinity keeps every other tenant's new pods off
  it; running pods are never touched). Every GPU that is or becomes free on a
  reserved node, up to what the gang needs there, is held; held GPUs count as
  *held idle*. When all are held, the gang's pods go in and it starts. If the gang fits
  elsewhere first, it starts there and the holds are released.
* **Backfill.** A waiting job may use held GPUs only when its runtime hint
  says it ends by the reservation's estimated start. ASSUMPTION: every job's
  hint is its exact trace duration (the simulator knows it); real hints
  (``expected_runtime_s``, a RayJob's ``activeDeadlineSeconds``) are rarer and
  rougher. Without hints nothing backfills.
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


@dataclass
class Reservation:
    job: Job
    where: list[int]  # node of each of the gang's pods
    need: np.ndarray  # GPUs the gang needs per node
    est_start_s: float  # math.inf without hints
    created_s: float
    deadline_s: float


class GuardSim(Sim):
    """``Sim`` with the guard; see the module docstring."""

    def __init__(self, free: np.ndarray, jobs: list[Job], give_up_s: float, max_hold_s: float = 900.0,
                 hints: bool = True) -> None:
        super().__init__("raygpu+guard", free, jobs, give_up_s)
        self.held = np.zeros_like(self.free)
        self.rsv: Reservation | None = None
        self.max_hold_s, self.hints = max_hold_s, hints
        self.held_idle_gpu_s = 0.0
        self.reservations = self.timeouts = self.backfilled = self.swapped = 0

    # ------------------------------------------------------------ metrics
    def account(self, dt: float) -> None:
        super().account(dt)
        self.held_idle_gpu_s += dt * int(self.held.sum())

    def extra_metrics(self) -> dict[str, object]:
        return {"held_idle_gpu_h": round(self.held_idle_gpu_s / 3600, 1), "reservations": self.reservations,
                "reservation_timeouts": self.timeouts, "backfilled": self.backfilled,
                "started_by_reservation": self.swapped, "hints": self.hints, "max_hold_s": self.max_hold_s}

    # ------------------------------------------------------------ the reservation
    def _avail_times(self) -> np.ndarray:
        """``T[n, x]``: earliest time node ``n`` has ``x`` GPUs free for the gang (inf above its size)."""
        n_nodes, top = len(self.free), int(self.cap.max())
        x = np.arange(top + 1)[None, :]
        have = self.free[:, None]
        if not self.hints:  # no runtime estimates: rank nodes by how many GPUs are free now
            t = np.where(x <= have, self.now, self.now + (x - have).astype(float))
            return np.where(x <= self.cap[:, None], t, math.inf)
        t = np.where(x <= have, self.now, math.inf)
        ends: list[tuple[int, float, int]] = [(n, end, g) for jid, end in self.running.items()
                                              for n, g in self.jobs[jid].placed]
        ends.sort()
        got = self.free.astype(np.int64).copy()
        for n, end, g in ends:  # releases per node in end order: x <= got[n] is reached at `end`
            lo, got[n] = got[n] + 1, got[n] + g
            t[n, lo:min(got[n], top) + 1] = np.minimum(t[n, lo:min(got[n], top) + 1], end)
        return t

    def _elect(self) -> None:
        gangs = [j for j in self.waiting if j.gang and j.start is None]
        if not gangs:
            return
        j = min(gangs, key=lambda j: (j.queued, j.jid))
        t = self._avail_times()
        top = t.shape[1] - 1
        rows = np.arange(len(self.free))
        assigned = np.zeros_like(self.free)
        where = []
        for g in sorted(j.pods, reverse=True):
            want = assigned + g
            when = np.where(want <= top, t[rows, np.minimum(want, top)], math.inf)
            n = int(np.argmin(when))
            if not math.isfinite(when[n]):
                return  # no node can ever hold this pod (not in this cluster shape)
            where.append(n)
            assigned[n] += g
        est = float(max(t[n, assigned[n]] for n in set(where))) if self.hints else math.inf
        deadline = (max(self.now, est) if self.hints else self.now) + self.max_hold_s
        order = sorted(range(len(j.pods)), key=lambda i: -j.pods[i])
        pod_nodes = [0] * len(j.pods)
        for i, n in zip(order, where):
            pod_nodes[i] = n
        self.rsv = Reservation(j, pod_nodes, assigned, est, self.now, deadline)
        self.reservations += 1
        self.push(deadline, TIMEOUT, j.jid)
        self._top_up()

    def _top_up(self) -> None:
        """Hold every free GPU of a reserved node, up to what the gang needs there; swap when all are held."""
        r = self.rsv
        if r is None:
            return
        take = np.minimum(np.maximum(r.need - self.held, 0), self.free)
        self.free -= take
        self.held += take
        if (self.held >= r.need).all():  # every GPU held: the gang's pods go in
            j = r.job
            self.held -= r.need
            j.placed = [(n, g) for n, g in zip(r.where, j.pods)]
            j.pods = []
            self.rsv = None
            self.swapped += 1
            self.start(j)

    def _release(self) -> None:
        self.free += self.held
        self.held[:] = 0
        self.rsv = None

    def on_other_event(self, kind: int, j: Job) -> bool:
        r = self.rsv
        if kind != TIMEOUT or r is None or r.job is not j or self.now < r.deadline_s - 1e-6:
            return False  # a stale deadline: that reservation already ended
        self._release()
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

    def schedule(self) -> None:
        self._top_up()
        still = []
        for j in self.waiting:
            if j.start is not None:  # started by the swap
                continue
            r = self.rsv
            if r is not None and j is r.job:
                if fit_all(self.free + self.held, j.pods) is not None:  # fits now anyway: no need to wait
                    self._release()
                    self._place_all(j, fit_all(self.free, j.pods) or [])
                else:
                    still.append(j)
                continue
            where = fit_all(self.free, j.pods) if self.free.max() > 0 else None
            if (where is None and r is not None and math.isfinite(r.est_start_s)  # no estimate: no backfill
                    and self.now + j.dur <= r.est_start_s and self.held.max() > 0):
                where = fit_all(self.free + self.held, j.pods)
                self.backfilled += where is not None
            if where is None:
                still.append(j)
            else:
                self._place_all(j, where)
        self.waiting = still
        if self.rsv is None:
            self._elect()
        self.waiting = [j for j in self.waiting if j.start is None]  # the elected gang may have started at once
