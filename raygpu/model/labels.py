"""Every ``raygpu.io/*`` label and annotation key, and the names raygpu derives.

One commented file, like KubeRay's ``utils/constant.go``: grep here first.
A key's comment says which objects carry it, who writes it and what its
value is. Pure data and pure functions: no I/O.
"""

from __future__ import annotations

import hashlib
import json
import re

PREFIX = "raygpu.io/"

# ---------------------------------------------------------------------------------------------
# Policy annotations a user sets on a RayCluster (parsed by raygpu.model.annotations, never raise)
# ---------------------------------------------------------------------------------------------
KEY_GANG_BACKEND = "raygpu.io/gang-backend"  # coscheduling | kueue | volcano | workload | none (default none)
KEY_QUEUE = "raygpu.io/queue"  # the Kueue LocalQueue of reservations (backend kueue)
# backend coscheduling: the schedulerName (scheduler profile running the Coscheduling plugin) the reserved pods
# ask for; a DNS-1123 subdomain name (default scheduler-plugins-scheduler, the upstream chart's profile)
KEY_GANG_SCHEDULER_NAME = "raygpu.io/gang-scheduler-name"
KEY_GANG_TEMPLATE = "raygpu.io/gang-template"  # worker group reservations copy (default: the planner picks)
KEY_IDLE_TIMEOUT = "raygpu.io/idle-timeout"  # e.g. 300s, 10m: a worker idle that long is reclaimed; or auto
IDLE_TIMEOUT_AUTO = "auto"  # the keep-warm policy learns each group's warm workers (docs/reclaimer.md)
GROUP_IDLE_TIMEOUT_PREFIX = KEY_IDLE_TIMEOUT + "."  # raygpu.io/idle-timeout.<worker group>: per-group override
# keep-warm knobs, read when an idle timeout is "auto" (raygpu.plan.reclaim.warm; defaults in raygpu.model.warm)
KEY_WARM_QUANTILE = "raygpu.io/warm-quantile"  # 0 < q <= 1 (default 0.8): quantile of the demand rise kept warm
KEY_WARM_HISTORY = "raygpu.io/warm-history"  # a duration (default 6h): how far back demand samples count
KEY_WARM_FALLBACK = "raygpu.io/warm-fallback"  # a duration (default 300s): idle timeout until enough samples
KEY_WARM_HOLD = "raygpu.io/warm-hold"  # 0..100 start-ups (default 0.5): idle time before a worker beyond the target goes
KEY_RECLAIM = "raygpu.io/reclaim"  # off | dry-run | on (default dry-run): what the sidecar may write
KEY_RECONCILE = "raygpu.io/reconcile"  # report | repair (default report): what the doctor may write
# gang scale-up (raygpu.reclaim.scale_up, docs/gang-scale-up.md): the sidecar reserves a gang for each pending
# placement group that raygpu did not create (Ray Train, Tune, Serve, vLLM); independent of raygpu.io/reclaim
KEY_GANG_SCALE_UP = "raygpu.io/gang-scale-up"  # on | off (default off)
KEY_GANG_SCALE_UP_IN_FLIGHT = "raygpu.io/gang-scale-up-in-flight"  # 1..64 (default 4): reservations not yet used
KEY_GANG_SCALE_UP_TIMEOUT = "raygpu.io/gang-scale-up-timeout"  # 30s..24h (default 10m): used by then or rolled back
# the starvation guard (raygpu.guard, docs/guard.md); parsed with the rest by parse_cluster_policy
KEY_GUARD = "raygpu.io/guard"  # on a RayCluster: on | off (default off): guard every reservation of it
KEY_MAX_HOLD = "raygpu.io/max-hold"  # on a RayCluster: 30s..6h (default 15m): the most a gang's nodes are blocked
KEY_GUARD_SCOPE = "raygpu.io/guard-scope"  # on a RayCluster: scope name (default: the namespace); also on state
#   ConfigMaps of guarded reservations and on the scope's Lease (value: the scope, as a DNS label)
GUARD_KEYS = (KEY_GUARD, KEY_MAX_HOLD, KEY_GUARD_SCOPE)
KEY_DOCTOR_INTERVAL = "raygpu.io/doctor-interval"  # off (default) | 1m..24h: the sidecar runs the doctor's checks
POLICY_KEYS = (*GUARD_KEYS, KEY_DOCTOR_INTERVAL, KEY_GANG_BACKEND, KEY_QUEUE, KEY_GANG_SCHEDULER_NAME, KEY_GANG_TEMPLATE, KEY_IDLE_TIMEOUT, KEY_RECLAIM, KEY_RECONCILE,
               KEY_WARM_QUANTILE, KEY_WARM_HISTORY, KEY_WARM_FALLBACK, KEY_WARM_HOLD, KEY_GANG_SCALE_UP,
               KEY_GANG_SCALE_UP_IN_FLIGHT, KEY_GANG_SCALE_UP_TIMEOUT)

# ---------------------------------------------------------------------------------------------
# Labels raygpu writes (on pods, Ray nodes, state ConfigMaps and gang objects)
# ---------------------------------------------------------------------------------------------
# value: GangPlan.reservation_group (the rg-* worker group); on pods, Ray nodes, ConfigMaps, PodGroups
LABEL_RESERVATION = "raygpu.io/reservation"
LABEL_OWNER_JOB = "raygpu.io/owner-job"  # Ray job id of the driver that owns the reservation (GC when it dies)
LABEL_CLUSTER = "raygpu.io/cluster"  # RayCluster name (as a DNS label), on gang objects and state ConfigMaps
# On a state ConfigMap the sidecar's gang scale-up made (value CREATED_BY_SCALE_UP): its liveness is its
# placement group in Ray's table (annotation raygpu.io/placement-group, set at creation), not a heartbeat
LABEL_CREATED_BY = "raygpu.io/created-by"
CREATED_BY_SCALE_UP = "gang-scale-up"
# On a backend-workload pod template: the PodGroup (scheduling.k8s.io) the pod joins. deploy/workload's
# MutatingAdmissionPolicy copies it into spec.schedulingGroup.podGroupName at pod creation, because KubeRay
# < 1.7 (and its RayCluster CRD) drop that PodSpec field from the template (docs/decisions.md).
LABEL_SCHEDULING_GROUP = "raygpu.io/scheduling-group"

# ---------------------------------------------------------------------------------------------
# Annotations raygpu writes on a reservation's state ConfigMap (and pods, gang objects)
# ---------------------------------------------------------------------------------------------
ANNOTATION_RESERVATION_STATE = "raygpu.io/reservation-state"  # a ReservationState value
ANNOTATION_PLACEMENT_GROUP = "raygpu.io/placement-group"  # Ray placement group id (hex), once created
ANNOTATION_PLAN_REASON = "raygpu.io/plan-reason"  # GangPlan.reason, for humans reading kubectl output
ANNOTATION_HEARTBEAT = "raygpu.io/heartbeat-at"  # unix seconds, written by the driver's watchdog
ANNOTATION_DEADLINE = "raygpu.io/deadline-at"  # unix seconds: ready by then or rolled back
ANNOTATION_REQUEST_ID = "raygpu.io/request-id"  # a random id per reserve() call: proves a state ConfigMap whose create answer was lost is ours
ANNOTATION_GATED = "raygpu.io/gated"  # read on a reservation's pods: set, they are not admitted yet (raygpu never writes it)
ANNOTATION_REQUEUE = "raygpu.io/requeue-at"  # on a coscheduling PodGroup: unix seconds, forces a retry

# ---------------------------------------------------------------------------------------------
# The keep-warm state ConfigMap (raygpu.reclaim.warm): one per RayCluster with a group in auto
# ---------------------------------------------------------------------------------------------
LABEL_WARM_STATE = "raygpu.io/warm-state"  # value: the RayCluster name (as a DNS label); with LABEL_CLUSTER
WARM_STATE_KEY = "history.json"  # its data key: raygpu.model.warm.encode_history

# ---------------------------------------------------------------------------------------------
# The starvation guard (raygpu.guard, docs/guard.md)
# ---------------------------------------------------------------------------------------------
# (its RayCluster keys KEY_GUARD, KEY_MAX_HOLD, KEY_GUARD_SCOPE are policy keys: above)
LABEL_BLOCKER = "raygpu.io/guard-blocker"  # on blocker pods: the gang's guard tag (model.guard.guard_tag)
LABEL_GUARD_FOR = "raygpu.io/guard-for"  # on a guarded gang's pods and its blockers: the gang's guard tag (its
#   namespace and state ConfigMap name as one DNS label); every pod without this value is kept off a blocked node
ANNOTATION_GUARD_TIMEOUTS = "raygpu.io/guard-timeouts"  # on a state ConfigMap: holds that timed out (queue order)
ANNOTATION_EXPECTED_RUNTIME = "raygpu.io/expected-runtime-s"  # on a state ConfigMap and its pods: the driver's runtime hint
LABEL_GUARD_PASS = "raygpu.io/guard-pass"  # on a backfilling gang's pending pods: the holder whose blockers let them in
ANNOTATION_GUARD_START = "raygpu.io/guard-estimated-start"  # on a scope's Lease: the hold's estimated start (unix s)
ANNOTATION_GUARD_GRANTS = "raygpu.io/guard-grants"  # on a scope's Lease, by its holder only: "<rev>;<tag>=yes|no,..."
LABEL_GUARD_ASK = "raygpu.io/guard-ask"  # on an ask Lease (<scope lease>.ask.<gang tag>): the scope Lease it asks
ANNOTATION_GUARD_ASK = "raygpu.io/guard-ask"  # on an ask Lease, by its gang only: "<grant rev seen>;<pending pods with a pass>"
GUARD_GATE = "raygpu.io/guard"  # schedulingGate on a guarded reservation's pods until the guard swaps them in
BACKFILL_GATE = "raygpu.io/backfill"  # schedulingGate on a hinted gang's pods until its first backfill decision
PRIORITY_CLASS_BLOCKER = "raygpu-guard-blocker"  # deploy/guard/priorityclasses.yaml: above user pods (none of
#   them can preempt a blocker to get onto a blocked node), preemptionPolicy Never
GUARD_LEASE_PREFIX = "raygpu-guard-"  # coordination.k8s.io Lease per scope: raygpu-guard-<scope>, in the guard namespace
# The guard namespace (one per Kubernetes cluster, every scope's objects in it, so one holder per scope across
# namespaces): the scope Leases, one ticket Lease per waiting guarded gang, and every blocker pod
DEFAULT_GUARD_NAMESPACE = "raygpu-system"
GUARD_NAMESPACE_ENV = "RAYGPU_GUARD_NAMESPACE"  # the driver's environment: another guard namespace
LABEL_GUARD_TICKET = "raygpu.io/guard-ticket"  # on a ticket Lease (<scope lease>.<gang tag>): the scope it waits in
ANNOTATION_GUARD_GANG = "raygpu.io/guard-gang"  # on a ticket Lease and blockers: <namespace>/<state ConfigMap>, for humans

# ---------------------------------------------------------------------------------------------
# Names raygpu derives
# ---------------------------------------------------------------------------------------------
RESERVATION_GROUP_PREFIX = "rg-"  # worker groups that carry a reservation: rg-<request name>
WARM_STATE_SUFFIX = "-raygpu-warm"  # the keep-warm state ConfigMap: warm_state_name(cluster)

# ---------------------------------------------------------------------------------------------
# The local testbed only (raygpu.testing)
# ---------------------------------------------------------------------------------------------
LABEL_POOL = "raygpu.io/pool"  # on kwok nodes: the test (namespace) they are private to
LABEL_TESTBED_SHAPE = "raygpu.io/testbed-shape"  # on kwok nodes: the catalog shape, or "custom"
ANNOTATION_TESTBED_RAY = "raygpu.io/testbed-ray"  # on pods: "stopped" | "keep" (see raygpu.testing.bridge)


# A Kubernetes label value, and the name part of a label key: <= 63 of [A-Za-z0-9-_.], alphanumeric at both
# ends (the empty value, valid for a label, is left to callers). Use with ``fullmatch``.
LABEL_VALUE = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?")
# A DNS-1123 subdomain name: [a-z0-9-] parts joined by dots, alphanumeric at both ends of each part, <= 253 chars
# in all (check the length apart). What Kubernetes accepts as a pod's spec.schedulerName. Use with ``fullmatch``.
DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
DNS_SUBDOMAIN_MAX = 253


def dns_label(text: str, prefix: str = "") -> str:
    """``prefix + text`` as a DNS label (<= 63 chars, [a-z0-9-]); deterministic.

    When ``text`` had to be changed or cut, 8 hex digits of its SHA-256 are
    appended so that different texts keep different labels.
    """
    clean = re.sub(r"-+", "-", re.sub(r"[^a-z0-9-]+", "-", text.lower())).strip("-")
    if clean == text and clean and len(prefix + clean) <= 63:
        return prefix + clean
    digest = hashlib.sha256(text.encode()).hexdigest()[:8]
    head = (prefix + clean)[: 63 - 9].rstrip("-") or "rg"
    return f"{head}-{digest}"


_NOT_LABEL = re.compile(r"[^a-z0-9-]+")
HASH_SEPARATOR = "--"  # before the hash of a generated name; a plain generated name never contains "--"
_GANG_INFIX = "-" + RESERVATION_GROUP_PREFIX  # "-rg-": between cluster and request name in gang_name


def _clean(text: str) -> str:
    """``text`` lower-cased, runs of other characters as one ``-``, no ``-`` at either end."""
    return re.sub(r"-+", "-", _NOT_LABEL.sub("-", text.lower())).strip("-")


def _hashed(head: str, *parts: str) -> str:
    """``<head cut to fit>--<8 hex of SHA-256 over parts>``: a DNS label of <= 63 chars."""
    digest = hashlib.sha256(json.dumps(list(parts)).encode()).hexdigest()[:8]
    head = head[: 63 - len(HASH_SEPARATOR) - 8].strip("-") or RESERVATION_GROUP_PREFIX.strip("-")
    return f"{head}{HASH_SEPARATOR}{digest}"


def warm_state_name(cluster: str) -> str:
    """The keep-warm state ConfigMap of a RayCluster: ``<cluster>-raygpu-warm`` (a DNS label, hashed when
    the cluster name does not fit). Deterministic; different clusters give different names."""
    plain = cluster + WARM_STATE_SUFFIX
    if _clean(cluster) == cluster and cluster and len(plain) <= 63:
        return plain
    return _hashed(f"{_clean(cluster)}{WARM_STATE_SUFFIX}", cluster, "warm")


def reservation_group_name(request_name: str) -> str:
    """The worker group of a reservation (also the value of :data:`LABEL_RESERVATION`): ``rg-<name>``.

    Promises: a DNS label of <= 63 chars (worker group names are label values and
    pod name prefixes); the same name gives the same group; different request names
    give different groups. ``rg-<name>`` exactly when ``<name>`` is already a DNS
    label without ``--`` that fits; otherwise ``rg-<cleaned, cut>--<8 hex>`` where
    the hex is a SHA-256 of the name. A plain name never contains ``--`` and a
    hashed one always does, so the two forms cannot meet.
    """
    clean = _clean(request_name)
    plain = RESERVATION_GROUP_PREFIX + clean
    if clean and clean == request_name and len(plain) <= 63:
        return plain
    return _hashed(plain, request_name)


def gang_name(cluster: str, request_name: str) -> str:
    """The name of a reservation's state ConfigMap and gang object (PodGroup / Kueue pod group).

    Promises: a DNS label of <= 63 chars (the name is also a pod label value);
    the same (cluster, request name) gives the same name; different pairs give
    different names, so two clusters of one namespace never share one. The plain
    form is ``<cluster>-rg-<name>`` (``c-rg-job1``), used only when the cluster is
    a DNS label, the group ``rg-<name>`` is plain, it fits, and ``-rg-`` occurs in
    it exactly once, so that cluster and name can be read back from it (cluster
    ``a`` + request ``b-rg-c`` and cluster ``a-rg-b`` + request ``c`` would both
    read ``a-rg-b-rg-c``). Otherwise ``<cleaned, cut>--<8 hex>``, the hex a
    SHA-256 of both names.
    """
    group = reservation_group_name(request_name)
    plain = f"{cluster}-{group}"
    unambiguous = _occurrences(plain, _GANG_INFIX) == 1 and HASH_SEPARATOR not in group
    if _clean(cluster) == cluster and cluster and unambiguous and len(plain) <= 63:
        return plain
    return _hashed(f"{_clean(cluster)}{_GANG_INFIX}{_clean(request_name)}", cluster, request_name)


def _occurrences(text: str, part: str) -> int:
    """How often ``part`` occurs in ``text``, overlaps counted."""
    return sum(text.startswith(part, i) for i in range(len(text)))
