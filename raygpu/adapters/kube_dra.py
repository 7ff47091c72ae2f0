"""Read DRA (Dynamic Resource Allocation, ``resource.k8s.io``) objects: ResourceSlices and ResourceClaims.

Promises: :func:`read_dra` never raises. A cluster that does not serve
``resource.k8s.io`` (discovery has no ResourceSlice: Kubernetes < 1.32 or
the group turned off), or an identity that may not list it (403), gives
``None`` for the objects and one note saying why; nothing else changes. One
slice or claim that does not parse is skipped with a note naming it, never
the others; a device that does not parse is left out of its slice.

Versions: ``v1`` (GA in 1.34), else ``v1beta2``, else ``v1beta1``. The
device shape is the same in ``v1`` and ``v1beta2``; ``v1beta1`` nests a
device's attributes, capacity and taints under ``basic``, read the same way.
Field names follow k8s.io/api resource/v1 types.go (v0.34):
``spec.nodeName``, ``spec.driver``, ``spec.pool.{name,generation,resourceSliceCount}``,
``spec.devices[].{name,attributes,taints,nodeName}``; a claim's
``status.allocation.devices.results[].{request,driver,pool,device}`` and
``status.reservedFor[]``; its annotation ``resource.kubernetes.io/extended-resource-claim``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from raygpu.model.views import DraAllocatedDevice, DraDeviceTaint, DraDeviceView, ResourceClaimView, ResourceSliceView

DRA_GROUP = "resource.k8s.io"
DRA_VERSIONS = ("v1", "v1beta2", "v1beta1")  # newest first
# on the claim the scheduler makes for an extended-resource request served by DRA (KEP-5004)
EXTENDED_RESOURCE_CLAIM = "resource.kubernetes.io/extended-resource-claim"


@dataclass(frozen=True)
class DraRead:
    """What :func:`read_dra` found: None where the API is not served or not readable, and why (``notes``)."""

    slices: tuple[ResourceSliceView, ...] | None
    claims: tuple[ResourceClaimView, ...] | None
    notes: tuple[str, ...] = ()


def read_dra(kube: Any, namespace: str | None) -> DraRead:
    """ResourceSlices (cluster-wide) and the ResourceClaims of ``namespace`` (None: every namespace).

    ``kube`` is a ``KubeAdapter`` (``dyn`` for discovery, ``list``). Never raises: see the module docstring.
    """
    try:
        served = {r.api_version for r in kube.dyn.resources.search(group=DRA_GROUP, kind="ResourceSlice")}
    except Exception as e:  # noqa: BLE001 - a failed discovery reads as "not served", said once
        return DraRead(None, None, (f"DRA: cannot discover {DRA_GROUP} ({type(e).__name__}: {e}); "
                                    "ResourceSlices not read, GPUs counted from node allocatable only",))
    version = next((v for v in DRA_VERSIONS if v in served), None)
    if version is None:
        return DraRead(None, None, (f"DRA: {DRA_GROUP} is not served by this API server; "
                                    "GPUs counted from node allocatable only",))
    api = f"{DRA_GROUP}/{version}"
    notes: list[str] = []
    try:
        raw_slices = kube.list(api, "ResourceSlice")
    except Exception as e:  # noqa: BLE001 - 403 (ForbiddenError names the permission) or unreachable
        return DraRead(None, None, (f"DRA: cannot list ResourceSlices ({e}); GPUs counted from node allocatable only",))
    slices = tuple(_each(raw_slices, resource_slice, "ResourceSlice", notes))
    try:
        claims: tuple[ResourceClaimView, ...] | None = tuple(
            _each(kube.list(api, "ResourceClaim", namespace), resource_claim, "ResourceClaim", notes))
    except Exception as e:  # noqa: BLE001 - slices are still worth counting without claims
        claims = None
        notes.append(f"DRA: cannot list ResourceClaims ({e}); tainted devices are not matched to their pods")
    return DraRead(slices, claims, tuple(notes))


def _each(items: Any, parse: Any, what: str, notes: list[str]) -> list[Any]:
    out = []
    for item in items if isinstance(items, list) else []:
        try:
            out.append(parse(item))
        except Exception as e:  # noqa: BLE001 - one bad object must not hide the others
            md = item.get("metadata") if isinstance(item, dict) else None
            name = md.get("name", "?") if isinstance(md, dict) else "?"
            notes.append(f"DRA: skipped {what} {name}: cannot parse it: {type(e).__name__}: {e}")
    return out


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _attr_value(value: Any) -> str | None:
    """A DeviceAttribute (exactly one of string, int, bool, version) as a string; None when it has none."""
    v = _dict(value)
    for kind in ("string", "version", "int", "bool"):
        if v.get(kind) is not None:
            got = v[kind]
            return ("true" if got else "false") if isinstance(got, bool) else str(got)
    return None


def device(d: dict[str, Any]) -> DraDeviceView:
    """One ``spec.devices[]`` entry; raises (KeyError, TypeError) when it has no name."""
    body = _dict(d.get("basic")) or d  # v1beta1 nests the device's fields under basic
    name = d["name"]
    if not isinstance(name, str) or not name:
        raise TypeError(f"device name {name!r} is not a string")
    attrs = {str(k): v for k, raw in _dict(body.get("attributes")).items() if (v := _attr_value(raw)) is not None}
    taints = tuple(DraDeviceTaint(key=str(t["key"]), value=t.get("value") or None, effect=str(t.get("effect", "")))
                   for t in body.get("taints") or [] if isinstance(t, dict) and t.get("key"))
    node = body.get("nodeName")
    return DraDeviceView(name=name, attributes=attrs, taints=taints, node_name=node if isinstance(node, str) else None)


def resource_slice(s: dict[str, Any]) -> ResourceSliceView:
    """A ResourceSlice as a frozen view; a device without a name is left out. Raises when the slice has no name."""
    spec, pool = _dict(s.get("spec")), _dict(_dict(s.get("spec")).get("pool"))
    raw = spec.get("devices") if isinstance(spec.get("devices"), list) else []
    devices = []
    for d in raw:
        try:
            devices.append(device(d))
        except (KeyError, TypeError, ValueError, AttributeError):
            continue  # a device the API server would not have admitted: not counted
    node = spec.get("nodeName")
    return ResourceSliceView(
        name=s["metadata"]["name"], node_name=node if isinstance(node, str) and node else None,
        driver=str(spec.get("driver") or ""), device_count=len(raw), pool=str(pool.get("name") or ""),
        pool_generation=_int(pool.get("generation"), 0), pool_slice_count=max(_int(pool.get("resourceSliceCount"), 1), 1),
        devices=tuple(devices))


def resource_claim(c: dict[str, Any]) -> ResourceClaimView:
    """A ResourceClaim as a frozen view: allocated devices and the pods it is reserved for."""
    md, st = c["metadata"], _dict(c.get("status"))
    results = _dict(_dict(_dict(st.get("allocation")).get("devices"))).get("results") or []
    allocated = tuple(DraAllocatedDevice(request=str(r.get("request") or ""), driver=str(r["driver"]),
                                         pool=str(r.get("pool") or ""), device=str(r["device"]))
                      for r in results if isinstance(r, dict) and r.get("driver") and r.get("device"))
    pods = tuple(str(r["name"]) for r in st.get("reservedFor") or []
                 if isinstance(r, dict) and r.get("resource") == "pods" and r.get("name"))
    extended = _dict(md.get("annotations")).get(EXTENDED_RESOURCE_CLAIM) == "true"
    return ResourceClaimView(name=md["name"], namespace=md.get("namespace") or "", allocated=allocated,
                             reserved_for_pods=pods, extended_resource=extended)


def _int(value: Any, default: int) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return default
