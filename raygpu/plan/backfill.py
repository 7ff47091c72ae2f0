"""Runtime hints for the starvation guard, pure: when running pods end, when a hold can start, who may backfill.

A running pod's *estimated end* is its ``status.startTime`` plus what bounds its life: its
``spec.activeDeadlineSeconds`` (the kubelet ends it then) or, on a pod raygpu created (label
``raygpu.io/reservation``), raygpu's ``raygpu.io/expected-runtime-s`` annotation (the driver's hint); the
sooner of the two. Any other pod's end is unknown and counts as never. From the ends, a node's *fit time*
for some pods is the earliest time their requests fit in what is free once every pod ending by then is
gone; a hold's *estimated start* is the latest fit time of its nodes (None: some node needs a pod with an
unknown end to finish). A gang may *backfill* onto held nodes when it would end, by its own hint plus
``BACKFILL_MARGIN_S``, before that start.

No clock: ``now_s`` is an argument. Times are unix seconds: startTime is the kubelet's clock, ``now_s``
the caller's (a driver's); ``BACKFILL_MARGIN_S`` is the skew they may have (docs/guard.md).
"""

from __future__ import annotations

from typing import Mapping, Sequence

from raygpu.model.base import Frozen
from raygpu.model.labels import ANNOTATION_EXPECTED_RUNTIME, LABEL_RESERVATION
from raygpu.model.views import K8sPodView
from raygpu.plan.common.free_index import fits

BACKFILL_MARGIN_S = 30.0  # clock skew between kubelets and drivers (NTP keeps it far below), plus start-up slack
_ENDED = ("Succeeded", "Failed")


def hint_s(pod: K8sPodView) -> float | None:
    """raygpu's runtime hint on a pod raygpu created (``raygpu.io/reservation`` label), else None."""
    if not pod.labels.get(LABEL_RESERVATION):
        return None
    try:
        value = float(pod.annotations.get(ANNOTATION_EXPECTED_RUNTIME, ""))
    except ValueError:
        return None
    return value if 0 < value < float("inf") else None


def pod_end_s(pod: K8sPodView, now_s: float) -> float | None:
    """When ``pod`` is estimated to end (unix s), None if unknown. A pod not started yet counts from
    ``now_s``; an end already past (an overrun, or a kubelet late to enforce a deadline) is ``now_s``:
    it may end any moment, never "in the past"."""
    bounds = [b for b in (pod.active_deadline_s, hint_s(pod)) if b is not None]
    if not bounds:
        return None
    return max(now_s, (pod.started_at_s or now_s) + min(bounds))


def fit_time_s(allocatable: Mapping[str, float], pods: Sequence[K8sPodView], need: Mapping[str, float],
               now_s: float) -> float | None:
    """The earliest time ``need`` fits on a node of ``allocatable`` whose bound pods are ``pods``: ``now_s``
    if it fits now, else the estimated end after which enough has ended, None if that takes a pod whose end
    is unknown (or never: more than the allocatable). Ended pods hold nothing; a pod being deleted still
    holds its requests (as the scheduler counts it) until its estimated end, unknown if none."""
    free = dict(allocatable)
    live = [p for p in pods if p.phase not in _ENDED]
    for p in live:
        for r, v in p.requests.items():
            free[r] = free.get(r, 0.0) - v
    if fits(need, free):
        return now_s
    known = sorted(((e, p) for p in live if (e := pod_end_s(p, now_s)) is not None), key=lambda x: x[0])
    for end, p in known:
        for r, v in p.requests.items():
            free[r] = free.get(r, 0.0) + v
        if fits(need, free):
            return end
    return None


def estimated_start_s(need: Mapping[str, Mapping[str, float]], allocatable: Mapping[str, Mapping[str, float]],
                      pods: Mapping[str, Sequence[K8sPodView]], now_s: float) -> float | None:
    """A hold's estimated start: the latest fit time of its nodes for the gang's pods there (``need``, per
    node: plan.guard.need_by_node); None if any node's is unknown or the node is gone (absent from
    ``allocatable``)."""
    times = []
    for node, n in need.items():
        if node not in allocatable:
            return None
        t = fit_time_s(allocatable[node], pods.get(node, ()), n, now_s)
        if t is None:
            return None
        times.append(t)
    return max(times, default=now_s)


class BackfillDecision(Frozen):
    """Whether a gang's pending pods carry ``raygpu.io/guard-pass=<holder>`` this step."""

    pass_for: str | None  # the holder (its state ConfigMap's name) whose blockers may let the pods in; None: no pass
    reason: str


def decide_backfill(me: str, holder: str, start_s: float | None, expected_runtime_s: float | None,
                    now_s: float, margin_s: float = BACKFILL_MARGIN_S) -> BackfillDecision:
    """May gang ``me`` (hint ``expected_runtime_s``) backfill onto the nodes held by ``holder``, whose hold
    is estimated to start at ``start_s``? Only when it ends before that start by ``margin_s`` at least:
    ``now_s + expected_runtime_s + margin_s <= start_s`` (``now_s`` the caller's clock, ``start_s`` from the
    kubelets' startTimes: the margin bounds their skew). No hint, no holder, an unknown start: no pass."""
    if not holder or holder == me:
        return BackfillDecision(pass_for=None, reason="no other gang holds the scope")
    if expected_runtime_s is None:
        return BackfillDecision(pass_for=None, reason="no runtime hint (expected_runtime_s)")
    if start_s is None:
        return BackfillDecision(pass_for=None, reason=f"{holder}'s hold has no estimated start (a pod it waits "
                                                      "for has no known end)")
    end_s = now_s + expected_runtime_s + margin_s
    if end_s > start_s:
        return BackfillDecision(pass_for=None, reason=f"would end {end_s - start_s:.0f} s after {holder}'s hold "
                                                      f"starts (hint {expected_runtime_s:g} s + margin {margin_s:g} s)")
    return BackfillDecision(pass_for=holder, reason=f"ends {start_s - end_s:.0f} s before {holder}'s hold starts "
                                                    f"(hint {expected_runtime_s:g} s + margin {margin_s:g} s)")


ANSWER_WAIT_S = 10.0  # an ask unanswered this long (a holder answers within a step or two): lift the gate, no pass


class PassDecision(Frozen):
    """What a backfilling gang does with its own pending pods this step, from its holder's answer."""

    pass_for: str | None  # the holder whose pass the pods carry; None: no pass (taken off where it is)
    lift_gate: bool  # lift raygpu.io/backfill: the first scheduling try carries the answer (or none came)
    reason: str


def decide_pass(me: str, holder: str, grants: Mapping[str, bool], waited_s: float,
                answer_wait_s: float = ANSWER_WAIT_S) -> PassDecision:
    """Gang ``me`` asked the scope's holder ``holder`` for a pass; ``grants``: the holder's answers on its Lease
    (the holder alone decides: :func:`decide_backfill` on its clock); ``waited_s``: how long it has asked, on
    its own clock. Granted: the pass. Refused or nobody holds: no pass. Not answered yet: no pass, the gate
    kept until ``answer_wait_s`` (so the pods' first try carries the answer)."""
    if not holder or holder == me:
        return PassDecision(pass_for=None, lift_gate=True, reason="no other gang holds the scope")
    answer = grants.get(me)
    if answer is True:
        return PassDecision(pass_for=holder, lift_gate=True, reason=f"granted by {holder}")
    if answer is False:
        return PassDecision(pass_for=None, lift_gate=True, reason=f"refused by {holder} (its hold starts before "
                                                                  "this gang would end, or has no estimated start)")
    late = waited_s >= answer_wait_s
    return PassDecision(pass_for=None, lift_gate=late, reason=f"asked {holder}; no answer " +
                        (f"for {waited_s:.0f} s: scheduled without a pass" if late else "yet"))
