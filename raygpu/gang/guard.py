"""The starvation guard of one guarded reservation, run by its driver's watchdog (docs/guard.md).

Every object of a scope lives in the *guard namespace* (raygpu-system, or ``$RAYGPU_GUARD_NAMESPACE``), so
one gang holds a scope across every namespace: the scope's Lease ``raygpu-guard-<scope>``, one *ticket*
Lease per waiting guarded gang (``<scope lease>.<tag>``, renewed by its driver: the line), and the blockers.

Each ``step`` (at most every ``GUARD_EVERY_S``): (0) holding for longer than max-hold in all: time out; no
Lease renewal landed for ``STEP_DOWN_S``: stop blocking (delete our blockers) before anyone may take the
Lease; (1) read the scope's proven tickets (ours created or renewed) and its Lease; a ticket unchanged for
its duration on our clock is gone; (2) decide (``plan.guard.decide_lease``) and write the Lease, every
update guarded by its resourceVersion (a conflict: re-read next step, never overwrite); (3) while
holding: delete the blockers and tickets proven to belong to gangs that are gone (``blockers_to_clear``),
wait for a live gang's blockers to go, then choose the nodes once (``plan.guard.choose_nodes``) and create
one *blocker* pod per chosen node: ``spec.nodeName`` set (the API server binds it; no scheduler queue, no
race), requests 1m CPU and 1Mi memory, and a required pod anti-affinity (topologyKey
kubernetes.io/hostname, every namespace) against every pod not labelled ``raygpu.io/guard-for=<tag>``.
Once every chosen node has room for the gang's pods, the gang's gated pods are labelled, pinned to those
nodes and ungated; once all are bound the blockers are deleted. Runtime hints (plan/backfill.py): the
nodes are chosen by when the gang fits soonest, and the hold's estimated start is published on the Lease
(``raygpu.io/guard-estimated-start``) for gangs that may backfill (gang/backfill.py) with the pass
``raygpu.io/guard-pass=<tag>`` that the blockers let in. (4) max-hold spent: delete the blockers, free the
Lease, leave the line, fail the gang (rolled back). Once the reservation is admitted: delete leftover
blockers, free the Lease, delete the ticket, Event GuardReleased.

Touches only: the scope's Lease, tickets (ours; a gone gang's, under its uid), blocker pods of the scope
in the guard namespace (ours: label ``raygpu.io/guard-blocker=<tag>`` *and* owned by our ticket; a gone
gang's: owned by a ticket that is not live; each deleted under a uid precondition), and the reservation's
own pods (``raygpu.io/reservation=<group>``). It never deletes, evicts or preempts any other pod.
"""

from __future__ import annotations

import datetime as dt
import math
import os
import time
from typing import TYPE_CHECKING, Any, Callable

from raygpu.adapters.kube import KubeAdapter, node_view, parse_each, pod_view
from raygpu.errors import ConflictError, NotFoundError, RayGpuError
from raygpu.model.gang import GangPlan, ReservationState
from raygpu.model.guard import (HELD, LEASE_DURATION_S, Blocker, GuardPolicy, HoldPhase, HoldUnit, LeaseView, Ticket,
                                check_hold_transition, guard_namespace, guard_tag, parse_timeouts, ticket_name)
from raygpu.model.labels import (ANNOTATION_GUARD_GANG, ANNOTATION_GUARD_START, ANNOTATION_GUARD_TIMEOUTS,
                                 KEY_GUARD_SCOPE, LABEL_BLOCKER,
                                 LABEL_CLUSTER, LABEL_GUARD_FOR, LABEL_GUARD_PASS, LABEL_GUARD_TICKET,
                                 LABEL_RESERVATION, PRIORITY_CLASS_BLOCKER, dns_label)
from raygpu.model.views import K8sPodView
from raygpu.plan.backfill import estimated_start_s
from raygpu.plan.gang.shapes import free_nodes
from raygpu.plan.guard import (LeaseAction, blocker_units, blockers_to_clear, choose_nodes, decide_lease,
                               live_tickets, need_by_node, plan_hold)

if TYPE_CHECKING:
    from raygpu.gang.reservation import Reservation

GUARD_EVERY_S = 2.0  # the guard's step (the watchdog's is 0.5 s): a few reads per step
LEASE = ("coordination.k8s.io/v1", "Lease")
PAUSE_IMAGE = "registry.k8s.io/pause:3.10"
BLOCKER_REQUESTS = {"cpu": "1m", "memory": "1Mi"}  # no GPU: a blocker holds a node by its anti-affinity
HOSTNAME = "kubernetes.io/hostname"
STEP_DOWN_S = 2 * LEASE_DURATION_S / 3  # a holder whose last renewal landed this long ago stops blocking: before
#   anyone can take its Lease (LEASE_DURATION_S after they last saw it change, on their clocks)


def _micro_time() -> str:  # a Lease's MicroTime; informational (nobody compares it with a clock)
    return dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def pin(affinity: dict[str, Any] | None, node: str) -> dict[str, Any]:
    """``affinity`` with its required node terms narrowed to ``node`` (matchFields metadata.name); a gated
    pod may only have its node affinity narrowed, which this does: every existing term gets the field."""
    field = {"key": "metadata.name", "operator": "In", "values": [node]}
    out = dict(affinity or {})
    na = dict(out.get("nodeAffinity") or {})
    req = dict(na.get("requiredDuringSchedulingIgnoredDuringExecution") or {})
    terms = [dict(t) for t in req.get("nodeSelectorTerms") or []] or [{}]
    for t in terms:
        t["matchFields"] = [*(t.get("matchFields") or []), field]
    req["nodeSelectorTerms"] = terms
    na["requiredDuringSchedulingIgnoredDuringExecution"] = req
    out["nodeAffinity"] = na
    return out


class Guard:
    """The guard of one reservation. ``clock``: the driver's monotonic seconds (never compared elsewhere);
    ``wall``: its unix seconds, used only for runtime hints (estimated ends from the kubelets' startTimes:
    plan/backfill.py, whose margin bounds the skew)."""

    def __init__(self, kube: KubeAdapter, plan: GangPlan, policy: GuardPolicy, *, state_uid: str,
                 cluster_uid: str, template_spec: dict[str, Any], clock: Callable[[], float],
                 progress: Callable[[str], None] = lambda m: None, wall: Callable[[], float] = time.time,
                 namespace: str | None = None) -> None:
        self.kube, self.plan, self.policy = kube, plan, policy
        self.state_uid, self.cluster_uid, self.template_spec = state_uid, cluster_uid, template_spec
        self.clock, self.progress, self.wall = clock, progress, wall
        self.ns = namespace or guard_namespace(os.environ)  # the guard namespace: scope Lease, tickets, blockers
        self.published: str | None = None  # the estimated start last written on the Lease ("" = none)
        self.scope = policy.scope_for(plan.namespace)
        self.lease_name = policy.lease_name(plan.namespace)
        self.me = plan.gang_name
        self.tag = guard_tag(plan.namespace, plan.gang_name)  # holderIdentity; raygpu.io/guard-for on pods, blockers
        self.ticket = ticket_name(self.lease_name, self.tag)
        self.ticket_uid = ""  # our ticket Lease's uid once read back: our blockers' owner
        self.nodes: tuple[str, ...] | None = None  # chosen once per hold
        self.phase = HoldPhase.WAITING  # changed only by _to, along model.guard.ALLOWED_HOLD_TRANSITIONS
        self.held_since: float | None = None  # our clock, when we took the Lease (set while the phase is HELD)
        self.held_before_s = 0.0  # our clock: how long earlier holds of this gang blocked nodes (max-hold bounds the sum)
        self.failure: str | None = None  # why the gang is rolled back (max-hold spent, or the hold lost after the swap)
        self._seen: tuple[tuple[str, str, str], float] | None = None
        self._tickets_seen: dict[str, tuple[tuple[str, str], float]] = {}  # ticket -> (record, first seen unchanged)
        self._last_step = float("-inf")
        self._last_renew = float("-inf")  # our clock: the last scope-Lease write that landed
        self._last_ticket = float("-inf")  # our clock: the last ticket renewal that landed

    @classmethod
    def of(cls, rsv: Reservation, clock: Callable[[], float], progress: Callable[[str], None],
           wall: Callable[[], float] = time.time) -> "Guard | None":
        """The guard of reservation ``rsv`` (by its wiring, fixed when it was planned), None when it is not
        guarded."""
        wiring = rsv.wiring
        if wiring.guard is None:
            return None
        return cls(rsv.kube, rsv.plan, wiring.guard, state_uid=rsv.state_uid, cluster_uid=wiring.cluster_uid,
                   template_spec=wiring.template_spec, clock=clock, progress=progress, wall=wall)

    # ----------------------------------------------------------------- phase
    def _to(self, phase: HoldPhase) -> None:
        """The one way the hold's phase changes: an edge not in ALLOWED_HOLD_TRANSITIONS raises PermanentError."""
        self.phase = check_hold_transition(self.phase, phase)

    @property
    def done(self) -> bool:
        """The guard has ended (released): the watchdog stops stepping it."""
        return self.phase == HoldPhase.RELEASED

    @property
    def swapped(self) -> bool:
        """The gang's pods are ungated onto the held nodes (this hold)."""
        return self.phase in (HoldPhase.SWAPPED, HoldPhase.UNBLOCKED)

    @property
    def failed(self) -> str | None:
        """Why the gang must be rolled back (max-hold spent, or its hold lost after the swap), else None."""
        return self.failure

    # ------------------------------------------------------------------ step
    def step(self, state: ReservationState) -> None:
        """One guard step (a no-op sooner than ``GUARD_EVERY_S`` after the last). Raises RayGpuError when a
        read or write failed: the watchdog retries next step; nothing is believed that did not land."""
        now = self.clock()
        if self.done or now - self._last_step < GUARD_EVERY_S:
            return
        self._last_step = now
        if state != ReservationState.RESERVED:
            self.release(f"reservation {state.value}")
            return
        if self.phase in HELD and self._held_for(now) > self.policy.max_hold_s:
            self._time_out(f"nodes blocked for {self._held_for(now):.0f} s in all > max-hold "
                           f"{self.policy.max_hold_s:g} s")
            return
        if self.phase in HELD and now - self._last_renew > STEP_DOWN_S:
            self._stop_blocking(now, f"the scope's Lease was not renewed for {now - self._last_renew:.0f} s")
        if self.phase == HoldPhase.STOPPED:
            self._stopped()
        if self.phase == HoldPhase.FAILED:
            return  # max-hold spent (or lost after the swap): it never holds again; the watchdog rolls the gang back
        tickets = self._tickets(now)
        for t in tickets:
            if t.name not in self._tickets_seen or self._tickets_seen[t.name][0] != t.record:
                self._tickets_seen[t.name] = (t.record, now)
        live, gone = live_tickets(tickets, {n: now - at for n, (_, at) in self._tickets_seen.items()}, self.tag)
        lease = self._read_lease()
        if lease is None or self._seen is None or self._seen[0] != lease.record:
            self._seen = (lease.record if lease else ("", "", ""), now)
        decision = decide_lease(self.tag, lease, [t.waiting() for t in live], now - self._seen[1])
        if self.phase in HELD and decision.action != LeaseAction.RENEW:
            self._stop_blocking(now, f"{lease.holder if lease else 'nobody'} holds scope {self.scope} now")
            self._stopped()
            if self.phase == HoldPhase.FAILED:
                return  # swapped in already: rolled back, never holds again
        if decision.action == LeaseAction.WAIT:
            return
        if decision.action == LeaseAction.CREATE:
            self._create_lease()
            self._last_renew = now
        elif decision.action == LeaseAction.ACQUIRE or now - self._last_renew > LEASE_DURATION_S / 3:
            assert lease is not None  # decide_lease says CREATE when there is none
            self._write_lease(lease, acquire=decision.action == LeaseAction.ACQUIRE)
            self._last_renew = now
        if self.phase == HoldPhase.WAITING:
            self._to(HoldPhase.CHOOSING)
            self.held_since = now
            self.progress(f"guard: {self.me} holds scope {self.scope} ({decision.reason})")
        if not self._clear_gone(live, gone):
            return  # a live gang's blockers still stand (it is removing them): block nothing until they are gone
        self._hold(now)

    def _tickets(self, now: float) -> list[Ticket]:
        """The scope's proven tickets (model.guard.Ticket.from_k8s: a lookalike never queues), ours created if
        missing and renewed every LEASE_DURATION_S / 3."""
        raw = self.kube.list(*LEASE, self.ns, f"{LABEL_GUARD_TICKET}={self.scope}")
        tickets = [t for r in raw if (t := Ticket.from_k8s(r, self.scope, self.lease_name)) is not None]
        mine = next((t for t in tickets if t.tag == self.tag), None)
        if mine is None:
            t0 = _micro_time()
            try:
                made = self.kube.create({"apiVersion": LEASE[0], "kind": LEASE[1], "metadata": {
                    "name": self.ticket, "namespace": self.ns,
                    "labels": {LABEL_GUARD_TICKET: self.scope, KEY_GUARD_SCOPE: self.scope,
                               LABEL_CLUSTER: dns_label(self.plan.cluster)},
                    "annotations": {ANNOTATION_GUARD_GANG: f"{self.plan.namespace}/{self.me}"}},
                    "spec": {"holderIdentity": self.tag, "leaseDurationSeconds": LEASE_DURATION_S, "acquireTime": t0,
                             "renewTime": t0}})
            except ConflictError:
                return tickets  # exists: a create whose answer was lost (read back next step)
            self._last_ticket = now
            mine = Ticket.from_k8s(made, self.scope, self.lease_name)
            tickets = [*tickets, *([mine] if mine else [])]
        elif now - self._last_ticket > LEASE_DURATION_S / 3:
            self.kube.merge_patch(*LEASE, self.ticket, self.ns, {"metadata": {"resourceVersion": mine.resource_version},
                                                                 "spec": {"renewTime": _micro_time()}})
            self._last_ticket = now
        if mine is not None:
            self.ticket_uid = mine.uid
        return tickets

    def _clear_gone(self, live: list[Ticket], gone: list[Ticket]) -> bool:
        """As the holder: delete the blockers (uid precondition) proven to belong to a gang that is gone (their
        owner ticket is not live) and the gone tickets. Returns False while another, live gang's blockers
        still stand in the scope (it removes them itself once it sees it no longer holds)."""
        delete, wait = blockers_to_clear(self._scope_blockers(), {t.uid for t in live}, self.ticket_uid)
        for b in delete:
            try:
                self.kube.delete("v1", "Pod", b.name, self.ns, uid=b.uid)
            except ConflictError:
                pass  # another object of that name now: not the one proven gone
        for t in gone:
            try:
                self.kube.delete(*LEASE, t.name, self.ns, uid=t.uid)
            except (ConflictError, NotFoundError):
                pass
            self._tickets_seen.pop(t.name, None)
        if delete or gone:
            self._event("GuardTookOver", f"{self.me}: removed {len(delete)} blocker(s) and {len(gone)} ticket(s) of "
                        f"gangs gone from scope {self.scope} ({', '.join(t.gang or t.tag for t in gone) or '-'})")
        return not wait

    def _stop_blocking(self, now: float, why: str) -> None:
        """End this hold early (our Lease went, or could not be renewed in time): STOPPED until its blockers
        are gone (now, or at the next step that reaches the API server), the time held counts against
        max-hold. Swapped in already: the gang is rolled back."""
        self.held_before_s += now - (self.held_since or now)
        self._event("GuardLost", f"{self.me}: {why}; its blockers are deleted" +
                    ("; its pods were already swapped in: rolled back" if self.swapped else ""), "Warning")
        if self.swapped:
            self.failure = f"guard: {why} after the swap"
        self._to(HoldPhase.STOPPED)
        self.nodes, self.held_since, self.published = None, None, None

    def _stopped(self) -> None:
        """STOPPED: delete our blockers (raises when a delete fails: STOPPED until one step gets them all), then
        back in line, or FAILED when the gang was swapped in already."""
        self.delete_blockers()
        self._to(HoldPhase.FAILED if self.failure else HoldPhase.WAITING)

    def _hold(self, now: float) -> None:
        need = self.plan.need
        gpu = need.gpu_shape.resource if need.gpu_shape else None
        if self.phase == HoldPhase.CHOOSING:
            self.nodes = self._choose(gpu)
            if self.nodes is None:
                return
            self._to(HoldPhase.BLOCKING)
            self._event("GuardHeld", f"{self.me} is first in line in scope {self.scope}: blocking "
                        f"{', '.join(sorted(set(self.nodes)))} for up to {self.policy.max_hold_s:g} s")
        if self.phase in (HoldPhase.SWAPPED, HoldPhase.UNBLOCKED):
            self._unblock_when_bound(now)
            return
        if not self.ticket_uid:
            return  # our ticket not read back yet: a blocker must name its owner
        units = blocker_units(f"{self.tag}-bl", self.nodes)
        alloc, pods = self._held(sorted(set(self.nodes)))
        free = {n.name: n.free for n in free_nodes(alloc, pods)}
        need_at = need_by_node(need.k8s_requests, self.nodes)
        step = plan_hold(units, self._blockers(), free, need_at, self._held_for(now), self.policy.max_hold_s)
        if step.timed_out:
            self._time_out(step.reason)
            return
        for u in step.to_create:
            self._create_blocker(u)
        wall = self.wall()
        self._publish(estimated_start_s(need_at, {n.name: n.allocatable for n in alloc}, _by_node(pods), wall), wall)
        swapping = self.phase == HoldPhase.SWAPPING
        if step.swap and not swapping and self._revoke_passes():
            return  # backfill pods still pending with our pass: without it they cannot race the gang; swap next step
        if step.swap or swapping:  # a swap cut short by a failed patch: the pods it let in now use the room
            self._swap()

    def _unblock_when_bound(self, now: float) -> None:
        """After the swap: once every gang pod is bound, delete the blockers; past max-hold, time out."""
        if self.phase == HoldPhase.UNBLOCKED:
            return
        if self._held_for(now) > self.policy.max_hold_s:
            self._time_out("the gang's pods were not all bound within max-hold")
            return
        pods = self._gang_pods()
        if len(pods) == self.plan.pod_count and all(p.node_name for p in pods):
            self.delete_blockers()
            self._to(HoldPhase.UNBLOCKED)
            self.progress(f"guard: every pod of {self.me} is bound; blockers deleted")

    def _held_for(self, now: float) -> float:
        """How long this gang's holds have blocked nodes, all of them together (our clock)."""
        return self.held_before_s + (now - self.held_since if self.held_since is not None else 0.0)

    def _held(self, names: list[str]) -> tuple[list, list[K8sPodView]]:
        """The held nodes and the pods bound there, only: one GET per node and one list per node (a
        ``spec.nodeName`` field selector), so a step costs the same on 10 nodes or 10,000. A node that is
        gone is left out (plan_hold: it never fits)."""
        raw = [n for n in (self.kube.get("v1", "Node", name) for name in names) if n is not None]
        pods = [p for name in names for p in self.kube.list("v1", "Pod", field_selector=f"spec.nodeName={name}")]
        return parse_each(raw, node_view, "Node"), parse_each(pods, pod_view, "Pod")

    def _choose(self, gpu: str | None) -> tuple[str, ...] | None:
        """Nodes the gang's pods may use (nodeSelector, taints): where they fit soonest by the pods' known
        ends, then by most free GPUs now (plan.guard.choose_nodes)."""
        sel = self.template_spec.get("nodeSelector") or {}
        tols = parse_each([{"metadata": {"name": "t", "namespace": "t"}, "spec": {
            "tolerations": self.template_spec.get("tolerations") or []}}], pod_view, "Pod")[0].tolerations
        nodes = [n for n in parse_each(self.kube.list("v1", "Node"), node_view, "Node")
                 if all(n.labels.get(k) == v for k, v in sel.items())
                 and all(any(t.tolerates(x) for t in tols) for x in n.taints if x.effect in ("NoSchedule", "NoExecute"))]
        pods = parse_each(self.kube.list("v1", "Pod"), pod_view, "Pod")
        return choose_nodes(self.plan.need.k8s_requests, self.plan.pod_count, free_nodes(nodes, pods), gpu,
                            _by_node(pods), self.wall())

    # ---------------------------------------------------------------- blockers
    def _blocker_pods(self) -> list[dict[str, Any]]:
        """Our blockers: label ``raygpu.io/guard-blocker=<tag>`` *and* owned by our ticket (uid)."""
        if not self.ticket_uid:
            self._find_ticket()
        return [p for p in self.kube.list("v1", "Pod", self.ns, f"{LABEL_BLOCKER}={self.tag}")
                if self.ticket_uid and _owner_uid(p) == self.ticket_uid]

    def _find_ticket(self) -> None:
        raw = self.kube.get(*LEASE, self.ticket, self.ns)
        t = Ticket.from_k8s(raw, self.scope, self.lease_name) if raw else None
        self.ticket_uid = t.uid if t is not None and t.tag == self.tag else ""

    def _blockers(self) -> list[Blocker]:
        return [_blocker(p) for p in self._blocker_pods()]

    def _scope_blockers(self) -> list[Blocker]:
        """Every blocker of the scope in the guard namespace (anyone's), with its owner ticket's uid."""
        return [_blocker(p) for p in self.kube.list("v1", "Pod", self.ns, f"{KEY_GUARD_SCOPE}={self.scope}")
                if LABEL_BLOCKER in ((p.get("metadata") or {}).get("labels") or {})]

    def blocker_spec(self, node: str) -> dict[str, Any]:
        """A blocker's pod spec: bound to ``node`` by ``nodeName``, tiny requests, the gang's tolerations, and a
        required anti-affinity against every pod (any namespace) whose raygpu.io/guard-for is not this gang
        *and* whose raygpu.io/guard-pass is not this gang (requirements are ANDed): a pod with the pass
        (a backfill, plan/backfill.py) is let in."""
        term = {"labelSelector": {"matchExpressions": [
                    {"key": LABEL_GUARD_FOR, "operator": "NotIn", "values": [self.tag]},
                    {"key": LABEL_GUARD_PASS, "operator": "NotIn", "values": [self.tag]}]},
                "namespaceSelector": {}, "topologyKey": HOSTNAME}
        spec: dict[str, Any] = {
            "nodeName": node, "priorityClassName": PRIORITY_CLASS_BLOCKER, "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 0,
            # a kubelet ends it once this gang's max-hold (and a Lease's duration) is spent, whoever is left
            "activeDeadlineSeconds": max(1, math.ceil(self.policy.max_hold_s - self.held_before_s) + LEASE_DURATION_S),
            "affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [term]}},
            "containers": [{"name": "block", "image": PAUSE_IMAGE,
                            "resources": {"requests": dict(BLOCKER_REQUESTS), "limits": dict(BLOCKER_REQUESTS)}}]}
        if self.template_spec.get("tolerations"):  # tolerating nothing more than the gang's pods
            spec["tolerations"] = self.template_spec["tolerations"]
        return spec

    def _create_blocker(self, unit: HoldUnit) -> None:
        try:
            self.kube.create({"apiVersion": "v1", "kind": "Pod", "metadata": {
                "name": unit.name, "namespace": self.ns,
                "labels": {LABEL_BLOCKER: self.tag, LABEL_GUARD_FOR: self.tag, KEY_GUARD_SCOPE: self.scope,
                           LABEL_CLUSTER: dns_label(self.plan.cluster)},
                "annotations": {ANNOTATION_GUARD_GANG: f"{self.plan.namespace}/{self.me}"},
                "ownerReferences": [{"apiVersion": LEASE[0], "kind": LEASE[1], "name": self.ticket,
                                     "uid": self.ticket_uid, "blockOwnerDeletion": False}]},
                "spec": self.blocker_spec(unit.node)})
        except ConflictError:
            pass  # exists: an earlier create whose answer was lost (read back, and proven, next step)

    def delete_blockers(self) -> int:
        """Delete this reservation's blockers (proven ours: label and owner uid), each under a uid precondition.
        Returns how many were deleted; raises RayGpuError on a failed delete."""
        n = 0
        for p in self._blocker_pods():
            md = p["metadata"]
            try:
                n += self.kube.delete("v1", "Pod", md["name"], self.ns, uid=md.get("uid"))
            except ConflictError:
                pass  # another object of that name now: not ours
        return n

    # ------------------------------------------------------------------ swap
    def _gang_pods(self) -> list:
        return sorted((p for p in self.kube.ray_pods(self.plan.namespace, self.plan.cluster)
                       if p.labels.get(LABEL_RESERVATION) == self.plan.reservation_group and not p.deleting),
                      key=lambda p: p.name)

    def _swap(self) -> None:
        """Label each gated gang pod ``raygpu.io/guard-for=<gang>`` (the blockers' anti-affinity spares it), pin
        it to its node, then ungate it. Idempotent: a pod already ungated is patched to the same values."""
        pods = self._gang_pods()
        if len(pods) != self.plan.pod_count or self.nodes is None:
            return  # KubeRay has not created them all yet
        if self.phase == HoldPhase.BLOCKING:
            self._to(HoldPhase.SWAPPING)
        for p, node in zip(pods, self.nodes):
            self.kube.merge_patch("v1", "Pod", p.name, self.plan.namespace,
                                  {"metadata": {"labels": {LABEL_GUARD_FOR: self.tag}},
                                   "spec": {"affinity": pin(self.template_spec.get("affinity"), node)}})
        for p in pods:
            self.kube.merge_patch("v1", "Pod", p.name, self.plan.namespace, {"spec": {"schedulingGates": None}})
        self._to(HoldPhase.SWAPPED)
        self.progress(f"guard: every chosen node blocked and with room; {len(pods)} pods of {self.me} ungated")

    # ----------------------------------------------------------------- Lease
    def _read_lease(self) -> LeaseView | None:
        return read_lease(self.kube, self.lease_name, self.ns)

    def _create_lease(self) -> None:
        t = _micro_time()
        self.kube.create({"apiVersion": LEASE[0], "kind": LEASE[1], "metadata": {
            "name": self.lease_name, "namespace": self.ns, "labels": {KEY_GUARD_SCOPE: self.scope}},
            "spec": {"holderIdentity": self.tag, "leaseDurationSeconds": LEASE_DURATION_S, "acquireTime": t,
                     "renewTime": t, "leaseTransitions": 0}})

    def _write_lease(self, lease: LeaseView, acquire: bool) -> None:
        t = _micro_time()
        spec: dict[str, Any] = {"holderIdentity": self.tag, "leaseDurationSeconds": LEASE_DURATION_S, "renewTime": t}
        if acquire:
            spec.update(acquireTime=t, leaseTransitions=lease.transitions + 1)
        self.kube.merge_patch(*LEASE, self.lease_name, self.ns,
                              {"metadata": {"resourceVersion": lease.resource_version}, "spec": spec})

    def _free_lease(self) -> None:
        lease = self._read_lease()
        if lease is not None and lease.holder == self.tag:
            self.kube.merge_patch(*LEASE, self.lease_name, self.ns, {
                "metadata": {"resourceVersion": lease.resource_version, "annotations": {ANNOTATION_GUARD_START: None}},
                "spec": {"holderIdentity": None}})
        self.published = None

    def _publish(self, start_s: float | None, now_s: float) -> None:
        """Write the hold's estimated start (whole unix seconds; "" when unknown) on the Lease when it changed,
        by a merge patch carrying the resourceVersion just read: a 409 is left for the next step to re-read,
        never overwritten. Only while we hold the Lease. A start already due that stays due (it is "now"
        while an overrun lasts) is not rewritten every step."""
        value = "" if start_s is None else f"{start_s:.0f}"
        if value == self.published or (value and self.published and max(float(value), float(self.published)) <= now_s):
            return
        lease = self._read_lease()
        if lease is None or lease.holder != self.tag:
            return
        try:
            self.kube.merge_patch(*LEASE, self.lease_name, self.ns, {"metadata": {
                "resourceVersion": lease.resource_version, "annotations": {ANNOTATION_GUARD_START: value or None}}})
        except ConflictError:
            return  # changed since read: re-read next step
        self.published = value

    def _revoke_passes(self) -> int:
        """Before the swap: take our pass off raygpu's backfill pods still pending (unbound) in the
        namespace, so none races the gang for the room it waited for. Only pods raygpu made (label
        raygpu.io/reservation) are touched, each under its resourceVersion. Returns how many it revoked."""
        n = 0
        for p in self.kube.list("v1", "Pod", self.plan.namespace, f"{LABEL_GUARD_PASS}={self.tag},{LABEL_RESERVATION}"):
            md = p["metadata"]
            if (p.get("spec") or {}).get("nodeName") or md.get("deletionTimestamp"):
                continue
            try:
                self.kube.merge_patch("v1", "Pod", md["name"], self.plan.namespace, {"metadata": {
                    "resourceVersion": md.get("resourceVersion"), "labels": {LABEL_GUARD_PASS: None}}})
            except ConflictError:
                pass  # changed since read: looked at again next step (the swap waits for it)
            n += 1
        return n

    # ------------------------------------------------------------- endings
    def _time_out(self, why: str) -> None:
        """max-hold spent (all this gang's holds together): delete the blockers, free the Lease, count the
        time-out, and fail the gang (the watchdog rolls it back, as when its timeout_s runs out): it never
        holds again, so no gang blocks nodes for longer than its max-hold."""
        self.delete_blockers()
        cm = self.kube.get("v1", "ConfigMap", self.me, self.plan.namespace) or {}
        done = parse_timeouts(((cm.get("metadata") or {}).get("annotations") or {}).get(ANNOTATION_GUARD_TIMEOUTS, "0"))
        self.kube.merge_patch("v1", "ConfigMap", self.me, self.plan.namespace,
                              {"metadata": {"annotations": {ANNOTATION_GUARD_TIMEOUTS: str(done + 1)}}})
        self._free_lease()
        self._delete_ticket()
        self._event("GuardTimedOut", f"{self.me}: {why}; blockers deleted, scope {self.scope} freed; max-hold "
                    f"{self.policy.max_hold_s:g} s is spent, so the gang is rolled back" +
                    ("; its pods were already swapped in" if self.swapped else ""), "Warning")
        self.failure = f"guard: {why} (max-hold {self.policy.max_hold_s:g} s spent)" + (
            " after the swap" if self.swapped else "")
        self._to(HoldPhase.FAILED)
        self.nodes, self.held_since = None, None

    def release(self, why: str) -> None:
        """End the guard: delete leftover blockers, free the Lease if we hold it, Event GuardReleased once.
        Idempotent; raises RayGpuError when a write failed (called again, it finishes)."""
        if self.done:
            return
        held = self.phase in HELD
        self.delete_blockers()
        self._free_lease()
        self._delete_ticket()
        self._to(HoldPhase.RELEASED)
        if held:
            self._event("GuardReleased", f"{self.me}: {why}; scope {self.scope} freed")

    def _delete_ticket(self) -> None:
        """Leave the line: our ticket goes (uid precondition; already gone is fine)."""
        if not self.ticket_uid:
            self._find_ticket()
        if self.ticket_uid:
            try:
                self.kube.delete(*LEASE, self.ticket, self.ns, uid=self.ticket_uid)
            except (ConflictError, NotFoundError):
                pass

    def _event(self, reason: str, message: str, type_: str = "Normal") -> None:
        self.progress(f"guard: {reason}: {message}")
        try:
            self.kube.event({"apiVersion": "ray.io/v1", "kind": "RayCluster", "name": self.plan.cluster,
                             "namespace": self.plan.namespace, "uid": self.cluster_uid}, reason, message, type_)
        except RayGpuError as e:  # an Event never blocks the guard
            self.progress(f"guard: event {reason} not recorded: {e}")


def _owner_uid(pod: dict[str, Any]) -> str:
    """The uid of the ticket Lease a blocker pod is owned by ("" when none)."""
    return next((o.get("uid") or "" for o in (pod.get("metadata") or {}).get("ownerReferences") or []
                 if o.get("kind") == LEASE[1]), "")


def _blocker(p: dict[str, Any]) -> Blocker:
    md = p.get("metadata") or {}
    return Blocker(name=md.get("name", ""), uid=md.get("uid", ""), node=(p.get("spec") or {}).get("nodeName") or "",
                   ended=(p.get("status") or {}).get("phase") in ("Succeeded", "Failed"),
                   deleting=bool(md.get("deletionTimestamp")), owner_uid=_owner_uid(p))


def _by_node(pods: list[K8sPodView]) -> dict[str, list[K8sPodView]]:
    out: dict[str, list[K8sPodView]] = {}
    for p in pods:
        if p.node_name:
            out.setdefault(p.node_name, []).append(p)
    return out


def read_lease(kube: KubeAdapter, name: str, namespace: str) -> LeaseView | None:
    """The scope's Lease (None: there is none), as the holder and the backfill (``gang.backfill``) read it."""
    raw = kube.get(*LEASE, name, namespace)
    return LeaseView.from_k8s(raw) if raw else None
