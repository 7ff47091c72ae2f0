"""Kubernetes objects as frozen views: ``pod_view`` and ``node_view`` (split out of adapters/kube.py, by concept).

A value that does not parse takes a safe default, recorded as a ParseProblem on the view; nothing here
does I/O. ``raygpu.adapters.kube`` re-exports both.
"""

from __future__ import annotations

from typing import Any

from raygpu.model.base import timestamp_s
from raygpu.model.raycluster import MAX_NUM_GPUS, ParseProblem, param_number, resource_map
from raygpu.model.views import DeviceHealthView, K8sNodeView, K8sPodView, NodeCondition, Taint, Toleration


def _sum_resources(containers: list[dict[str, Any]], key: str, obj: str,
                   problems: list[ParseProblem]) -> dict[str, float]:
    out: dict[str, float] = {}
    for c in containers:
        field = f"containers[{c.get('name', '?')}].{key}"
        for k, v in resource_map((c.get("resources") or {}).get(key), obj, field, problems).items():
            out[k] = out.get(k, 0.0) + v
    return out


def start_cmd_num_gpus(value: str, obj: str, problems: list[ParseProblem]) -> float | None:
    """``--num-gpus=N`` of a KUBERAY_GEN_RAY_START_CMD; None (recorded) unless N is a number in [0, 1024]."""
    raw = value.split("--num-gpus=")[1].split()[0] if value.split("--num-gpus=")[1].split() else ""
    given = param_number(raw)
    if given is None:
        problems.append(ParseProblem(obj=obj, field="env.KUBERAY_GEN_RAY_START_CMD --num-gpus", value=raw,
                                     reason=f"is not a number in [0, {MAX_NUM_GPUS:g}]", default_used="its group's rayStartParams"))
    return given


def pod_view(p: dict[str, Any]) -> K8sPodView:
    """A pod as a frozen view. A value that does not parse takes a safe default, recorded in ``problems``.

    Raises (KeyError, ValueError) only for an object without a name or namespace or with a bad
    creationTimestamp, which the API server never sends; callers skip such an object (``parse_each``).
    """
    md, spec, st = p["metadata"], p.get("spec") or {}, p.get("status") or {}
    obj = f"Pod {md['namespace']}/{md['name']}"
    problems: list[ParseProblem] = []
    labels = md.get("labels") or {}
    containers = spec.get("containers") or []
    num_gpus = None
    for e in (containers[0].get("env") or []) if containers else []:
        if e.get("name") == "KUBERAY_GEN_RAY_START_CMD" and "--num-gpus=" in (e.get("value") or ""):
            num_gpus = start_cmd_num_gpus(e["value"], obj, problems)
    return K8sPodView(
        name=md["name"], namespace=md["namespace"], uid=md.get("uid", ""), node_name=spec.get("nodeName"),
        phase=st.get("phase", "Pending"), deleting=bool(md.get("deletionTimestamp")), labels=labels,
        annotations=md.get("annotations") or {}, requests=_sum_resources(containers, "requests", obj, problems),
        limits=_sum_resources(containers, "limits", obj, problems),
        tolerations=tuple(Toleration(**{k: t.get(k) for k in ("key", "value", "effect") if t.get(k) is not None},
                                     operator=t.get("operator", "Equal")) for t in spec.get("tolerations") or []),
        node_selector=dict(spec.get("nodeSelector") or {}),
        created_at_s=timestamp_s(md.get("creationTimestamp")), ray_cluster=labels.get("ray.io/cluster"),
        **_times(spec, st, obj, problems),
        ray_group=labels.get("ray.io/group"), ray_node_type=labels.get("ray.io/node-type"),
        ray_start_num_gpus=num_gpus, scheduling_group=(spec.get("schedulingGroup") or {}).get("podGroupName"),
        scheduler_name=spec.get("schedulerName") if isinstance(spec.get("schedulerName"), str) else None,
        problems=tuple(problems), device_health=DeviceHealthView.of_pod_status(st))


def _times(spec: dict[str, Any], st: dict[str, Any], obj: str, problems: list[ParseProblem]) -> dict[str, Any]:
    """status.startTime and spec.activeDeadlineSeconds (a pod's estimated end: plan/backfill.py); bad: None."""
    out: dict[str, Any] = {}
    try:
        out["started_at_s"] = timestamp_s(st.get("startTime")) or None
    except (TypeError, ValueError):
        problems.append(ParseProblem(obj=obj, field="status.startTime", value=str(st.get("startTime")),
                                     reason="not a timestamp", default_used="not started"))
    ads = spec.get("activeDeadlineSeconds")
    if isinstance(ads, int) and not isinstance(ads, bool) and ads > 0:
        out["active_deadline_s"] = float(ads)
    elif ads is not None:
        problems.append(ParseProblem(obj=obj, field="spec.activeDeadlineSeconds", value=str(ads),
                                     reason="not a positive integer", default_used="none"))
    return out


def node_view(n: dict[str, Any]) -> K8sNodeView:
    """A node as a frozen view; a capacity that is no quantity is left out, recorded in ``problems``."""
    md, spec, st = n["metadata"], n.get("spec") or {}, n.get("status") or {}
    obj = f"Node {md['name']}"
    problems: list[ParseProblem] = []
    conds = {c["type"]: c["status"] for c in st.get("conditions") or []}
    return K8sNodeView(
        name=md["name"], labels=md.get("labels") or {},
        capacity=resource_map(st.get("capacity"), obj, "capacity", problems),
        allocatable=resource_map(st.get("allocatable"), obj, "allocatable", problems),
        taints=tuple(Taint(key=t["key"], value=t.get("value"), effect=t["effect"]) for t in spec.get("taints") or []),
        ready=conds.get("Ready") == "True", unschedulable=bool(spec.get("unschedulable")),
        problems=tuple(problems),
        conditions=tuple(NodeCondition(type=str(c["type"]), reason=str(c.get("reason") or ""),
                                       message=str(c.get("message") or ""))
                         for c in st.get("conditions") or []
                         if c.get("status") == "True" and c.get("type") not in (None, "Ready")))
