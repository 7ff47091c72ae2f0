"""Plan one gang reservation: which worker group to copy, how many pods, which bundle on which pod.

``plan_gang`` is pure: no I/O, no clock, no ray/kubernetes imports. Every
error is raised before anything is created: PermanentError for malformed
input, InfeasibleError (naming the bundle, resource, amount and the largest
template) for a request no worker group of the cluster can ever hold.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Union

from raygpu.errors import InfeasibleError, PermanentError
from raygpu.model.annotations import ClusterPolicy, parse_cluster_policy
from raygpu.model.gang import Backend, Bundle, GangPlan, GangRequest, NodeFree, PodNeed, Strategy
from raygpu.model.labels import gang_name, reservation_group_name
from raygpu.model.raycluster import GroupTemplate, RayClusterView
from raygpu.model.shapes import GpuKind
from raygpu.plan.gang.capacity import (GPU, describe_group, format_amount, format_ray_resources, pod_k8s_resources,
                                  template_capacity, template_gpu_shape)
from raygpu.plan.gang.pack import SMALL as _SMALL, FewPods as _FewPods, FirstFit as _FirstFit
from raygpu.plan.gang.shapes import ShapeOption, admission_fit, describe_fit, rank_options, shape_options

# plan_gang's ``free``: one tuple for every template, per worker group name, or None (not known)
FreeNow = Union[tuple[NodeFree, ...], Mapping[str, tuple[NodeFree, ...]], None]

_EPS = 1e-9
_KIND_WORDS = {GpuKind.WHOLE: "whole-GPU", GpuKind.MIG: "MIG", GpuKind.SHARE: "shared-GPU"}


@dataclass(frozen=True)
class _Candidate:
    group: GroupTemplate
    index: int
    cap: dict[str, float]
    gpu_kind: GpuKind | None | str = "?"  # computed once per template ("?": at construction), not per bundle
    # what the plan copies from the template, once per cluster by gang_templates (None: computed when chosen)
    shape: tuple | None = None  # template_gpu_shape(group)
    description: str | None = None  # describe_group(group)
    k8s: tuple[dict[str, float], dict[str, float]] | str | None = None  # pod_k8s_resources(group), or its error

    def __post_init__(self) -> None:
        if self.gpu_kind == "?":
            object.__setattr__(self, "gpu_kind", _kind_of(self.group))

    def emitted(self) -> tuple[tuple, str, tuple[dict[str, float], dict[str, float]]]:
        """(GPU shape and units, description, Kubernetes requests and limits) of a pod of this template;
        raises the PermanentError of a container quantity that does not parse."""
        k8s = self.k8s if self.k8s is not None else _k8s_of(self.group)
        if isinstance(k8s, str):
            raise PermanentError(k8s)
        return (self.shape if self.shape is not None else template_gpu_shape(self.group),
                self.description if self.description is not None else describe_group(self.group), k8s)

    def kind(self) -> GpuKind | None:
        return self.gpu_kind

    def k8s_requests(self) -> dict[str, float]:
        """What one pod of this template asks Kubernetes for; raises as ``pod_k8s_resources`` does."""
        k8s = self.k8s if self.k8s is not None else _k8s_of(self.group)
        if isinstance(k8s, str):
            raise PermanentError(k8s)
        return k8s[0]


@dataclass(frozen=True)
class GangTemplates:
    """The worker groups of one RayCluster as ``plan_gang`` weighs them, computed once per cluster.

    Pass it to every ``plan_gang`` of one cycle (``templates=``) so that each request does not parse the
    same templates again. A template whose spec did not parse is kept as its error: ``plan_gang`` raises
    it at the step where it would have found it.
    """

    cluster: RayClusterView
    candidates: tuple[_Candidate, ...]
    error: str | None = None
    policy: ClusterPolicy | None = None  # the cluster's annotations parsed (None: parsed by plan_gang)
    # plan_gang's choice per (gang-template, strategy, bundles, free) it planned on these templates: a cache
    # (the choice depends on nothing else), so that the many equal requests of a cycle choose once
    choices: dict[tuple, tuple] = field(default_factory=dict, compare=False, repr=False)


def gang_templates(cluster: RayClusterView) -> GangTemplates:
    """Every worker group of ``cluster`` with its Ray capacity and GPU kind, and the cluster's policy
    annotations parsed (pure; never raises)."""
    policy, _ = parse_cluster_policy(cluster.annotations)
    try:
        caps = [template_capacity(g) for g in cluster.worker_groups]
    except PermanentError as e:
        return GangTemplates(cluster, (), str(e), policy)
    return GangTemplates(cluster, tuple(
        _Candidate(g, i, cap, _kind_of(g), template_gpu_shape(g), describe_group(g), _k8s_of(g))
        for i, (g, cap) in enumerate(zip(cluster.worker_groups, caps))), None, policy)


def _k8s_of(group: GroupTemplate) -> tuple[dict[str, float], dict[str, float]] | str:
    """``pod_k8s_resources(group)``, or the message of the PermanentError it raises."""
    try:
        return pod_k8s_resources(group)
    except PermanentError as e:
        return str(e)


def _kind_of(group: GroupTemplate) -> GpuKind | None:
    shape, _ = template_gpu_shape(group)
    return shape.kind if shape is not None else None


def _misfit(amounts: dict[str, float], cap: dict[str, float]) -> str | None:
    """The first resource of ``amounts`` that ``cap`` cannot hold, or None when all fit."""
    return next((r for r, v in amounts.items() if v > cap.get(r, 0.0) + _EPS), None)


def _is_fractional(gpu: float) -> bool:
    return gpu > 0 and abs(gpu - round(gpu)) > _EPS


def _shape_ok(bundle: Bundle, c: _Candidate) -> bool:
    gpu = bundle.get(GPU)
    if gpu <= 0:
        return True
    return c.kind() is GpuKind.SHARE if _is_fractional(gpu) else c.kind() in (GpuKind.WHOLE, GpuKind.MIG)


def _fits(bundle: Bundle, c: _Candidate) -> bool:
    return _shape_ok(bundle, c) and _misfit(bundle.resources, c.cap) is None


def _largest(cands: list[_Candidate], resource: str) -> _Candidate | None:
    return max(cands, key=lambda c: (c.cap.get(resource, 0.0), -c.index), default=None)


def _why_not(i: int, bundle: Bundle, cands: list[_Candidate], prefix: str) -> InfeasibleError:
    """Explain why bundle ``i`` fits none of ``cands``."""
    gpu = bundle.get(GPU)
    if gpu > 0:
        fractional = _is_fractional(gpu)
        compatible = [c for c in cands if _shape_ok(bundle, c)]
        if not compatible:
            gpu_cands = [c for c in cands if c.kind() is not None]
            kinds = sorted({_KIND_WORDS[c.kind()] for c in gpu_cands})  # type: ignore[index]
            big = _largest(gpu_cands, GPU)
            have = (f"only {' and '.join(kinds)} templates (largest: {describe_group(big.group)})"
                    if big else "no GPU templates")
            need = ("fractional GPUs need a shared-GPU template (limits nvidia.com/gpu.shared and rayStartParams "
                    f"num-gpus); raygpu does not round GPU={gpu:g} to a whole GPU or a MIG slice" if fractional else
                    "whole GPUs need a template with nvidia.com/gpu or a MIG profile; a shared GPU is not "
                    "an isolated GPU and is never used for a whole-number GPU request")
            return InfeasibleError(f"{prefix}bundle {i} asks GPU={gpu:g}; this cluster has {have}; {need}",
                                   bundle_index=i, resource=GPU, requested=gpu, limit=0.0,
                                   template=big.group.group_name if big else None)
        cands, scope = compatible, ("shared-GPU " if fractional else "whole-GPU/MIG ")
    else:
        scope = ""
    for resource, amount in bundle.resources.items():
        big = _largest(cands, resource)
        best = big.cap.get(resource, 0.0) if big else 0.0
        if amount > best + _EPS:
            have = (f"the largest {scope}template has {resource}={format_amount(resource, best)}: "
                    f"{describe_group(big.group)}"
                    if big and best > 0 else f"no worker group offers Ray resource {resource!r}")
            return InfeasibleError(
                f"{prefix}bundle {i} asks {resource}={format_amount(resource, amount)}; {have}; "
                "a bundle must fit on one pod: split it or add a bigger worker group",
                bundle_index=i, resource=resource, requested=amount, limit=best,
                template=big.group.group_name if big and best > 0 else None)
    lacks = [(c, _misfit(bundle.resources, c.cap)) for c in cands]
    first_c, first_r = lacks[0]
    detail = "; ".join(f"group '{c.group.group_name}' has {r}={format_amount(r, c.cap.get(r, 0.0))}" for c, r in lacks)
    return InfeasibleError(
        f"{prefix}bundle {i} asks {format_ray_resources(bundle.resources)}; no single template holds all of it ({detail})",
        bundle_index=i, resource=first_r, requested=bundle.get(first_r or ""), limit=first_c.cap.get(first_r or "", 0.0),
        template=first_c.group.group_name)


def _pack(bundles: tuple[Bundle, ...], strategy: Strategy, c: _Candidate) -> list[int] | InfeasibleError:
    """Bundle -> pod index for ``strategy`` on pods of ``c`` (each bundle already fits one pod)."""
    if strategy in (Strategy.SPREAD, Strategy.STRICT_SPREAD):
        return list(range(len(bundles)))  # one bundle per pod: we own the pods, spreading is free
    if strategy is Strategy.STRICT_PACK:
        used: dict[str, float] = {}
        for i, b in enumerate(bundles):
            for r, v in b.resources.items():
                used[r] = used.get(r, 0.0) + v
            r = _misfit(used, c.cap)
            if r is not None:
                total = sum(x.get(r) for x in bundles)
                return InfeasibleError(
                    f"STRICT_PACK puts all {len(bundles)} bundles on one pod: together they ask "
                    f"{r}={format_amount(r, total)} (exceeded at bundle {i}); {describe_group(c.group)} holds "
                    f"{r}={format_amount(r, c.cap.get(r, 0.0))}",
                    bundle_index=i, resource=r, requested=total, limit=c.cap.get(r, 0.0), template=c.group.group_name)
        return [0] * len(bundles)
    # PACK: first-fit-decreasing by dominant share of a pod, ties by bundle index (deterministic).
    first = bundles[0].resources
    if all(b.resources == first for b in bundles):
        order = range(len(bundles))  # equal bundles (the usual gang): equal shares, so by index
    else:
        order = sorted(range(len(bundles)), key=lambda i: (
            -max(v / c.cap[r] for r, v in bundles[i].resources.items()), i))
    pods = _FirstFit(c.cap, len(bundles)) if len(bundles) > _SMALL else _FewPods(c.cap)
    assign = [0] * len(bundles)
    for i in order:
        assign[i] = pods.place(bundles[i].resources)
    return assign


def _waste(asked: dict[str, float], c: _Candidate, pods: int) -> tuple[float, float]:
    """(idle Ray GPUs, idle fraction of other resources summed) over the whole gang; ``asked``: what the
    bundles ask per resource (``_asked``)."""
    def idle(r: str) -> float:
        return pods * c.cap.get(r, 0.0) - asked[r]
    other = sum(idle(r) / cap for r, cap in c.cap.items() if r != GPU)
    return idle(GPU), other


def _asked(bundles: tuple[Bundle, ...], resources) -> dict[str, float]:
    """Per resource, what the bundles ask in all (summed in bundle order, once per request)."""
    return {r: sum(b.get(r) for b in bundles) for r in resources}


def _free_of(free: FreeNow, c: _Candidate) -> tuple[NodeFree, ...] | None:
    return free.get(c.group.group_name) if isinstance(free, Mapping) else free


def _choose(request: GangRequest, cands: list[_Candidate], prefix: str, policy: ClusterPolicy,
            free: FreeNow) -> tuple[_Candidate, PodNeed, tuple[int, ...], list[str]]:
    """Steps 2-4 of ``plan_gang`` for ``request``'s bundles and strategy on ``cands``: (the template chosen,
    the pods it needs, bundle -> pod, the reason's parts). Depends on the request's strategy and bundles,
    ``policy.gang_template``, ``cands`` and ``free`` only (``GangTemplates.choices`` caches it by those);
    raises InfeasibleError or PermanentError as ``plan_gang`` documents."""
    bundles = request.bundles
    fit_rows: dict[tuple, list[bool]] = {}  # equal bundles (the usual gang) are checked once per template
    fit = []
    for b in bundles:
        key = tuple(b.resources.items())
        if key not in fit_rows:
            fit_rows[key] = [_fits(b, c) for c in cands]
        fit.append(fit_rows[key])
    for i, b in enumerate(bundles):
        if not any(fit[i]):
            raise _why_not(i, b, cands, prefix)

    # 2. Choose the template: it must fit every bundle; then least waste.
    common = [c for j, c in enumerate(cands) if all(row[j] for row in fit)]
    if not common:
        best = max(cands, key=lambda c: (sum(_fits(b, c) for b in bundles), -c.index))
        i = next(i for i, b in enumerate(bundles) if not _fits(b, best))
        fits = "; ".join(f"bundle {j} fits {[c.group.group_name for c in cands if _fits(b, c)]}"
                         for j, b in enumerate(bundles))
        r = _misfit(bundles[i].resources, best.cap) or GPU
        raise InfeasibleError(f"no single worker group fits every bundle ({fits}): bundle {i} asks "
                              f"{r}={format_amount(r, bundles[i].get(r))}, {describe_group(best.group)} has "
                              f"{r}={format_amount(r, best.cap.get(r, 0.0))}; one reservation copies one template",
                              bundle_index=i, resource=r, requested=bundles[i].get(r), limit=best.cap.get(r, 0.0),
                              template=best.group.group_name)

    # 3. Pack bundles into pods on every fitting template; keep the least wasteful, then the shape
    #    that binds now (else the smallest pods): gang_shapes.
    options, failures, fits = [], [], {}
    asked = _asked(bundles, {GPU}.union(*(c.cap for c in common)))
    for c in common:
        packed = _pack(bundles, request.strategy, c)
        if isinstance(packed, InfeasibleError):
            failures.append(packed)
            continue
        for assign_option in shape_options(bundles, request.strategy, lambda: packed):
            pods = max(assign_option) + 1
            gpu_idle, other_idle = _waste(asked, c, pods)
            mig_rank = int(c.kind() is GpuKind.MIG and any(b.get(GPU) for b in bundles))  # prefer whole GPUs
            fit = fits[c.index, pods] = admission_fit(c.k8s_requests(), pods, _free_of(free, c))
            idle = {r: pods * v - asked[r] for r, v in c.cap.items()}
            options.append(ShapeOption(waste_key=(mig_rank, round(gpu_idle, 6), pods, other_idle, c.index), idle=idle,
                                       pods=pods, fit=fit, payload=(c, assign_option)))
    if not options:
        raise max(failures, key=lambda e: e.limit or 0.0)
    ranked = rank_options(options)
    chosen, assign = ranked[0].payload
    gpu_idle, pods = ranked[0].waste_key[1], ranked[0].pods

    # 4. Emit the plan with its explanation.
    group = chosen.group
    (shape, _), described, (requests, limits) = chosen.emitted()
    rule = {Strategy.STRICT_SPREAD: "one bundle per pod",
            Strategy.SPREAD: "one bundle per pod (raygpu owns the pods, so spreading costs nothing)",
            Strategy.STRICT_PACK: "all bundles on one pod",
            Strategy.PACK: "first-fit-decreasing into as few pods as possible"}[request.strategy]
    if request.strategy is Strategy.PACK:
        rule = "least waste, then pods that bind now, else the smallest pods"
    reason = [f"{request.strategy.value}: {len(bundles)} bundle(s) -> {pods} pod(s) of {described}; {rule}"]
    if len(options) > 1 and request.strategy is not Strategy.STRICT_PACK:
        reason.append(describe_fit(fits[chosen.index, pods], pods))
    if shape is not None and shape.kind is GpuKind.MIG and any(b.get(GPU) for b in bundles):
        reason.append(f"planned as MIG slices: 1 GPU = one {shape.resource.split('/')[-1]} slice "
                      f"({shape.compute_slices}/7 of a GPU's compute, {shape.memory_gb} GB), not a whole GPU")
    if shape is not None and shape.kind is GpuKind.SHARE and any(b.get(GPU) for b in bundles):
        reason.append(f"GPU amounts are shares of {shape.resource} (time-sliced, not isolated); Ray GPU="
                      f"{chosen.cap.get(GPU, 0):g} per pod")
    if policy.gang_template is not None:
        reason.append("template named by raygpu.io/gang-template")
    elif len({o.payload[0].index for o in options}) > 1:
        others = ", ".join(dict.fromkeys(f"'{o.payload[0].group.group_name}'" for o in ranked if o.payload[0] is not chosen))
        reason.append(f"chosen for least waste ({gpu_idle:g} Ray GPU idle) over {others}")
    need = PodNeed(template_group=group.group_name, pod_count=pods, k8s_requests=requests, k8s_limits=limits,
                   ray_resources=chosen.cap, gpu_shape=shape)
    return chosen, need, tuple(assign), reason


def plan_gang(request: GangRequest, cluster: RayClusterView, policy: ClusterPolicy | None = None,
              free: FreeNow = None, *, templates: GangTemplates | None = None) -> GangPlan:
    """Decide the reservation for ``request`` on ``cluster``; ``policy`` defaults to its annotations.

    ``free``: what the nodes the pods may use can bind now (``gang_shapes.free_nodes``), one tuple for
    every template or, per worker group name, the nodes that template's pods may use
    (``gang_free.free_by_template``; a group absent from it: not known);
    among the least wasteful shapes the planner prefers one that binds now, else
    the smallest pods (``raygpu.plan.gang.shapes``); None = not known.
    Promises: the plan uses one worker group template; every bundle fits its
    pod; the same inputs give the same plan; a shape never idles more GPUs
    than the least wasteful one. Raises PermanentError (bad input,
    unknown group, Kueue without a queue, ``templates`` of another cluster) or
    InfeasibleError (cannot ever fit). ``templates``: ``gang_templates(cluster)``,
    computed once for many requests; the plan is the same with or without it
    (it also caches each choice of template and packing, so equal requests of a
    cycle choose once; the same ``free`` object counts as the same capacity).
    """
    if templates is not None and templates.cluster is not cluster and templates.cluster != cluster:
        raise PermanentError(f"templates were computed for RayCluster {templates.cluster.namespace}/"
                             f"{templates.cluster.name}, not for {cluster.namespace}/{cluster.name}")
    if policy is None:
        policy = templates.policy if templates is not None and templates.policy is not None \
            else parse_cluster_policy(cluster.annotations)[0]
    # 1. Validate what the request models cannot check alone.
    if (request.cluster, request.namespace) != (cluster.name, cluster.namespace):
        raise PermanentError(f"request is for {request.namespace}/{request.cluster}, "
                             f"the snapshot is {cluster.namespace}/{cluster.name}")
    backend = request.backend or policy.gang_backend
    queue = request.queue or policy.queue
    if backend is Backend.KUEUE and not queue:
        raise PermanentError("backend kueue needs a LocalQueue: set raygpu.io/queue or pass queue=")
    scheduler_name = None
    if backend is Backend.COSCHEDULING:
        scheduler_name = request.scheduler_name or policy.gang_scheduler_name
    elif request.scheduler_name is not None:
        raise PermanentError(f"scheduler_name={request.scheduler_name!r} names the scheduler of backend "
                             f"coscheduling; this request's backend is {backend.value}")
    if not cluster.worker_groups:
        raise InfeasibleError(f"RayCluster {cluster.namespace}/{cluster.name} has no worker groups; "
                              "a reservation copies a worker group template")
    templates = templates or gang_templates(cluster)
    if templates.error is not None:
        raise PermanentError(templates.error)
    cands = list(templates.candidates)
    prefix = ""
    if policy.gang_template is not None:
        named = [c for c in cands if c.group.group_name == policy.gang_template]
        if not named:
            raise PermanentError(f"raygpu.io/gang-template names group '{policy.gang_template}'; the worker groups "
                                 f"are: {', '.join(c.group.group_name for c in cands)}")
        cands, prefix = named, f"raygpu.io/gang-template names group '{policy.gang_template}': "
    bundles = request.bundles
    key = (policy.gang_template, request.strategy, tuple(tuple(b.resources.items()) for b in bundles), id(free))
    cached = templates.choices.get(key)
    if cached is None or cached[0] is not free:
        cached = templates.choices[key] = (free, *_choose(request, cands, prefix, policy, free))
    _, chosen, need, assign, reason = cached
    group, pods = chosen.group, need.pod_count
    rg = reservation_group_name(request.name)
    notes = []
    if pods > group.max_replicas:
        notes.append(f"{pods} pods exceed group '{group.group_name}' maxReplicas={group.max_replicas}; allowed: "
                     f"the reservation is its own worker group '{rg}' with replicas = minReplicas = maxReplicas = {pods}")
    topo = [f"topology {request.topology.describe()}"] if request.topology is not None else []
    return GangPlan(
        name=request.name, cluster=cluster.name, namespace=cluster.namespace, strategy=request.strategy,
        backend=backend, queue=queue, timeout_s=request.timeout_s,
        need=need, bundle_to_pod=assign, reservation_group=rg, gang_name=gang_name(cluster.name, request.name),
        reason="; ".join(reason + topo + notes), notes=tuple(notes), topology=request.topology,
        scheduler_name=scheduler_name)
