"""The Kubernetes side of one gang reservation: reserve, observe, release.

The reservation's state lives on Kubernetes, so that a restarted sidecar or
another driver can read it: a ConfigMap named ``plan.gang_name`` (labels
``raygpu.io/reservation`` and ``raygpu.io/cluster``, owned by the RayCluster)
whose annotation ``raygpu.io/reservation-state`` walks the table in
``raygpu.model.gang.ALLOWED_TRANSITIONS``. Gang objects (PodGroups) are owned
by that ConfigMap, so deleting it lets the garbage collector take them.

``reserve`` reads as the sidecar's cycle does: ``observe_reserve`` does every read into one frozen
``ReserveSnapshot``; ``plan_reserve`` (pure, plan/gang/reserve.py) decides and lays out every write;
``act_reserve`` makes them in order and builds the ``Reservation`` with its guard wiring.

Promises: ``reserve`` changes the RayCluster with exactly one JSON patch that
tests ``metadata.resourceVersion`` first; a conflict re-reads the cluster and
re-plans (at most ``MAX_REPLANS`` times), it never overwrites. ``release`` is
idempotent and leaves no worker group, gang object or state ConfigMap behind.
"""

from __future__ import annotations

import enum
import os
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Callable

from raygpu.adapters.kube import KubeAdapter
from raygpu.errors import ConflictError, PermanentError, RayGpuError
from raygpu.gang.backends import get_backend
from raygpu.gang.backends.workload import GROUP as WORKLOAD_GROUP, MAP_NAME as WORKLOAD_POLICY
from raygpu.gang.free import can_i, free_now
from raygpu.model.annotations import AnnotationProblem, ClusterPolicy, is_guard_problem, parse_cluster_policy
from raygpu.model.guard import GuardPolicy, GuardWiring, guard_namespace
from raygpu.model.gang import Backend, GangPlan, GangRequest, ReservationState, check_transition
from raygpu.model.gc import is_reservation_group
from raygpu.model.labels import (ANNOTATION_GATED, ANNOTATION_HEARTBEAT, ANNOTATION_PLACEMENT_GROUP,
                                 ANNOTATION_REQUEST_ID, ANNOTATION_RESERVATION_STATE, LABEL_RESERVATION,
                                 KEY_GANG_SCHEDULER_NAME, PRIORITY_CLASS_BLOCKER)
from raygpu.model.raycluster import RayClusterView
from raygpu.model.views import K8sPodView
from raygpu.plan.common.patch import raycluster_patch, remove_worker_group, set_replicas, set_workers_to_delete
from raygpu.plan.gang.reserve import (ReservePlan, ReserveSnapshot, backfill_applies, chosen_backend, is_guarded,
                                      plan_reserve, replan_reserve)

MAX_REPLANS = 5
RELEASE_DRAIN_S = 60.0  # how long a release waits for the reservation's pods to go
EXIT_DRAIN_S = 3.0  # ... on Ctrl-C or interpreter exit; the finisher waits for the rest


@dataclass
class Reservation:
    """Handle on one reservation in one namespace (state ConfigMap ``plan.gang_name``)."""

    kube: KubeAdapter
    plan: GangPlan
    request: GangRequest
    state: ReservationState = ReservationState.PLANNED
    history: list[str] = field(default_factory=list)
    # the starvation guard's and backfill's wiring, fixed when reserve planned it (plan/gang/reserve.py)
    wiring: GuardWiring = field(default_factory=GuardWiring)
    state_uid: str = ""  # the state ConfigMap's uid (the guard's blockers are owned by it)
    # the gang objects this reservation created: (apiVersion, kind, name, uid); a release deletes exactly these
    created: list[tuple[str, str, str, str]] = field(default_factory=list)
    # what the last observe() saw of the reserved pods: (not deleting, scheduled to a node, Running)
    pods_seen: tuple[int, int, int] = (0, 0, 0)
    _lock: threading.RLock = field(default_factory=threading.RLock, repr=False, compare=False)

    @property
    def state_object(self) -> tuple[str, str, str, str]:
        return ("v1", "ConfigMap", self.plan.gang_name, self.plan.namespace)

    # ------------------------------------------------------------ lifecycle
    def transition(self, target: ReservationState, note: str = "") -> None:
        """Move along an edge of the state table, recording it on the state ConfigMap first.

        The in-memory state changes only once the write landed: a write that
        fails raises and leaves ``state`` as it was, so the caller retries and
        the driver never believes more than the ConfigMap says. A state
        ConfigMap that is gone (PermanentError) is only accepted on the way
        out (failed, released, rolled_back); otherwise it raises.
        """
        with self._lock:
            if target == self.state:
                return
            check_transition(self.state, target)
            history = [*self.history, f"{target.value}{': ' + note if note else ''}"]
            api, kind, name, ns = self.state_object
            try:
                self.kube.merge_patch(api, kind, name, ns, {"metadata": {"annotations": {
                    ANNOTATION_RESERVATION_STATE: target.value}}, "data": {"history": "\n".join(history)}})
            except PermanentError:
                if target not in (ReservationState.FAILED, ReservationState.RELEASED, ReservationState.ROLLED_BACK):
                    raise  # the state object vanished under a live reservation
            self.state, self.history = target, history

    def pods(self) -> list[K8sPodView]:
        """The pods of the reservation's worker group."""
        return [p for p in self.kube.ray_pods(self.plan.namespace, self.plan.cluster)
                if p.labels.get(LABEL_RESERVATION) == self.plan.reservation_group]

    def observe(self) -> ReservationState:
        """Advance RESERVED -> ADMITTED -> BOUND from what the pods show; returns the state."""
        ps = [p for p in self.pods() if not p.deleting]
        n = self.plan.pod_count
        self.pods_seen = (len(ps), sum(1 for p in ps if p.node_name), sum(1 for p in ps if p.phase == "Running"))
        broken = self._gang_wiring_lost(ps)
        if broken and self.state in (ReservationState.RESERVED, ReservationState.ADMITTED):
            # these pods would bind one by one: fail now (the watchdog rolls back) rather than hold GPUs half-placed
            self.transition(ReservationState.FAILED, broken)
            return self.state
        gated = any(p.annotations.get(ANNOTATION_GATED) for p in ps)
        if self.state == ReservationState.RESERVED and len(ps) == n and not gated and all(p.node_name for p in ps):
            self.transition(ReservationState.ADMITTED, f"{n} pods scheduled together")
        if self.state == ReservationState.ADMITTED and all(p.phase == "Running" for p in ps) and len(ps) == n:
            self.transition(ReservationState.BOUND, f"{n} pods Running on {len({p.node_name for p in ps})} nodes")
        return self.state

    def _gang_wiring_lost(self, ps: list[K8sPodView]) -> str | None:
        """Why some of the gang's pods would no longer be scheduled together (None: they would), by the wiring
        the plan wrote that something removed since: the PodGroup's spec.schedulingGroup (KubeRay dropped it
        and the admission policy did not put it back) or the Coscheduling profile's spec.schedulerName (an
        admission webhook or an operator rewrote it)."""
        stray = sorted(p.name for p in ps if self.plan.backend is Backend.WORKLOAD
                       and p.scheduling_group != self.plan.gang_name)
        if stray:
            return (f"pod(s) {', '.join(stray[:3])} are not in PodGroup {self.plan.gang_name} (spec.schedulingGroup "
                    f"unset): install deploy/workload's MutatingAdmissionPolicy {WORKLOAD_POLICY}, which sets it "
                    f"from the pod label")
        astray = sorted((p.name, p.scheduler_name) for p in ps if self.plan.scheduler_name and p.scheduler_name
                        and p.scheduler_name != self.plan.scheduler_name)
        if astray:
            return (f"pod(s) {', '.join(n for n, _ in astray[:3])} ask for scheduler {astray[0][1]!r}, not "
                    f"{self.plan.scheduler_name!r} (the profile running Coscheduling) that the plan wrote")
        return None

    def heartbeat(self, now_s: float) -> None:
        """Beat on the state object; while the gang waits to be scheduled, nudge the gang scheduler too."""
        api, kind, name, ns = self.state_object
        self.kube.merge_patch(api, kind, name, ns, {"metadata": {"annotations": {ANNOTATION_HEARTBEAT: f"{now_s:.0f}"}}})
        if self.state == ReservationState.RESERVED:
            for api_version, obj_kind, obj_name, body in get_backend(self.plan.backend).requeue_patches(self.plan, now_s):
                try:
                    self.kube.merge_patch(api_version, obj_kind, obj_name, ns, body)
                except PermanentError:
                    pass  # the gang object is gone (released under us): nothing to nudge

    def record_placement_group(self, pg_id: str) -> None:
        """Record the Ray PG's id on the state ConfigMap (the sidecar's GC checks it); raises if the write failed."""
        api, kind, name, ns = self.state_object
        self.kube.merge_patch(api, kind, name, ns, {"metadata": {"annotations": {ANNOTATION_PLACEMENT_GROUP: pg_id}}})

    # --------------------------------------------------------------- release
    def release(self, failed: str | None = None, drain_timeout_s: float = RELEASE_DRAIN_S) -> GroupOutcome:
        """Remove the worker group, the gang objects and the state ConfigMap. Idempotent.

        ``failed`` (a reason) walks FAILED -> ROLLED_BACK instead of RELEASED
        (a reservation already released keeps that end). A call that raises
        has changed no state it did not also write, so calling again finishes
        the job. Waits up to ``drain_timeout_s`` for the group's pods to go. Returns
        ``GroupOutcome.DRAINING`` when they outlived the wait: the state is then
        terminal and the zero-replica group and the state ConfigMap stay for
        ``finish_release`` (or the sidecar's garbage collection) to remove.
        """
        if failed and self.state not in (ReservationState.FAILED, ReservationState.ROLLED_BACK,
                                         ReservationState.RELEASED):
            self.transition(ReservationState.FAILED, failed)
        final = (ReservationState.ROLLED_BACK if self.state in (ReservationState.FAILED, ReservationState.ROLLED_BACK)
                 else ReservationState.RELEASED)
        group = remove_reservation_group(self.kube, self.plan.namespace, self.plan.cluster,
                                         self.plan.reservation_group, drain_timeout_s=drain_timeout_s)
        if group is GroupOutcome.DRAINING:
            # pods outlived the drain wait: keep the zero-replica group and the state object (now terminal),
            # so that finish_release or the sidecar's garbage collection removes both once the pods are gone
            self.transition(final, "pods still terminating; the group is removed when they are gone")
            return group
        api, kind, name, ns = self.state_object
        self.kube.delete(api, kind, name, ns)  # PodGroups are owned by it: the GC deletes them
        for obj_api, obj_kind, obj_name, obj_uid in reversed(self.created):
            try:  # only the object this reservation created (uid precondition): a same-named other one stays
                self.kube.delete(obj_api, obj_kind, obj_name, self.plan.namespace, uid=obj_uid)
            except ConflictError:
                pass  # replaced by someone else's object of that name: not ours to delete
        if self.state not in (ReservationState.RELEASED, ReservationState.ROLLED_BACK):
            self.state = check_transition(self.state, final)
            self.history.append(final.value)
        return group


class GroupOutcome(enum.Enum):
    """What taking a reservation's worker group out of the RayCluster came to (``remove_reservation_group``)."""

    ABSENT = "absent"  # the group (or the cluster) was already gone, or the group is not raygpu's: nothing written
    DRAINING = "draining"  # scaled to zero, its pods outlived the wait: the group stays until they are gone
    REMOVED = "removed"  # its pods are gone and the group is out of the spec


def remove_reservation_group(kube: KubeAdapter, namespace: str, cluster: str, group: str,
                             drain_timeout_s: float = RELEASE_DRAIN_S) -> GroupOutcome:
    """Take worker group ``group`` out of the RayCluster, its pods first; re-read on every conflict.

    KubeRay never deletes the pods of a group that left the spec, so this
    (1) scales the group to zero with its pods listed in ``workersToDelete``
    (KubeRay deletes them), (2) waits up to ``drain_timeout_s`` (0: just looks)
    for them to go, (3) removes the group once they have. Each write is a JSON
    patch that tests the resourceVersion and the group's name first. Returns
    ``GroupOutcome.REMOVED``; ``ABSENT`` when the group (or the cluster) was
    already gone; ``DRAINING`` when pods are still there at the deadline: the
    group stays, at zero replicas, so that no pod is left without an owner
    group, and calling again later finishes the job. A group whose pod template
    lacks ``raygpu.io/reservation=<group>`` is not raygpu's: never written, ``ABSENT``.
    """
    def patch(build) -> bool:
        for _ in range(MAX_REPLANS):
            try:
                view = kube.get_raycluster(namespace, cluster)
            except PermanentError:
                return False
            try:
                idx = view.group_index(group)
            except KeyError:
                return False
            if not is_reservation_group(view.worker_groups[idx]):
                return False  # not raygpu's: its pod template lacks raygpu.io/reservation=<group>; never touched
            ops = build(idx, view)
            if not ops:
                return True
            try:
                kube.patch_raycluster(namespace, cluster, raycluster_patch(view.resource_version, ops))
                return True
            except ConflictError:
                continue
        raise ConflictError(f"could not update worker group {group} of {namespace}/{cluster}: "
                            f"{MAX_REPLANS} conflicting writes in a row")

    def live_pods() -> list[str]:
        return sorted(p.name for p in kube.ray_pods(namespace, cluster) if p.ray_group == group and not p.deleting)

    def scale_to_zero(idx: int, view) -> list[dict]:
        g = view.worker_groups[idx]
        pods = live_pods()
        if g.replicas == 0 and g.min_replicas == 0 and set(pods) <= set(g.workers_to_delete):
            return []  # already scaled to zero with every pod listed: nothing to write
        return [*set_replicas(idx, 0, group),
                {"op": "add", "path": f"/spec/workerGroupSpecs/{idx}/minReplicas", "value": 0},
                *set_workers_to_delete(idx, pods)]
    if not patch(scale_to_zero):
        return GroupOutcome.ABSENT
    deadline = time.monotonic() + drain_timeout_s
    while any(True for p in kube.ray_pods(namespace, cluster) if p.ray_group == group):
        if time.monotonic() >= deadline:
            return GroupOutcome.DRAINING
        time.sleep(0.5)
    return GroupOutcome.REMOVED if patch(lambda idx, view: remove_worker_group(idx, group)) else GroupOutcome.ABSENT


def finish_release(kube: KubeAdapter, namespace: str, cluster: str, reservation: str, group: str,
                   drain_timeout_s: float = 0.0, uid: str | None = None) -> tuple[GroupOutcome, bool]:
    """Finish releasing reservation ``reservation`` (its state ConfigMap) whose worker group is ``group``.

    Scales the group to zero (KubeRay deletes the pods), waits up to
    ``drain_timeout_s`` (0: never blocks) for them to go, then removes the
    group and deletes the state ConfigMap; the backend's gang objects are
    owned by the ConfigMap, so Kubernetes' garbage collector deletes them.
    Idempotent. Returns (the group's ``GroupOutcome``, ConfigMap deleted); while draining the ConfigMap stays, so that calling
    again finishes the job. ``uid``: the ConfigMap is deleted only if it is
    still the object of that uid (a precondition). Raises RayGpuError on failure.
    """
    outcome = remove_reservation_group(kube, namespace, cluster, group, drain_timeout_s=drain_timeout_s)
    if outcome is GroupOutcome.DRAINING:
        return outcome, False
    return outcome, kube.delete("v1", "ConfigMap", reservation, namespace, uid=uid)


def reserve(kube: KubeAdapter, request: GangRequest, now_s: float,
            progress: Callable[[str], None] = lambda m: None) -> Reservation:
    """Plan and reserve ``request``: state ConfigMap, gang objects, one RayCluster patch.

    ``observe_reserve`` (every read) -> ``plan_reserve`` (pure, plan/gang/reserve.py) -> ``act_reserve``
    (the writes). Raises InfeasibleError / PermanentError before anything is created when the request
    cannot be planned; on any later failure everything created is deleted before the error propagates.
    """
    snap = observe_reserve(kube, request, now_s, progress)
    plan = plan_reserve(snap)
    progress(f"plan: {plan.gang.reason}")
    return act_reserve(kube, snap, plan, progress)


def observe_reserve(kube: KubeAdapter, request: GangRequest, now_s: float,
                    progress: Callable[[str], None] = lambda m: None) -> ReserveSnapshot:
    """Every read ``reserve`` makes, once, before anything is decided or written.

    The RayCluster and its annotations (a bad value is said through ``progress``, the guard's and a
    coscheduling gang's ``raygpu.io/gang-scheduler-name`` also as a Warning Event ``InvalidAnnotation`` on the
    RayCluster, best effort, and its default used); the free
    capacity each template's pods could bind now (``free_now``: only if this identity may list nodes and
    pods); whether raygpu's blocker PriorityClass exists (a guarded gang on backend ``none``); whether this
    identity may backfill (an unguarded gang with a runtime hint); which ``scheduling.k8s.io`` version the
    server serves (backend ``workload``: API discovery). Raises what a read raises (NotFoundError: no such
    RayCluster) and PermanentError when the server serves no Workload API this backend can use.
    """
    view = RayClusterView.from_k8s(kube.raw_raycluster(request.namespace, request.cluster))
    policy, problems = parse_cluster_policy(view.annotations)
    backend = chosen_backend(request, policy)
    for pr in problems:
        if pr.key == KEY_GANG_SCHEDULER_NAME and backend is Backend.COSCHEDULING and request.scheduler_name is None:
            _invalid_annotation(kube, view, pr, progress)  # this gang's pods go to the default scheduler name
        else:
            progress(f"annotation {pr.key}={pr.value!r} ignored ({pr.reason}); using {pr.default_used}")
    # what each template's pods could bind now (None: not known), and the nodes marked unhealthy (kept out)
    free, unhealthy = free_now(kube, view, progress)
    guard_policy = _guard_policy(kube, view, policy, problems)
    blocker_class = (kube.get("scheduling.k8s.io/v1", "PriorityClass", PRIORITY_CLASS_BLOCKER) is not None
                     if is_guarded(request, guard_policy) and backend is Backend.NONE else None)
    may_backfill = backfill_applies(request, guard_policy) and _may_backfill(kube, request.namespace, progress)
    builder = get_backend(backend, served=kube.api_group_kinds(WORKLOAD_GROUP) if backend is Backend.WORKLOAD
                          else None)  # a server without the Workload API: PermanentError naming it
    return ReserveSnapshot(request=request, cluster=view, policy=policy, free=free, guard_policy=guard_policy,
                           backend=builder, now_s=now_s, request_id=uuid.uuid4().hex, blocker_class=blocker_class,
                           may_backfill=may_backfill, unhealthy_nodes=unhealthy)


def act_reserve(kube: KubeAdapter, snap: ReserveSnapshot, plan: ReservePlan,
                progress: Callable[[str], None] = lambda m: None, *,
                rollback_drain_s: float | None = None) -> Reservation:
    """Make ``plan``'s writes in order and return the reservation, ``RESERVED``.

    (1) The state ConfigMap: if its create fails, one that landed anyway (the answer was lost) is deleted,
    only if it carries this call's request id. (2) The gang objects, owned by it; a field the server dropped
    fails the reservation (``check_created``). (3) The RayCluster patch; a conflict re-reads the cluster and
    ``replan_reserve`` lays the patch out again (at most ``MAX_REPLANS`` tries), never an overwrite. Any
    failure from (2) on releases what was created (the Reservation's ``release``) and raises the cause.
    ``rollback_drain_s``: how long that release waits for pods to go (None: ``RELEASE_DRAIN_S``, on Ctrl-C
    ``EXIT_DRAIN_S``); the sidecar passes 0 and its garbage collection finishes what is left.
    """
    gang, request = plan.gang, snap.request
    try:
        cm = kube.create(plan.state_configmap)
    except BaseException:
        _undo_lost_create(kube, gang.namespace, gang.gang_name, snap.request_id)
        raise
    state_uid = ""
    created: list[tuple[str, str, str, str]] = []
    rsv: Reservation | None = None
    try:
        state_uid = cm["metadata"]["uid"]
        # gang objects before the pods exist, so the first pod already finds its group
        for obj in plan.gang_objects_owned_by(state_uid):
            made = kube.create(obj)
            created.append((obj["apiVersion"], obj["kind"], obj["metadata"]["name"], made["metadata"]["uid"]))
            snap.backend.check_created(obj, made)  # a field the server dropped (a gated topology) fails here
        plan = _patch_raycluster(kube, snap, plan, progress)
        rsv = Reservation(kube, gang, request, history=[ReservationState.PLANNED.value], wiring=plan.wiring,
                          state_uid=state_uid, created=created)
        rsv.transition(ReservationState.RESERVED, f"worker group {gang.reservation_group} x{gang.pod_count}")
        return rsv
    except BaseException as e:
        # what a release needs: the state ConfigMap, the worker group (by name) and the objects created
        _roll_back(rsv or Reservation(kube, gang, request, history=[ReservationState.PLANNED.value],
                                      state_uid=state_uid, created=created), e, progress, rollback_drain_s)
        raise


def _patch_raycluster(kube: KubeAdapter, snap: ReserveSnapshot, plan: ReservePlan,
                      progress: Callable[[str], None]) -> ReservePlan:
    """Send ``plan.patch``; on a conflict re-read the RayCluster and re-plan (``replan_reserve``), at most
    ``MAX_REPLANS`` patches. Returns the plan whose patch landed; raises ConflictError past the last."""
    ns, cluster = plan.gang.namespace, plan.gang.cluster
    for attempt in range(MAX_REPLANS):
        try:
            kube.patch_raycluster(ns, cluster, list(plan.patch))
            return plan
        except ConflictError:
            progress(f"RayCluster changed under us (attempt {attempt + 1}); re-reading and re-planning")
            replanned = replan_reserve(snap, plan, kube.get_raycluster(snap.request.namespace, snap.request.cluster))
            if replanned is None:
                return plan  # our patch landed and its answer was lost
            plan = replanned
    raise ConflictError(f"{MAX_REPLANS} conflicting writes in a row on {ns}/{cluster}")


def _roll_back(rsv: Reservation, cause: BaseException, progress: Callable[[str], None],
               drain_timeout_s: float | None = None) -> None:
    """Release what a failed ``act_reserve`` created; a release that fails too is said and noted on ``cause``."""
    interrupted = isinstance(cause, KeyboardInterrupt)
    # Ctrl-C must give the prompt back: pods that outlive a short wait are left to the sidecar's GC
    if drain_timeout_s is None:
        drain_timeout_s = EXIT_DRAIN_S if interrupted else RELEASE_DRAIN_S
    try:
        rsv.release(failed=f"reserve failed: {cause!r}" if interrupted else f"reserve failed: {cause}",
                    drain_timeout_s=drain_timeout_s)
    except Exception as cleanup:  # noqa: BLE001 - the caller needs the cause, not the cleanup's error
        said = (f"undoing the failed reservation also failed ({cleanup}); what is left is released by the "
                "sidecar's garbage collection")
        progress(said)
        cause.add_note(said)


def _guard_policy(kube: KubeAdapter, view: RayClusterView, policy: ClusterPolicy,
                  problems: list[AnnotationProblem]) -> GuardPolicy:
    """The cluster's guard policy (parsed with every other cluster annotation); a problem with a guard key, or a
    key misspelt close to one, is also a Warning Event ``InvalidAnnotation`` on the RayCluster, best effort (the
    guard may run without the sidecar, which says every problem)."""
    for pr in problems:
        if not is_guard_problem(pr):
            continue
        try:
            kube.event({"apiVersion": "ray.io/v1", "kind": "RayCluster", "name": view.name,
                        "namespace": view.namespace, "uid": view.uid}, "InvalidAnnotation",
                       f"{pr.key}={pr.value!r}: {pr.reason}; using {pr.default_used}", "Warning")
        except RayGpuError:
            pass  # the caller's progress said it; an Event is best effort
    return policy.guard


def _invalid_annotation(kube: KubeAdapter, view: RayClusterView, pr: AnnotationProblem,
                        progress: Callable[[str], None]) -> None:
    """Say ``pr`` through ``progress`` and as a Warning Event ``InvalidAnnotation`` on the RayCluster (best effort)."""
    progress(f"annotation {pr.key}={pr.value!r} ignored ({pr.reason}); using {pr.default_used}")
    try:
        kube.event({"apiVersion": "ray.io/v1", "kind": "RayCluster", "name": view.name,
                    "namespace": view.namespace, "uid": view.uid}, "InvalidAnnotation",
                   f"{pr.key}={pr.value!r}: {pr.reason}; using {pr.default_used}", "Warning")
    except RayGpuError:
        pass  # the message above reached the driver; an Event is best effort


def _may_backfill(kube: KubeAdapter, namespace: str, progress: Callable[[str], None]) -> bool:
    """Whether this driver may backfill: get the scope's Lease, create, patch and delete its own ask Lease in the
    guard namespace, and patch its own pods in ``namespace`` (SelfSubjectAccessReviews). Said once when not:
    the gang is then made as usual (guard/backfill.py)."""
    gns = guard_namespace(os.environ)
    if can_i(kube, "patch", "pods", namespace=namespace) and all(
            can_i(kube, verb, "leases", "coordination.k8s.io", namespace=gns) for verb in ("get", "create", "patch", "delete")):
        return True
    progress("backfill off: this identity may not patch pods in the namespace or get, create, patch and delete "
             f"leases in the guard namespace {gns} (docs/permissions.md)")
    return False


def _undo_lost_create(kube: KubeAdapter, namespace: str, name: str, request_id: str) -> None:
    """The create of a state ConfigMap failed: if it landed anyway (the answer was lost), delete it, but only
    the object carrying this call's ``request_id``, under a uid precondition. Never raises: what it cannot
    undo, the sidecar's garbage collection releases after the heartbeat timeout."""
    try:
        cm = kube.get("v1", "ConfigMap", name, namespace)
        md = (cm or {}).get("metadata") or {}
        if cm is not None and (md.get("annotations") or {}).get(ANNOTATION_REQUEST_ID) == request_id:
            kube.delete("v1", "ConfigMap", name, namespace, uid=md.get("uid"))
    except Exception:  # noqa: BLE001 - best effort; the error that made us undo is what the caller sees
        pass


def now() -> float:
    return time.time()


__all__ = ["Reservation", "reserve", "observe_reserve", "plan_reserve", "replan_reserve", "act_reserve",
           "remove_reservation_group", "finish_release", "RELEASE_DRAIN_S", "EXIT_DRAIN_S", "GroupOutcome"]
