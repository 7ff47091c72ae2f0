"""What one pod of a worker group offers, in Ray's names and in Kubernetes' names.

Pure helpers for the gang planner: :func:`template_capacity` is the Ray
resources a pod of the group will register (as KubeRay turns the group into
``ray start`` flags), :func:`pod_k8s_resources` what the whole pod asks the
Kubernetes scheduler for, :func:`template_gpu_shape` which GPU unit it uses.
"""

from __future__ import annotations

import json
from typing import Any

from raygpu.errors import PermanentError
from raygpu.model.raycluster import GroupTemplate, parse_quantity
from raygpu.model.shapes import GpuKind, GpuShape, gpu_resources, parse_gpu_resource

GPU, CPU, MEMORY = "GPU", "CPU", "memory"


def custom_ray_resources(ray_start_params: dict[str, str]) -> dict[str, float]:
    """Custom resources of rayStartParams ``resources`` (a JSON object, often quoted and escaped).

    Returns {} when absent or unparsable: such a group then offers no custom resource.
    """
    raw = ray_start_params.get("resources", "").strip()
    while len(raw) >= 2 and raw[0] == raw[-1] and raw[0] in "'\"":
        raw = raw[1:-1].strip()
    try:
        parsed = json.loads(raw.replace('\\"', '"')) if raw else {}
    except ValueError:
        return {}
    if not isinstance(parsed, dict):
        return {}
    return {str(k): float(v) for k, v in parsed.items() if isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0}


def template_capacity(group: GroupTemplate) -> dict[str, float]:
    """Ray resources one pod of ``group`` registers: GPU, CPU, memory (bytes) and custom ones.

    GPU and CPU follow KubeRay (``num-gpus``/``num-cpus`` else the container
    limits); memory is rayStartParams ``memory``, else the memory limit (which
    KubeRay passes as ``--memory``), else the memory request.

    Raises PermanentError naming the value when the group's spec has one that did
    not parse (``group.problems``): a reservation must not copy a template whose pods
    Ray cannot start with the resources the plan assumes.
    """
    if group.problems:
        raise PermanentError("invalid worker group template: " + "; ".join(p.message for p in group.problems))
    params = group.ray_start_params
    if "memory" in params:
        memory = parse_quantity(params["memory"])
    else:
        memory = group.limits.get("memory") or group.requests.get("memory", 0.0)
    cap = {GPU: group.ray_gpus, CPU: group.ray_cpus, MEMORY: memory}
    cap.update(custom_ray_resources(params))
    return {k: v for k, v in cap.items() if v > 0}


def template_gpu_shape(group: GroupTemplate) -> tuple[GpuShape | None, float]:
    """The GPU shape a pod of ``group`` asks Kubernetes for and how many units, or (None, 0).

    With several GPU resources in the limits the first in sorted order wins,
    the one KubeRay counts for Ray.
    """
    gpus = gpu_resources(group.limits) or gpu_resources(group.requests)
    if not gpus:
        return None, 0.0
    name = sorted(gpus)[0]
    return parse_gpu_resource(name), gpus[name]


def is_share_template(group: GroupTemplate) -> bool:
    shape, _ = template_gpu_shape(group)
    return shape is not None and shape.kind is GpuKind.SHARE


def describe_group(group: GroupTemplate) -> str:
    """``group 'gpu' (8 x nvidia.com/gpu; Ray GPU=8, CPU=96, memory=512GiB)``, for messages."""
    shape, count = template_gpu_shape(group)
    cap = template_capacity(group)
    parts = []
    if shape is not None:
        parts.append(f"{count:g} x {shape.resource}")
        if shape.kind is GpuKind.SHARE and "num-gpus" not in group.ray_start_params:
            parts.append("no rayStartParams num-gpus, so Ray sees 0 GPUs")
    parts.append("Ray " + format_ray_resources(cap) if cap else "no Ray resources")
    return f"group '{group.group_name}' ({'; '.join(parts)})"


def format_amount(resource: str, amount: float) -> str:
    """``memory`` in GiB, everything else as a plain number."""
    if resource.endswith("memory"):
        return f"{amount / 2**30:g}GiB"
    return f"{amount:g}"


def format_ray_resources(resources: dict[str, float]) -> str:
    order = {GPU: 0, CPU: 1, MEMORY: 2}
    keys = sorted(resources, key=lambda k: (order.get(k, 3), k))
    return ", ".join(f"{k}={format_amount(k, resources[k])}" for k in keys)


def _container_resources(container: dict[str, Any], group: str) -> tuple[dict[str, float], dict[str, float]]:
    res = container.get("resources") or {}
    try:
        limits = {k: parse_quantity(v) for k, v in (res.get("limits") or {}).items()}
        requests = {k: parse_quantity(v) for k, v in (res.get("requests") or {}).items()}
    except ValueError as exc:
        raise PermanentError(f"group '{group}' container {container.get('name', '?')!r}: bad quantity ({exc})") from None
    return {**limits, **requests}, limits  # Kubernetes defaults a missing request to the limit


def pod_k8s_resources(group: GroupTemplate) -> tuple[dict[str, float], dict[str, float]]:
    """(requests, limits) of one whole pod of ``group`` in Kubernetes names.

    Requests follow the scheduler: the sum over containers (a missing request
    defaults to the limit), raised to the largest init container where that is
    bigger. Limits are summed over the regular containers.
    """
    spec = group.template.get("spec") or {}
    requests: dict[str, float] = {}
    limits: dict[str, float] = {}
    for container in spec.get("containers") or []:
        req, lim = _container_resources(container, group.group_name)
        for k, v in req.items():
            requests[k] = requests.get(k, 0.0) + v
        for k, v in lim.items():
            limits[k] = limits.get(k, 0.0) + v
    for container in spec.get("initContainers") or []:
        req, _ = _container_resources(container, group.group_name)
        for k, v in req.items():
            requests[k] = max(requests.get(k, 0.0), v)
    if not spec.get("containers"):  # a template parsed without its raw pod spec
        requests, limits = {**group.limits, **group.requests}, dict(group.limits)
    return {k: v for k, v in requests.items() if v}, {k: v for k, v in limits.items() if v}
