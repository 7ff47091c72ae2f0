"""The fourth policy of the gang-admission replay, ``raygpu+guard``: raygpu's shapes plus the starvation guard.

It runs the product's own pure planning functions (``raygpu.plan.guard``, ``raygpu.plan.backfill``) on state
built from the simulator's, each time the simulator's state changes (no separate model of the guard):

* **Gated from the start, one holder per scope.** A scope is a node pool (``benchmarks._gang_admission_pools``;
  ``--pools 1``: the whole cluster). Every raygpu gang waits gated in its scope's line; no gang pod binds
  before its swap. When the scope has no holder, ``plan.guard.queue_order`` picks the first in line (fewest
  time-outs, then oldest) and ``plan.guard.decide_lease`` must say CREATE or ACQUIRE for it (the Lease is
  released or absent: the simulator has no Lease writes to lose).
* **Nodes** (among its pool's): ``plan.guard.choose_nodes`` on a ``NodeFree`` per node (GPUs only) and the
  running pods per node as ``K8sPodView`` (start time, and the ends the backfill mode makes known, below):
  where the gang fits soonest, then most GPUs free now.
* **Blockers hold whole nodes**, as the product's do (anti-affinity against every other pod): while a gang
  holds, no other job's pod goes to a chosen node unless it has the holder's pass; every free GPU there is
  *held idle*. ``plan.guard.plan_hold`` decides each step: swap once the gang's pods
  (``plan.guard.need_by_node``) fit in what is free on every chosen node; time out once the gang's nodes have
  been blocked for longer than max-hold *in all* (``held_for_s``: every hold of the gang together).
* **Time-out = rollback**: the product fails the reservation (it never holds again). Here the job retries
  at once, at the back of the queue, as an unguarded raygpu gang (ungated, all-or-nothing, may backfill by
  its hint): ASSUMPTION, the product leaves a retry to the job.
* **Backfill** (``backfill=``): a job that is not in line (a single, or a rolled-back gang) may use a chosen
  node when ``plan.backfill.decide_backfill`` gives it the holder's pass: its hint ends, plus
  ``BACKFILL_MARGIN_S``, before the hold's ``plan.backfill.estimated_start_s``. ASSUMPTION: a hint is the
  job's exact trace duration.

  - ``all``: every job has a hint; singles' pods carry ``activeDeadlineSeconds`` (their end is known).
  - ``gangs``: the product's rule: only raygpu gangs carry a hint (``expected_runtime_s=``; their pods the
    ``raygpu.io/expected-runtime-s`` annotation); singles' ends are unknown and they never backfill. A
    guarded gang in line never backfills (it is gated), so only rolled-back gangs do.
  - ``none``: no hints, no backfill; nodes by most GPUs free now.

Not mapped: the guard's 2 s step and the watchdog's latencies (the simulator acts at each event, at once),
Lease renewals and lost holders (nothing fails here), the pass revocation before the swap (pods bind at once).
Half-placed GPU-h stay 0 (all-or-nothing); held idle GPUs are reported apart.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from benchmarks._gang_admission_sim import Job, Sim, fit_all
from raygpu.model.gang import NodeFree
from raygpu.model.guard import Blocker, HoldUnit, WaitingGang
from raygpu.model.labels import ANNOTATION_EXPECTED_RUNTIME, LABEL_RESERVATION
from raygpu.model.views import K8sPodView
from raygpu.plan.backfill import decide_backfill, estimated_start_s
from raygpu.plan.guard import LeaseAction, blocker_units, choose_nodes, decide_lease, need_by_node, plan_hold, queue_order

TIMEOUT = 3  # event kind: a hold's max-hold runs out
BACKFILL = ("all", "gangs", "none")
GPU = "nvidia.com/gpu"


@dataclass
class Hold:
    job: Job
    nodes: tuple[str, ...]  # plan.guard.choose_nodes: a node name per gang pod
    units: list[HoldUnit]
    need: dict[str, dict[str, float]]  # plan.guard.need_by_node
    held_since: float


class GuardSim(Sim):
    """``Sim`` with the guard; see the module docstring."""

    def __init__(self, free: np.ndarray, jobs: list[Job], give_up_s: float, max_hold_s: float = 900.0,
                 hints: bool = True, backfill: str | None = None, pools: np.ndarray | None = None,
                 packing: str = "first-fit") -> None:
        super().__init__("raygpu+guard", free, jobs, give_up_s, pools, packing=packing)
        backfill = backfill or ("all" if hints else "none")
        if backfill not in BACKFILL:
            raise ValueError(f"backfill must be one of {BACKFILL}, got {backfill!r}")
        self.max_hold_s, self.backfill, self.hints = max_hold_s, backfill, backfill != "none"
        self.holds: dict[int, Hold] = {}  # scope (pool) -> its one holder
        self.blocked = np.zeros(len(free), dtype=bool)  # nodes a blocker stands on
        self.held_before: dict[int, float] = {}  # jid -> seconds its nodes were blocked by earlier holds
        self.rolled_back: set[int] = set()  # jids whose max-hold is spent: unguarded from then on
        self.pods_at: dict[str, list[K8sPodView]] = {}  # node name -> running pods there
        self.held_idle_gpu_s = 0.0
        self.reservations = self.timeouts = self.backfilled = self.swapped = 0
        self.max_reservations = 0
        self.max_blocked_s = 0.0  # the most any gang's nodes were blocked, all its holds together

    # ------------------------------------------------------------ metrics
    def account(self, dt: float) -> None:
        super().account(dt)
        self.held_idle_gpu_s += dt * int(self.free[self.blocked].sum())

    def extra_metrics(self) -> dict[str, object]:
        return {"held_idle_gpu_h": round(self.held_idle_gpu_s / 3600, 1), "reservations": self.reservations,
                "reservation_timeouts": self.timeouts, "hold_timeouts": self.timeouts, "backfilled": self.backfilled,
                "started_by_reservation": self.swapped, "hints": self.hints, "backfill": self.backfill,
                "pools": self.pools.count, "max_reservations_at_once": self.max_reservations,
                "max_hold_s": self.max_hold_s, "max_blocked_s": round(self.max_blocked_s, 1)}

    @staticmethod
    def scope(j: Job) -> int:
        return max(j.pool, 0)

    def guarded(self, j: Job) -> bool:
        """In line (gated): a raygpu gang whose max-hold is not spent."""
        return j.gang and j.jid not in self.rolled_back

    def hint(self, j: Job) -> float | None:
        """Job ``j``'s runtime hint, where the backfill mode gives it one (its exact duration)."""
        return j.dur if self.backfill == "all" or (self.backfill == "gangs" and j.gang) else None

    # ------------------------------------------------------------ the product's inputs, from the simulator's state
    def _pod_view(self, j: Job, i: int, n: int, g: int) -> K8sPodView:
        labels, ann, deadline = {}, {}, None
        if self.hint(j) is not None and j.gang:  # raygpu's pods carry the driver's hint
            labels, ann = {LABEL_RESERVATION: f"rg-{j.jid}"}, {ANNOTATION_EXPECTED_RUNTIME: f"{j.dur:g}"}
        elif self.hint(j) is not None:
            deadline = j.dur  # another tenant's pod whose end is known: activeDeadlineSeconds
        return K8sPodView(name=f"{j.name}-{i}", uid=str(j.jid), namespace="jobs", node_name=str(n), phase="Running",
                          requests={GPU: float(g)}, started_at_s=self.now, labels=labels, annotations=ann,
                          active_deadline_s=deadline)

    def start(self, j: Job) -> None:
        super().start(j)
        for i, (n, g) in enumerate(j.placed):
            self.pods_at.setdefault(str(n), []).append(self._pod_view(j, i, n, g))

    def on_end(self, j: Job) -> None:
        uid = str(j.jid)
        for n in {n for n, _ in j.placed}:
            self.pods_at[str(n)] = [p for p in self.pods_at[str(n)] if p.uid != uid]

    def _node_free(self, pool: int) -> list[NodeFree]:
        mask = self.pools.nodes(pool)
        idx = np.arange(len(self.free)) if mask is None else np.flatnonzero(mask)
        return [NodeFree(name=str(n), free={GPU: float(self.free[n])}, allocatable={GPU: float(self.cap[n])})
                for n in idx.tolist()]

    def _estimated_start(self, h: Hold) -> float | None:
        return estimated_start_s(h.need, {n: {GPU: float(self.cap[int(n)])} for n in h.need}, self.pods_at, self.now)

    # ------------------------------------------------------------ the hold
    def _elect(self, pool: int) -> None:
        line = [WaitingGang(name=str(j.jid), created_at_s=j.queued, state="reserved", timeouts=0)
                for j in self.waiting if self.guarded(j) and self.scope(j) == pool]
        if not line:
            return
        first = queue_order(line)[0]
        if decide_lease(first.name, None, line, 0.0).action not in (LeaseAction.CREATE, LeaseAction.ACQUIRE):
            return
        j = self.jobs[int(first.name)]
        req = {GPU: float(j.pods[0])}
        nodes = choose_nodes(req, len(j.pods), self._node_free(j.pool), GPU, self.pods_at if self.hints else None,
                             self.now)
        if nodes is None:
            return  # some pod fits no node of the pool: it never holds
        h = Hold(j, nodes, blocker_units(f"g{j.jid}-bl", nodes), need_by_node(req, nodes), self.now)
        self.holds[pool] = h
        self.blocked[[int(n) for n in h.need]] = True
        self.reservations += 1
        self.max_reservations = max(self.max_reservations, len(self.holds))
        self.push(self.now + self.max_hold_s - self.held_before.get(j.jid, 0.0) + 1e-3, TIMEOUT, j.jid)

    def _end_hold(self, pool: int) -> Hold:
        h = self.holds.pop(pool)
        self.blocked[[int(n) for n in h.need]] = False
        total = self.held_before.get(h.job.jid, 0.0) + self.now - h.held_since
        self.held_before[h.job.jid] = total
        self.max_blocked_s = max(self.max_blocked_s, total)
        return h

    def _step_hold(self, pool: int) -> None:
        h = self.holds[pool]
        j = h.job
        blockers = [Blocker(name=u.name, node=u.node) for u in h.units]  # created and bound at once
        free = {n: {GPU: float(self.free[int(n)])} for n in h.need}
        held_for = self.held_before.get(j.jid, 0.0) + self.now - h.held_since
        step = plan_hold(h.units, blockers, free, h.need, held_for, self.max_hold_s)
        if step.timed_out:
            self._end_hold(pool)
            self.timeouts += 1
            self.rolled_back.add(j.jid)
            j.queued = self.now  # rolled back; the job retries at the back, unguarded
            self.waiting.remove(j)
            self.waiting.append(j)
        elif step.swap:
            self._end_hold(pool)
            self.swapped += 1
            self._place_all(j, [int(n) for n in h.nodes])

    def on_other_event(self, kind: int, j: Job) -> bool:
        return kind == TIMEOUT

    # ------------------------------------------------------------ scheduling pass
    def _place_all(self, j: Job, where: list[int]) -> None:
        for n in where:
            self.place(j, 0, n)
        j.gate = 0
        self.start(j)

    def _passes(self, j: Job) -> np.ndarray:
        """Chosen nodes whose holder gives ``j`` its pass (plan.backfill.decide_backfill)."""
        ok = np.zeros(len(self.free), dtype=bool)
        for pool, h in self.holds.items():
            d = decide_backfill(str(j.jid), str(h.job.jid), self._estimated_start(h), self.hint(j), self.now)
            if d.pass_for is not None:
                ok[[int(n) for n in h.need]] = True
        return ok

    def schedule(self) -> None:
        for pool in list(self.holds):
            self._step_hold(pool)
        still = []
        for j in self.waiting:
            if j.start is not None:  # swapped in just now
                continue
            if self.guarded(j):  # gated: only the swap places it
                still.append(j)
                continue
            if self.free.max() <= 0:
                still.append(j)
                continue
            open_ = np.where(self.blocked, 0, self.free)
            where = fit_all(self.avail(j, open_), j.pods, self.score())
            if where is None and self.holds and self.hints and self.avail(j, self.free).sum() >= sum(j.pods):
                passes = self._passes(j)
                if passes.any():
                    where = fit_all(self.avail(j, np.where(self.blocked & ~passes, 0, self.free)), j.pods,
                                    self.score())
                    self.backfilled += where is not None
            if where is None:
                still.append(j)
            else:
                self._place_all(j, where)
        self.waiting = still
        for pool in range(self.pools.count):
            if pool not in self.holds:
                self._elect(pool)
                if pool in self.holds:
                    self._step_hold(pool)  # fits at once: swapped in now
        self.waiting = [j for j in self.waiting if j.start is None]


class GuardProposalSim(GuardSim):
    """NOT the product: a guard design measured against issue 29's goal (``--guard-patience S``), row
    ``guard-proposal``. Everything is ``GuardSim``'s (the product's plan functions, blockers holding whole
    nodes, max-hold in all) but two rules:

    * **Patience.** A guarded gang waits its first ``patience_s`` as an ordinary raygpu gang (ungated,
      all-or-nothing, may backfill by its hint) and joins its scope's line only after that: most gangs start
      before they would ever need a hold, and the line holds only those that have waited ``patience_s``.
    * **Fast path.** A gang in line (not the holder) whose pods fit now on nodes no blocker stands on starts
      at once instead of waiting for its turn to hold.

    What the product would need (not built): gated pods cannot be gated again once ungated, so a gang would
    be created gated and ungate itself (pinned) when it fits on open nodes, safely only behind blockers of
    its own for that one step (a "try-hold" that never waits, so two of them cannot deadlock).
    """

    def __init__(self, *args, patience_s: float = 1200.0, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        if not patience_s >= 0:
            raise ValueError(f"patience_s must be >= 0, got {patience_s!r}")
        self.policy, self.patience_s = "guard-proposal", patience_s
        self._woken: set[int] = set()

    def extra_metrics(self) -> dict[str, object]:
        return {**super().extra_metrics(), "patience_s": self.patience_s}

    def guarded(self, j: Job) -> bool:
        return super().guarded(j) and self.now - j.queued >= self.patience_s

    def schedule(self) -> None:
        for j in self.waiting:  # a step when a gang's patience runs out and it joins the line
            if j.gang and self.patience_s > 0 and j.jid not in self._woken:
                self._woken.add(j.jid)
                self.push(j.queued + self.patience_s + 1e-3, TIMEOUT, j.jid)
        holders = {h.job.jid for h in self.holds.values()}
        for j in self.waiting:  # the fast path
            if self.guarded(j) and j.jid not in holders and j.start is None:
                where = fit_all(self.avail(j, np.where(self.blocked, 0, self.free)), j.pods, self.score())
                if where is not None:
                    self._place_all(j, where)
        self.waiting = [j for j in self.waiting if j.start is None]
        super().schedule()
