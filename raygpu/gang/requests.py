"""Requests and read-only views of reservations: build a GangRequest, plan one as a dry run, list and load
state ConfigMaps. Nothing here writes (``reservation.reserve`` does)."""

from __future__ import annotations

import uuid

from raygpu.adapters.kube import KubeAdapter
from raygpu.gang.free import free_now
from raygpu.model.gang import GangPlan, GangRequest
from raygpu.model.topology import parse_topology_strategy
from raygpu.model.labels import LABEL_CLUSTER, LABEL_RESERVATION, dns_label
from raygpu.plan.gang.reservation import plan_gang


def gang_request(bundles, strategy, cluster, namespace, backend, timeout_s, name, queue, owner_job=None,
                 guard=None, expected_runtime_s=None, topology_strategy=None, scheduler_name=None) -> GangRequest:
    """The GangRequest of a ``placement_group`` call; ``strategy``/``topology_strategy`` as Ray takes them
    (model/topology.py: one or the other; neither: PACK). Raises PermanentError for bad input."""
    strategy, topology = parse_topology_strategy(topology_strategy, strategy)
    return GangRequest(name=name or f"pg-{uuid.uuid4().hex[:8]}", cluster=cluster, namespace=namespace,
                       bundles=bundles, strategy=strategy, backend=backend, timeout_s=timeout_s, queue=queue,
                       owner_job=owner_job, guard=guard, expected_runtime_s=expected_runtime_s, topology=topology,
                       scheduler_name=scheduler_name)


def plan_placement_group(bundles: list[dict[str, float]], strategy: str | None = None, *, cluster: str,
                         namespace: str = "default", backend: str | None = None, timeout_s: float = 600,
                         name: str | None = None, queue: str | None = None,
                         kubeconfig: str | None = None, topology_strategy: dict | None = None,
                         request_timeout_s: float | None = None, scheduler_name: str | None = None) -> GangPlan:
    """Dry run: read the RayCluster and return the plan. Creates nothing, writes nothing.

    ``scheduler_name`` (backend coscheduling): the schedulerName the pods would ask for (default: the
    RayCluster's ``raygpu.io/gang-scheduler-name``, else ``scheduler-plugins-scheduler``).

    ``request_timeout_s``: the first contact's deadline (``KubeAdapter``: default
    ``$RAYGPU_REQUEST_TIMEOUT_S``, else 15 s). Raises InfeasibleError (which bundle, which resource, which
    limit), PermanentError (bad input, unknown cluster or backend) or TransientError (no answer in time).
    """
    req = gang_request(bundles, strategy, cluster, namespace, backend, timeout_s, name or "dry-run", queue,
                       topology_strategy=topology_strategy, scheduler_name=scheduler_name)
    kube = KubeAdapter(kubeconfig, first_contact_timeout_s=request_timeout_s)
    view = kube.get_raycluster(namespace, cluster)
    return plan_gang(req, view, free=free_now(kube, view, lambda _: None)[0])  # the plan reserve() would make


def load_plan(cm: dict) -> GangPlan:
    return GangPlan.model_validate_json((cm.get("data") or {})["plan.json"])


def list_reservations(kube: KubeAdapter, namespace: str | None, cluster: str | None = None) -> list[dict]:
    """State ConfigMaps of reservations (raw dicts: the caller reads their annotations)."""
    sel = LABEL_RESERVATION + (f",{LABEL_CLUSTER}={dns_label(cluster)}" if cluster else "")
    return kube.list("v1", "ConfigMap", namespace, sel)
