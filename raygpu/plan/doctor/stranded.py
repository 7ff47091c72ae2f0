"""Stranded-GPU arithmetic: GPUs allocatable on a node that no pending work can use.

Three causes, per Kubernetes node and per GPU resource name:

(a) the integer model: Kubernetes hands out whole GPUs, Ray packs fractional
    tasks onto them; the unused rest of a partly used GPU serves no whole-GPU
    task (``integer_model_gpus``, from Ray's total - available);
(c) fragments: fewer GPUs free on the node than the smallest pending request
    for that resource (``fragment_gpus``); checked first, as the GPU count
    alone rules the node out;
(b) CPU or memory exhaustion: enough GPUs are free for some worker shape that
    asks for that resource, but no such shape fits the node's free CPU or
    memory (``cpu_memory_gpus``).

Free = allocatable - what the pods bound to the node request. Only pods in
the snapshot count: an adapter that lists only Ray pods makes free CPU and
GPUs look larger than they are on shared nodes.

Worker shapes come from ``templates`` (``GroupTemplate`` of the RayCluster)
when given, else from the Ray worker pods in the snapshot, one per group.
Pending requests are the Pending, unbound pods' GPU requests and, when
``include_pending_pgs``, the GPU of each bundle of a PENDING placement group
(as ``nvidia.com/gpu``, rounded up to whole GPUs).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from itertools import chain, compress, repeat
from operator import attrgetter, is_, sub

from raygpu.model.findings import NodeStranded, StrandedReport
from raygpu.model.raycluster import GroupTemplate
from raygpu.model.shapes import WHOLE_GPU
from raygpu.model.views import PgState, Snapshot
from raygpu.plan.doctor.checks_index import NodeTally, SnapshotIndex
from raygpu.plan.doctor.facts import EPS, fmt, gpu_resources

_STATE, _BUNDLES = attrgetter("state"), attrgetter("bundles")


@dataclass(frozen=True)
class _Shape:
    """What one worker pod needs from a node: CPU cores, memory bytes, GPU units by resource."""

    name: str
    cpu: float
    memory: float
    gpus: dict[str, float]


def _template_shapes(templates: Iterable[GroupTemplate]) -> list[_Shape]:
    out = []
    for t in templates:
        if t.is_head:
            continue
        req = {**t.limits, **t.requests}  # requests default to limits in Kubernetes
        gpus = gpu_resources(t.limits) or gpu_resources(t.requests)
        out.append(_Shape(t.group_name, req.get("cpu", 0.0), req.get("memory", 0.0), dict(gpus)))
    return out


def _pod_shapes(ix: SnapshotIndex) -> list[_Shape]:
    """One shape per Ray worker group, from its first pod in the snapshot."""
    by_group: dict[str, _Shape] = {}
    # first pod per (cluster, group) from the index, then per key string: the first pod per key string
    for (cluster, group), pod in ix.first_worker_of_group.items():
        key = f"{cluster}/{group}"
        if key not in by_group:
            req = {**pod.limits, **pod.requests}
            by_group[key] = _Shape(key, req.get("cpu", 0.0), req.get("memory", 0.0), ix.pod_gpus(pod))
    return list(by_group.values())


def pending_gpu_requests(ix: SnapshotIndex, include_pending_pgs: bool = True) -> dict[str, float]:
    """The smallest pending GPU request, per GPU resource name."""
    smallest: dict[str, float] = {}

    def add(resource: str, count: float) -> None:
        if count > 0:
            smallest[resource] = min(smallest.get(resource, math.inf), count)

    for pod in ix.pending_gpu_pods:
        for resource, count in ix.pod_gpus(pod).items():
            add(resource, count)
    if include_pending_pgs:  # every bundle of a pending PG, in C (a backlog is thousands): the first least count
        pgs = ix.snapshot.ray.placement_groups
        pending = compress(pgs, map(is_, map(_STATE, pgs), repeat(PgState.PENDING)))
        gpus = map(dict.get, chain.from_iterable(map(_BUNDLES, pending)), repeat("GPU"), repeat(0.0))
        counts = list(filter((0).__lt__, map(math.ceil, map(sub, gpus, repeat(EPS)))))  # ints: count > 0
        if counts:
            add(WHOLE_GPU.resource, min(counts))  # as each added in turn: min keeps the first of equals
    return smallest


def stranded_gpus(
    snapshot: Snapshot,
    *,
    templates: Iterable[GroupTemplate] = (),
    include_pending_pgs: bool = True,
    index: SnapshotIndex | None = None,
) -> StrandedReport:
    """Per-node and cluster-wide stranded GPUs of ``snapshot``. Pure; never raises on odd data.

    ``index``: ``SnapshotIndex.build(snapshot)`` when the caller has it already (reconcile does).
    """
    ix = index or SnapshotIndex.build(snapshot)
    shapes = _template_shapes(templates) or _pod_shapes(ix)
    smallest = pending_gpu_requests(ix, include_pending_pgs)
    tallies = ix.tallies
    rows = []
    for name in ix.sorted_node_names():
        tally = tallies[name]
        alloc = tally.allocatable_gpus
        if not alloc:
            continue
        if len(alloc) == 1 and not tally.leftovers:
            ((resource, count),) = alloc.items()
            used = tally.used_gpus.get(resource, 0.0)
            if not count - used > 0:  # the usual busy node: no GPU free, nothing stranded (_node_row's numbers)
                rows.append((name, tally.allocatable_units, 0.0 + used, 0.0, round(tally.integer_model_gpus, 6), 0.0, 0.0,
                             tally.allocatable_cpu - tally.used_cpu, tally.allocatable_memory - tally.used_memory, ()))
                continue
        rows.append(_node_row(name, tally, shapes, smallest))
    nodes = NodeStranded.typed_many(rows)
    return StrandedReport(
        nodes=nodes,
        smallest_pending_gpus=smallest,
        allocatable_gpus=sum([r[1] for r in rows]),
        free_gpus=sum([r[3] for r in rows]),
        integer_model_gpus=round(sum([r[4] for r in rows]), 6),
        cpu_memory_gpus=sum([r[5] for r in rows]),
        fragment_gpus=sum([r[6] for r in rows]),
    )


def _node_row(name: str, tally: NodeTally, shapes: list[_Shape], smallest: dict[str, float]) -> tuple:
    """The stranded arithmetic of node ``name`` (with allocatable GPUs), from what the index added up there:
    the field values of its ``NodeStranded`` in field order (``NodeStranded.typed_many``), each of its type."""
    alloc, used_gpu = tally.allocatable_gpus, tally.used_gpus
    free_cpu = tally.allocatable_cpu - tally.used_cpu
    free_mem = tally.allocatable_memory - tally.used_memory
    free_total = cpu_mem = frag = 0.0
    reasons: list[str] = []
    for resource, count in sorted(alloc.items()) if len(alloc) > 1 else alloc.items():
        free = max(0.0, count - used_gpu.get(resource, 0.0))
        free_total += free
        if free <= 0:
            continue
        if resource in smallest and free < smallest[resource] - EPS:
            frag += free
            reasons.append(f"{fmt(free)} {resource} free, smallest pending request is {fmt(smallest[resource])}")
            continue
        # shapes that could use these GPUs (their GPU count fits what is free), judged on CPU and memory
        fitting = [s for s in shapes if 0 < s.gpus.get(resource, 0.0) <= free + EPS]
        if fitting and not any(s.cpu <= free_cpu + EPS and s.memory <= free_mem + EPS for s in fitting):
            short = []
            if all(s.cpu > free_cpu + EPS for s in fitting):
                short.append(f"cpu (free {fmt(max(free_cpu, 0.0))})")
            if all(s.memory > free_mem + EPS for s in fitting):
                short.append(f"memory (free {max(free_mem, 0.0) / 2**30:.1f} GiB)")
            cpu_mem += free
            reasons.append(
                f"{fmt(free)} {resource} free but no worker shape fits the free "
                f"{' and '.join(short) or 'cpu + memory together'}"
            )
    for rn, rest in tally.leftovers:
        reasons.append(f"Ray node {rn.node_id}: {fmt(round(rest, 6))} GPU left over by fractional tasks")
    return (name, tally.allocatable_units, sum([used_gpu.get(r, 0.0) for r in alloc]), free_total,
            round(tally.integer_model_gpus, 6), cpu_mem, frag, free_cpu, free_mem, tuple(reasons))
