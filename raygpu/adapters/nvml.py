"""The container's view of its GPUs, read through NVML (``pynvml`` from nvidia-ml-py).

``probe_nvml`` runs where the GPUs are: in a tiny Ray task pinned to each Ray
node (the Ray adapter ships it there), or in ``raygpu doctor --local``.
It never raises: any failure, from a missing library to a lost GPU, becomes
``NvmlView(available=False, reason="NVML unavailable: <reason>")``, where
``<reason>`` is NVML's own error string (``Driver Not Loaded``,
``NVML Shared Library Not Found``, ``GPU is lost``...). ``plan/`` reads those
strings to tell a kernel-driver fault from a container-toolkit one.

Per GPU it also reads the memory-error counters (``NvmlHealthView``: uncorrectable ECC errors, volatile
and aggregate; remapped rows on Ampere and newer, else retired pages) and, on one event set for all GPUs,
the critical XIDs NVML delivers within a bounded wait (``xid_wait_ms``). NVML's event set only
delivers events that happen after it was registered, so one probe sees the XIDs of its own wait; the XIDs
of the hours before are the health agents' job (their node conditions are read by the doctor too).
A counter the GPU does not support stays None; a failing health read never makes the view unavailable.
"""

from __future__ import annotations

import re
import time
from types import ModuleType
from typing import Any

from raygpu.model.views import MigDeviceView, NvmlDeviceView, NvmlHealthView, NvmlView, XidEvent

_MIG_PROFILE_RE = re.compile(r"(\d+g\.\d+gb(?:\+me)?)", re.IGNORECASE)
_MIG_ENABLE = 1  # pynvml.NVML_DEVICE_MIG_ENABLE
# Memory slices (of 8) -> compute slices for the MIG profiles of A100/H100/H200.
# 4 memory slices are both 3g and 4g; 3g is the profile people create, so we say 3g.
_COMPUTE_FOR_MEMORY_SLICES = {1: 1, 2: 2, 4: 3, 8: 7}
# pynvml constants (nvml.h), spelled out so that a fake or an old binding without them still works
_ECC_UNCORRECTED = 1  # NVML_MEMORY_ERROR_TYPE_UNCORRECTED
_VOLATILE_ECC, _AGGREGATE_ECC = 0, 1  # NVML_VOLATILE_ECC, NVML_AGGREGATE_ECC
_RETIRED_SBE, _RETIRED_DBE = 0, 1  # NVML_PAGE_RETIREMENT_CAUSE_{MULTIPLE_SINGLE_BIT,DOUBLE_BIT}_ECC_ERROR(S)
_EVENT_XID_CRITICAL = 0x8  # nvmlEventTypeXidCriticalError
DEFAULT_XID_WAIT_MS = 500
MAX_XID_EVENTS = 64  # per probe: a GPU in an XID storm must not keep the probe busy


def probe_nvml(node_id: str, nvml: ModuleType | Any | None = None, xid_wait_ms: int = DEFAULT_XID_WAIT_MS) -> NvmlView:
    """Read device count, UUIDs, names, memory, MIG instances, versions, memory-error counters and XIDs.

    ``xid_wait_ms``: how long to wait for critical XID events (0: do not watch); the probe returns
    after at most that much waiting plus the reads.

    ``nvml`` is the pynvml module; tests pass a hand-written fake with the same
    functions and ``NVMLError`` classes. Imported lazily so that importing
    raygpu never needs nvidia-ml-py. Calls ``nvmlInit`` and always
    ``nvmlShutdown`` after a successful init. Never raises.
    """
    if nvml is None:
        try:
            import pynvml as nvml  # noqa: PLC0415 - lazy on purpose: GPU-less machines lack it
        except ImportError as exc:
            return _unavailable(node_id, f"pynvml not installed ({exc})")
    try:
        nvml.nvmlInit()
    except Exception as exc:  # NVMLError_LibraryNotFound, NVMLError_DriverNotLoaded, OSError...
        return _unavailable(node_id, _describe(exc))
    try:
        return _read(node_id, nvml, xid_wait_ms)
    except Exception as exc:  # a GPU lost mid-read, an unexpected binding: report, never raise
        return _unavailable(node_id, _describe(exc))
    finally:
        try:
            nvml.nvmlShutdown()
        except Exception:  # noqa: S110 - nothing to do if shutdown fails
            pass


def _read(node_id: str, nvml: Any, xid_wait_ms: int) -> NvmlView:
    driver = _optional(lambda: _text(nvml.nvmlSystemGetDriverVersion()))
    cuda = _optional(lambda: _cuda_version(nvml.nvmlSystemGetCudaDriverVersion()))
    devices = []
    for index in range(nvml.nvmlDeviceGetCount()):
        try:
            devices.append(_device(nvml, index))
        except Exception as exc:
            return _unavailable(node_id, f"device {index}: {_describe(exc)}", driver, cuda)
    xids, waited = _xid_events(nvml, devices, xid_wait_ms) if xid_wait_ms > 0 and devices else ((), None)
    return NvmlView(node_id=node_id, available=True, driver_version=driver, cuda_version=cuda, devices=tuple(devices),
                    xid_events=xids, xid_wait_ms=waited)


def _health(nvml: Any, handle: Any) -> NvmlHealthView:
    """The memory-error counters of one GPU; a query the GPU does not support leaves its field None."""
    out: dict[str, Any] = {
        "ecc_volatile_uncorrected": _optional(lambda: int(nvml.nvmlDeviceGetTotalEccErrors(
            handle, _ECC_UNCORRECTED, _VOLATILE_ECC))),
        "ecc_aggregate_uncorrected": _optional(lambda: int(nvml.nvmlDeviceGetTotalEccErrors(
            handle, _ECC_UNCORRECTED, _AGGREGATE_ECC))),
    }
    rows = _optional(lambda: tuple(nvml.nvmlDeviceGetRemappedRows(handle)))  # Ampere+: (corr, unc, pending, failed)
    if rows is not None and len(rows) >= 4:
        out.update(remapped_rows_correctable=int(rows[0]), remapped_rows_uncorrectable=int(rows[1]),
                   remap_pending=bool(rows[2]), remap_failure=bool(rows[3]))
    else:  # Volta / Turing retire pages instead
        pages = [_optional(lambda c=c: len(nvml.nvmlDeviceGetRetiredPages(handle, c))) for c in (_RETIRED_SBE, _RETIRED_DBE)]
        if any(p is not None for p in pages):
            out["retired_pages"] = sum(p or 0 for p in pages)
        pending = _optional(lambda: nvml.nvmlDeviceGetRetiredPagesPendingStatus(handle))
        if pending is not None:
            out["retired_pages_pending"] = bool(pending)
    return NvmlHealthView(**out)


def _xid_events(nvml: Any, devices: list[NvmlDeviceView], wait_ms: int) -> tuple[tuple[XidEvent, ...], int | None]:
    """Critical XIDs delivered within ``wait_ms`` on one event set registered for every GPU that supports it.

    Returns the events and the wait, or ``((), None)`` when no GPU could be registered (MIG on, no
    support, an old binding). The set is always freed.
    """
    try:
        event_set = nvml.nvmlEventSetCreate()
    except Exception:
        return (), None
    try:
        registered = 0
        for d in devices:
            try:
                nvml.nvmlDeviceRegisterEvents(nvml.nvmlDeviceGetHandleByIndex(d.index), _EVENT_XID_CRITICAL, event_set)
                registered += 1
            except Exception:  # noqa: S112 - NotSupported on this GPU (MIG on, a consumer GPU): watch the others
                continue
        if not registered:
            return (), None
        wait = getattr(nvml, "nvmlEventSetWait_v2", None) or nvml.nvmlEventSetWait
        by_uuid = {d.uuid: d.index for d in devices}
        events: list[XidEvent] = []
        deadline = time.monotonic() + wait_ms / 1000
        while len(events) < MAX_XID_EVENTS:
            left_ms = max(0, int((deadline - time.monotonic()) * 1000))
            try:
                data = wait(event_set, left_ms)
            except Exception:  # NVMLError_Timeout: nothing (more) within the wait
                break
            uuid = _optional(lambda: _text(nvml.nvmlDeviceGetUUID(data.device)))
            events.append(XidEvent(xid=int(data.eventData), uuid=uuid, device_index=by_uuid.get(uuid)))
            if left_ms == 0:
                break
        return tuple(events), wait_ms
    finally:
        try:
            nvml.nvmlEventSetFree(event_set)
        except Exception:  # noqa: S110 - nothing to do if freeing fails
            pass


def _device(nvml: Any, index: int) -> NvmlDeviceView:
    handle = nvml.nvmlDeviceGetHandleByIndex(index)
    memory = int(nvml.nvmlDeviceGetMemoryInfo(handle).total)
    try:
        current_mode = nvml.nvmlDeviceGetMigMode(handle)[0]
    except nvml.NVMLError:  # NotSupported on GPUs without MIG
        current_mode = 0
    migs: list[MigDeviceView] = []
    if current_mode == _MIG_ENABLE:
        for slot in range(nvml.nvmlDeviceGetMaxMigDeviceCount(handle)):
            try:
                mig = nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot)
            except nvml.NVMLError:  # NotFound: no instance in this slot
                continue
            mig_memory = int(nvml.nvmlDeviceGetMemoryInfo(mig).total)
            migs.append(
                MigDeviceView(
                    uuid=_text(nvml.nvmlDeviceGetUUID(mig)),
                    profile=mig_profile(_optional(lambda: _text(nvml.nvmlDeviceGetName(mig))), mig_memory, memory),
                    memory_total_bytes=mig_memory,
                )
            )
    return NvmlDeviceView(
        index=index,
        uuid=_text(nvml.nvmlDeviceGetUUID(handle)),
        name=_text(nvml.nvmlDeviceGetName(handle)),
        memory_total_bytes=memory,
        mig_enabled=current_mode == _MIG_ENABLE,
        mig_devices=tuple(migs),
        health=_health(nvml, handle),
    )


def mig_profile(name: str | None, memory_bytes: int, parent_memory_bytes: int) -> str:
    """The MIG profile (``3g.40gb``): from the device name when it carries one, else from memory.

    Drivers since R470 name MIG devices ``NVIDIA A100-SXM4-80GB MIG 3g.40gb``.
    Without that, the memory share of the parent gives the memory slices (of
    8) and the marketed size; 4 memory slices are reported as ``3g`` (``4g``
    has the same memory and cannot be told apart this way).
    """
    if name and (m := _MIG_PROFILE_RE.search(name)):
        return m.group(1).lower()
    parent_gb = round(parent_memory_bytes / 2**30)
    slices = max(1, round(8 * memory_bytes / parent_memory_bytes)) if parent_memory_bytes else 0
    if not slices:
        return f"{round(memory_bytes / 2**30)}gb"
    compute = _COMPUTE_FOR_MEMORY_SLICES.get(slices)
    gb = round(parent_gb * slices / 8)
    return f"{compute}g.{gb}gb" if compute else f"{gb}gb"


def _unavailable(node_id: str, reason: str, driver: str | None = None, cuda: str | None = None) -> NvmlView:
    return NvmlView(
        node_id=node_id, available=False, reason=f"NVML unavailable: {reason}", driver_version=driver, cuda_version=cuda
    )


def _describe(exc: BaseException) -> str:
    text = str(exc).strip()
    return text or type(exc).__name__


def _text(value: str | bytes) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _cuda_version(value: int) -> str:
    """NVML's int (12040) as ``12.4``."""
    return f"{value // 1000}.{(value % 1000) // 10}"


def _optional(read: Any) -> Any:
    try:
        return read()
    except Exception:
        return None
