"""Which DRA devices are GPUs, and the GPUs each pod was given through ResourceClaims (pure, no I/O).

* :func:`is_gpu_device`: which ResourceSlice devices are GPUs, as NVIDIA's
  DRA driver publishes them (``checks_dra`` counts a node's GPUs with it).
* :func:`claim_gpus_by_pod`: per pod, the GPU devices allocated to the
  ResourceClaims reserved for it (``status.reservedFor``). Built once per
  snapshot by the index, so that every comparison of Ray with the pod
  (``phantom-gpus``, ``stranded-gpus``, the rows' ``POD``, NVML's count)
  sees the GPUs a pod gets without an ``nvidia.com/gpu`` limit.

Kept apart from ``checks_dra`` (which reads the index) so that the index
can use it.
"""

from __future__ import annotations

from dataclasses import dataclass

from raygpu.model.views import DraDeviceView, K8sView, ResourceClaimView, ResourceSliceView

NVIDIA_GPU_DRIVER = "gpu.nvidia.com"  # NVIDIA/k8s-dra-driver-gpu's gpu-kubelet-plugin
# its "type" attribute: "gpu" (a whole GPU), "mig" (a MIG device); "vfio" (passthrough to a VM) is no container GPU
GPU_DEVICE_TYPES = frozenset({"gpu", "mig"})


def attribute(driver: str, device: DraDeviceView, name: str) -> str | None:
    """A device attribute by its short name (``type``) or qualified by the driver (``gpu.nvidia.com/type``)."""
    got = device.attributes.get(name)
    return got if got is not None else device.attributes.get(f"{driver}/{name}")


def is_gpu_device(driver: str, device: DraDeviceView) -> bool:
    """Whether a ResourceSlice device is an NVIDIA GPU unit a container can be given.

    Only driver ``gpu.nvidia.com`` publishes GPUs (its sibling
    ``compute-domain.nvidia.com`` publishes IMEX channels, not GPUs). Its
    ``type`` attribute decides: ``gpu`` and ``mig`` count (one unit each, as
    ``nvidia.com/gpu`` and ``nvidia.com/mig-*`` do), ``vfio`` and anything
    else do not. A device without ``type`` (a driver older than the
    attribute) counts when its ``uuid`` is a GPU or MIG UUID (``GPU-...``,
    ``MIG-...``), else when its name is the driver's ``gpu-<minor>`` (not
    ``gpu-vfio-<n>``).
    """
    if driver != NVIDIA_GPU_DRIVER:
        return False
    kind = attribute(driver, device, "type")
    if kind is not None:
        return kind in GPU_DEVICE_TYPES
    uuid = attribute(driver, device, "uuid") or ""
    if uuid:
        return uuid.startswith(("GPU-", "MIG-"))
    return device.name.startswith("gpu-") and not device.name.startswith("gpu-vfio-")


def device_id(driver: str, pool: str, name: str) -> str:
    """``<driver>/<pool>/<device>``: how a claim's allocation and a pod's ``allocatedResourcesStatus`` name a device."""
    return f"{driver}/{pool}/{name}"


def current_slices(slices: tuple[ResourceSliceView, ...]) -> list[ResourceSliceView]:
    """The slices of each (driver, pool) at its highest generation; older ones are being replaced, not counted."""
    newest: dict[tuple[str, str], int] = {}
    for s in slices:
        key = (s.driver, s.pool)
        newest[key] = max(newest.get(key, s.pool_generation), s.pool_generation)
    return [s for s in slices if s.pool_generation == newest[(s.driver, s.pool)]]


@dataclass(frozen=True)
class ClaimGpus:
    """The GPU devices one pod was given through the ResourceClaims reserved for it."""

    units: float  # distinct GPU devices over its claims
    per_claim: tuple[tuple[str, int, str], ...]  # (claim name, its GPU devices, their drivers), by claim name

    def facts(self) -> tuple[str, ...]:
        """``ResourceClaim <name>: 8 GPU devices (gpu.nvidia.com)``, one per claim."""
        return tuple(f"ResourceClaim {name}: {n} GPU device{'s' if n != 1 else ''} ({drivers})"
                     for name, n, drivers in self.per_claim)

    def describe(self) -> str:
        """``claim c1: 8`` (``, claim c2: 1``): the claims, for a message."""
        return ", ".join(f"claim {name}: {n}" for name, n, _ in self.per_claim)


def claim_gpus_by_pod(k8s: K8sView) -> dict[tuple[str, str], ClaimGpus]:
    """(namespace, pod name) -> the GPU devices allocated to the claims reserved for that pod.

    A claim counts for each pod its ``status.reservedFor`` names (same
    namespace): DRA gives every consumer of a shared claim access to all of
    its devices, so each pod can use them all, as each Ray node of those pods
    can count them all. A device is a GPU when :func:`is_gpu_device` says so
    of its ResourceSlice entry (of the current generation, else of an older
    one still listed); a device of no listed slice is judged by its driver
    and name alone. A device a pod reaches through two claims counts once.
    Claims the scheduler made for an ``nvidia.com/gpu`` request served by
    DRA (KEP-5004, ``extended_resource``) are left out: the pod's limit
    already counts those GPUs. Nothing when ``resource_claims`` is None or
    empty: the pod's limits alone, as without DRA.
    """
    claims = k8s.resource_claims
    if not claims:
        return {}
    used = [c for c in claims if c.allocated and c.reserved_for_pods and not c.extended_resource]
    if not used:
        return {}
    gpu: dict[str, bool] = {}
    slices = k8s.resource_slices or ()
    current = current_slices(slices)
    keep = {id(s) for s in current}
    for s in [s for s in slices if id(s) not in keep] + current:  # current last: it decides
        for d in s.devices:
            gpu[device_id(s.driver, s.pool, d.name)] = is_gpu_device(s.driver, d)
    devices: dict[tuple[str, str], set[str]] = {}
    named: dict[tuple[str, str], list[tuple[str, int, str]]] = {}
    for c in sorted(used, key=_claim_key):
        ids = {}
        for a in c.allocated:
            ident = device_id(a.driver, a.pool, a.device)
            if _is_gpu(gpu, ident, a.driver, a.device):
                ids[ident] = a.driver
        if not ids:
            continue
        entry = (c.name, len(ids), ", ".join(sorted(set(ids.values()))))
        for pod in dict.fromkeys(c.reserved_for_pods):
            key = (c.namespace, pod)
            devices.setdefault(key, set()).update(ids)
            named.setdefault(key, []).append(entry)
    return {key: ClaimGpus(float(len(ids)), tuple(named[key])) for key, ids in devices.items()}


def _claim_key(c: ResourceClaimView) -> tuple[str, str]:
    return c.namespace, c.name


def _is_gpu(gpu: dict[str, bool], ident: str, driver: str, name: str) -> bool:
    got = gpu.get(ident)
    return is_gpu_device(driver, DraDeviceView(name=name)) if got is None else got
