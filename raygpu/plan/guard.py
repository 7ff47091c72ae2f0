"""The starvation guard's decisions, pure: who holds a scope, which nodes, which blockers, when to swap.

:func:`plan_guard_step` is one step of a guarded gang (``raygpu.guard.holder`` observes, calls it, acts):
what the step saw (:class:`GuardObservation`) in, the one plan (:class:`GuardStep`) out. The functions
above it are its named parts, also called by the gang-admission benchmark.

No I/O, no clock: every time is an argument measured on the caller's own
clock (``unchanged_for_s``, ``held_for_s``), never compared with a time
another machine wrote. docs/guard.md states the contract.
"""

from __future__ import annotations

import heapq
from enum import Enum
from typing import Mapping, Sequence

from raygpu.model.base import Frozen
from raygpu.model.gang import NodeFree
from raygpu.model.gc import ReservationRecord
from raygpu.model.guard import (HELD, LEASE_DURATION_S, STEP_DOWN_S, Ask, Blocker, HoldPhase, HoldUnit, LeaseView, Ticket,
                                WaitingGang, format_grants)
from raygpu.model.views import K8sPodView
from raygpu.plan.backfill import decide_backfill, estimated_start_s, fit_time_s
from raygpu.plan.common.free_index import fits


class LeaseAction(str, Enum):
    CREATE = "create"  # no Lease yet: create it held by us
    ACQUIRE = "acquire"  # released, expired, or its holder no longer waits: take it (resourceVersion-guarded)
    RENEW = "renew"  # we hold it
    WAIT = "wait"  # someone else holds it, or an older gang waits


class LeaseDecision(Frozen):
    action: LeaseAction
    reason: str


def queue_order(gangs: Sequence[WaitingGang]) -> list[WaitingGang]:
    """Waiting gangs, first in line first: fewest timed-out holds, then oldest (API server's clock), then name."""
    return sorted((g for g in gangs if g.waiting), key=lambda g: (g.timeouts, g.created_at_s, g.name))


def decide_lease(me: str, lease: LeaseView | None, gangs: Sequence[WaitingGang], unchanged_for_s: float) -> LeaseDecision:
    """What gang ``me`` (its state ConfigMap's name) does with its scope's Lease this step.

    ``gangs``: the scope's guarded reservations; ``unchanged_for_s``: how long,
    on the caller's clock, the Lease's record (holder, renewTime,
    resourceVersion) has looked the same to it (0 when first seen). A Lease is
    free when released (holder ""), when its holder no longer waits (admitted,
    released or gone: read from the API server, no clock), or when it has not
    changed for its leaseDurationSeconds. Only the first gang in
    :func:`queue_order` takes a free Lease, so at most one gang per scope holds.
    """
    line = queue_order(gangs)
    first = line[0].name if line else None
    if lease is not None and lease.holder == me:
        return LeaseDecision(action=LeaseAction.RENEW, reason="we hold the scope")
    if first != me:
        return LeaseDecision(action=LeaseAction.WAIT, reason=f"{first or 'nobody'} is first in line")
    if lease is None:
        return LeaseDecision(action=LeaseAction.CREATE, reason="first in line; no Lease yet")
    if not lease.holder:
        return LeaseDecision(action=LeaseAction.ACQUIRE, reason="first in line; the Lease is released")
    if lease.holder not in {g.name for g in line}:
        return LeaseDecision(action=LeaseAction.ACQUIRE, reason=f"first in line; holder {lease.holder} no longer waits")
    if unchanged_for_s > lease.lease_duration_s:
        return LeaseDecision(action=LeaseAction.ACQUIRE, reason=f"first in line; holder {lease.holder} has not "
                             f"renewed for {unchanged_for_s:.0f} s > {lease.lease_duration_s} s")
    return LeaseDecision(action=LeaseAction.WAIT, reason=f"{lease.holder} holds the scope")


def live_tickets(tickets: Sequence[Ticket], unchanged_for_s: Mapping[str, float],
                 me: str) -> tuple[list[Ticket], list[Ticket]]:
    """The scope's proven tickets split into (live, gone). ``unchanged_for_s``: ticket name -> how long its
    record has looked the same on the caller's clock. A ticket unchanged for longer than its
    leaseDurationSeconds is gone: its driver died or cannot reach the API server, and (STEP_DOWN_S) a
    holder that cannot renew has stopped blocking by then. Our own ticket (tag ``me``) is always live."""
    live, gone = [], []
    for t in tickets:
        (live if t.tag == me or unchanged_for_s.get(t.name, 0.0) <= t.lease_duration_s else gone).append(t)
    return live, gone


def blockers_to_clear(blockers: Sequence[Blocker], live_owner_uids: set[str],
                      my_uid: str) -> tuple[list[Blocker], list[Blocker]]:
    """The scope's blockers that are not ours, split into (to delete, to wait for). A blocker whose owner
    ticket is not live (gone, or deleted) is proven to belong to a holder that is gone: the next holder
    deletes it (uid precondition). One whose owner is live belongs to a gang that will remove it itself
    (it sees it no longer holds): the next holder blocks nothing until it is gone, so two gangs never
    block at once."""
    delete, wait = [], []
    for b in blockers:
        if b.owner_uid == my_uid and my_uid:
            continue
        (wait if b.owner_uid in live_owner_uids else delete).append(b)
    return delete, wait


def choose_nodes(pod_requests: Mapping[str, float], pod_count: int, nodes: Sequence[NodeFree],
                 gpu_resource: str | None, pods: Mapping[str, Sequence[K8sPodView]] | None = None,
                 now_s: float = 0.0) -> tuple[str, ...] | None:
    """A node per gang pod, among nodes whose allocatable holds it (a node takes several pods while its
    allocatable holds them); None if some pod fits no node.

    Where the pod fits soonest (plan.backfill.fit_time_s over ``pods``, the pods bound per node, and their
    estimated ends: a pod with no runtime hint or activeDeadlineSeconds never ends), then the node with the
    most of ``gpu_resource`` free now, then the most of every resource, then the name. Without ``pods``, or
    with no hints, every node that does not fit now ties at "never", so the choice is the most GPUs free now.
    Linear in the nodes plus n log n: each node's rank is computed once into a heap; a pick changes only
    the picked node's rank, recomputed and pushed back (a node that no longer holds the pod leaves the heap).
    """
    key = gpu_resource or "cpu"
    never = float("inf")
    left = {n.name: dict(n.allocatable) for n in nodes}
    free = {n.name: dict(n.free) for n in nodes}
    taken: dict[str, dict[str, float]] = {}
    by_name = {n.name: n for n in nodes}

    def rank(n: NodeFree) -> tuple[float, float, float, str]:
        """Smallest first: fits soonest, then most ``key`` free now, then most of everything, then the name."""
        soonest = 0.0
        if pods is not None:
            need = {r: taken.get(n.name, {}).get(r, 0.0) + v for r, v in pod_requests.items()}
            t = fit_time_s(n.allocatable, pods.get(n.name, ()), need, now_s)
            soonest = never if t is None else t
        f = free[n.name]
        return (soonest, -f.get(key, 0.0), -sum(f.values()), n.name)

    heap = [rank(n) for n in nodes if fits(pod_requests, left[n.name])]
    heapq.heapify(heap)
    out: list[str] = []
    for _ in range(pod_count):
        if not heap:
            return None
        name = heapq.heappop(heap)[3]
        out.append(name)
        for r, v in pod_requests.items():
            left[name][r] = left[name].get(r, 0.0) - v
            free[name][r] = free[name].get(r, 0.0) - v
            taken.setdefault(name, {})[r] = taken.get(name, {}).get(r, 0.0) + v
        if fits(pod_requests, left[name]):
            heapq.heappush(heap, rank(by_name[name]))
    return tuple(out)


def blocker_units(prefix: str, nodes: Sequence[str]) -> list[HoldUnit]:
    """The blockers of one hold: one per distinct chosen node, ``<prefix>-<i>`` (``i``: the node's index among
    the distinct nodes in name order). Names are deterministic, so a create whose answer was lost is found
    again, never made twice. A blocker requests (almost) nothing: it holds a node by its anti-affinity."""
    return [HoldUnit(name=f"{prefix}-{i}", node=n) for i, n in enumerate(sorted(set(nodes)))]


def need_by_node(pod_requests: Mapping[str, float], nodes: Sequence[str]) -> dict[str, dict[str, float]]:
    """What the gang's pods need per node: ``pod_requests`` once for every gang pod chosen for that node."""
    out: dict[str, dict[str, float]] = {}
    for n in nodes:
        acc = out.setdefault(n, {})
        for r, v in pod_requests.items():
            acc[r] = acc.get(r, 0.0) + v
    return out


class HoldStep(Frozen):
    """One step of a hold: blockers to create, whether to swap the gang in, whether the hold ran out."""

    to_create: tuple[HoldUnit, ...] = ()
    swap: bool = False
    timed_out: bool = False
    blocked: int = 0  # nodes whose blocker is bound there
    wanted: int = 0
    short: tuple[str, ...] = ()  # blocked nodes where the gang's pods do not fit yet
    reason: str = ""


def plan_hold(units: Sequence[HoldUnit], blockers: Sequence[Blocker], free: Mapping[str, Mapping[str, float]],
              need: Mapping[str, Mapping[str, float]], held_for_s: float, max_hold_s: float) -> HoldStep:
    """Decide one hold step. ``held_for_s``: how long this gang has held the scope, on the caller's clock;
    ``free``: free capacity per node now (allocatable minus the pods bound there); ``need``: the gang's
    requests per chosen node (:func:`need_by_node`).

    Past ``max_hold_s``: time out (the caller deletes the blockers and frees the Lease). Else create every
    missing blocker; once every blocker is bound to its node (and not ending or being deleted) *and* the
    gang's pods fit in what is free on every chosen node, swap: the gang's pods are pinned there and ungated.
    A node absent from ``free`` (gone, not ready, cordoned) never fits.
    """
    by_name = {b.name: b for b in blockers}
    blocked = sum(1 for u in units if (b := by_name.get(u.name)) is not None and b.holds and b.node == u.node)
    short = tuple(n for n in sorted(need) if n not in free or not fits(need[n], free[n]))
    if held_for_s > max_hold_s:
        return HoldStep(timed_out=True, blocked=blocked, wanted=len(units), short=short,
                        reason=f"{blocked}/{len(units)} nodes blocked, {len(short)} still short of room for the "
                               f"gang, after {held_for_s:.0f} s > max-hold {max_hold_s:g} s")
    missing = tuple(u for u in units if u.name not in by_name)
    if units and blocked == len(units) and not short:
        return HoldStep(swap=True, blocked=blocked, wanted=len(units),
                        reason=f"all {blocked} nodes blocked and room for the gang on each")
    return HoldStep(to_create=missing, blocked=blocked, wanted=len(units), short=short,
                    reason=f"{blocked}/{len(units)} nodes blocked; waiting for room on {', '.join(short) or '-'}")


class TicketAction(str, Enum):
    NONE = "none"
    CREATE = "create"  # we have no ticket yet: join the line (then look again: the API server dates it)
    RENEW = "renew"  # every LEASE_DURATION_S / 3: a ticket unchanged for LEASE_DURATION_S is gone


class HoldView(Frozen):
    """What one step read of its hold; read only in the phase that needs it (the caller's observe)."""

    scope_blockers: tuple[Blocker, ...] = ()  # every blocker of the scope in the guard namespace, anyone's
    blockers: tuple[Blocker, ...] = ()  # ours: label raygpu.io/guard-blocker=<tag> and owned by our ticket
    candidates: tuple[NodeFree, ...] | None = None  # choosing only: the nodes the gang's pods may use
    free: dict[str, dict[str, float]] = {}  # per held (or candidate) node: free now
    allocatable: dict[str, dict[str, float]] = {}  # per held (or candidate) node that exists
    pods_by_node: dict[str, tuple[K8sPodView, ...]] = {}  # the pods bound there
    gang_pods: tuple[str, ...] = ()  # the reservation's pods (not being deleted), by name
    gang_bound: bool = False  # every one of them bound


class GuardObservation(Frozen):
    """What one step of a guarded gang saw. Times are the driver's own clock (seconds), ``wall_s`` its unix
    seconds (runtime hints only); nothing here is compared with a clock another machine wrote."""

    gang: str  # <state ConfigMap>, for messages
    tag: str  # holderIdentity on the Lease and tickets
    scope: str
    state: str  # the reservation's state: past ``reserved`` the guard ends
    phase: HoldPhase
    failure: str | None = None  # why the gang is rolled back, once it is
    max_hold_s: float
    held_for_s: float = 0.0  # all this gang's holds together, this one included
    since_renew_s: float = float("inf")  # since our last write of the scope's Lease landed
    since_ticket_s: float = float("inf")  # since our last ticket renewal landed
    nodes: tuple[str, ...] | None = None  # chosen in this hold
    ticket: Ticket | None = None  # ours; None: not created yet
    tickets: tuple[Ticket, ...] = ()  # the scope's proven tickets (ours included)
    tickets_unchanged_for_s: dict[str, float] = {}  # ticket name -> how long its record has looked the same
    lease: LeaseView | None = None
    lease_unchanged_for_s: float = 0.0
    pod_requests: dict[str, float]  # one gang pod's requests (Kubernetes names)
    pod_count: int
    gpu_resource: str | None = None
    wall_s: float = 0.0
    published: str | None = None  # the estimated start last written on the Lease ("" = none)
    asks: tuple[Ask, ...] = ()  # the scope's proven backfill asks (read while holding)
    asks_unchanged_for_s: dict[str, float] = {}  # ask name -> how long its record has looked the same
    hold: HoldView | None = None


class GuardEvent(Frozen):
    reason: str  # GuardHeld, GuardReleased, GuardTimedOut, GuardLost, GuardTookOver
    message: str
    type: str = "Normal"


class GuardStep(Frozen):
    """One step's plan, acted on in this order (each an edge of ALLOWED_HOLD_TRANSITIONS where it moves the
    phase): ``release`` or ``time_out`` end it; else ``stop`` (-> stopped), ``delete_mine`` (-> waiting or
    failed), ``ticket``, ``lease``, ``take`` (-> choosing), ``again`` (look again this step), the gone gangs'
    ``to_delete``, ``tickets_to_delete`` and ``asks_to_delete``, ``nodes`` (-> blocking), ``unblock``
    (-> unblocked), ``to_create``, ``publish`` and ``grants`` (one Lease patch), ``swap`` (-> swapping ->
    swapped)."""

    phases: tuple[HoldPhase, ...] = ()  # the phases entered, in order; the last is where the step ends
    release: bool = False  # past ``reserved``: our blockers, the Lease (if ours) and our ticket go
    time_out: bool = False  # max-hold spent: our blockers go, the count is written, the Lease freed, the ticket goes
    failure: str | None = None  # set when the gang is to be rolled back
    stop: str | None = None  # why the hold ends early (GuardLost)
    delete_mine: bool = False  # delete our blockers (stopped)
    ticket: TicketAction = TicketAction.NONE
    lease: LeaseAction | None = None  # the write (CREATE, ACQUIRE, RENEW), None: none this step
    take: bool = False  # we hold the scope from this step on
    again: bool = False  # the phase moved to one that reads more: observe and plan again this step
    to_delete: tuple[Blocker, ...] = ()  # gone gangs' blockers (uid precondition)
    tickets_to_delete: tuple[Ticket, ...] = ()  # gone tickets (uid precondition)
    asks_to_delete: tuple[Ask, ...] = ()  # gone backfill asks (uid precondition)
    nodes: tuple[str, ...] | None = None  # chosen this step
    unblock: bool = False  # every gang pod bound: delete our blockers
    to_create: tuple[HoldUnit, ...] = ()
    publish: str | None = None  # the estimated start to write on the Lease (unix s, "" = none); None: unchanged
    grants: str | None = None  # the answers to backfill asks to write on the Lease (format_grants); None: unchanged
    swap: bool = False  # label, pin and ungate the gang's pods
    events: tuple[GuardEvent, ...] = ()
    progress: tuple[str, ...] = ()  # lines for the driver's progress log
    reason: str = ""


def _publish(start_s: float | None, published: str | None, now_s: float) -> str | None:
    """The estimated start to write ("" = none), None when it need not be: unchanged, or a start already due
    that stays due (it is "now" while an overrun lasts) is not rewritten every step."""
    value = "" if start_s is None else f"{start_s:.0f}"
    if value == published or (value and published and max(float(value), float(published)) <= now_s):
        return None
    return value


def plan_guard_step(o: GuardObservation) -> GuardStep:
    """One step of a guarded gang, decided from what it saw (docs/guard.md, "Steps" and "Phases").

    In order: past ``reserved``, release. Holding past max-hold (every hold of this gang together): time
    out, for good. Holding with no Lease write landed for ``STEP_DOWN_S``: stop (before anyone may take the
    Lease). Stopped: delete our blockers, then back in line (or failed, when swapped in already). Then the
    line: our ticket (create, or renew every LEASE_DURATION_S / 3), :func:`live_tickets`,
    :func:`decide_lease`; holding and the Lease not ours to renew: stop. Holding: delete the blockers,
    tickets and backfill asks of gangs proven gone (:func:`live_tickets`, :func:`live_asks`) and wait for a
    live gang's blockers (:func:`blockers_to_clear`), choose the
    nodes once (:func:`choose_nodes`), then :func:`plan_hold`, publish the estimated start, answer the live
    backfill asks (:func:`answer_asks`: grant, refuse, or before the swap revoke every pass and wait until each
    asker has seen that and has no pending pod with a pass), swap; swapped: unblock once every gang pod is
    bound.
    """
    P = HoldPhase
    if o.phase == P.RELEASED:
        return GuardStep(reason="released")
    held = o.phase in HELD
    swapped = o.phase in (P.SWAPPED, P.UNBLOCKED)
    if o.state != "reserved":  # (its Event, GuardReleased when it held, is the release's own: the watchdog calls it too)
        return GuardStep(phases=(P.RELEASED,), release=True, reason=f"reservation {o.state}")
    if held and o.held_for_s > o.max_hold_s:
        return _time_out(o, f"nodes blocked for {o.held_for_s:.0f} s in all > max-hold {o.max_hold_s:g} s", swapped)
    phases: list[HoldPhase] = []
    events: list[GuardEvent] = []
    stop: str | None = None
    failure = o.failure
    phase = o.phase
    if held and o.since_renew_s > STEP_DOWN_S:  # before anyone may take the Lease (LEASE_DURATION_S)
        stop = f"the scope's Lease was not renewed for {o.since_renew_s:.0f} s"
        phase, failure = _stopped(o, stop, swapped, phases, events)
    delete_mine = phase == P.STOPPED
    if delete_mine:
        phase = P.FAILED if failure else P.WAITING
        phases.append(phase)
    if phase == P.FAILED:
        return GuardStep(phases=tuple(phases), failure=failure, stop=stop, delete_mine=delete_mine,
                         events=tuple(events), reason=stop or "failed: never holds again")
    if o.ticket is None:
        return GuardStep(phases=tuple(phases), failure=failure, stop=stop, delete_mine=delete_mine,
                         ticket=TicketAction.CREATE, again=True, events=tuple(events), reason="joining the line")
    ticket = TicketAction.RENEW if o.since_ticket_s > LEASE_DURATION_S / 3 else TicketAction.NONE
    live, gone = live_tickets(o.tickets, o.tickets_unchanged_for_s, o.tag)
    decision = decide_lease(o.tag, o.lease, [t.waiting() for t in live], o.lease_unchanged_for_s)
    base = dict(failure=failure, stop=stop, delete_mine=delete_mine, ticket=ticket, reason=decision.reason)
    if phase in HELD and decision.action != LeaseAction.RENEW:
        stop = f"{o.lease.holder if o.lease else 'nobody'} holds scope {o.scope} now"
        phase, failure = _stopped(o, stop, phase in (P.SWAPPED, P.UNBLOCKED), phases, events)
        phase = P.FAILED if failure else P.WAITING
        phases.append(phase)
        base.update(failure=failure, stop=stop, delete_mine=True)
        if phase == P.FAILED:
            return GuardStep(phases=tuple(phases), events=tuple(events), **base)
    if decision.action == LeaseAction.WAIT:
        return GuardStep(phases=tuple(phases), events=tuple(events), **base)
    write = decision.action if (decision.action != LeaseAction.RENEW or o.since_renew_s > LEASE_DURATION_S / 3) \
        else None
    if phase == P.WAITING:
        phases.append(P.CHOOSING)
        return GuardStep(phases=tuple(phases), events=tuple(events), lease=write, take=True, again=True,
                         progress=(f"guard: {o.gang} holds scope {o.scope} ({decision.reason})",), **base)
    h = o.hold
    if h is None:  # (held, but this look read nothing of the hold: look again)
        return GuardStep(phases=tuple(phases), events=tuple(events), lease=write, again=True, **base)
    to_delete, wait = blockers_to_clear(h.scope_blockers, {t.uid for t in live}, o.ticket.uid)
    asking, gone_asks = live_asks(o.asks, o.asks_unchanged_for_s)
    base.update(lease=write, to_delete=tuple(to_delete), tickets_to_delete=tuple(gone),
                asks_to_delete=tuple(gone_asks))
    if to_delete or gone:
        events.append(GuardEvent(reason="GuardTookOver", message=(
            f"{o.gang}: removed {len(to_delete)} blocker(s) and {len(gone)} ticket(s) of gangs gone from scope "
            f"{o.scope} ({', '.join(t.gang or t.tag for t in gone) or '-'})")))
    if wait:  # a live gang's blockers still stand (it is removing them): block nothing until they are gone
        return GuardStep(phases=tuple(phases), events=tuple(events), **{**base, "reason": "waiting for "
                         f"{len(wait)} blocker(s) of a live gang to go"})
    nodes = o.nodes
    chosen = None
    if phase == P.CHOOSING:
        if h.candidates is None:
            return GuardStep(phases=tuple(phases), events=tuple(events), again=True, **base)
        chosen = choose_nodes(o.pod_requests, o.pod_count, h.candidates, o.gpu_resource, h.pods_by_node, o.wall_s)
        if chosen is None:
            return GuardStep(phases=tuple(phases), events=tuple(events),
                             **{**base, "reason": "the gang's pods fit no set of nodes"})
        nodes = chosen
        phase = P.BLOCKING
        phases.append(phase)
        events.append(GuardEvent(reason="GuardHeld", message=f"{o.gang} is first in line in scope {o.scope}: "
                                 f"blocking {', '.join(sorted(set(chosen)))} for up to {o.max_hold_s:g} s"))
    base.update(nodes=chosen)
    assert nodes is not None  # BLOCKING and after: chosen in this hold
    if phase in (P.SWAPPED, P.UNBLOCKED):
        bound = phase == P.SWAPPED and len(h.gang_pods) == o.pod_count and h.gang_bound
        if bound:
            phases.append(P.UNBLOCKED)
        return GuardStep(phases=tuple(phases), events=tuple(events), unblock=bound,
                         progress=(f"guard: every pod of {o.gang} is bound; blockers deleted",) if bound else (),
                         **base)
    units = blocker_units(f"{o.tag}-bl", nodes)
    need_at = need_by_node(o.pod_requests, nodes)
    hold = plan_hold(units, h.blockers, h.free, need_at, o.held_for_s, o.max_hold_s)
    if hold.timed_out:
        return _time_out(o, hold.reason, False)
    start_s = estimated_start_s(need_at, h.allocatable, h.pods_by_node, o.wall_s)
    swapping = phase == P.SWAPPING
    grants, clear = answer_asks(o, asking, start_s, revoke=hold.swap or swapping)
    base.update(to_create=hold.to_create, publish=_publish(start_s, o.published, o.wall_s), grants=grants,
                reason=hold.reason)
    if hold.swap and not swapping and (grants is not None or not clear):
        # a pass may still let a backfill pod in: revoked first; the swap waits until every asker took it off
        return GuardStep(phases=tuple(phases), events=tuple(events), **{
            **base, "reason": "before the swap: every backfill pass revoked; waiting for the askers to take it off"})
    if (hold.swap or swapping) and len(h.gang_pods) == o.pod_count:  # a swap cut short: the pods it let in use the room
        if not swapping:
            phases.append(P.SWAPPING)
        phases.append(P.SWAPPED)
        return GuardStep(phases=tuple(phases), events=tuple(events), swap=True, progress=(
            f"guard: every chosen node blocked and with room; {len(h.gang_pods)} pods of {o.gang} ungated",), **base)
    return GuardStep(phases=tuple(phases), events=tuple(events), **base)


def live_asks(asks: Sequence[Ask], unchanged_for_s: Mapping[str, float]) -> tuple[list[Ask], list[Ask]]:
    """The scope's proven backfill asks split into (live, gone), as :func:`live_tickets` does: an ask whose
    record has looked the same on the holder's clock for longer than its leaseDurationSeconds is gone (its
    driver died or is cut off; a live one renews every LEASE_DURATION_S / 3). The holder deletes it."""
    live, gone = [], []
    for a in asks:
        (live if unchanged_for_s.get(a.name, 0.0) <= a.lease_duration_s else gone).append(a)
    return live, gone


def answer_asks(o: GuardObservation, live: Sequence[Ask], start_s: float | None,
                revoke: bool) -> tuple[str | None, bool]:
    """The holder's answers to the scope's live backfill asks: each granted when it ends a margin before the
    hold's estimated start (plan.backfill.decide_backfill, on the holder's clock), all refused when
    ``revoke`` (the swap is due). Returns (the ``raygpu.io/guard-grants`` to write, None when the answers are
    unchanged; whether no pass can let a pod in any more: nothing granted on the Lease, and every live asker
    reports the Lease's current revision acted on and no pending pod with a pass). The revision only grows
    while the Lease exists (model.guard.format_grants), so a report names the one write it acted on: an
    asker that read "yes" just before the revocation is waited for until it reports the revocation's."""
    rev, now = (o.lease.grant_rev, o.lease.grants) if o.lease is not None else (0, {})
    answers = {a.tag: not revoke and decide_backfill(a.tag, o.tag, start_s, a.hint_s, o.wall_s).pass_for == o.tag
               for a in live}
    write = format_grants(rev + 1, answers) if answers != now else None
    clear = not any(now.values()) and all(a.seen_rev == rev and a.passes == 0 for a in live)
    return write, clear


def _stopped(o: GuardObservation, why: str, swapped: bool, phases: list[HoldPhase],
             events: list[GuardEvent]) -> tuple[HoldPhase, str | None]:
    """A hold ends early: stopped (its blockers to delete), GuardLost; swapped in already: rolled back."""
    phases.append(HoldPhase.STOPPED)
    events.append(GuardEvent(reason="GuardLost", type="Warning", message=f"{o.gang}: {why}; its blockers are deleted" +
                             ("; its pods were already swapped in: rolled back" if swapped else "")))
    return HoldPhase.STOPPED, (f"guard: {why} after the swap" if swapped else o.failure)


def _time_out(o: GuardObservation, why: str, swapped: bool) -> GuardStep:
    """max-hold spent (all this gang's holds together): it never holds again; the gang is rolled back."""
    return GuardStep(phases=(HoldPhase.FAILED,), time_out=True, reason=why, events=(GuardEvent(
        reason="GuardTimedOut", type="Warning", message=(
            f"{o.gang}: {why}; blockers deleted, scope {o.scope} freed; max-hold {o.max_hold_s:g} s is spent, so the "
            "gang is rolled back" + ("; its pods were already swapped in" if swapped else ""))),),
        failure=f"guard: {why} (max-hold {o.max_hold_s:g} s spent)" + (" after the swap" if swapped else ""))


class ScopeGauges(Frozen):
    """What the sidecar exports about one guard scope (docs/metrics of reclaim.metrics)."""

    scope: str
    waiting: int  # guarded gangs not yet admitted (state planned or reserved)
    timeouts: int  # holds of those gangs that ran out (raygpu.io/guard-timeouts, summed)
    longest_wait_s: float  # the longest any of them has waited, on the caller's clock since it first saw it


def guard_gauges(reservations: Sequence[ReservationRecord], first_seen_s: Mapping[str, float],
                 now_s: float) -> tuple[ScopeGauges, ...]:
    """Per scope with a waiting guarded gang, sorted by scope. ``first_seen_s``: state ConfigMap name -> when
    the caller first saw it (its own clock; a name it never saw counts as seen now). Gangs that are not
    guarded, or no longer wait, are left out; a scope with none waiting is absent."""
    by_scope: dict[str, list[ReservationRecord]] = {}
    for r in reservations:
        if r.guard_scope and r.state in ("planned", "reserved"):
            by_scope.setdefault(r.guard_scope, []).append(r)
    return tuple(ScopeGauges(scope=s, waiting=len(rs), timeouts=sum(r.guard_timeouts for r in rs),
                             longest_wait_s=max(max(0.0, now_s - first_seen_s.get(r.name, now_s)) for r in rs))
                 for s, rs in sorted(by_scope.items()))
