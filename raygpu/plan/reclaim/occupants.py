"""Which pods stay on each Kubernetes node, and the order in which the reclaimer prefers to delete its candidates.

Helpers of ``plan.reclaim.plan_reclaim`` (pure, no I/O). A node's *occupants* are
the pods that will still be on it after the plan: bound to it, not deleting, not
Succeeded or Failed, not on their way out (in ``workersToDelete``). The
candidates (idle workers the reclaimer may delete) are ordered so that deleting
them frees whole nodes first: fewest pods that stay on their node, then fewest
fellow candidates there, then most idle, then name.
"""

from __future__ import annotations

from collections import defaultdict
from itertools import compress
from operator import attrgetter
from typing import Protocol

from raygpu.model.views import K8sPodView, RayNodeView
from raygpu.plan.reclaim.pending import Candidate

GONE_PHASES = ("Succeeded", "Failed")
_NODE_NAME = attrgetter("node_name")


class Worker(Protocol):
    """A candidate as the reclaimer holds it (``plan.reclaim._Worker``)."""

    name: str
    group: str
    node: RayNodeView | None
    idle_for_s: float | None
    node_name: str | None
    stays: bool  # counts among its node's occupants: on a node, not Succeeded or Failed


def occupants_of(pods: tuple[K8sPodView, ...], namespace: str, going_away: set[str],
                 workers: list[Worker]) -> dict[str, int]:
    """Kubernetes node name -> how many pods (of any cluster) will still be on it, for the nodes of ``workers``
    (the candidates: no other node is ever asked about; a node with none may be missing). Counts, not sets:
    one cycle at 10,000 nodes would keep 21,000 key tuples and 10,000 sets alive, enough to force a full
    garbage collection. ``going_away``: names in the cluster's ``namespace``."""
    wanted = {w.node_name for w in workers if w.node_name}
    out: dict[str, int] = defaultdict(int)
    if not wanted:
        return out
    for p in compress(pods,  # the pods on other nodes left out by a C loop
                       map(wanted.__contains__, map(_NODE_NAME, pods))):
        if not p.deleting and p.phase not in GONE_PHASES \
                and not (going_away and p.name in going_away and p.namespace == namespace):
            out[p.node_name] += 1
    return out


def count_others(occupants: dict[str, int], others: list[K8sPodView], namespace: str,
                 going_away: set[str]) -> None:
    """Add to ``occupants`` (``occupants_of``' counts, of the cluster's pods so far) the pods of ``others``
    (not of the cluster) that stay on their node."""
    for p in others:
        node = p.node_name
        if node and not p.deleting and p.phase not in GONE_PHASES \
                and not (going_away and p.name in going_away and p.namespace == namespace):
            occupants[node] = occupants.get(node, 0) + 1


def staying_on_node(workers: list[Worker]) -> dict[str, int]:
    """Kubernetes node name -> how many of ``workers`` are among its occupants (``occupants_of``)."""
    out: dict[str, int] = defaultdict(int)
    for w in workers:
        if w.stays:
            out[w.node_name] += 1
    return out


def defrag_keys(workers: list[Worker], occupants: dict[str, int]) -> list[tuple]:
    """Per worker of ``workers`` (the candidates), its sort key: fewest pods that stay on its node, fewest
    fellow candidates, most idle, name.

    Of the other occupants of a worker's node, those that are not among ``workers`` stay and the rest are
    its fellow candidates."""
    mine: dict[str, int] = defaultdict(int)  # Kubernetes node name -> how many of ``workers`` are occupants
    for w in workers:
        if w.stays:
            mine[w.node_name] += 1
    out = []
    for w in workers:
        node = w.node_name
        if not node:
            out.append((1, 0, -(w.idle_for_s or 0.0), w.name))  # unknown node: never "frees" one
        else:
            fellows = mine.get(node, 0)
            out.append((occupants.get(node, 0) - fellows, fellows - w.stays, -(w.idle_for_s or 0.0), w.name))
    return out


def candidate_ranks(candidates: list[Worker], occupants: dict[str, int]) -> dict[str, Candidate]:
    """By Ray node id, ranked least wanted deletion first: shares its node with most staying pods, then
    with most fellow candidates, then least idle, then node id (``defrag_keys`` turned around, its first two
    negated, written out: one flat tuple per candidate)."""
    mine = staying_on_node(candidates)
    out = {}
    for w in candidates:
        nid, node = w.node.node_id, w.node_name
        if not node:
            rank = (-1, 0, w.idle_for_s or 0.0, nid)
        else:
            fellows = mine.get(node, 0)
            rank = (fellows - occupants.get(node, 0), w.stays - fellows, w.idle_for_s or 0.0, nid)
        out[nid] = Candidate(nid, w.name, w.group, rank)
    return out
