"""What ``reserve`` wires for the guard and for runtime hints before the worker group is patched in.

``guard_policy_for`` decides whether a reservation is guarded (and refuses one that cannot work before
anything is created); ``wire_guard`` gates a guarded group's pods; ``wire_hint`` puts the driver's
``expected_runtime_s`` on the group's pods, where a hold's estimate of when its nodes free up reads it
(plan/backfill.py). Split out of gang/guard.py, by concept. docs/guard.md.
"""

from __future__ import annotations

from typing import Any, Callable

from raygpu.adapters.kube import KubeAdapter
from raygpu.errors import PermanentError, RayGpuError
from raygpu.model.gang import GangPlan
from raygpu.model.guard import GuardPolicy, parse_guard_policy
from raygpu.model.labels import ANNOTATION_EXPECTED_RUNTIME, BACKFILL_GATE, GUARD_GATE, PRIORITY_CLASS_BLOCKER


def guard_policy_for(kube: KubeAdapter, guard: bool | None, annotations: dict[str, str], plan: GangPlan,
                     cluster_uid: str, progress: Callable[[str], None] = lambda m: None) -> GuardPolicy | None:
    """The guard policy of a reservation about to be made, or None when it is not guarded.

    ``guard`` (the request's) wins over the cluster's ``raygpu.io/guard``; a bad annotation value is reported
    (progress and a Warning Event ``InvalidAnnotation`` on the RayCluster) and its default used. Raises
    PermanentError before anything is created when a guarded reservation cannot work: a backend other than
    ``none`` (the guard is the all-or-nothing itself), or raygpu's blocker PriorityClass not installed.
    """
    policy, problems = parse_guard_policy(annotations)
    for pr in problems:
        progress(f"annotation {pr.key}={pr.value!r} ignored ({pr.reason}); using {pr.default_used}")
        try:
            kube.event({"apiVersion": "ray.io/v1", "kind": "RayCluster", "name": plan.cluster,
                        "namespace": plan.namespace, "uid": cluster_uid}, "InvalidAnnotation",
                       f"{pr.key}={pr.value!r}: {pr.reason}; using {pr.default_used}", "Warning")
        except RayGpuError:
            pass  # the message above reached the driver; an Event is best effort
    if not (guard if guard is not None else policy.enabled):
        return None
    if plan.backend.value != "none":
        raise PermanentError(f"the starvation guard needs backend none (it makes the gang all-or-nothing itself), "
                             f"got {plan.backend.value}; pass backend='none' or guard=False")
    if kube.get("scheduling.k8s.io/v1", "PriorityClass", PRIORITY_CLASS_BLOCKER) is None:
        raise PermanentError(f"the starvation guard needs PriorityClass {PRIORITY_CLASS_BLOCKER}: kubectl apply -f "
                             "deploy/guard/priorityclasses.yaml (or pass guard=False)")
    return policy.model_copy(update={"enabled": True})


def wire_guard(spec: dict[str, Any]) -> None:
    """Make a guarded reservation's worker group spec wait for the guard: its pods are created gated
    (``raygpu.io/guard``), so none binds before the swap (mutated in place). Their priority is the user's."""
    _add_gate(spec, GUARD_GATE)


def backfill_allowed(kube: KubeAdapter, namespace: str, progress: Callable[[str], None]) -> bool:
    """Whether this driver may backfill: get the scope's Lease and patch its own pods in ``namespace`` (asked by
    SelfSubjectAccessReview before anything is created). Said once when not: the gang is then made as usual."""
    from raygpu.gang.free import can_i
    if can_i(kube, "patch", "pods", namespace=namespace) and can_i(kube, "get", "leases", "coordination.k8s.io",
                                                                      namespace=namespace):
        return True
    progress("backfill off: this identity may not patch pods or get leases in the namespace (docs/permissions.md)")
    return False


def wire_hint(spec: dict[str, Any], expected_runtime_s: float | None, gate: bool = False) -> None:
    """Annotate a reservation's pods (its worker group's pod template, mutated in place) with the driver's
    runtime hint ``raygpu.io/expected-runtime-s``; nothing without one. ``gate``: a gang that may backfill
    also gets the scheduling gate ``raygpu.io/backfill``, so that its pods' first scheduling attempt already
    carries the right pass (gang/backfill.py lifts it on its first step): kube-scheduler does not retry a
    pending pod for a change of its own labels."""
    if expected_runtime_s is None:
        return
    md = spec["template"].setdefault("metadata", {})
    md["annotations"] = {**(md.get("annotations") or {}), ANNOTATION_EXPECTED_RUNTIME: f"{expected_runtime_s:g}"}
    if gate:
        _add_gate(spec, BACKFILL_GATE)


def _add_gate(spec: dict[str, Any], name: str) -> None:
    """Append the scheduling gate ``name`` to a worker group spec's pod template, keeping the template's own."""
    pod = spec["template"].setdefault("spec", {})
    pod["schedulingGates"] = [*(pod.get("schedulingGates") or []), {"name": name}]
