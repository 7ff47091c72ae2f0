"""Facts of one view object, for the doctor's index and checks: pure functions of their argument.

What a resource map says about GPUs (``gpu_resources``, ``pod_gpu_map``,
``has_slices``), what an NVML view says (``nvml_units_and_mig``,
``nvml_reason_class``), and how counts are written in messages (``fmt``).
The GPU-name parse is memoised in a plain dict: a handful of names, read for
every key of every map of a snapshot.
"""

from __future__ import annotations

from functools import lru_cache

from raygpu.model.shapes import GpuKind, GpuShape, parse_gpu_resource
from raygpu.model.views import K8sPodView, NvmlView

TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})
GPU_COUNT_LABEL = "nvidia.com/gpu.count"
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
MIG_STRATEGY_LABEL = "nvidia.com/mig.strategy"
EPS = 1e-6

# NVML error strings (pynvml's NVMLError.__str__) that mean the host driver is at fault.
_DRIVER_REASONS = (
    "driver not loaded",
    "gpu is lost",
    "version mismatch",
    "requires restart",
    "reset required",
)
_LIBRARY_REASONS = ("library not found", "shared library", "pynvml not installed")


@lru_cache(maxsize=4096)
def shape_of(resource: str) -> GpuShape | None:
    """``parse_gpu_resource``, memoised: a pure function of a handful of names."""
    return parse_gpu_resource(resource)


# resource name -> its GpuKind, or None when it is not a GPU (filled on first sight of a name)
KIND_OF: dict[str, GpuKind | None] = {}


def _kind(resource: str) -> GpuKind | None:
    if resource in KIND_OF:
        return KIND_OF[resource]
    shape = shape_of(resource)
    got = KIND_OF[resource] = shape.kind if shape is not None else None
    return got


def gpu_resources(resources: dict[str, float]) -> dict[str, float]:
    """The non-zero GPU entries of a Kubernetes resource map, in its order (``shapes.gpu_resources``)."""
    out = {}
    for k, v in resources.items():
        if v and (KIND_OF[k] if k in KIND_OF else _kind(k)) is not None:
            out[k] = v
    return out


def gpu_names(names: tuple[str, ...]) -> tuple[tuple[str, ...], bool]:
    """The GPU resources among ``names``, in their order, and whether one is a slice or share (not WHOLE)."""
    gpu = tuple(name for name in names if shape_of(name) is not None)
    return gpu, any(shape_of(name).kind is not GpuKind.WHOLE for name in gpu)


def gpu_units(resources: dict[str, float]) -> float:
    """All GPU units in a Kubernetes resource map (whole GPUs, MIG slices and shares alike)."""
    return float(sum(gpu_resources(resources).values()))


def pod_gpu_map(pod: K8sPodView) -> dict[str, float]:
    """GPU resources a pod holds. Extended resources have requests == limits; take the larger."""
    out = gpu_resources(pod.limits)
    if pod.requests != pod.limits:  # equal maps (the usual pod) add nothing: max(v, v) == v
        for name, value in gpu_resources(pod.requests).items():
            out[name] = max(out.get(name, 0.0), value)
    return out


def has_slices(gpu_map: dict[str, float]) -> bool:
    """Some resource of a GPU map is a MIG slice or a time-sliced share (not a whole GPU)."""
    for name in gpu_map:
        kind = KIND_OF[name] if name in KIND_OF else _kind(name)
        if kind is not None and kind is not GpuKind.WHOLE:
            return True
    return False


def pod_gpu_kinds(pod: K8sPodView) -> set[GpuKind]:
    return {kind for name in pod_gpu_map(pod) if (kind := _kind(name)) is not None}


def nvml_units_and_mig(view: NvmlView) -> tuple[int, bool]:
    """``view.gpu_units`` (MIG instances where MIG is on, else whole devices) and whether MIG is on for some device."""
    units = len(view.devices)
    mig = False
    for d in view.devices:
        if d.mig_enabled:
            mig = True
            units += len(d.mig_devices) - 1
    return units, mig


def mig_on(view: NvmlView) -> bool:
    """NVML reports MIG mode on for some device."""
    for d in view.devices:
        if d.mig_enabled:
            return True
    return False


def nvml_reason_class(view: NvmlView) -> str:
    """Classify why NVML is unavailable: ``driver``, ``library`` or ``other``."""
    reason = (view.reason or "").lower()
    if any(r in reason for r in _DRIVER_REASONS):
        return "driver"
    if any(r in reason for r in _LIBRARY_REASONS):
        return "library"
    return "other"


def is_blocking_taint_effect(effect: str) -> bool:
    return effect in ("NoSchedule", "NoExecute")


def as_float(value: str | None) -> float:
    """A label value as a number; 0.0 when absent or not a number."""
    try:
        return float(value) if value is not None else 0.0
    except ValueError:
        return 0.0


def fmt(x: float | None) -> str:
    """A count for messages: ``8`` not ``8.0``, ``0.5`` stays."""
    if x is None:
        return "-"
    return str(int(x)) if abs(x - round(x)) < EPS else f"{x:g}"


def pod_facts(req: dict[str, float], lim: dict[str, float],
              names_memo: dict[tuple[str, ...], tuple[tuple[str, ...], bool]]) -> tuple:
    """(GPU map or None, its units, some GPU of it a slice or share, CPU, memory) of a pod's requests and limits.

    The GPU map is ``pod_gpu_map``'s: the limits' non-zero GPU entries, then the larger of each in the
    requests; CPU and memory are the requests', a missing request counting its limit (as in Kubernetes).
    ``names_memo``: a map's resource names -> (its GPU names, one of them a slice or share), filled here.
    """
    names = tuple(lim)
    got = names_memo.get(names) or names_memo.setdefault(names, gpu_names(names))
    gpus = {name: value for name in got[0] if (value := lim[name])} if got[0] else None
    sliced = got[1]
    names = tuple(req)
    got = names_memo.get(names) or names_memo.setdefault(names, gpu_names(names))
    if got[0]:
        sliced = sliced or got[1]
        gpus = {} if gpus is None else gpus
        for name in got[0]:
            if value := req[name]:
                gpus[name] = max(gpus.get(name, 0.0), value)
    if not gpus:
        gpus, sliced = None, False
    elif sliced:  # some GPU name of the maps is a slice or share: is one in the map (not 0)?
        sliced = any(shape_of(resource).kind is not GpuKind.WHOLE for resource in gpus)
    cpu, memory = req.get("cpu"), req.get("memory")
    return (gpus, sum(gpus.values()) if gpus else 0, sliced, lim.get("cpu", 0.0) if cpu is None else cpu,
            lim.get("memory", 0.0) if memory is None else memory)
