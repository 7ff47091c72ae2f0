"""DRA builders: ResourceSlices as NVIDIA's DRA driver publishes them, claims, device health.

``with_dra(snap().gpu_node("n1", 8).obj(), slices=[gpu_slice("n1", 8, taints={2: "xid=79:NoExecute"})])``
adds DRA objects to any snapshot the ``SnapBuilder`` made. ``slice_object``
is the same slice as the API server returns it (``resource.k8s.io/v1``), for
the adapter's parse tests and the testbed.
"""

from __future__ import annotations

from typing import Any

from raygpu.model.views import (
    DeviceHealthView,
    DraAllocatedDevice,
    DraDeviceTaint,
    DraDeviceView,
    ResourceClaimView,
    ResourceSliceView,
    Snapshot,
)

DRIVER = "gpu.nvidia.com"
H100 = "NVIDIA H100 80GB HBM3"


def _taint(spec: str) -> DraDeviceTaint:
    """``key[=value]:Effect``."""
    kv, _, effect = spec.rpartition(":")
    key, _, value = kv.partition("=")
    return DraDeviceTaint(key=key, value=value or None, effect=effect)


def gpu_slice(node: str, gpus: int = 8, *, pool: str | None = None, driver: str = DRIVER, generation: int = 0,
              slice_count: int = 1, taints: dict[int, str] | None = None, type_: str | None = "gpu",
              first: int = 0, name: str | None = None) -> ResourceSliceView:
    """A slice of ``gpus`` devices ``gpu-<first>``.. on ``node`` with the driver's attributes (type, uuid,
    productName); ``taints``: device index -> ``key[=value]:Effect``; ``type_`` None leaves the attribute out."""
    devices = []
    for i in range(first, first + gpus):
        attrs = {"uuid": f"GPU-{node}-{i:04d}", "productName": H100}
        if type_ is not None:
            attrs["type"] = type_
        devices.append(DraDeviceView(name=f"gpu-{i}", attributes=attrs,
                                     taints=(_taint(taints[i]),) if taints and i in taints else ()))
    return ResourceSliceView(name=name or f"{node}-{driver}-{first}", node_name=node, driver=driver,
                             device_count=gpus, pool=pool or node, pool_generation=generation,
                             pool_slice_count=slice_count, devices=tuple(devices))


def claim(name: str, node: str, *devices: int, pods: tuple[str, ...] = (), namespace: str = "default",
          pool: str | None = None, driver: str = DRIVER, extended: bool = False) -> ResourceClaimView:
    """A claim allocated ``gpu-<i>`` of ``node``'s pool, reserved for ``pods``; ``extended``: made by the
    scheduler for an ``nvidia.com/gpu`` request served by DRA (KEP-5004)."""
    return ResourceClaimView(name=name, namespace=namespace, reserved_for_pods=pods, extended_resource=extended,
                             allocated=tuple(DraAllocatedDevice(request="gpu", driver=driver, pool=pool or node,
                                                                device=f"gpu-{i}") for i in devices))


def health(resource_id: str, state: str = "Unhealthy", *, resource: str = "claim:gpu/gpu",
           container: str = "ray-worker") -> DeviceHealthView:
    return DeviceHealthView(container=container, resource=resource, resource_id=resource_id, health=state)


def with_dra(snapshot: Snapshot, slices: list[ResourceSliceView] | None = None,
             claims: list[ResourceClaimView] | None = None,
             pod_health: dict[str, list[DeviceHealthView]] | None = None) -> Snapshot:
    """``snapshot`` with these slices and claims (None: the API not served) and device health on the named pods."""
    k8s = snapshot.k8s
    pods = tuple(p.model_copy(update={"device_health": tuple(pod_health[p.name])}) if pod_health and p.name in pod_health
                 else p for p in k8s.pods)
    return snapshot.model_copy(update={"k8s": k8s.model_copy(update={
        "resource_slices": tuple(slices) if slices is not None else k8s.resource_slices,
        "resource_claims": tuple(claims) if claims is not None else k8s.resource_claims,
        "pods": pods})})


def slice_object(s: ResourceSliceView, api_version: str = "resource.k8s.io/v1") -> dict[str, Any]:
    """``s`` as the API server stores it (what a DRA driver writes)."""
    def attr(v: str) -> dict[str, Any]:
        return {"string": v}

    devices = []
    for d in s.devices:
        dev: dict[str, Any] = {"name": d.name, "attributes": {k: attr(v) for k, v in d.attributes.items()}}
        if d.taints:
            dev["taints"] = [{"key": t.key, **({"value": t.value} if t.value else {}), "effect": t.effect}
                             for t in d.taints]
        devices.append(dev)
    return {"apiVersion": api_version, "kind": "ResourceSlice", "metadata": {"name": s.name},
            "spec": {"driver": s.driver, "nodeName": s.node_name,
                     "pool": {"name": s.pool, "generation": s.pool_generation,
                              "resourceSliceCount": s.pool_slice_count},
                     "devices": devices}}
