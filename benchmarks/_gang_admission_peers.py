"""The peers that reserve, in the gang-admission replay: EASY backfill, reserve-and-elect, Kueue StrictFIFO.

Each runs on the trace's shapes (a gang is k pods of g GPUs, as in ``pods``), admits a gang all-or-nothing,
and keeps a gang to its node pool (singles go anywhere), with the simulator's node choice (first fit, or
MostAllocated under ``--packing most-allocated``). Plain implementations, not the products' code:

* ``easy-backfill`` (Slurm-like; one partition per pool): jobs in arrival order; the first gang of a pool
  that does not fit now gets the pool's reservation: its earliest start (the *shadow time*) from the running
  jobs' ends (their real runtimes: the estimate is exact) and the nodes it would take then. A later job
  starts now only if it does not delay it: it ends by the shadow time, or it uses only GPUs the reservation
  leaves spare at the shadow time. Singles never get a reservation (they go anywhere and fit soon).
* ``volcano-reserve`` (Volcano's elect + reserve, no backfill): per pool, the oldest gang that does not fit
  now is elected and locks nodes of its pool, most GPUs free first, until the gang fits in their capacity;
  no other job is placed on a locked node until the gang starts (on any nodes of its pool). No time-out.
* ``kueue-strictfifo`` (Kueue, one ClusterQueue per pool, ``queueingStrategy: StrictFIFO``): a pool's gangs
  are admitted in arrival order, each only when it fits all-or-nothing now; a gang that does not fit
  blocks every later gang of its pool. No node is held: singles (not queued by Kueue) take any free GPU.
  ASSUMPTION: admission by fit (as with TopologyAwareScheduling / waitForPodsReady), not by quota.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from benchmarks._gang_admission_sim import Job, Sim, fit_all

RESERVING_PEERS = ("easy-backfill", "volcano-reserve", "kueue-strictfifo")


class _GangSim(Sim):
    """A gang's pods are admitted all-or-nothing (never half-placed)."""

    def __init__(self, policy: str, free: np.ndarray, jobs: list[Job], give_up_s: float,
                 pools: np.ndarray | None = None, packing: str = "first-fit") -> None:
        super().__init__(policy, free, jobs, give_up_s, pools, packing=packing)

    def fit(self, j: Job, per_node: np.ndarray) -> list[int] | None:
        return fit_all(self.avail(j, per_node), j.pods, self.score())

    def admit(self, j: Job, where: list[int]) -> None:
        for n in where:
            self.place(j, 0, n)
        self.start(j)


@dataclass
class Shadow:
    job: Job
    t: float  # the shadow time: when the job will start
    spare: np.ndarray  # GPUs per node free at t that the job does not take (inf off its pool)


class EasySim(_GangSim):
    """``easy-backfill``; see the module docstring."""

    def __init__(self, free, jobs, give_up_s, pools=None, packing="first-fit") -> None:
        super().__init__("easy-backfill", free, jobs, give_up_s, pools, packing)
        self.shadows: dict[int, Shadow] = {}  # pool -> the reservation of its head gang

    def _shadow(self, j: Job) -> Shadow | None:
        """Earliest time gang ``j`` fits in its pool as running jobs end (exact ends), and the spare GPUs then."""
        free = self.free.copy()
        for end, jid in sorted((e, i) for i, e in self.running.items()):
            for n, g in self.jobs[jid].placed:
                free[n] += g
            if self.avail(j, free).sum() < sum(j.pods):
                continue
            where = self.fit(j, free)
            if where is not None:
                spare = free.astype(float)
                for n, g in zip(where, j.pods):
                    spare[n] -= g
                mask = self.pools.nodes(j.pool)
                if mask is not None:
                    spare[~mask] = np.inf
                return Shadow(j, end, spare)
        return None  # never fits (not in this pool's shape)

    def schedule(self) -> None:
        self.shadows = {p: s for p, s in self.shadows.items() if s.job.start is None}
        still = []
        for j in self.waiting:
            limit = np.full(len(self.free), np.inf)
            for s in self.shadows.values():
                if s.job is not j and self.now + j.dur > s.t:  # would still run at the shadow time
                    limit = np.minimum(limit, s.spare)
            where = self.fit(j, np.minimum(self.free, limit).astype(np.int64))
            if where is not None:
                self.admit(j, where)
                for s in self.shadows.values():
                    if s.job is not j and self.now + j.dur > s.t:
                        for n, g in j.placed:
                            s.spare[n] -= g
                continue
            still.append(j)
            if j.gang and j.pool not in self.shadows:
                s = self._shadow(j)
                if s is not None:
                    self.shadows[j.pool] = s
        self.waiting = still


class VolcanoSim(_GangSim):
    """``volcano-reserve``; see the module docstring."""

    def __init__(self, free, jobs, give_up_s, pools=None, packing="first-fit") -> None:
        super().__init__("volcano-reserve", free, jobs, give_up_s, pools, packing)
        self.elected: dict[int, tuple[Job, np.ndarray]] = {}  # pool -> (target job, its locked nodes)
        self.locked = np.zeros(len(free), dtype=bool)

    def _lock(self, j: Job) -> np.ndarray | None:
        mask = self.pools.nodes(j.pool)
        idx = np.arange(len(self.free)) if mask is None else np.flatnonzero(mask)
        idx = idx[~self.locked[idx]]
        order = idx[np.argsort(-self.free[idx], kind="stable")]  # most idle first
        lock = np.zeros(len(self.free), dtype=bool)
        for n in order.tolist():
            lock[n] = True
            if fit_all(np.where(lock, self.cap, 0), j.pods) is not None:
                return lock
        return None

    def schedule(self) -> None:
        still = []
        for j in self.waiting:
            e = self.elected.get(j.pool) if j.gang else None
            target = e is not None and e[0] is j
            open_ = self.free if target else np.where(self.locked, 0, self.free)
            where = self.fit(j, open_)
            if where is not None:
                if target:
                    self.locked &= ~e[1]
                    del self.elected[j.pool]
                self.admit(j, where)
                continue
            still.append(j)
            if j.gang and j.pool not in self.elected:
                lock = self._lock(j)
                if lock is not None:
                    self.elected[j.pool] = (j, lock)
                    self.locked |= lock
        self.waiting = still


class KueueSim(_GangSim):
    """``kueue-strictfifo``; see the module docstring."""

    def __init__(self, free, jobs, give_up_s, pools=None, packing="first-fit") -> None:
        super().__init__("kueue-strictfifo", free, jobs, give_up_s, pools, packing)

    def schedule(self) -> None:
        still, blocked = [], set()
        for j in self.waiting:
            if j.gang and j.pool in blocked:
                still.append(j)
                continue
            where = self.fit(j, self.free)
            if where is None:
                still.append(j)
                if j.gang:
                    blocked.add(j.pool)
            else:
                self.admit(j, where)
        self.waiting = still


PEERS = {"easy-backfill": EasySim, "volcano-reserve": VolcanoSim, "kueue-strictfifo": KueueSim}
