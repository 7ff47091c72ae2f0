"""Pod shapes chosen for admission: among the least wasteful shapes, the one the cluster can bind now.

``plan_gang`` proposes, per fitting template, the pod shapes its strategy allows
(:func:`shape_options`) and ranks them with :func:`admission_key`:

1. only shapes as little wasteful as the least-waste choice are considered:
   whole GPUs before MIG slices, the fewest idle Ray GPUs, and no more idle
   of any other Ray resource (CPU, memory, custom) than that choice, so
   admission never buys a shape that idles more of anything;
2. among those, a shape whose pods all fit the free fragments of the nodes
   *now* (:func:`admission_fit`); of those, the one that breaks the fewest
   untouched nodes (kept for gangs of whole-node pods), then fewest pods;
3. when none binds now (or the free capacity is not known), the smallest pods:
   one pod per bundle rather than merged pods that each need a whole free
   node, which single-GPU pods of other tenants may never leave free.

STRICT_PACK stays one pod (its only shape); SPREAD/STRICT_SPREAD stay one
bundle per pod; PACK's shapes are first-fit-decreasing (fewest pods) and one
pod per bundle. Pure: no I/O, no clock.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from raygpu.model.gang import Bundle, NodeFree, Strategy
from raygpu.model.views import K8sNodeView, K8sPodView

_EPS = 1e-9
_DONE_PHASES = ("Succeeded", "Failed")


@dataclass(frozen=True)
class AdmissionFit:
    """How ``pods`` copies of one pod fit the free nodes: ``binds_now`` None when nothing is known."""

    binds_now: bool | None
    untouched_nodes_used: int = 0  # nodes with every resource free that the pods must break into
    fitting_now: int = 0  # pods of the shape the free fragments hold (<= pods)


def shape_options(bundles: tuple[Bundle, ...], strategy: Strategy,
                  pack: Callable[[], list[int]]) -> list[list[int]]:
    """The bundle -> pod assignments ``strategy`` allows on one template; ``pack()`` is its usual packing.

    PACK adds one pod per bundle when the packing merged bundles; every other
    strategy has exactly one shape.
    """
    packed = pack()
    options = [packed]
    if strategy is Strategy.PACK and max(packed) + 1 < len(bundles):
        options.append(list(range(len(bundles))))
    return options


def _slots(need: dict[str, float], free: dict[str, float]) -> int:
    """How many pods asking ``need`` fit ``free``."""
    counts = [math.floor((max(free.get(r, 0.0), 0.0) + _EPS) / v) for r, v in need.items() if v > 0]
    return min(counts) if counts else 1 << 30


def _untouched(node: NodeFree) -> bool:
    return bool(node.allocatable) and all(node.free.get(r, 0.0) + _EPS >= v for r, v in node.allocatable.items())


def admission_fit(pod_requests: dict[str, float], pods: int, free: Sequence[NodeFree] | None) -> AdmissionFit:
    """Whether ``pods`` pods asking ``pod_requests`` (Kubernetes names) all fit ``free`` now.

    Pods go to fragments (nodes already in use) first, then to the untouched
    nodes holding the most of them, so ``untouched_nodes_used`` is the fewest
    untouched nodes any placement must break. ``free=None``: unknown
    (``binds_now`` None). Counting ignores which node kube-scheduler would
    actually pick: it says a placement exists, not that it will be found.
    """
    if free is None:
        return AdmissionFit(binds_now=None)
    in_fragments, whole = 0, []
    for node in free:
        n = _slots(pod_requests, node.free)
        if n <= 0:
            continue
        if _untouched(node):
            whole.append((n, node.count))
        else:
            in_fragments += n * node.count
    left = max(pods - in_fragments, 0)
    broken = 0
    for n, count in sorted(whole, reverse=True):
        if left <= 0:
            break
        take = min(count, -(-left // n))
        broken += take
        left -= take * n
    fitting = pods - max(left, 0)
    return AdmissionFit(binds_now=left <= 0, untouched_nodes_used=broken if left <= 0 else 0, fitting_now=fitting)


@dataclass(frozen=True)
class ShapeOption:
    """One candidate shape: ``waste_key`` is the least-waste order (mig rank, idle GPUs, pods, ...)."""

    waste_key: tuple[Any, ...]
    idle: dict[str, float]  # idle Ray resources over the whole gang, absolute
    pods: int
    fit: AdmissionFit
    payload: Any = None  # the caller's (template, assignment)


def rank_options(options: Sequence[ShapeOption]) -> list[ShapeOption]:
    """Best first: the shapes no more wasteful than the least-waste one by :func:`admission_key`, then the rest."""
    base = min(options, key=lambda o: o.waste_key)

    def no_worse(o: ShapeOption) -> bool:
        return o.waste_key[:2] == base.waste_key[:2] and all(
            v <= base.idle.get(r, 0.0) + _EPS * max(1.0, abs(base.idle.get(r, 0.0))) for r, v in o.idle.items())

    flags = [no_worse(o) for o in options]
    ok = sorted((o for o, good in zip(options, flags) if good), key=lambda o: (admission_key(o.fit, o.pods), o.waste_key))
    return ok + sorted((o for o, good in zip(options, flags) if not good), key=lambda o: o.waste_key)


def admission_key(fit: AdmissionFit, pods: int) -> tuple[int, int, int]:
    """Sort key among shapes of equal waste: binds now (fewest untouched nodes, fewest pods), else most pods."""
    if fit.binds_now:
        return (0, fit.untouched_nodes_used, pods)
    return (1, 0, -pods)


def describe_fit(fit: AdmissionFit, pods: int) -> str:
    """A phrase for the plan's reason."""
    if fit.binds_now is None:
        return "free capacity not given: smallest pods (one per bundle where waste allows), which fit more fragments"
    if fit.binds_now:
        broken = (f"breaking {fit.untouched_nodes_used} untouched node(s)" if fit.untouched_nodes_used
                  else "in existing fragments")
        return f"all {pods} pod(s) fit the free nodes now, {broken}"
    return (f"only {fit.fitting_now} of {pods} pod(s) fit the free nodes now: smallest pods, "
            "which fit more fragments as GPUs free up")


def free_nodes(nodes: Sequence[K8sNodeView], pods: Sequence[K8sPodView]) -> tuple[NodeFree, ...]:
    """Free capacity per schedulable node: allocatable minus the requests of the pods bound there.

    Nodes that are not ready or are cordoned are left out; pods that ended
    (Succeeded/Failed) hold nothing; a pod being deleted still holds its
    requests until it is gone, as the scheduler counts it. Identical nodes are
    not merged (names are kept for messages).
    """
    used: dict[str, dict[str, float]] = {}
    for p in pods:
        if p.node_name is None or p.phase in _DONE_PHASES:
            continue
        acc = used.setdefault(p.node_name, {})
        for r, v in p.requests.items():
            acc[r] = acc.get(r, 0.0) + v
    out = []
    for n in nodes:
        if not n.ready or n.unschedulable:
            continue
        taken = used.get(n.name, {})
        out.append(NodeFree(name=n.name, allocatable=dict(n.allocatable),
                            free={r: v - taken.get(r, 0.0) for r, v in n.allocatable.items()}))
    return tuple(out)
