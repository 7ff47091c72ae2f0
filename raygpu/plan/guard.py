"""The starvation guard's decisions, pure: who holds a scope, which nodes, which blockers, when to swap.

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
from raygpu.model.guard import Blocker, HoldUnit, LeaseView, Ticket, WaitingGang
from raygpu.model.views import K8sPodView
from raygpu.plan.backfill import fit_time_s
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
