"""Every write of one reservation, laid out before the first is made: ``plan_reserve`` and ``replan_reserve``.

``raygpu.gang.reservation.reserve`` is observe -> plan -> act, as the sidecar's cycle is:
``observe_reserve`` reads everything once into a :class:`ReserveSnapshot`; ``plan_reserve`` decides
(``plan_gang``, then the refusals) and returns a :class:`ReservePlan` that lists the writes in the order
``act_reserve`` makes them:

1. the state ConfigMap ``<cluster>-rg-<name>``, owned by the RayCluster, state ``planned``;
2. the backend's gang objects (PodGroup, Workload), each owned by that ConfigMap once it exists
   (:meth:`ReservePlan.gang_objects_owned_by`: its uid is the one thing only the create can tell);
3. one RayCluster JSON patch that tests ``metadata.resourceVersion`` and appends the worker group;

plus the :class:`~raygpu.model.guard.GuardWiring` the ``Reservation`` is built with. When that patch
meets a conflict, act re-reads the RayCluster and ``replan_reserve`` lays the patch out again from the new
view (never an overwrite).

Pure: no I/O, no clock (``now_s`` is in the snapshot), no randomness (nor is the request id). The gang
backends (gang/backends/) are pure builders too; plan/ does not import gang/, so the snapshot carries the one
the server can serve, named here by its shape (:class:`GangBuilder`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Protocol

from raygpu.errors import PermanentError
from raygpu.model.annotations import ClusterPolicy
from raygpu.model.gang import Backend, GangPlan, GangRequest, ReservationState
from raygpu.model.gc import is_reservation_group
from raygpu.model.guard import GuardPolicy, GuardWiring, parse_guard_policy
from raygpu.model.labels import (ANNOTATION_DEADLINE, ANNOTATION_EXPECTED_RUNTIME, ANNOTATION_HEARTBEAT,
                                 ANNOTATION_PLACEMENT_GROUP, ANNOTATION_PLAN_REASON, ANNOTATION_REQUEST_ID,
                                 ANNOTATION_RESERVATION_STATE, BACKFILL_GATE, CREATED_BY_SCALE_UP, GUARD_GATE,
                                 KEY_GUARD_SCOPE, LABEL_CLUSTER, LABEL_CREATED_BY, LABEL_OWNER_JOB,
                                 LABEL_RESERVATION, PRIORITY_CLASS_BLOCKER, dns_label)
from raygpu.model.raycluster import GroupTemplate, RayClusterView
from raygpu.plan.common.patch import add_worker_group, raycluster_patch
from raygpu.plan.gang.reservation import FreeNow, plan_gang


class GangBuilder(Protocol):
    """What a gang backend (``raygpu.gang.backends.GangBackend``) builds from a plan; pure."""

    def worker_group_spec(self, plan: GangPlan, template_group: GroupTemplate,
                          request: GangRequest) -> dict[str, Any]: ...

    def gang_objects(self, plan: GangPlan, request: GangRequest,
                     owner_ref: dict[str, Any] | None) -> list[dict[str, Any]]: ...

    def check_created(self, sent: dict[str, Any], made: dict[str, Any]) -> None: ...


@dataclass(frozen=True)
class ReserveSnapshot:
    """Everything ``reserve`` reads, read once before anything is decided (``observe_reserve``)."""

    request: GangRequest
    cluster: RayClusterView
    policy: ClusterPolicy  # the cluster's annotations (a bad value: its default, already reported)
    free: FreeNow  # what each template's pods could bind now; None: not known
    guard_policy: GuardPolicy  # the cluster's guard annotations (a bad value: its default, already reported)
    backend: GangBuilder  # the gang backend's builder, of the API version the server serves
    now_s: float
    request_id: str  # this call's id on the state ConfigMap: a create whose answer was lost is found by it
    blocker_class: bool | None = None  # raygpu's blocker PriorityClass exists; None: not read (not needed)
    may_backfill: bool = False  # this identity may get the scope's Lease and patch its pods (asked when it matters)
    # gang scale-up (raygpu.reclaim.scale_up): the pending Ray placement group (hex id) the sidecar reserves for;
    # the state ConfigMap then says so (label raygpu.io/created-by, annotation raygpu.io/placement-group)
    scale_up_pg: str | None = None
    # nodes a GPU health agent (or the doctor's NVML probe) marked unhealthy: the reservation's pods get a required
    # node affinity that keeps them off these (docs/doctor.md, "GPU health"); () when none or not known
    unhealthy_nodes: tuple[str, ...] = ()


@dataclass(frozen=True)
class ReservePlan:
    """The writes of one reservation, in the order ``act_reserve`` makes them, and the handle's wiring."""

    gang: GangPlan
    state_configmap: dict[str, Any]  # 1. created first: labels, owner (the RayCluster), state, deadline, plan.json
    gang_objects: tuple[dict[str, Any], ...]  # 2. created next, in order, owned by the state ConfigMap
    worker_group: dict[str, Any]  # the reservation's worker group, as the patch appends it
    patch: tuple[dict[str, Any], ...]  # 3. one RayCluster JSON patch: test resourceVersion, append worker_group
    wiring: GuardWiring  # the Reservation's guard / backfill wiring

    def gang_objects_owned_by(self, state_uid: str) -> list[dict[str, Any]]:
        """The gang objects, each owned by the state ConfigMap of uid ``state_uid`` (known once created), so that
        deleting the ConfigMap lets Kubernetes' garbage collector take them."""
        owner = {"apiVersion": "v1", "kind": "ConfigMap", "name": self.gang.gang_name, "uid": state_uid,
                 "blockOwnerDeletion": False}
        return [{**obj, "metadata": {**obj["metadata"], "ownerReferences": [dict(owner)]}}
                for obj in self.gang_objects]


def chosen_backend(request: GangRequest, policy: ClusterPolicy) -> Backend:
    """The backend a plan for ``request`` uses (``plan_gang`` chooses the same): what observe needs to know
    before planning, to ask only what that backend needs (API discovery, the guard's PriorityClass)."""
    return request.backend or policy.gang_backend


def is_guarded(request: GangRequest, guard_policy: GuardPolicy) -> bool:
    """Whether the reservation is guarded: the request's ``guard`` wins over the cluster's ``raygpu.io/guard``."""
    return request.guard if request.guard is not None else guard_policy.enabled


def backfill_applies(request: GangRequest, guard_policy: GuardPolicy) -> bool:
    """Whether backfill could apply (then observe asks whether this identity may): an unguarded gang with
    a runtime hint (docs/guard.md)."""
    return not is_guarded(request, guard_policy) and request.expected_runtime_s is not None


def plan_reserve(snap: ReserveSnapshot) -> ReservePlan:
    """Decide the reservation and lay out every write, or refuse before any is made.

    Raises InfeasibleError / PermanentError as ``plan_gang`` does; then PermanentError when a guarded
    reservation cannot work (a backend other than ``none``: the guard makes the gang all-or-nothing itself;
    raygpu's blocker PriorityClass not installed) or when the request's worker group already exists (the
    name is taken). The same snapshot gives the same plan.
    """
    request, cluster = snap.request, snap.cluster
    gang = plan_gang(request, cluster, snap.policy, snap.free)
    guard: GuardPolicy | None = None
    if is_guarded(request, snap.guard_policy):
        if gang.backend is not Backend.NONE:
            raise PermanentError(f"the starvation guard needs backend none (it makes the gang all-or-nothing "
                                 f"itself), got {gang.backend.value}; pass backend='none' or guard=False")
        if not snap.blocker_class:
            raise PermanentError(f"the starvation guard needs PriorityClass {PRIORITY_CLASS_BLOCKER}: kubectl apply "
                                 "-f deploy/guard/priorityclasses.yaml (or pass guard=False)")
        guard = snap.guard_policy.model_copy(update={"enabled": True})
    if cluster.group(gang.reservation_group) is not None:
        raise PermanentError(f"a reservation named {request.name!r} already exists on {request.namespace}/"
                             f"{request.cluster} (worker group {gang.reservation_group}); pick another name")
    labels = {LABEL_RESERVATION: gang.reservation_group, LABEL_CLUSTER: dns_label(gang.cluster)}
    if request.owner_job:
        labels[LABEL_OWNER_JOB] = dns_label(request.owner_job)
    if guard is not None:
        labels[KEY_GUARD_SCOPE] = guard.scope_for(gang.namespace)
    if snap.scale_up_pg:
        labels[LABEL_CREATED_BY] = CREATED_BY_SCALE_UP
    owner = {"apiVersion": "ray.io/v1", "kind": "RayCluster", "name": cluster.name, "uid": cluster.uid,
             "blockOwnerDeletion": False}
    state = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {
        "name": gang.gang_name, "namespace": gang.namespace, "labels": labels, "ownerReferences": [owner],
        "annotations": {ANNOTATION_RESERVATION_STATE: ReservationState.PLANNED.value,
                        ANNOTATION_PLAN_REASON: gang.reason[:1000],
                        ANNOTATION_HEARTBEAT: f"{snap.now_s:.0f}",
                        ANNOTATION_DEADLINE: f"{snap.now_s + request.timeout_s:.0f}",
                        ANNOTATION_REQUEST_ID: snap.request_id,
                        **({ANNOTATION_PLACEMENT_GROUP: snap.scale_up_pg} if snap.scale_up_pg else {}),
                        **({ANNOTATION_EXPECTED_RUNTIME: f"{request.expected_runtime_s:g}"}
                           if request.expected_runtime_s else {})}},
        "data": {"plan.json": gang.model_dump_json(), "history": ReservationState.PLANNED.value}}
    objects = tuple(snap.backend.gang_objects(gang, request, None))  # owned by the state ConfigMap once made
    spec, patch, wiring = _worker_group(snap, gang, guard, cluster)
    return ReservePlan(gang=gang, state_configmap=state, gang_objects=objects, worker_group=spec, patch=patch,
                       wiring=wiring)


def replan_reserve(snap: ReserveSnapshot, plan: ReservePlan, cluster: RayClusterView) -> ReservePlan | None:
    """After the RayCluster patch met a conflict: the patch laid out again from ``cluster``, read again.

    None when the worker group is already there and raygpu's: the patch landed and only its answer was lost
    (the group's name is this reservation's alone: the state ConfigMap of that name, created before, would
    have refused a second driver). The gang plan stays ``plan.gang``; raises PermanentError when a fresh
    plan would need other pods (the cluster's templates changed while reserving), as ``plan_gang`` may too.
    """
    landed = cluster.group(plan.gang.reservation_group)
    if landed is not None and is_reservation_group(landed):
        return None
    if plan_gang(snap.request, cluster, snap.policy, snap.free).need != plan.gang.need:
        raise PermanentError("the cluster's templates changed while reserving; retry the request")
    spec, patch, wiring = _worker_group(snap, plan.gang, plan.wiring.guard, cluster)
    return replace(plan, worker_group=spec, patch=patch, wiring=wiring)


def _worker_group(snap: ReserveSnapshot, gang: GangPlan, guard: GuardPolicy | None,
                  cluster: RayClusterView) -> tuple[dict[str, Any], tuple[dict[str, Any], ...], GuardWiring]:
    """The worker group laid out on ``cluster``, the RayCluster patch that appends it, and the wiring: a copy of
    the template group the gang plan chose with the backend's wiring; a guarded gang's pods gated by the guard;
    a runtime hint on the pods (and the backfill gate when the gang may backfill)."""
    request = snap.request
    backfill = guard is None and request.expected_runtime_s is not None and snap.may_backfill
    template = cluster.group(gang.need.template_group)
    assert template is not None  # the gang plan chose it from this view (or an equal plan did: replan_reserve)
    spec = snap.backend.worker_group_spec(gang, template, request)
    if snap.unhealthy_nodes:
        avoid_nodes(spec["template"].setdefault("spec", {}), snap.unhealthy_nodes)
    if guard is not None:
        _add_gate(spec, GUARD_GATE)  # no pod binds before the guard's swap; their priority stays the user's
    if request.expected_runtime_s is not None:
        md = spec["template"].setdefault("metadata", {})
        md["annotations"] = {**(md.get("annotations") or {}),
                             ANNOTATION_EXPECTED_RUNTIME: f"{request.expected_runtime_s:g}"}
        if backfill:
            # the gate makes the pods' first scheduling attempt already carry the right pass (guard/backfill.py
            # lifts it on its first step): kube-scheduler does not retry a pending pod for its own labels
            _add_gate(spec, BACKFILL_GATE)
    if guard is not None:
        wiring = GuardWiring(guard=guard, cluster_uid=cluster.uid, template_spec=spec["template"].get("spec") or {})
    elif backfill:
        wiring = GuardWiring(scope_lease=parse_guard_policy(cluster.annotations)[0].lease_name(gang.namespace))
    else:
        wiring = GuardWiring()
    return spec, tuple(raycluster_patch(cluster.resource_version, add_worker_group(spec))), wiring


def avoid_nodes(pod_spec: dict[str, Any], nodes: tuple[str, ...]) -> None:
    """Keep pods of ``pod_spec`` off ``nodes``: ``metadata.name NotIn nodes`` added to every required node selector
    term (terms are ORed, so each must exclude them), or one term of its own when the template has none. Mutates
    the backend's fresh copy, as ``_add_gate`` does; the template's own affinity is kept otherwise (the sidecar's
    admission policy lets a reservation change ``affinity``: it is gang wiring)."""
    expr = {"key": "metadata.name", "operator": "NotIn", "values": sorted(nodes)}
    aff = pod_spec.setdefault("affinity", {}) or {}
    pod_spec["affinity"] = aff
    node_aff = aff.setdefault("nodeAffinity", {}) or {}
    aff["nodeAffinity"] = node_aff
    required = node_aff.setdefault("requiredDuringSchedulingIgnoredDuringExecution", {}) or {}
    node_aff["requiredDuringSchedulingIgnoredDuringExecution"] = required
    terms = required.get("nodeSelectorTerms") or [{}]
    required["nodeSelectorTerms"] = [{**t, "matchFields": [*(t.get("matchFields") or []), expr]} for t in terms]


def _add_gate(spec: dict[str, Any], name: str) -> None:
    """Append the scheduling gate ``name`` to a worker group spec's pod template (a fresh copy the backend
    built: mutated here, before anyone else sees it), keeping the template's own gates."""
    pod = spec["template"].setdefault("spec", {})
    pod["schedulingGates"] = [*(pod.get("schedulingGates") or []), {"name": name}]


__all__ = ["GangBuilder", "ReservePlan", "ReserveSnapshot", "avoid_nodes", "chosen_backend", "is_guarded", "backfill_applies",
           "plan_reserve", "replan_reserve"]
