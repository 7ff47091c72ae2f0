"""Ray's view of the cluster, read straight from the GCS, without ``ray.init``.

A driver process can join only one Ray cluster, and the sidecar or the doctor
must be able to read any cluster, so nothing here connects a driver:

* nodes: ``ray.autoscaler.v2.sdk.get_cluster_status`` (the GCS autoscaler
  state: instance id, node type, RUNNING/IDLE/DEAD, total and available
  resources, idle duration, labels, IP);
* placement groups: ``GlobalStateAccessor.get_placement_group_table()`` parsed
  as ``PlacementGroupTableData`` protos, the only source that carries the
  per-bundle ``label_selector`` and the creator job id (the dicts of
  ``ray.util.placement_group_table()`` drop both, and need ``ray.init``);
* pending tasks and actors (``resource_demand``): the same cluster status's
  ``resource_demands.ray_task_actor_demand``, for the keep-warm policy;
* the job table (``read_job_liveness``): which driver jobs are alive, for the
  reservation garbage collector.

Promises: ``read_ray_view`` never raises and returns within about
``timeout_s``; an unreachable or silent GCS gives ``RayView(reachable=False,
reason=...)``. The PG table is the GCS's own record; node ``available``
is the raylets' last resource report to the GCS, so it trails placements by
up to a report period (about a second). The GCS clients block for up to ~40 s on a dead address and
release the GIL while they wait, so reads run in a daemon thread we stop
waiting for. Conversion functions take plain dicts (the dataclass / proto as
a dict) so that they can be tested on recordings.
"""

from __future__ import annotations

import base64
import dataclasses
import re
import socket
import threading
import time
from typing import Any

from raygpu.adapters.ray_extra import import_ray
from raygpu.model.views import PgState, PlacementGroupView, RayNodeView, RayView, ResourceDemand

HEAD_RESOURCE = "node:__internal_head__"  # how Ray's autoscaler v2 tells the head apart
ACCELERATOR_LABEL = "ray.io/accelerator-type"
ACCELERATOR_RESOURCE_PREFIX = "accelerator_type:"
# Resources Ray derives for placed bundles: GPU_group_<pg>, GPU_group_<i>_<pg>, bundle_group_<pg>.
_PG_RESOURCE = re.compile(r"_group_(\d+_)?[0-9a-f]{36}$")


def read_ray_view(address: str | None = None, timeout_s: float = 10, now_s: float | None = None) -> RayView:
    """Read nodes and the placement-group table of the Ray cluster whose GCS is at ``address``.

    ``address`` is ``host:port`` of the GCS; None means the cluster this process
    is connected to, else ``RAY_ADDRESS``, else the latest local cluster.
    ``now_s`` (default: the wall clock) turns idle durations into ``idle_since_s``.
    Never raises.
    """
    now_s = time.time() if now_s is None else now_s
    try:
        gcs = gcs_address(address)
    except Exception as e:  # noqa: BLE001 - any failure to find a cluster is "unreachable"
        return RayView(reachable=False, reason=f"no Ray GCS address: {e}")
    deadline = time.monotonic() + timeout_s
    try:
        _probe_tcp(gcs, min(timeout_s, 3.0))
    except OSError as e:
        return RayView(reachable=False, reason=f"cannot reach the Ray GCS at {gcs}: {e}")
    result: dict[str, Any] = {}

    def read() -> None:
        try:
            result["raw"] = _read_raw(gcs, max(1.0, deadline - time.monotonic()))
        except BaseException as e:  # noqa: BLE001 - reported as a value
            result["error"] = e

    reader = threading.Thread(target=read, name="raygpu-gcs-read", daemon=True)
    reader.start()
    reader.join(max(0.0, deadline - time.monotonic()))
    if reader.is_alive():
        return RayView(reachable=False, reason=f"the Ray GCS at {gcs} did not answer within {timeout_s:g}s")
    if "error" in result:
        e = result["error"]
        return RayView(reachable=False, reason=f"reading the Ray GCS at {gcs} failed: {type(e).__name__}: {e}")
    nodes, pgs, demand = result["raw"]
    try:
        return RayView(nodes=tuple(node_view(n, now_s) for n in nodes),
                       placement_groups=tuple(placement_group_view(p) for p in pgs),
                       resource_demand=demand_view(demand))
    except Exception as e:  # noqa: BLE001 - a reply we cannot parse is a Ray version problem, not a crash
        return RayView(reachable=False, reason=f"unexpected GCS reply from {gcs}: {type(e).__name__}: {e}")


def gcs_address(address: str | None) -> str:
    """``host:port`` of the GCS to read: ``address``, else the connected driver's
    cluster, else ``RAY_ADDRESS``, else the latest local cluster.

    Raises ValueError (malformed address), ConnectionError (none to be found) or MissingExtraError (Ray is not
    installed: the message names the extra).
    """
    ray = import_ray("reading Ray's GCS")
    from ray._private.services import canonicalize_bootstrap_address

    if address is None and ray.is_initialized():
        return ray.get_runtime_context().gcs_address
    gcs = canonicalize_bootstrap_address(address or "auto")
    if not gcs:
        raise ValueError("no address given, RAY_ADDRESS unset and no local cluster")
    return gcs


def _probe_tcp(gcs: str, timeout_s: float) -> None:
    """Fail fast (refused, no route) before the GCS client's 40 s reconnect loop."""
    host, _, port = gcs.rpartition(":")
    socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s).close()


def _read_raw(gcs: str, timeout_s: float) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]:
    from google.protobuf.json_format import MessageToDict
    from ray._raylet import GcsClientOptions, GlobalStateAccessor
    from ray.autoscaler.v2.sdk import get_cluster_status
    from ray.core.generated.gcs_pb2 import PlacementGroupTableData

    status = get_cluster_status(gcs, timeout=max(1, int(timeout_s)))
    nodes = [{**dataclasses.asdict(n), "node_activity": list(n.node_activity or [])}  # a proto container
             for n in (*status.active_nodes, *status.idle_nodes, *status.failed_nodes)]
    accessor = GlobalStateAccessor(GcsClientOptions.create(gcs, None, allow_cluster_id_nil=True,
                                                           fetch_cluster_id_if_nil=False))
    if not accessor.connect():
        raise ConnectionError("GlobalStateAccessor could not connect")
    pgs = [MessageToDict(PlacementGroupTableData.FromString(raw), preserving_proto_field_name=True)
           for raw in accessor.get_placement_group_table()]
    demand = [dataclasses.asdict(d) for d in status.resource_demands.ray_task_actor_demand]
    return nodes, pgs, demand


# ------------------------------------------------------------ conversions
def node_view(info: dict[str, Any], now_s: float) -> RayNodeView:
    """One ``ray.autoscaler.v2.schema.NodeInfo`` (as ``dataclasses.asdict``) -> RayNodeView.

    ``idle_since_s`` is ``now_s`` minus the GCS idle duration, only for IDLE nodes.
    ``is_head`` is Ray's own test (the ``node:__internal_head__`` resource), so a
    DEAD node, which reports no resources, is never the head.
    The per-bundle resources Ray derives for placed PGs (``GPU_group_<pg id>``)
    are dropped: the PG table says where bundles are.
    """
    node_id = info["node_id"]
    usage = info.get("resource_usage") or {}
    rows = [r for r in usage.get("usage") or [] if not _PG_RESOURCE.search(r["resource_name"])]
    total = {r["resource_name"]: float(r["total"]) for r in rows}
    available = {r["resource_name"]: float(r["total"]) - float(r["used"]) for r in rows}
    status = info.get("node_status") or "DEAD"
    node_type = info.get("ray_node_type_name") or None
    if node_type == f"node_{node_id}":  # the parser's stand-in when the raylet had no RAY_NODE_TYPE_NAME
        node_type = None
    labels = {str(k): str(v) for k, v in (info.get("labels") or {}).items()}
    accel = labels.get(ACCELERATOR_LABEL) or next(
        (k[len(ACCELERATOR_RESOURCE_PREFIX):] for k in total if k.startswith(ACCELERATOR_RESOURCE_PREFIX)), None)
    idle_ms = usage.get("idle_time_ms") or 0
    return RayNodeView(
        node_id=node_id, alive=status != "DEAD", is_head=HEAD_RESOURCE in total,
        instance_id=info.get("instance_id") or None, node_type=node_type, ip=info.get("ip_address") or None,
        labels=labels, total=total, available=available,
        idle_since_s=now_s - idle_ms / 1000.0 if status == "IDLE" else None, accelerator_type=accel,
        draining=status == "DRAINING")


def placement_group_view(pg: dict[str, Any]) -> PlacementGroupView:
    """One ``PlacementGroupTableData`` (as ``MessageToDict(preserving_proto_field_name=True)``) -> view.

    Proto defaults are absent from such dicts: state PENDING, strategy PACK,
    bundle index 0, an unplaced bundle has no ``node_id``. Ids are base64 there, hex here.
    """
    bundles = sorted(pg.get("bundles") or [], key=lambda b: int((b.get("bundle_id") or {}).get("bundle_index", 0)))
    creator = _hex(pg.get("creator_job_id"))
    return PlacementGroupView(
        pg_id=_hex(pg["placement_group_id"]) or "", name=pg.get("name", ""),
        state=PgState(pg.get("state", "PENDING")), strategy=pg.get("strategy", "PACK"),
        bundles=tuple({k: float(v) for k, v in (b.get("unit_resources") or {}).items()} for b in bundles),
        bundle_node_ids=tuple(_hex(b.get("node_id")) for b in bundles),
        bundle_label_selectors=tuple(dict(b.get("label_selector") or {}) for b in bundles),
        creator_job_id=creator, created_ms=_float(pg.get("placement_group_creation_timestamp_ms")))


def _float(raw: Any) -> float | None:
    """A proto int64 (a string in MessageToDict) or number -> float; None when absent or unreadable."""
    try:
        return float(raw) if raw not in (None, "") else None
    except (TypeError, ValueError):
        return None


def demand_view(demand: list[dict[str, Any]]) -> tuple[ResourceDemand, ...]:
    """``ResourceDemandSummary.ray_task_actor_demand`` (each ``dataclasses.asdict``) -> pending tasks and
    actors by shape. Placement-group demand is left out: the PG table says which bundles are unplaced."""
    return tuple(ResourceDemand(bundle={str(k): float(v) for k, v in (b.get("bundle") or {}).items()},
                                count=int(b.get("count") or 0))
                 for d in demand for b in d.get("bundles_by_count") or [] if int(b.get("count") or 0) > 0)


def _hex(b64: str | None) -> str | None:
    """A base64 proto id -> hex; None for empty or nil (all 0xff) ids."""
    raw = base64.b64decode(b64) if b64 else b""
    return raw.hex() if raw and raw != b"\xff" * len(raw) else None


# ------------------------------------------------------------------ job table
def read_job_liveness(gcs_address: str, timeout_s: float = 5.0) -> dict[str, bool] | None:
    """Ray's job table: Ray job id (hex) -> alive, for every job the GCS knows.

    None when it cannot be read in ``timeout_s``. No ``ray.init``; never raises.
    """
    result: dict[str, Any] = {}

    def read() -> None:
        try:
            from ray._raylet import GcsClientOptions, GlobalStateAccessor
            from ray.core.generated.gcs_pb2 import JobTableData
            accessor = GlobalStateAccessor(GcsClientOptions.create(gcs_address, None, allow_cluster_id_nil=True,
                                                                   fetch_cluster_id_if_nil=False))
            if not accessor.connect():
                raise ConnectionError("GlobalStateAccessor could not connect")
            try:
                rows = accessor.get_job_table(skip_submission_job_info_field=True, skip_is_running_tasks_field=True)
            finally:
                accessor.disconnect()
            jobs = {}
            for raw in rows:
                entry = JobTableData.FromString(raw)
                jobs[entry.job_id.hex()] = not entry.is_dead
            result["jobs"] = jobs
        except BaseException as e:  # noqa: BLE001 - reported as None
            result["error"] = e

    t = threading.Thread(target=read, name="raygpu-gcs-jobs", daemon=True)
    t.start()
    t.join(timeout_s)
    return result.get("jobs") if not t.is_alive() else None


# ------------------------------------------------------------------ drain
def drain_idle_node(gcs_address: str, node_id: str, message: str, timeout_s: float = 5.0) -> tuple[bool, str]:
    """Ask the GCS to drain Ray node ``node_id`` (hex) for idle termination, as Ray's autoscaler v2 does
    before it terminates an idle instance (``DrainNode``, reason ``DRAIN_NODE_REASON_IDLE_TERMINATION``,
    no deadline).

    Returns (accepted, why not). The raylet accepts only while the node is idle; once accepted, Ray
    places nothing new there and the raylet exits (Ray 2.60: within about a second; its pod's container
    then ends). Rejected ("no longer idle") when a task or actor landed since: the caller keeps the
    worker. Ray accepts a drain of a node already draining or gone. Any failure or no answer within
    ``timeout_s`` is (False, the reason). No ``ray.init``; never raises.
    """
    result: dict[str, Any] = {}

    def drain() -> None:
        try:
            from ray._raylet import GcsClient
            from ray.core.generated.autoscaler_pb2 import DrainNodeReason
            client = GcsClient(address=gcs_address)
            result["answer"] = client.drain_node(node_id, DrainNodeReason.Value("DRAIN_NODE_REASON_IDLE_TERMINATION"),
                                                 message, 0)
        except BaseException as e:  # noqa: BLE001 - reported as a value
            result["error"] = e

    t = threading.Thread(target=drain, name="raygpu-gcs-drain", daemon=True)
    t.start()
    t.join(timeout_s)
    if t.is_alive():
        return False, f"the Ray GCS at {gcs_address} did not answer the drain within {timeout_s:g}s"
    if "error" in result:
        e = result["error"]
        return False, f"drain failed: {type(e).__name__}: {e}"
    accepted, why = result["answer"]
    return bool(accepted), "" if accepted else (why or "rejected")
