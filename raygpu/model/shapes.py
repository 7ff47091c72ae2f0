"""GPU shapes: whole GPUs, MIG profiles and soft shares are different things.

Kubernetes names GPU capacity with extended resources:

* ``nvidia.com/gpu``               a whole, isolated GPU (``WHOLE``)
* ``nvidia.com/mig-<g>g.<m>gb``    a fixed MIG slice, g compute slices and m GB (``MIG``)
* ``nvidia.com/gpu.shared``        a time-sliced / MPS share with no isolation (``SHARE``)
  (the device plugin's ``renameByDefault`` name; other vendors' ``*/gpu`` count as whole)

Ray sees a single ``GPU`` number per node. These helpers say which Kubernetes
resource a GPU count came from so that the planner and the doctor never mix
shapes silently.
"""

from __future__ import annotations

import re
from enum import Enum

from raygpu.model.base import Frozen

_MIG_RE = re.compile(r"^nvidia\.com/mig-(?P<g>\d+)g\.(?P<m>\d+)gb(?:\.(?P<extra>[a-z0-9+.]+))?$")


class GpuKind(str, Enum):
    WHOLE = "whole"
    MIG = "mig"
    SHARE = "share"


class GpuShape(Frozen):
    """One kind of schedulable GPU unit, as a Kubernetes resource name describes it."""


    resource: str
    kind: GpuKind
    compute_slices: int = 7  # of 7 on A100/H100; a whole GPU has all of them
    memory_gb: int | None = None

    @property
    def label(self) -> str:
        if self.kind is GpuKind.MIG:
            return f"MIG {self.compute_slices}g.{self.memory_gb}gb"
        return "GPU share" if self.kind is GpuKind.SHARE else "whole GPU"


WHOLE_GPU = GpuShape(resource="nvidia.com/gpu", kind=GpuKind.WHOLE)


def parse_gpu_resource(name: str) -> GpuShape | None:
    """Return the shape of a Kubernetes resource name, or None if it is not a GPU.

    >>> parse_gpu_resource("nvidia.com/mig-3g.40gb").compute_slices
    3
    """
    m = _MIG_RE.match(name)
    if m:
        return GpuShape(resource=name, kind=GpuKind.MIG, compute_slices=int(m["g"]), memory_gb=int(m["m"]))
    if name == "nvidia.com/gpu.shared" or name.endswith("/gpu.shared"):
        return GpuShape(resource=name, kind=GpuKind.SHARE)
    if name == "nvidia.com/gpu" or name.endswith("/gpu"):
        return GpuShape(resource=name, kind=GpuKind.WHOLE, memory_gb=None)
    return None


def gpu_resources(resources: dict[str, float]) -> dict[str, float]:
    """The GPU entries of a resource map (Kubernetes names), zero counts dropped."""
    return {k: v for k, v in resources.items() if v and parse_gpu_resource(k) is not None}


def is_kuberay_gpu_key(name: str) -> bool:
    """KubeRay's ``utils.IsGPUResourceKey``: ends in ``gpu`` or is a MIG profile."""
    return name.endswith("gpu") or bool(re.search(r"nvidia\.com/mig-\d+g\.\d+gb$", name))


def ray_gpu_count_from_limits(limits: dict[str, float]) -> float:
    """The GPU count KubeRay hands to ``ray start --num-gpus`` when rayStartParams has none.

    KubeRay (ray-operator v1.5 ``addWellKnownAcceleratorResources``) walks the
    container limits in sorted key order and takes the first non-zero one for
    which ``IsGPUResourceKey`` holds. Each MIG slice counts as one Ray GPU.
    Note ``nvidia.com/gpu.shared`` does not end in ``gpu``: Ray sees 0 GPUs.
    """
    for name in sorted(limits):
        if limits[name] and is_kuberay_gpu_key(name):
            return float(int(limits[name]))
    return 0.0
