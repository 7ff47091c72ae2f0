"""The sidecar's Prometheus metrics, on a registry of their own (one per sidecar, so tests can run several).

=============================================  =========  ===============================================
metric                                         type       meaning
=============================================  =========  ===============================================
raygpu_reclaim_idle_gpu_seconds_total          counter    GPU-seconds spent on idle Ray workers (idle GPUs
                                                          x seconds between two cycles): the waste
raygpu_reclaim_idle_gpus                       gauge      GPUs on idle Ray workers at the last cycle
raygpu_reclaim_reclaimable_gpus                gauge      GPUs the last plan would free (in any mode)
raygpu_reclaim_gpus_reclaimed_total            counter    GPUs of workers removed by an applied patch
raygpu_reclaim_workers_deleted_total           counter    workers put in workersToDelete by this sidecar
raygpu_reclaim_decisions_total{action,reason}  counter    one per pod per planned cycle
raygpu_reclaim_drains_total{result}           counter    idle drains asked of Ray before a patch: accepted
                                                          or rejected (a rejected worker is kept)
raygpu_reclaim_patch_conflicts_total           counter    patches refused because the RayCluster changed
raygpu_reclaim_cycle_duration_seconds          histogram  one observation per cycle
raygpu_reclaim_cycles_total{outcome}           counter    cycles by outcome (see CycleOutcome)
raygpu_gc_reservations_released_total{reason}  counter    reservations released by the garbage collector
raygpu_reclaim_invalid_annotations_total       counter    distinct bad annotation values seen
raygpu_reclaim_search_budget_spent_total       counter    cycles whose pending-PG placement searches ran out of
                                                          budget (what they could not judge was kept;
                                                          docs/reliability.md, "The budget rule")
raygpu_reclaim_warm_target{group}              gauge      idle workers the keep-warm policy keeps in a group
                                                          (idle-timeout auto); absent while on its fallback
raygpu_guard_waiting_gangs{scope}              gauge      guarded gangs waiting in a starvation-guard scope
                                                          (docs/guard.md); absent when none waits
raygpu_guard_timeouts{scope}                   gauge      holds of those waiting gangs that ran out max-hold
raygpu_guard_longest_wait_seconds{scope}       gauge      longest wait of one of them, on the sidecar's clock
                                                          since it first saw the gang (restart: from then)
raygpu_scale_up_reservations_total{result}     counter    gang scale-up reservations tried: reserved, refused
                                                          (cannot be planned), failed (rolled back), exists
                                                          (one for that placement group was there already)
raygpu_scale_up_pending_placement_groups       gauge      pending placement groups gang scale-up saw at the
  {state}                                                 last cycle: reserved (a reservation waits for it)
                                                          or waiting (none yet: grace, fits now, cap, back-off)
raygpu_doctor_findings{check,severity}         gauge      findings of the sidecar's last health cycle
                                                          (raygpu.io/doctor-interval), by finding kind (the
                                                          check's name: node-health, gpu-xid, orphan-pod...)
                                                          and severity; every kind and severity is exported
                                                          (0 when none) once a health cycle ran
=============================================  =========  ===============================================

Every counter is exported from the start at 0, for each label value it can take (the ``action,reason`` pairs of
``decisions`` excepted: those appear at their first decision), so ``rate()`` and ``increase()`` see its first
increment: an alert on ``increase(raygpu_gc_reservations_released_total{reason="TimedOut"}[1h]) > 0`` fires for
the first timed-out reservation too (deploy/monitoring/raygpu-rules.yaml).
"""

from __future__ import annotations

from typing import Any, Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from raygpu.model.gc import GcReason
from raygpu.plan.guard import ScopeGauges
from raygpu.reclaim.report import CycleOutcome

# the label values each labelled counter starts with, at 0
DRAIN_RESULTS = ("accepted", "rejected")
SCALE_UP_RESULTS = ("reserved", "refused", "failed", "exists")
# GcReason values a reservation is released (or scaled to zero) for; the others only keep
KEEP_ONLY_REASONS = (GcReason.IN_USE, GcReason.LIVE, GcReason.RAY_SAYS_ALIVE, GcReason.UNPROVEN)
RELEASE_REASONS = tuple(r.value for r in GcReason if r not in KEEP_ONLY_REASONS)


class SidecarMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        r = self.registry = registry or CollectorRegistry()
        self.idle_gpu_seconds = Counter("raygpu_reclaim_idle_gpu_seconds", "GPU-seconds spent on idle Ray workers",
                                        registry=r)
        self.idle_gpus = Gauge("raygpu_reclaim_idle_gpus", "GPUs on idle Ray workers at the last cycle", registry=r)
        self.reclaimable_gpus = Gauge("raygpu_reclaim_reclaimable_gpus", "GPUs the last plan would free",
                                      registry=r)
        self.gpus_reclaimed = Counter("raygpu_reclaim_gpus_reclaimed", "GPUs of workers removed by applied patches",
                                      registry=r)
        self.workers_deleted = Counter("raygpu_reclaim_workers_deleted", "Workers put in workersToDelete",
                                       registry=r)
        self.decisions = Counter("raygpu_reclaim_decisions", "Reclaim decisions, one per pod per planned cycle",
                                 ["action", "reason"], registry=r)
        self.drains = Counter("raygpu_reclaim_drains", "Idle drains asked of Ray before a patch, by result",
                              ["result"], registry=r)
        self.patch_conflicts = Counter("raygpu_reclaim_patch_conflicts",
                                       "RayCluster patches refused because the object changed", registry=r)
        self.cycle_duration = Histogram("raygpu_reclaim_cycle_duration_seconds", "Duration of one sidecar cycle",
                                        buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30), registry=r)
        self.cycles = Counter("raygpu_reclaim_cycles", "Sidecar cycles by outcome", ["outcome"], registry=r)
        self.reservations_released = Counter("raygpu_gc_reservations_released",
                                             "Reservations released by the garbage collector", ["reason"], registry=r)
        self.invalid_annotations = Counter("raygpu_reclaim_invalid_annotations",
                                           "Distinct bad raygpu annotation values seen", registry=r)
        self.search_budget_spent = Counter("raygpu_reclaim_search_budget_spent",
                                           "Cycles whose pending-PG placement searches ran out of budget",
                                           registry=r)
        self.warm_target = Gauge("raygpu_reclaim_warm_target", "Idle workers the keep-warm policy keeps warm",
                                 ["group"], registry=r)

        self.guard_waiting = Gauge("raygpu_guard_waiting_gangs", "Guarded gangs waiting in a scope", ["scope"],
                                   registry=r)
        self.guard_timeouts = Gauge("raygpu_guard_timeouts", "Holds of waiting guarded gangs that ran out max-hold",
                                    ["scope"], registry=r)
        self.guard_longest_wait = Gauge("raygpu_guard_longest_wait_seconds",
                                        "Longest wait of a guarded gang in a scope (the sidecar's clock)", ["scope"],
                                        registry=r)
        self.scale_up_reservations = Counter(
            "raygpu_scale_up_reservations", "Gang scale-up reservations the sidecar tried to make, by result "
            "(reserved, refused, failed, exists)", ["result"], registry=r)
        self.scale_up_pending = Gauge("raygpu_scale_up_pending_placement_groups",
                                      "Pending placement groups gang scale-up saw at the last cycle, by what it did "
                                      "(reserved: has a reservation; waiting: none yet)", ["state"], registry=r)
        self.doctor_findings = Gauge("raygpu_doctor_findings", "Findings of the sidecar's last doctor cycle, by "
                                     "finding kind (check) and severity", ["check", "severity"], registry=r)
        self._guard_scopes: set[str] = set()
        for counter, values in ((self.cycles, [o.value for o in CycleOutcome]), (self.drains, DRAIN_RESULTS),
                                (self.reservations_released, RELEASE_REASONS),
                                (self.scale_up_reservations, SCALE_UP_RESULTS)):
            for value in values:
                counter.labels(value)  # a child at 0: exported before its first increment

    def set_guard(self, scopes: Iterable[ScopeGauges]) -> None:
        """The guard gauges of this cycle; a scope no longer listed is removed (absent, not a stale value)."""
        now = set()
        for g in scopes:
            now.add(g.scope)
            self.guard_waiting.labels(g.scope).set(g.waiting)
            self.guard_timeouts.labels(g.scope).set(g.timeouts)
            self.guard_longest_wait.labels(g.scope).set(g.longest_wait_s)
        for gone in self._guard_scopes - now:
            for gauge in (self.guard_waiting, self.guard_timeouts, self.guard_longest_wait):
                gauge.remove(gone)
        self._guard_scopes = now

    def set_doctor_findings(self, counts: dict[tuple[str, str], int], kinds: Iterable[str],
                            severities: Iterable[str]) -> None:
        """The doctor gauge of one health cycle: every (kind, severity) pair set, 0 where nothing was found, so
        that an alert on ``> 0`` resolves when the finding goes."""
        sev = list(severities)
        for kind in kinds:
            for s in sev:
                self.doctor_findings.labels(kind, s).set(counts.get((kind, s), 0))

    def serve(self, port: int, addr: str = "0.0.0.0") -> Any:
        """Serve ``/metrics`` on ``port`` in a daemon thread; returns the server (``.shutdown()`` stops it)."""
        from prometheus_client import start_http_server
        started = start_http_server(port, addr=addr, registry=self.registry)
        return started[0] if isinstance(started, tuple) else started
