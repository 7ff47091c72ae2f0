"""Backfill: an unguarded gang with a runtime hint runs on nodes the guard holds when it ends first.

Run by the driver's watchdog (gang/api.py ``Watchdog``) for a reservation that is *not* guarded and has
``expected_runtime_s``, while it is ``reserved`` (its pods not all bound). Each step (at most every
``GUARD_EVERY_S``): read the scope's Lease; if another gang holds it and has published its hold's
estimated start (``raygpu.io/guard-estimated-start``, guard/holder.py), decide (plan.backfill.decide_backfill:
``now + expected_runtime_s + BACKFILL_MARGIN_S <= start``) and put the pass
``raygpu.io/guard-pass=<holder>`` on this reservation's own pending pods, or take it off when it no longer
holds. The holder's blockers let a pod with the pass in (docs/guard.md). The pods are created with the
scheduling gate ``raygpu.io/backfill``, lifted with the first decision, because kube-scheduler does not
retry a pending pod when only its own labels change: its first try must already carry the pass. Only this reservation's own pods
(``raygpu.io/reservation=<group>``, not yet bound) are ever labelled, each patch under the pod's
resourceVersion; nobody else's pod is touched. A guarded gang waiting in line does not backfill: it is
gated so that the guard can place it whole, which a backfill could not.
"""

from __future__ import annotations

import os
import time
from typing import Any, Callable

from raygpu.adapters.kube import KubeAdapter
from raygpu.errors import ConflictError, ForbiddenError
from raygpu.guard.holder import GUARD_EVERY_S, Wired, read_lease
from raygpu.model.gang import GangPlan, ReservationState
from raygpu.model.guard import guard_namespace, guard_tag
from raygpu.model.labels import BACKFILL_GATE, LABEL_GUARD_PASS, LABEL_RESERVATION, dns_label
from raygpu.plan.backfill import decide_backfill


class Backfill:
    """The backfill of one reservation. ``clock``: the driver's monotonic seconds (the step's pace);
    ``wall``: its unix seconds, compared with the estimated start (the margin bounds the skew)."""

    def __init__(self, kube: KubeAdapter, plan: GangPlan, lease_name: str, expected_runtime_s: float, *,
                 clock: Callable[[], float], wall: Callable[[], float] = time.time,
                 progress: Callable[[str], None] = lambda m: None) -> None:
        self.kube, self.plan, self.lease_name = kube, plan, lease_name
        self.ns = guard_namespace(os.environ)  # where the scope's Lease is (guard/holder.py)
        self.expected_runtime_s, self.clock, self.wall, self.progress = expected_runtime_s, clock, wall, progress
        self.done = False
        self.reason = ""  # the last decision's
        self.said: str | None = None  # the pass last said (None: no pass)
        self._last_step = float("-inf")

    @classmethod
    def of(cls, rsv: Wired, clock: Callable[[], float], progress: Callable[[str], None],
           wall: Callable[[], float] = time.time) -> "Backfill | None":
        """The backfill of reservation ``rsv`` (by its wiring, fixed when it was planned); None when it is
        guarded, has no runtime hint or may not backfill (no scope Lease in its wiring)."""
        hint, wiring = rsv.request.expected_runtime_s, rsv.wiring
        if wiring.guard is not None or hint is None or not wiring.scope_lease:
            return None
        return cls(rsv.kube, rsv.plan, wiring.scope_lease, hint, clock=clock, wall=wall, progress=progress)

    def step(self, state: ReservationState) -> None:
        """One step (a no-op sooner than ``GUARD_EVERY_S`` after the last). Past ``reserved`` it ends: the
        pods are bound, a pass left on them lets nothing else in. Raises RayGpuError when a read or write
        failed (the watchdog retries next step)."""
        now = self.clock()
        if self.done or now - self._last_step < GUARD_EVERY_S:
            return
        self._last_step = now
        if state != ReservationState.RESERVED:
            self.done = True
            return
        try:
            self._step()
        except ForbiddenError as e:  # reserve asked (SelfSubjectAccessReview); the rights went since
            self.done = True
            self.progress(f"backfill: off, the driver may no longer patch its pods ({e}); a pod still gated "
                          "raygpu.io/backfill waits until the reservation's timeout_s (docs/permissions.md)")

    def _step(self) -> None:
        try:
            lease = read_lease(self.kube, self.lease_name, self.ns)
        except ForbiddenError:
            lease = None  # (rights taken away since reserve asked) no pass; the gate is still lifted below
        d = decide_backfill(guard_tag(self.plan.namespace, self.plan.gang_name), lease.holder if lease else "",
                            lease.estimated_start_s if lease else None, self.expected_runtime_s, self.wall())
        if d.pass_for != self.said or not self.reason:  # said when the decision changes, not its numbers
            self.said = d.pass_for
            self.progress(f"backfill: {'pass for ' + d.pass_for if d.pass_for else 'no pass'}: {d.reason}")
        self.reason = d.reason
        want = dns_label(d.pass_for) if d.pass_for else None
        for p in self.kube.list("v1", "Pod", self.plan.namespace, f"{LABEL_RESERVATION}={self.plan.reservation_group}"):
            md, spec = p["metadata"], p.get("spec") or {}
            if spec.get("nodeName") or md.get("deletionTimestamp"):
                continue  # bound or going: its label no longer matters
            gates = spec.get("schedulingGates") or []
            gated = any(g.get("name") == BACKFILL_GATE for g in gates)
            if (md.get("labels") or {}).get(LABEL_GUARD_PASS) == want and not gated:
                continue
            body: dict[str, Any] = {"metadata": {"resourceVersion": md.get("resourceVersion"),
                                                 "labels": {LABEL_GUARD_PASS: want}}}
            if gated:  # the first decision made: lift our gate in the same patch, so the first try has the pass
                body["spec"] = {"schedulingGates": [g for g in gates if g.get("name") != BACKFILL_GATE] or None}
            try:
                self.kube.merge_patch("v1", "Pod", md["name"], self.plan.namespace, body)
            except ConflictError:
                pass  # changed since read (bound, or the holder revoked the pass): looked at again next step
