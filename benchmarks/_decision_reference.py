"""Two yardsticks for ``bench_decision_cost`` that do not depend on how fast the box is.

* ``reference_pass(snapshot)``: the least any planner must do, one plain Python pass that reads every
  pod, Ray node and Kubernetes node of the snapshot once and joins them by name (pod name = Ray
  instance id, pod node = node name). Its time on the same box, at the same size, is the box's cost of
  touching the data. The ratio cycle / reference says how much work raygpu does per object read, on any
  box; how the reference itself grows with size says what the machine's memory adds (a pass that reads
  each object once is linear in work; when its time grows faster, that is caches, not the algorithm).
* ``executed_lines(fn)``: how many Python lines ``fn()`` executes (``sys.settrace`` line events, the
  tracer's own lines not counted). Counted, not timed: the same on every box and at any load, and a
  quadratic step shows as a count that more than doubles when the cluster doubles. It does not count
  work done in C (sorts, dict and set operations), which grows as n log n at worst here.
"""

from __future__ import annotations

import sys
from typing import Any, Callable

from raygpu.model.views import Snapshot


def reference_pass(snapshot: Snapshot) -> float:
    """One pass over the Ray nodes, nodes and pods of ``snapshot``, each read once and joined by name (a
    number out, so that nothing is optimised away)."""
    by_instance = {}
    for r in snapshot.ray.nodes:
        if r.alive and r.instance_id:
            by_instance[r.instance_id] = r
    gpus = {}
    for node in snapshot.k8s.nodes:
        gpus[node.name] = node.capacity.get("nvidia.com/gpu", 0.0)
    total = 0.0
    for p in snapshot.k8s.pods:
        r = by_instance.get(p.name)
        if r is not None and p.phase == "Running" and p.node_name in gpus:
            total += r.total.get("GPU", 0.0) - r.available.get("GPU", 0.0) + p.requests.get("cpu", 0.0)
    return total


def executed_lines(fn: Callable[[], Any]) -> int:
    """Python lines ``fn()`` executes in this thread (every frame it calls, raygpu's and the libraries')."""
    count = 0

    def local(frame, event, arg):  # noqa: ARG001 - the settrace signature
        nonlocal count
        if event == "line":
            count += 1
        return local

    def global_(frame, event, arg):  # noqa: ARG001
        return local

    if sys.gettrace() is not None:
        raise RuntimeError("executed_lines needs the tracer to itself (a debugger or coverage is running)")
    sys.settrace(global_)
    try:
        fn()
    finally:
        sys.settrace(None)
    return count
