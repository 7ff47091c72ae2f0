"""plan/guard.py plan_guard_step: one step of a guarded gang, what it saw in, one plan out (pure: no I/O, no
clock). Each case is one observation; every plan's phases are a path along ALLOWED_HOLD_TRANSITIONS."""

from __future__ import annotations

import pytest

from raygpu.model.gang import NodeFree
from raygpu.model.guard import STEP_DOWN_S, Ask, Blocker, HoldPhase, LeaseView, Ticket, check_hold_transition
from raygpu.model.views import K8sPodView
from raygpu.plan.guard import GuardObservation, HoldView, LeaseAction, TicketAction, plan_guard_step

P = HoldPhase
GPU = "nvidia.com/gpu"
ME = "default-c-rg-me"


def ticket(tag: str, created: float, uid: str = "") -> Ticket:
    return Ticket(name=f"raygpu-guard-default.{tag}", uid=uid or f"uid-{tag}", tag=tag, created_at_s=created,
                  resource_version="1")


MINE = ticket(ME, 100)


def lease(holder: str, rev: int = 0, **grants: bool) -> LeaseView:
    return LeaseView(name="raygpu-guard-default", namespace="raygpu-system", resource_version="7", holder=holder,
                     grant_rev=rev, grants=grants)


def ask(tag: str, seen: int = 0, passes: int = 0, hint: float = 10) -> Ask:
    return Ask(name=f"raygpu-guard-default.ask.{tag}", tag=tag, hint_s=hint, seen_rev=seen, passes=passes)


def node(name: str, gpus_free: float) -> NodeFree:
    return NodeFree(name=name, free={GPU: gpus_free}, allocatable={GPU: 8.0})


def bound(name: str, node_name: str, owner: str = MINE.uid) -> Blocker:
    return Blocker(name=name, uid=f"uid-{name}", node=node_name, owner_uid=owner)


def obs(phase: P = P.WAITING, **kw) -> GuardObservation:
    base = dict(gang="rg-me", tag=ME, scope="default", state="reserved", phase=phase, max_hold_s=90.0,
                pod_requests={GPU: 8.0}, pod_count=2, gpu_resource=GPU, ticket=MINE, tickets=(MINE,),
                since_renew_s=2.0, since_ticket_s=2.0, lease=lease(ME) if phase in HELD_PHASES else None)
    if phase in (P.BLOCKING, P.SWAPPING, P.SWAPPED, P.UNBLOCKED):
        base["nodes"] = ("n2", "n3")
    return GuardObservation(**{**base, **kw})


HELD_PHASES = (P.CHOOSING, P.BLOCKING, P.SWAPPING, P.SWAPPED, P.UNBLOCKED)
ROOM = HoldView(blockers=(bound(f"{ME}-bl-0", "n2"), bound(f"{ME}-bl-1", "n3")),
                free={"n2": {GPU: 8.0}, "n3": {GPU: 8.0}}, allocatable={"n2": {GPU: 8.0}, "n3": {GPU: 8.0}},
                gang_pods=("p0", "p1"))
SHORT = ROOM.model_copy(update={"free": {"n2": {GPU: 8.0}, "n3": {GPU: 6.0}}})
GONE = ticket("dead", 1, uid="uid-dead")

CASES = {  # name: (observation, what the plan must say)
    "past reserved: released": (obs(P.BLOCKING, state="admitted"), dict(release=True, phases=(P.RELEASED,))),
    "past max-hold: failed for good": (obs(P.BLOCKING, held_for_s=91, hold=SHORT),
                                       dict(time_out=True, phases=(P.FAILED,))),
    "no renewal for the step-down time: stopped, blockers deleted, back in line": (
        obs(P.BLOCKING, since_renew_s=STEP_DOWN_S + 1, lease=lease("other"), tickets=(MINE, ticket("other", 1))),
        dict(stop="the scope's Lease was not renewed for 21 s", delete_mine=True, phases=(P.STOPPED, P.WAITING))),
    "stepped down after the swap: rolled back": (obs(P.SWAPPED, since_renew_s=STEP_DOWN_S + 1),
                                                 dict(delete_mine=True, phases=(P.STOPPED, P.FAILED))),
    "still stopped (a delete failed): delete again, back in line": (
        obs(P.STOPPED, lease=lease("other"), tickets=(MINE, ticket("other", 1))),
        dict(delete_mine=True, phases=(P.WAITING,), lease=None)),
    "no ticket yet: join the line and look again": (obs(ticket=None, tickets=()),
                                                    dict(ticket=TicketAction.CREATE, again=True, phases=())),
    "first in line, no Lease: create it, hold, look again": (obs(), dict(lease=LeaseAction.CREATE, take=True,
                                                                         again=True, phases=(P.CHOOSING,))),
    "an older live gang waits: nothing": (obs(tickets=(MINE, ticket("older", 1))), dict(lease=None, take=False,
                                                                                        phases=())),
    "ticket renewed every third of its duration": (obs(tickets=(MINE, ticket("older", 1)), since_ticket_s=11),
                                                   dict(ticket=TicketAction.RENEW)),
    "choosing: the freest nodes, a blocker each, GuardHeld": (
        obs(P.CHOOSING, hold=HoldView(candidates=(node("n1", 2), node("n2", 8), node("n3", 6)))),
        dict(nodes=("n2", "n3"), phases=(P.BLOCKING,), to_create_n=2, events=("GuardHeld",))),
    "choosing, no fit: still choosing": (obs(P.CHOOSING, hold=HoldView(candidates=(node("n1", 8),))),
                                         dict(nodes=None, phases=(), to_create_n=0)),
    "room on every blocked node, a pass granted: every pass revoked first, no swap": (
        obs(P.BLOCKING, hold=ROOM, lease=lease(ME, 1, bf=True), asks=(ask("bf", 1, passes=1),)),
        dict(grants="2;bf=no", swap=False, phases=())),
    "revoked, but the asker has not acted on it yet: no swap": (
        obs(P.BLOCKING, hold=ROOM, lease=lease(ME, 2, bf=False), asks=(ask("bf", 1, passes=0),)),
        dict(grants=None, swap=False, phases=())),
    "revoked, and the asker still has a pending pod with the pass: no swap": (
        obs(P.BLOCKING, hold=ROOM, lease=lease(ME, 2, bf=False), asks=(ask("bf", 2, passes=1),)),
        dict(grants=None, swap=False, phases=())),
    "revoked and taken off by every asker: swap": (
        obs(P.BLOCKING, hold=ROOM, lease=lease(ME, 2, bf=False), asks=(ask("bf", 2, passes=0),)),
        dict(grants=None, swap=True, phases=(P.SWAPPING, P.SWAPPED))),
    "a gone asker is not waited for, and its ask is deleted": (
        obs(P.BLOCKING, hold=ROOM, lease=lease(ME, 2), asks=(ask("bf", 1, passes=1),),
            asks_unchanged_for_s={"raygpu-guard-default.ask.bf": 31}),
        dict(grants=None, swap=True, asks_to_delete_n=1)),
    "an ask renewed within its duration is live: answered, never deleted": (
        obs(P.BLOCKING, hold=SHORT, lease=lease(ME, 2, bf=False), asks=(ask("bf", 2),),
            asks_unchanged_for_s={"raygpu-guard-default.ask.bf": 30}),
        dict(grants=None, asks_to_delete_n=0)),
    "a gone ask is deleted in any holding phase, before nodes are chosen too": (
        obs(P.CHOOSING, hold=HoldView(candidates=(node("n1", 2),)), asks=(ask("bf"),),
            asks_unchanged_for_s={"raygpu-guard-default.ask.bf": 31}),
        dict(asks_to_delete_n=1, nodes=None)),
    "an asker reporting another revision than the Lease's (an earlier Lease's) is waited for": (
        obs(P.BLOCKING, hold=ROOM, lease=lease(ME, 2, bf=False), asks=(ask("bf", 3, passes=0),)),
        dict(grants=None, swap=False, phases=())),
    "room on every blocked node: swap": (obs(P.BLOCKING, hold=ROOM), dict(swap=True, phases=(P.SWAPPING, P.SWAPPED))),
    "a swap cut short: finished although the room is taken": (obs(P.SWAPPING, hold=SHORT),
                                                              dict(swap=True, phases=(P.SWAPPED,))),
    "room on one node only: wait": (obs(P.BLOCKING, hold=SHORT), dict(swap=False, phases=())),
    "swapped and every pod bound: unblock": (obs(P.SWAPPED, hold=ROOM.model_copy(update={"gang_bound": True})),
                                             dict(unblock=True, phases=(P.UNBLOCKED,))),
    "a gone gang's blockers and ticket: deleted, GuardTookOver": (
        obs(P.BLOCKING, tickets=(MINE, GONE), tickets_unchanged_for_s={GONE.name: 31},
            hold=SHORT.model_copy(update={"scope_blockers": (bound("dead-bl-0", "n1", GONE.uid),)})),
        dict(to_delete_n=1, tickets_to_delete_n=1, events=("GuardTookOver",))),
    "a live gang's blockers: waited for, nothing created": (
        obs(P.CHOOSING, tickets=(MINE, ticket("live", 200)), hold=HoldView(
            scope_blockers=(bound("live-bl-0", "n1", "uid-live"),), candidates=(node("n2", 8), node("n3", 8)))),
        dict(to_delete_n=0, nodes=None, to_create_n=0, phases=())),
    "the Lease another's while holding: stopped, back in line": (
        obs(P.BLOCKING, lease=lease("older"), tickets=(MINE, ticket("older", 1))),
        dict(delete_mine=True, phases=(P.STOPPED, P.WAITING), events=("GuardLost",), lease=None)),
    "failed: nothing more": (obs(P.FAILED, failure="guard: x"), dict(phases=(), lease=None, ticket=TicketAction.NONE)),
}


@pytest.mark.parametrize("name", CASES)
def test_one_step_plan(name):
    o, want = CASES[name]
    plan = plan_guard_step(o)
    for k, v in want.items():
        if k.endswith("_n"):
            assert len(getattr(plan, k[:-2])) == v, k
        elif k == "events":
            assert tuple(e.reason for e in plan.events) == v
        else:
            assert getattr(plan, k) == v, (k, getattr(plan, k))
    at = o.phase
    for p in plan.phases:  # every phase the plan enters is an edge of the table
        at = check_hold_transition(at, p)
    assert plan_guard_step(o) == plan  # pure: the same look, the same plan


def test_the_holder_alone_answers_asks_by_the_hint_on_its_own_clock():
    t3 = K8sPodView(name="t3", namespace="default", node_name="n3", phase="Running", requests={GPU: 2.0},
                    started_at_s=900.0, active_deadline_s=200)  # n3 frees at 1100: the hold starts then
    hold = SHORT.model_copy(update={"pods_by_node": {"n3": (t3,)}})
    plan = plan_guard_step(obs(P.BLOCKING, hold=hold, wall_s=1000.0, asks=(ask("fits", hint=70), ask("late", hint=71))))
    assert plan.publish == "1100" and plan.grants == "1;fits=yes,late=no"  # 1000 + 70 + 30 margin <= 1100
    again = obs(P.BLOCKING, hold=hold, wall_s=1000.0, lease=lease(ME, 1, fits=True, late=False),
                asks=(ask("fits", 1, hint=70), ask("late", 1, hint=71)))
    assert plan_guard_step(again).grants is None  # unchanged: not rewritten


def test_a_roll_back_carries_why_and_says_so_once():
    plan = plan_guard_step(obs(P.SWAPPED, held_for_s=91, hold=ROOM))
    assert plan.failure and "max-hold 90 s spent" in plan.failure and plan.failure.endswith("after the swap")
    [e] = plan.events
    assert e.reason == "GuardTimedOut" and e.type == "Warning" and "already swapped in" in e.message


def test_the_estimated_start_is_published_only_when_it_changes():
    first = plan_guard_step(obs(P.BLOCKING, hold=SHORT, wall_s=1000.0))
    assert first.publish == "1000"  # (no pod bound on either node in this look: it fits now)
    assert plan_guard_step(obs(P.BLOCKING, hold=SHORT, wall_s=1000.0, published="1000")).publish is None
    assert plan_guard_step(obs(P.BLOCKING, hold=SHORT, wall_s=1500.0, published="1000")).publish is None  # due, stays due
