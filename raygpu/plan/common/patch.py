"""JSON patches (RFC 6902) for a RayCluster that fail instead of overwriting.

Every patch starts with a ``test`` on ``/metadata/resourceVersion``: if the
object changed since it was read, the API server rejects the whole patch
(HTTP 422), the adapter raises ConflictError, and the caller re-plans from a
fresh snapshot. Ops that address a worker group by index can also test its
``groupName`` so a patch written for one group never lands on another.
Pure data: nothing here talks to the API server.
"""

from __future__ import annotations

from typing import Any

from raygpu.errors import PermanentError

_GROUPS = "/spec/workerGroupSpecs"


def raycluster_patch(resource_version: str, ops: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``[test resourceVersion == resource_version] + ops``, for ``application/json-patch+json``.

    Raises PermanentError when ``resource_version`` is empty (no concurrency
    check possible) or ``ops`` is empty (a patch that changes nothing is a bug).
    """
    if not resource_version:
        raise PermanentError("a RayCluster patch needs the resourceVersion it was planned from")
    if not ops:
        raise PermanentError("a RayCluster patch needs at least one op")
    return [{"op": "test", "path": "/metadata/resourceVersion", "value": resource_version}, *ops]


def _index(index: int) -> int:
    if isinstance(index, bool) or not isinstance(index, int) or index < 0:
        raise PermanentError(f"worker group index must be an int >= 0, got {index!r}")
    return index


def guard_group_name(index: int, group_name: str) -> list[dict[str, Any]]:
    """A ``test`` that worker group ``index`` is still ``group_name``."""
    return [{"op": "test", "path": f"{_GROUPS}/{_index(index)}/groupName", "value": group_name}]


def add_worker_group(group_spec: dict[str, Any]) -> list[dict[str, Any]]:
    """Append ``group_spec`` to ``spec.workerGroupSpecs`` (the list must exist)."""
    if not group_spec.get("groupName"):
        raise PermanentError("a worker group spec needs a groupName")
    return [{"op": "add", "path": f"{_GROUPS}/-", "value": group_spec}]


def remove_worker_group(index: int, group_name: str) -> list[dict[str, Any]]:
    """Remove worker group ``index`` after testing it is ``group_name`` (a reorder is caught)."""
    return [*guard_group_name(index, group_name), {"op": "remove", "path": f"{_GROUPS}/{_index(index)}"}]


def set_replicas(index: int, replicas: int, group_name: str | None = None) -> list[dict[str, Any]]:
    """Set ``replicas`` of worker group ``index``; with ``group_name``, test it first."""
    if isinstance(replicas, bool) or not isinstance(replicas, int) or replicas < 0:
        raise PermanentError(f"replicas must be an int >= 0, got {replicas!r}")
    guard = guard_group_name(index, group_name) if group_name is not None else []
    return [*guard, {"op": "add", "path": f"{_GROUPS}/{_index(index)}/replicas", "value": replicas}]


def set_workers_to_delete(index: int, pod_names: list[str], group_name: str | None = None) -> list[dict[str, Any]]:
    """Set ``scaleStrategy.workersToDelete`` of worker group ``index`` to ``pod_names``.

    Writes the whole ``scaleStrategy`` object (``add`` creates or replaces it),
    so it works whether or not the group had one; with ``group_name``, tests it first.
    """
    if isinstance(pod_names, str) or not all(isinstance(p, str) and p for p in pod_names):
        raise PermanentError(f"workersToDelete must be a list of pod names, got {pod_names!r}")
    guard = guard_group_name(index, group_name) if group_name is not None else []
    value = {"workersToDelete": list(pod_names)}
    return [*guard, {"op": "add", "path": f"{_GROUPS}/{_index(index)}/scaleStrategy", "value": value}]
