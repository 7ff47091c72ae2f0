"""The starvation guard of one guarded reservation, run by its driver's watchdog (docs/guard.md).

Every object of a scope lives in the *guard namespace* (raygpu-system, or ``$RAYGPU_GUARD_NAMESPACE``), so
one gang holds a scope across every namespace: the scope's Lease ``raygpu-guard-<scope>``, one *ticket*
Lease per waiting guarded gang (``<scope lease>.<tag>``, renewed by its driver: the line), and the blockers.

Each ``step`` (at most every ``GUARD_EVERY_S``) reads as the sidecar's cycle: **observe** (``observe``: by
the hold's phase, the scope's proven tickets and Lease; while holding, the scope's blockers and ours;
choosing, the nodes the gang may use and every pod; after, only the held nodes, the pods bound there, the
gang's pods and our pending passes), **one pure plan** (``raygpu.plan.guard.plan_guard_step``: time out,
stop, the ticket and Lease writes, take the scope, gone gangs' blockers and tickets, the nodes, blockers to
create, the estimated start, revoke passes, swap, unblock, the next phase, the Events), **act** (``act``: in
the plan's order, each phase edge taken as its write lands: model.guard.ALLOWED_HOLD_TRANSITIONS). When the
plan moves to a phase that reads more (joined the line, took the Lease) it looks again in the same step.
A blocker pod: ``spec.nodeName`` set (the API server binds it; no scheduler queue, no race), requests 1m
CPU and 1Mi memory, and a required pod anti-affinity (topologyKey kubernetes.io/hostname, every namespace)
against every pod labelled neither ``raygpu.io/guard-for=<tag>`` nor ``raygpu.io/guard-pass=<tag>``
(a backfill, guard/backfill.py).

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
from typing import Any, Callable, Protocol

from raygpu.adapters.kube import KubeAdapter, node_view, parse_each, pod_view
from raygpu.errors import ConflictError, NotFoundError, RayGpuError
from raygpu.model.gang import GangPlan, GangRequest, NodeFree, ReservationState
from raygpu.model.guard import (HELD, LEASE_DURATION_S, Ask, Blocker, GuardPolicy, GuardWiring, HoldPhase, HoldUnit, LeaseView,
                                Ticket, check_hold_transition, format_grants, guard_namespace, guard_tag, parse_timeouts,
                                ticket_name)
from raygpu.model.labels import (ANNOTATION_GUARD_GANG, ANNOTATION_GUARD_GRANTS, ANNOTATION_GUARD_START,
                                 ANNOTATION_GUARD_TIMEOUTS, LABEL_GUARD_ASK,
                                 KEY_GUARD_SCOPE, LABEL_BLOCKER,
                                 LABEL_CLUSTER, LABEL_GUARD_FOR, LABEL_GUARD_PASS, LABEL_GUARD_TICKET,
                                 LABEL_RESERVATION, PRIORITY_CLASS_BLOCKER, dns_label)
from raygpu.model.views import K8sPodView
from raygpu.plan.gang.shapes import free_nodes
from raygpu.plan.guard import (GuardEvent, GuardObservation, GuardStep, HoldView, LeaseAction, TicketAction,
                               plan_guard_step)

GUARD_EVERY_S = 2.0  # the guard's step (the watchdog's is 0.5 s): a few reads per step
LEASE = ("coordination.k8s.io/v1", "Lease")
PAUSE_IMAGE = "registry.k8s.io/pause:3.10"
BLOCKER_REQUESTS = {"cpu": "1m", "memory": "1Mi"}  # no GPU: a blocker holds a node by its anti-affinity
HOSTNAME = "kubernetes.io/hostname"
MAX_LOOKS = 4  # observe-plan-act rounds in one step: join the line, take the Lease, choose and block (and one spare)


class Wired(Protocol):
    """What ``Guard.of`` and ``Backfill.of`` read of a reservation (``raygpu.gang.reservation.Reservation``,
    which this package does not import: the gang capability runs the guard, not the other way round)."""

    kube: KubeAdapter
    plan: GangPlan
    request: GangRequest
    wiring: GuardWiring
    state_uid: str


def _no_answers(lease: LeaseView) -> str | None:
    """``raygpu.io/guard-grants`` when the Lease is taken or freed: no answers, the revision one more (it only
    grows while the Lease exists: model.guard.format_grants); None (absent) when no answer was ever written."""
    return format_grants(lease.grant_rev + 1, {}) if lease.grant_rev or lease.grants else None


def micro_time() -> str:  # a Lease's MicroTime; informational (nobody compares it with a clock)
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
        self._asks_seen: dict[str, tuple[tuple[str, str], float]] = {}  # backfill ask -> (record, first seen unchanged)
        self._last_step = float("-inf")
        self._last_renew = float("-inf")  # our clock: the last scope-Lease write that landed
        self._last_ticket = float("-inf")  # our clock: the last ticket renewal that landed

    @classmethod
    def of(cls, rsv: Wired, clock: Callable[[], float], progress: Callable[[str], None],
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
        """One guard step (a no-op sooner than ``GUARD_EVERY_S`` after the last): observe, one pure plan
        (``plan.guard.plan_guard_step``), act; again, at most ``MAX_LOOKS`` times, while the plan's phase moves
        to one that reads more (joined the line, took the Lease). Raises RayGpuError when a read or write
        failed: the watchdog retries next step; nothing is believed that did not land."""
        now = self.clock()
        if self.done or now - self._last_step < GUARD_EVERY_S:
            return
        self._last_step = now
        for _ in range(MAX_LOOKS):
            seen = self.observe(state, now)
            if not self.act(plan_guard_step(seen), seen, now):
                return

    def observe(self, state: ReservationState, now: float) -> GuardObservation:
        """What this step sees, read by phase: past ``reserved`` or failed, nothing; else the line (the scope's
        proven tickets, its Lease) and, while holding, the hold: every blocker of the scope and ours; choosing,
        the nodes the gang's pods may use and every pod; after, only the held nodes and the pods bound there
        (a step costs the same on any cluster size), the gang's pods and our passes still pending."""
        P = HoldPhase
        need = self.plan.need
        o: dict[str, Any] = dict(
            gang=self.me, tag=self.tag, scope=self.scope, state=state.value, phase=self.phase, failure=self.failure,
            max_hold_s=self.policy.max_hold_s, held_for_s=self._held_for(now), since_renew_s=now - self._last_renew,
            since_ticket_s=now - self._last_ticket, nodes=self.nodes, pod_requests=dict(need.k8s_requests),
            pod_count=self.plan.pod_count, gpu_resource=need.gpu_shape.resource if need.gpu_shape else None,
            published=self.published)
        if state != ReservationState.RESERVED or self.phase in (P.FAILED, P.RELEASED):
            return GuardObservation(**o)
        raw = self.kube.list(*LEASE, self.ns, f"{LABEL_GUARD_TICKET}={self.scope}")
        tickets = [t for r in raw if (t := Ticket.from_k8s(r, self.scope, self.lease_name)) is not None]
        for t in tickets:
            if t.name not in self._tickets_seen or self._tickets_seen[t.name][0] != t.record:
                self._tickets_seen[t.name] = (t.record, now)
        mine = next((t for t in tickets if t.tag == self.tag), None)
        if mine is not None:
            self.ticket_uid = mine.uid
        lease = self._read_lease()
        if lease is None or self._seen is None or self._seen[0] != lease.record:
            self._seen = (lease.record if lease else ("", "", ""), now)
        o.update(ticket=mine, tickets=tuple(tickets), lease=lease, lease_unchanged_for_s=now - self._seen[1],
                 tickets_unchanged_for_s={n: now - at for n, (_, at) in self._tickets_seen.items()},
                 wall_s=self.wall())
        if self.phase in HELD and mine is not None:
            o["hold"] = self._observe_hold()
            asks = [a for r in self.kube.list(*LEASE, self.ns, f"{LABEL_GUARD_ASK}={self.lease_name}")
                    if (a := Ask.from_k8s(r, self.lease_name)) is not None]
            seen = self._asks_seen  # timed on our clock from when we first saw each record (an ask gone: forgotten)
            self._asks_seen = {a.name: seen[a.name] if a.name in seen and seen[a.name][0] == a.record else (a.record, now)
                               for a in asks}
            o.update(asks=tuple(asks), asks_unchanged_for_s={a.name: now - self._asks_seen[a.name][1] for a in asks})
        return GuardObservation(**o)

    def _observe_hold(self) -> HoldView:
        h: dict[str, Any] = dict(scope_blockers=tuple(self._scope_blockers()), blockers=tuple(self._blockers()))
        if self.phase == HoldPhase.CHOOSING:
            candidates, pods = self._candidates()
            h.update(candidates=candidates, free={n.name: n.free for n in candidates},
                     allocatable={n.name: n.allocatable for n in candidates}, pods_by_node=_by_node(pods))
        elif self.nodes is not None and self.phase in (HoldPhase.BLOCKING, HoldPhase.SWAPPING):
            alloc, pods = self._held(sorted(set(self.nodes)))
            h.update(free={n.name: n.free for n in free_nodes(alloc, pods)},
                     allocatable={n.name: n.allocatable for n in alloc}, pods_by_node=_by_node(pods))
        if self.phase in (HoldPhase.BLOCKING, HoldPhase.SWAPPING, HoldPhase.SWAPPED):
            gang = self._gang_pods()
            h.update(gang_pods=tuple(p.name for p in gang), gang_bound=all(p.node_name for p in gang))
        return HoldView(**h)

    def act(self, plan: GuardStep, seen: GuardObservation, now: float) -> bool:
        """Do what ``plan`` says, in its order (GuardStep), moving the phase along each edge as its action lands
        (a failed write raises before the phase moves: the next step plans it again). ``seen``: the look it
        was planned from (the Lease's resourceVersion to write under). Returns True when the plan asks to
        observe again this step."""
        P = HoldPhase
        events = {e.reason: e for e in plan.events}
        if plan.release:
            self.release(plan.reason)
            return False
        if plan.time_out:
            self._time_out(plan, events["GuardTimedOut"])
            return False
        if plan.stop:
            self.held_before_s += now - (self.held_since or now)
            self._emit(events["GuardLost"])
            self.failure = plan.failure
            self._to(P.STOPPED)
            self.nodes, self.held_since, self.published = None, None, None
        if plan.delete_mine:
            self.delete_blockers()
            self._to(P.FAILED if self.failure else P.WAITING)
        if self.phase == P.FAILED:
            return False  # max-hold spent (or lost after the swap): it never holds again; the watchdog rolls it back
        if plan.ticket == TicketAction.CREATE:
            return self._create_ticket(now)  # then look again (a create whose answer was lost: next step)
        if plan.ticket == TicketAction.RENEW and seen.ticket is not None:
            self._renew_ticket(seen.ticket, now)
        if plan.lease == LeaseAction.CREATE:
            self._create_lease()
            self._last_renew = now
        elif plan.lease is not None and seen.lease is not None:
            self._write_lease(seen.lease, acquire=plan.lease == LeaseAction.ACQUIRE)
            self._last_renew = now
        if plan.take:
            self._to(P.CHOOSING)
            self.held_since = now
        if plan.again:
            self._say(plan)
            return True
        self._clear_gone(plan, events.get("GuardTookOver"))
        if plan.nodes is not None:
            self.nodes = plan.nodes
            self._to(P.BLOCKING)
            self._emit(events["GuardHeld"])
        if plan.unblock:
            self.delete_blockers()
            self._to(P.UNBLOCKED)
        for u in plan.to_create:
            self._create_blocker(u)
        if plan.publish is not None or plan.grants is not None:
            self._annotate_lease(plan.publish, plan.grants)
        if plan.swap:
            if self.phase == P.BLOCKING:
                self._to(P.SWAPPING)
            self._swap(seen.hold.gang_pods if seen.hold else ())
            self._to(P.SWAPPED)
        self._say(plan)
        return False

    def _say(self, plan: GuardStep) -> None:
        for m in plan.progress:
            self.progress(m)

    def _create_ticket(self, now: float) -> bool:
        """Join the line: our ticket Lease, labelled as a proven ticket. False when it exists already (a create
        whose answer was lost: read back next step)."""
        t0 = micro_time()
        try:
            made = self.kube.create({"apiVersion": LEASE[0], "kind": LEASE[1], "metadata": {
                "name": self.ticket, "namespace": self.ns,
                "labels": {LABEL_GUARD_TICKET: self.scope, KEY_GUARD_SCOPE: self.scope,
                           LABEL_CLUSTER: dns_label(self.plan.cluster)},
                "annotations": {ANNOTATION_GUARD_GANG: f"{self.plan.namespace}/{self.me}"}},
                "spec": {"holderIdentity": self.tag, "leaseDurationSeconds": LEASE_DURATION_S, "acquireTime": t0,
                         "renewTime": t0}})
        except ConflictError:
            return False
        self._last_ticket = now
        self.ticket_uid = (made.get("metadata") or {}).get("uid") or self.ticket_uid
        return True

    def _renew_ticket(self, mine: Ticket, now: float) -> None:
        self.kube.merge_patch(*LEASE, self.ticket, self.ns, {"metadata": {"resourceVersion": mine.resource_version},
                                                             "spec": {"renewTime": micro_time()}})
        self._last_ticket = now

    def _clear_gone(self, plan: GuardStep, event: GuardEvent | None) -> None:
        """As the holder: delete the blockers (uid precondition) proven to belong to a gang that is gone (their
        owner ticket is not live), the gone tickets (plan.guard.blockers_to_clear) and the gone backfill asks
        (plan.guard.live_asks)."""
        for b in plan.to_delete:
            try:
                self.kube.delete("v1", "Pod", b.name, self.ns, uid=b.uid)
            except ConflictError:
                pass  # another object of that name now: not the one proven gone
        for t in plan.tickets_to_delete:
            try:
                self.kube.delete(*LEASE, t.name, self.ns, uid=t.uid)
            except (ConflictError, NotFoundError):
                pass
            self._tickets_seen.pop(t.name, None)
        for a in plan.asks_to_delete:  # a backfilling gang gone: its ask is answered and waited for no more
            try:
                self.kube.delete(*LEASE, a.name, self.ns, uid=a.uid or None)
            except (ConflictError, NotFoundError):
                pass
            self._asks_seen.pop(a.name, None)
        if event is not None:
            self._emit(event)

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

    def _candidates(self) -> tuple[tuple[NodeFree, ...], list[K8sPodView]]:
        """Nodes the gang's pods may use (nodeSelector, taints) with what is free on each, and every pod (their
        known ends rank the nodes: plan.guard.choose_nodes). Read once per hold, while choosing."""
        sel = self.template_spec.get("nodeSelector") or {}
        tols = parse_each([{"metadata": {"name": "t", "namespace": "t"}, "spec": {
            "tolerations": self.template_spec.get("tolerations") or []}}], pod_view, "Pod")[0].tolerations
        nodes = [n for n in parse_each(self.kube.list("v1", "Node"), node_view, "Node")
                 if all(n.labels.get(k) == v for k, v in sel.items())
                 and all(any(t.tolerates(x) for t in tols) for x in n.taints if x.effect in ("NoSchedule", "NoExecute"))]
        pods = parse_each(self.kube.list("v1", "Pod"), pod_view, "Pod")
        return free_nodes(nodes, pods), pods

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

    def _swap(self, names: tuple[str, ...]) -> None:
        """Label each gated gang pod (``names``, in name order) ``raygpu.io/guard-for=<gang>`` (the blockers'
        anti-affinity spares it), pin it to its node, then ungate it. Idempotent: a pod already ungated is
        patched to the same values."""
        assert self.nodes is not None and len(names) == len(self.nodes)  # (plan_guard_step swaps only then)
        for name, node in zip(names, self.nodes):
            self.kube.merge_patch("v1", "Pod", name, self.plan.namespace,
                                  {"metadata": {"labels": {LABEL_GUARD_FOR: self.tag}},
                                   "spec": {"affinity": pin(self.template_spec.get("affinity"), node)}})
        for name in names:
            self.kube.merge_patch("v1", "Pod", name, self.plan.namespace, {"spec": {"schedulingGates": None}})

    # ----------------------------------------------------------------- Lease
    def _read_lease(self) -> LeaseView | None:
        return read_lease(self.kube, self.lease_name, self.ns)

    def _create_lease(self) -> None:
        t = micro_time()
        self.kube.create({"apiVersion": LEASE[0], "kind": LEASE[1], "metadata": {
            "name": self.lease_name, "namespace": self.ns, "labels": {KEY_GUARD_SCOPE: self.scope}},
            "spec": {"holderIdentity": self.tag, "leaseDurationSeconds": LEASE_DURATION_S, "acquireTime": t,
                     "renewTime": t, "leaseTransitions": 0}})

    def _write_lease(self, lease: LeaseView, acquire: bool) -> None:
        t = micro_time()
        spec: dict[str, Any] = {"holderIdentity": self.tag, "leaseDurationSeconds": LEASE_DURATION_S, "renewTime": t}
        md: dict[str, Any] = {"resourceVersion": lease.resource_version}
        if acquire:  # the last holder's estimate and answers are not ours; the answers' revision counts on
            spec.update(acquireTime=t, leaseTransitions=lease.transitions + 1)
            md["annotations"] = {ANNOTATION_GUARD_START: None, ANNOTATION_GUARD_GRANTS: _no_answers(lease)}
        self.kube.merge_patch(*LEASE, self.lease_name, self.ns, {"metadata": md, "spec": spec})

    def _free_lease(self) -> None:
        lease = self._read_lease()
        if lease is not None and lease.holder == self.tag:
            self.kube.merge_patch(*LEASE, self.lease_name, self.ns, {
                "metadata": {"resourceVersion": lease.resource_version,
                             "annotations": {ANNOTATION_GUARD_START: None, ANNOTATION_GUARD_GRANTS: _no_answers(lease)}},
                "spec": {"holderIdentity": None}})
        self.published = None

    def _annotate_lease(self, start: str | None, grants: str | None) -> None:
        """Write the hold's estimated start (whole unix seconds; "" when unknown) and the answers to backfill
        asks (``raygpu.io/guard-grants``), whichever is not None, on the Lease in one merge patch carrying the
        resourceVersion just read: a 409 is left for the next step to re-read, never overwritten. Only while
        we hold the Lease: the holder is the only writer of both."""
        lease = self._read_lease()
        if lease is None or lease.holder != self.tag:
            return
        ann = {k: v or None for k, v in ((ANNOTATION_GUARD_START, start), (ANNOTATION_GUARD_GRANTS, grants)) if v is not None}
        try:
            self.kube.merge_patch(*LEASE, self.lease_name, self.ns, {"metadata": {
                "resourceVersion": lease.resource_version, "annotations": ann}})
        except ConflictError:
            return  # changed since read: re-read next step
        if start is not None:
            self.published = start

    # ------------------------------------------------------------- endings
    def _time_out(self, plan: GuardStep, event: GuardEvent) -> None:
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
        self._emit(event)
        self.failure = plan.failure
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

    def _emit(self, e: GuardEvent) -> None:
        self._event(e.reason, e.message, e.type)

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


def _by_node(pods: list[K8sPodView]) -> dict[str, tuple[K8sPodView, ...]]:
    out: dict[str, list[K8sPodView]] = {}
    for p in pods:
        if p.node_name:
            out.setdefault(p.node_name, []).append(p)
    return {n: tuple(ps) for n, ps in out.items()}


def read_lease(kube: KubeAdapter, name: str, namespace: str) -> LeaseView | None:
    """The scope's Lease (None: there is none), as the holder and the backfill (``guard.backfill``) read it."""
    raw = kube.get(*LEASE, name, namespace)
    return LeaseView.from_k8s(raw) if raw else None
