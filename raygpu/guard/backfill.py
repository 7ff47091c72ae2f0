"""Backfill: an unguarded gang with a runtime hint runs on nodes the guard holds when it ends first.

Run by the driver's watchdog (gang/api.py ``Watchdog``) for a reservation that is *not* guarded and has
``expected_runtime_s``, while it is ``reserved`` (its pods not all bound). The holder alone grants and revokes
passes; this gang only asks, and labels its own pods. Each step (at most every ``GUARD_EVERY_S``): read the
scope's Lease; while another gang holds it, keep an *ask* Lease in the guard namespace
(``<scope lease>.ask.<tag>``, written by this gang only: its hint, the grant revision it last acted on, how
many of its pending pods carry a pass), and act on the holder's answer on its Lease
(``raygpu.io/guard-grants``, plan.backfill.decide_pass): granted, put ``raygpu.io/guard-pass=<holder>`` on
this reservation's own pending pods; refused, revoked or nobody holding, take it off. The holder's blockers
let a pod with the pass in (docs/guard.md). The pods are created with the scheduling gate
``raygpu.io/backfill``, lifted once the holder has answered (or after ``ANSWER_WAIT_S``), because
kube-scheduler does not retry a pending pod when only its own labels change: its first try must already
carry the pass. Only this reservation's own pods (``raygpu.io/reservation=<group>``, not yet bound) are ever
labelled, each patch under the pod's resourceVersion; nobody else's pod is touched. A guarded gang waiting in
line does not backfill: it is gated so that the guard can place it whole, which a backfill could not.
"""

from __future__ import annotations

import os
from typing import Any, Callable

from raygpu.adapters.kube import KubeAdapter
from raygpu.errors import ConflictError, ForbiddenError, NotFoundError
from raygpu.guard.holder import GUARD_EVERY_S, LEASE, Wired, micro_time, read_lease
from raygpu.model.gang import GangPlan, ReservationState
from raygpu.model.guard import LEASE_DURATION_S, ask_name, guard_namespace, guard_tag
from raygpu.model.labels import (ANNOTATION_EXPECTED_RUNTIME, ANNOTATION_GUARD_ASK, BACKFILL_GATE, LABEL_CLUSTER,
                                 LABEL_GUARD_ASK, LABEL_GUARD_PASS, LABEL_RESERVATION, dns_label)
from raygpu.plan.backfill import decide_pass


class Backfill:
    """The backfill of one reservation. ``clock``: the driver's monotonic seconds (the step's pace, how long
    an ask has waited for its answer). No wall clock: the holder decides on its own."""

    def __init__(self, kube: KubeAdapter, plan: GangPlan, lease_name: str, expected_runtime_s: float, *,
                 clock: Callable[[], float], progress: Callable[[str], None] = lambda m: None) -> None:
        self.kube, self.plan, self.lease_name = kube, plan, lease_name
        self.ns = guard_namespace(os.environ)  # where the scope's Lease is (guard/holder.py)
        self.expected_runtime_s, self.clock, self.progress = expected_runtime_s, clock, progress
        self.done = False
        self.reason = ""  # the last decision's
        self.said: str | None = None  # the decision last said
        self.tag = guard_tag(plan.namespace, plan.gang_name)
        self.ask = ask_name(lease_name, self.tag)
        self._asked_at: float | None = None  # our clock: when we first asked the current holder
        self._asked_holder = ""
        self._ask_written: tuple[str, float] | None = None  # (annotation value, when) of our last ask write
        self._asked = False  # an ask write was tried (it may exist): deleted when we end
        self._last_step = float("-inf")

    @classmethod
    def of(cls, rsv: Wired, clock: Callable[[], float], progress: Callable[[str], None]) -> "Backfill | None":
        """The backfill of reservation ``rsv`` (by its wiring, fixed when it was planned); None when it is
        guarded, has no runtime hint or may not backfill (no scope Lease in its wiring)."""
        hint, wiring = rsv.request.expected_runtime_s, rsv.wiring
        if wiring.guard is not None or hint is None or not wiring.scope_lease:
            return None
        return cls(rsv.kube, rsv.plan, wiring.scope_lease, hint, clock=clock, progress=progress)

    def step(self, state: ReservationState) -> None:
        """One step (a no-op sooner than ``GUARD_EVERY_S`` after the last). Past ``reserved`` it ends and our
        ask goes: the pods are bound, a pass left on them lets nothing else in. Raises RayGpuError when a read or write
        failed (the watchdog retries next step)."""
        now = self.clock()
        if self.done or now - self._last_step < GUARD_EVERY_S:
            return
        self._last_step = now
        if state != ReservationState.RESERVED:
            self._withdraw()
            self.done = True
            return
        try:
            self._step()
        except ForbiddenError as e:  # reserve asked (SelfSubjectAccessReview); the rights went since
            self.done = True
            self.progress(f"backfill: off, the driver may no longer patch its pods or write its ask ({e}); a pod still gated "
                          "raygpu.io/backfill waits until the reservation's timeout_s (docs/permissions.md)")

    def _step(self) -> None:
        try:
            lease = read_lease(self.kube, self.lease_name, self.ns)
        except ForbiddenError:
            lease = None  # (rights taken away since reserve asked) no pass; the gate is still lifted below
        now = self.clock()
        holder = lease.holder if lease else ""
        if holder != self._asked_holder:
            self._asked_holder, self._asked_at = holder, now
        waited_s = now - self._asked_at if self._asked_at is not None else 0.0
        d = decide_pass(self.tag, holder, lease.grants if lease else {}, waited_s)
        said = f"{d.pass_for}/{d.lift_gate}"
        if said != self.said:  # said when the decision changes, not its numbers
            self.said = said
            self.progress(f"backfill: {'pass for ' + d.pass_for if d.pass_for else 'no pass'}: {d.reason}")
        self.reason = d.reason
        passes = self._label(dns_label(d.pass_for) if d.pass_for else None, d.lift_gate)
        if lease is not None and holder and holder != self.tag:
            self._write_ask(lease.grant_rev, passes, now)

    def _label(self, want: str | None, lift: bool) -> int:
        """Our pending pods carry ``want`` as their pass (None: none); our gate lifted when ``lift``. Returns
        how many of them carry a pass afterwards (a patch that met a 409 leaves the pod as it was)."""
        carrying = 0
        for p in self.kube.list("v1", "Pod", self.plan.namespace, f"{LABEL_RESERVATION}={self.plan.reservation_group}"):
            md, spec = p["metadata"], p.get("spec") or {}
            if spec.get("nodeName") or md.get("deletionTimestamp"):
                continue  # bound or going: its label no longer matters
            gates = spec.get("schedulingGates") or []
            gated = any(g.get("name") == BACKFILL_GATE for g in gates)
            has = (md.get("labels") or {}).get(LABEL_GUARD_PASS)
            if has == want and not (gated and lift):
                carrying += bool(has)
                continue
            body: dict[str, Any] = {"metadata": {"resourceVersion": md.get("resourceVersion"),
                                                 "labels": {LABEL_GUARD_PASS: want}}}
            if gated and lift:  # lift our gate in the same patch, so the first try has the answer
                body["spec"] = {"schedulingGates": [g for g in gates if g.get("name") != BACKFILL_GATE] or None}
            try:
                self.kube.merge_patch("v1", "Pod", md["name"], self.plan.namespace, body)
                carrying += bool(want)
            except ConflictError:
                carrying += bool(has)  # changed since read (bound, say): looked at again next step
        return carrying

    def _write_ask(self, seen_rev: int, passes: int, now: float) -> None:
        """Our ask Lease, written by us only: the grant revision this step acted on and how many of our pending
        pods carry a pass (the holder swaps only once every asker reports its revocation done). Written when
        it changes, and renewed every LEASE_DURATION_S / 3 (an ask unchanged for LEASE_DURATION_S is gone)."""
        value = f"{seen_rev};{passes}"
        if self._ask_written and self._ask_written[0] == value and now - self._ask_written[1] <= LEASE_DURATION_S / 3:
            return
        ann = {ANNOTATION_GUARD_ASK: value, ANNOTATION_EXPECTED_RUNTIME: f"{self.expected_runtime_s:g}"}
        t = micro_time()
        self._asked = True
        try:
            self.kube.merge_patch(*LEASE, self.ask, self.ns, {"metadata": {"annotations": ann}, "spec": {"renewTime": t}})
        except NotFoundError:  # not made yet, or deleted by the holder as gone (we were cut off): made again
            try:
                self.kube.create({"apiVersion": LEASE[0], "kind": LEASE[1], "metadata": {
                    "name": self.ask, "namespace": self.ns, "annotations": ann,
                    "labels": {LABEL_GUARD_ASK: self.lease_name, LABEL_CLUSTER: dns_label(self.plan.cluster)}},
                    "spec": {"holderIdentity": self.tag, "leaseDurationSeconds": LEASE_DURATION_S, "acquireTime": t,
                             "renewTime": t}})
            except ConflictError:
                return  # made meanwhile (a create whose answer was lost): patched next step
        self._ask_written = (value, now)

    def release(self) -> None:
        """The reservation ended (released, rolled back): our ask goes and the backfill stops. Idempotent;
        raises RayGpuError when the delete failed (called again, it finishes; else the holder deletes the ask
        once it has looked unchanged for LEASE_DURATION_S)."""
        self._withdraw()
        self.done = True

    def _withdraw(self) -> None:
        """Our ask goes once our pods are bound or the reservation ended (already gone is fine)."""
        if not self._asked:
            return
        try:
            self.kube.delete(*LEASE, self.ask, self.ns)
        except NotFoundError:
            pass
        self._asked, self._ask_written = False, None
