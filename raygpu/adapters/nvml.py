"""The container's view of its GPUs, read through NVML (``pynvml`` from nvidia-ml-py).

``probe_nvml`` runs where the GPUs are: in a tiny Ray task pinned to each Ray
node (the Ray adapter ships it there), or in ``raygpu doctor --local``.
It never raises: any failure, from a missing library to a lost GPU, becomes
``NvmlView(available=False, reason="NVML unavailable: <reason>")``, where
``<reason>`` is NVML's own error string (``Driver Not Loaded``,
``NVML Shared Library Not Found``, ``GPU is lost``...). ``plan/`` reads those
strings to tell a kernel-driver fault from a container-toolkit one.
"""

from __future__ import annotations

import re
from types import ModuleType
from typing import Any

from raygpu.model.views import MigDeviceView, NvmlDeviceView, NvmlView

_MIG_PROFILE_RE = re.compile(r"(\d+g\.\d+gb(?:\+me)?)", re.IGNORECASE)
_MIG_ENABLE = 1  # pynvml.NVML_DEVICE_MIG_ENABLE
# Memory slices (of 8) -> compute slices for the MIG profiles of A100/H100/H200.
# 4 memory slices are both 3g and 4g; 3g is the profile people create, so we say 3g.
_COMPUTE_FOR_MEMORY_SLICES = {1: 1, 2: 2, 4: 3, 8: 7}


def probe_nvml(node_id: str, nvml: ModuleType | Any | None = None) -> NvmlView:
    """Read device count, UUIDs, names, memory, MIG instances and versions through NVML.

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
        return _read(node_id, nvml)
    except Exception as exc:  # a GPU lost mid-read, an unexpected binding: report, never raise
        return _unavailable(node_id, _describe(exc))
    finally:
        try:
            nvml.nvmlShutdown()
        except Exception:  # noqa: S110 - nothing to do if shutdown fails
            pass


def _read(node_id: str, nvml: Any) -> NvmlView:
    driver = _optional(lambda: _text(nvml.nvmlSystemGetDriverVersion()))
    cuda = _optional(lambda: _cuda_version(nvml.nvmlSystemGetCudaDriverVersion()))
    devices = []
    for index in range(nvml.nvmlDeviceGetCount()):
        try:
            devices.append(_device(nvml, index))
        except Exception as exc:
            return _unavailable(node_id, f"device {index}: {_describe(exc)}", driver, cuda)
    return NvmlView(node_id=node_id, available=True, driver_version=driver, cuda_version=cuda, devices=tuple(devices))


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
