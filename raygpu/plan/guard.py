"""The starvation guard's decisions, pure: who holds a scope, which nodes, which placeholders, when to swap.

No I/O, no clock: every time is an argument measured on the caller's own
clock (``unchanged_for_s``, ``held_for_s``), never compared with a time
another machine wrote. docs/gang.md "Starvation guard" states the contract.
"""

from __future__ import annotations

import math
from enum import Enum
from typing import Mapping, Sequence

from raygpu.model.base import Frozen
from raygpu.model.gang import NodeFree
from raygpu.model.guard import HoldUnit, LeaseView, Placeholder, WaitingGang


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


def _fits(need: Mapping[str, float], have: Mapping[str, float]) -> bool:
    return all(v <= have.get(r, 0.0) + 1e-9 for r, v in need.items() if v > 0)


def choose_nodes(pod_requests: Mapping[str, float], pod_count: int, nodes: Sequence[NodeFree],
                 gpu_resource: str | None) -> tuple[str, ...] | None:
    """A node per gang pod: where it will fit soonest without runtime hints, i.e. the node with the most of
    ``gpu_resource`` free now (then the most of every resource, then the name), among nodes whose allocatable
    holds the pod; a node takes several pods while its allocatable holds them. None if some pod fits no node.
    """
    left = {n.name: dict(n.allocatable) for n in nodes}
    free = {n.name: dict(n.free) for n in nodes}
    out: list[str] = []
    for _ in range(pod_count):
        fitting = [n for n in nodes if _fits(pod_requests, left[n.name])]
        if not fitting:
            return None
        key = gpu_resource or "cpu"
        best = max(fitting, key=lambda n: (free[n.name].get(key, 0.0), sum(free[n.name].values()), _neg(n.name)))
        out.append(best.name)
        for r, v in pod_requests.items():
            left[best.name][r] = left[best.name].get(r, 0.0) - v
            free[best.name][r] = free[best.name].get(r, 0.0) - v
    return tuple(out)


def _neg(name: str) -> tuple[int, ...]:  # max() by name ascending
    return tuple(-ord(c) for c in name)


def split_units(pod_requests: Mapping[str, float], gpu_resource: str | None) -> list[dict[str, float]]:
    """A gang pod's requests as placeholder units that sum to exactly them: one unit per whole GPU (each GPU
    frees on its own), CPU (millicores) and memory (bytes) divided as evenly as integers allow, the remainder
    and every other resource on the first unit. A pod without whole GPUs is one unit."""
    gpus = pod_requests.get(gpu_resource, 0.0) if gpu_resource else 0.0
    if gpus < 1 or not float(gpus).is_integer():
        return [dict(pod_requests)]
    k = int(gpus)
    units: list[dict[str, float]] = [{gpu_resource: 1.0} for _ in range(k)]  # type: ignore[misc]
    for r, v in pod_requests.items():
        if r == gpu_resource:
            continue
        scale = 1000.0 if r == "cpu" else 1.0
        total = math.floor(v * scale + 1e-9)
        if r not in ("cpu", "memory") or total != v * scale:
            units[0][r] = v  # not divisible in whole units: all on the first
            continue
        each, rest = divmod(int(total), k)
        for i, u in enumerate(units):
            amount = each + (rest if i == 0 else 0)
            if amount:
                u[r] = amount / scale
    return units


def hold_units(prefix: str, pod_requests: Mapping[str, float], nodes: Sequence[str],
               gpu_resource: str | None) -> list[HoldUnit]:
    """Every placeholder of one hold: ``<prefix>-<pod>-<unit>`` pinned to the node chosen for gang pod ``pod``.
    Names are deterministic, so a create whose answer was lost is found again, never made twice."""
    units = split_units(pod_requests, gpu_resource)
    return [HoldUnit(name=f"{prefix}-{i}-{j}", node=node, requests=u)
            for i, node in enumerate(nodes) for j, u in enumerate(units)]


class HoldStep(Frozen):
    """One step of a hold: placeholders to create, whether to swap the gang in, whether the hold ran out."""

    to_create: tuple[HoldUnit, ...] = ()
    swap: bool = False
    timed_out: bool = False
    held: int = 0  # placeholders holding their GPUs
    wanted: int = 0
    reason: str = ""


def plan_hold(units: Sequence[HoldUnit], placeholders: Sequence[Placeholder], held_for_s: float,
              max_hold_s: float) -> HoldStep:
    """Decide one hold step. ``held_for_s``: how long this gang has held the scope, on the caller's clock.

    Past ``max_hold_s``: time out (the caller deletes the placeholders and frees the Lease). Else create every
    missing placeholder; once every one is bound and not being deleted, swap: the gang's pods, pinned to the
    same nodes, take the GPUs the placeholders hold.
    """
    by_name = {p.name: p for p in placeholders}
    held = sum(1 for u in units if (p := by_name.get(u.name)) is not None and p.bound and not p.deleting
               and p.node == u.node)
    if held_for_s > max_hold_s:
        return HoldStep(timed_out=True, held=held, wanted=len(units),
                        reason=f"held {held}/{len(units)} placeholders for {held_for_s:.0f} s > max-hold "
                               f"{max_hold_s:g} s")
    missing = tuple(u for u in units if u.name not in by_name)
    if held == len(units) and units:
        return HoldStep(swap=True, held=held, wanted=len(units),
                        reason=f"all {held} placeholders hold their GPUs")
    return HoldStep(to_create=missing, held=held, wanted=len(units),
                    reason=f"{held}/{len(units)} placeholders hold their GPUs")
