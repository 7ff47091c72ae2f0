"""A gang's topology constraint: every reserved pod on nodes that share one value of a node label.

Ray spells it ``topology_strategy`` on ``ray.util.placement_group`` (Ray 2.60): a dict of label key ->
strategy, mutually exclusive with ``strategy``, holding ``ray.io/node-id`` (the node-level strategy,
the same as ``strategy=``) and at most one other key, whose value must be ``STRICT_PACK``
(``ray/util/placement_group.py::_validate_topology_strategy``). :func:`parse_topology_strategy` reads
that dict the same way, with two differences (docs/decisions.md):

- the key is a **Kubernetes node label**: raygpu enforces the constraint where pods are placed, and the
  Ray PG is then pinned to exactly those pods, so Ray's own constraint holds by construction. Ray's
  ``ray.io/availability-zone`` / ``ray.io/availability-region`` node labels (which Ray fills from
  ``RAY_NODE_ZONE`` / ``RAY_NODE_REGION``) are read as ``topology.kubernetes.io/zone`` / ``/region``;
  any other ``ray.io/*`` key has no Kubernetes node label raygpu could know, so it is refused.
- ``PACK`` on the topology key is accepted and means *preferred* (as ``PACK`` is Ray's best-effort
  ``STRICT_PACK`` at node level); Ray itself refuses it for now.

Pure data and validation: no I/O. Bad input raises :class:`~raygpu.errors.PermanentError`.
"""

from __future__ import annotations

import re
from typing import Any, Mapping

from raygpu.errors import PermanentError
from raygpu.model.base import Frozen
from raygpu.model.labels import LABEL_VALUE

NODE_ID_KEY = "ray.io/node-id"  # Ray's NODE_ID_LABEL_KEY: the node-level strategy, same as strategy=
# Ray node labels whose Kubernetes node label is known (Ray reads them from env vars the pod spec sets)
RAY_TO_NODE_LABEL = {"ray.io/availability-zone": "topology.kubernetes.io/zone",
                     "ray.io/availability-region": "topology.kubernetes.io/region"}
_STRATEGIES = ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD")
_PREFIX = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


class Topology(Frozen):
    """All of the gang's pods on nodes with the same value of node label ``key``.

    ``required``: a hard constraint (the gang waits, then rolls back, rather than spread out);
    otherwise a preference the scheduler may give up. ``ray_key``: the key as the caller wrote it
    (``ray.io/availability-zone``), for messages.
    """

    key: str
    required: bool = True
    ray_key: str = ""

    def describe(self) -> str:
        how = "required" if self.required else "preferred"
        alias = f" (Ray's {self.ray_key})" if self.ray_key and self.ray_key != self.key else ""
        return f"{how}: all pods on nodes sharing one value of node label {self.key}{alias}"


def check_label_key(key: Any) -> str:
    """``key`` if it is a Kubernetes label key (``[prefix/]name``), else PermanentError saying why."""
    if not isinstance(key, str) or not key:
        raise PermanentError(f"a topology key must be a node label key (a non-empty string), got {key!r}")
    prefix, _, name = key.rpartition("/")
    if not LABEL_VALUE.fullmatch(name) or (prefix and (len(prefix) > 253 or not _PREFIX.fullmatch(prefix))) or \
            key.startswith("/"):
        raise PermanentError(f"topology key {key!r} is not a Kubernetes label key ([DNS subdomain/]name, the name "
                             "<= 63 of [A-Za-z0-9-_.], alphanumeric at both ends)")
    return key


def parse_topology_strategy(value: Any, strategy: str | None) -> tuple[str, Topology | None]:
    """Ray's ``topology_strategy`` (with ``strategy``) -> (the node-level strategy, the topology constraint).

    ``value`` None: ``(strategy or "PACK", None)``. Otherwise, as Ray does: ``strategy`` must be None
    (the node-level strategy goes in ``value["ray.io/node-id"]``, default ``PACK``); at most one other
    key, ``STRICT_PACK`` (required) or ``PACK`` (preferred). Raises PermanentError for anything else.
    """
    if value is None:
        return strategy or "PACK", None
    if not isinstance(value, Mapping):
        raise PermanentError(f"topology_strategy must be a dict of label key -> strategy, got {type(value).__name__}")
    if strategy is not None:
        raise PermanentError(f"strategy and topology_strategy cannot both be given (as in Ray): put the node-level "
                             f"strategy in topology_strategy[{NODE_ID_KEY!r}]")
    node_level, topology = "PACK", None
    for key, how in value.items():
        if not isinstance(how, str) or how.upper() not in _STRATEGIES:
            raise PermanentError(f"topology_strategy[{key!r}] = {how!r}; expected one of: {', '.join(_STRATEGIES)}")
        how = how.upper()
        if key == NODE_ID_KEY:
            node_level = how
            continue
        if topology is not None:
            raise PermanentError(f"topology_strategy has more than one topology key ({topology.ray_key!r}, {key!r}); "
                                 "Ray and every gang backend take one")
        if how not in ("STRICT_PACK", "PACK"):
            raise PermanentError(f"topology_strategy[{key!r}] = {how!r}; a topology key takes STRICT_PACK (required) "
                                 "or PACK (preferred): pods cannot be spread over domains")
        node_key = RAY_TO_NODE_LABEL.get(key, key)
        if isinstance(node_key, str) and node_key.startswith("ray.io/"):
            raise PermanentError(f"topology key {key!r} is a Ray node label with no Kubernetes node label raygpu "
                                 f"knows (known: {', '.join(sorted(RAY_TO_NODE_LABEL))}); raygpu places pods, so name "
                                 "the node label itself, e.g. topology.kubernetes.io/zone or nvidia.com/gpu.clique")
        topology = Topology(key=check_label_key(node_key), required=how == "STRICT_PACK", ray_key=key)
    return node_level, topology
