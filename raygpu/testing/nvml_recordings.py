"""NVML answers of three machines, and a hand-written fake ``pynvml`` that replays them.

Provenance, honestly: no GPU machine was available when these were written,
so they were not captured by raygpu itself. They are transcribed from what
NVML / nvidia-smi print on these models (names as ``nvmlDeviceGetName``
returns them, memory totals as ``nvmlDeviceGetMemoryInfo().total``: 81559 MiB
for an H100 80GB HBM3, 81920 MiB for an A100-SXM4-80GB, 40192 MiB for its
3g.40gb instance; ``nvmlSystemGetCudaDriverVersion`` as an int, 12020 = 12.2).
UUIDs have the real shape (``GPU-``/``MIG-`` + 8-4-4-4-12 hex) but are made
up. Replace with a real capture (``tests/gpu/test_nvml_real.py`` prints one)
when a GPU machine runs the suite.

Health (issue 28): each device may carry ``ecc`` (``nvmlDeviceGetTotalEccErrors`` for uncorrected
errors: ``volatile``, ``aggregate``), ``remapped_rows`` (``nvmlDeviceGetRemappedRows``: corrected rows,
uncorrected rows, pending, failure; Ampere and newer) or ``retired_pages`` (Volta / Turing:
``nvmlDeviceGetRetiredPages`` per cause ``sbe`` / ``dbe`` and ``nvmlDeviceGetRetiredPagesPendingStatus``
as ``pending``); a key that is absent answers ``NotSupported`` as NVML does on GPUs without the
feature. A recording's ``xid_events`` (``[{"device": i, "xid": n}]``) are delivered by the fake event
set (``nvmlEventSetWait_v2``) to a probe that registered for that device, then ``Timeout``. The
health recordings below are transcribed from NVIDIA's documentation of these calls and of the XIDs
(https://docs.nvidia.com/deploy/xid-errors/), not captured.

Error behaviour mirrors pynvml: ``NVMLError(value)`` maps the NVML return
code to a subclass (``NVMLError_LibraryNotFound`` = 12, ``DriverNotLoaded`` = 9,
``NotFound`` = 6, ``NotSupported`` = 3) whose ``str()`` is NVML's own message.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

MiB = 2**20

# ----------------------------------------------------------- recordings
H100_NODE: dict[str, Any] = {
    "driver_version": "535.129.03",
    "cuda_driver_version": 12020,
    "devices": [
        {
            "uuid": uuid,
            "name": "NVIDIA H100 80GB HBM3",
            "memory_total": 81559 * MiB,
            "mig_mode": None,  # nvmlDeviceGetMigMode -> [0, 0]; MIG off
            "mig": [],
            "ecc": {"volatile": 0, "aggregate": 0},
            "remapped_rows": (0, 0, 0, 0),
        }
        for uuid in (
            "GPU-5e3a8c1f-9b2d-4e71-a0c4-3f8d2b6e1a90",
            "GPU-0b7d4e29-6c13-4f85-9e2a-71d5c8b3f406",
            "GPU-c2f91a6d-3e48-4b07-8d5c-9a61e0f47b23",
            "GPU-7a14e3b8-d052-49c6-b3f1-2e8c6d90a5f7",
            "GPU-e86b2c07-14f9-4a3d-9c70-5b1d8e2f6a34",
            "GPU-3d05f7a2-8b6e-4c19-a4d2-c07e91b5f86d",
            "GPU-91c8d4e6-2a7b-4f03-8e15-6d3a0c9b7e52",
            "GPU-4f62a0b9-c3d1-48e7-b5a6-0e9f7d2c8143",
        )
    ],
}

A100_MIG_NODE: dict[str, Any] = {
    "driver_version": "550.54.15",
    "cuda_driver_version": 12040,
    "devices": [
        {
            "uuid": "GPU-a81f3c52-7d0e-4b96-8c2a-f54e1d07b3c9",
            "name": "NVIDIA A100-SXM4-80GB",
            "memory_total": 81920 * MiB,
            "mig_mode": [1, 1],
            "max_mig": 7,
            "mig": [  # slot -> instance; slots 2..6 are empty (NVML_ERROR_NOT_FOUND)
                {
                    "slot": 0,
                    "uuid": "MIG-2b9e6d14-0c7a-5f38-9e41-d6a3b8c0f275",
                    "name": "NVIDIA A100-SXM4-80GB MIG 3g.40gb",
                    "memory_total": 40192 * MiB,
                },
                {
                    "slot": 1,
                    "uuid": "MIG-f04c7a93-5e2d-5b81-a6f9-30e8c1d4b762",
                    "name": "NVIDIA A100-SXM4-80GB MIG 3g.40gb",
                    "memory_total": 40192 * MiB,
                },
            ],
        }
    ],
}

# An older driver that names MIG devices like their parent: the profile must come from memory.
A100_MIG_UNNAMED: dict[str, Any] = {
    **A100_MIG_NODE,
    "devices": [
        {
            **A100_MIG_NODE["devices"][0],
            "mig": [{**m, "name": "NVIDIA A100-SXM4-80GB"} for m in A100_MIG_NODE["devices"][0]["mig"]],
        }
    ],
}


def _h100_with(device: int, **health: Any) -> dict[str, Any]:
    """H100_NODE with device ``device``'s health keys replaced."""
    devices = [dict(d) for d in H100_NODE["devices"]]
    devices[device].update(health)
    return {**H100_NODE, "devices": devices}


# XID 79 (GPU has fallen off the bus) on device 2 during the probe's wait
H100_XID_79: dict[str, Any] = {**H100_NODE, "xid_events": [{"device": 2, "xid": 79}]}
# XID 13 (graphics engine exception: an application fault) on device 0: not a critical XID
H100_XID_13: dict[str, Any] = {**H100_NODE, "xid_events": [{"device": 0, "xid": 13}]}
# device 5: 2 uncorrectable ECC errors since the driver loaded (and in its lifetime), one row remapped, reset pending
H100_ECC_DBE: dict[str, Any] = _h100_with(5, ecc={"volatile": 2, "aggregate": 2}, remapped_rows=(0, 1, 1, 0))
# device 1: uncorrectable errors in its lifetime only (before the last driver load); rows remapped, nothing pending
H100_ECC_HISTORY: dict[str, Any] = _h100_with(1, ecc={"volatile": 0, "aggregate": 3}, remapped_rows=(0, 3, 0, 0))
# device 7: row remapping failed (no spare row left in a bank)
H100_REMAP_FAILED: dict[str, Any] = _h100_with(7, remapped_rows=(0, 8, 0, 1))
# A V100 (no row remapping: NotSupported) with a double-bit retired page waiting for a reset
V100_RETIRED_PENDING: dict[str, Any] = {
    "driver_version": "535.129.03",
    "cuda_driver_version": 12020,
    "devices": [
        {
            "uuid": "GPU-6c0e9d27-41b3-4a58-b2f7-8d19e3c05a64",
            "name": "Tesla V100-SXM2-32GB",
            "memory_total": 32768 * MiB,
            "mig_mode": None,
            "mig": [],
            "ecc": {"volatile": 1, "aggregate": 1},
            "retired_pages": {"sbe": 0, "dbe": 1, "pending": 1},
        }
    ],
}

NO_LIBRARY: dict[str, Any] = {"init_error": 12}  # NVML_ERROR_LIBRARY_NOT_FOUND: no libnvidia-ml.so.1
NO_DRIVER: dict[str, Any] = {"init_error": 9}  # NVML_ERROR_DRIVER_NOT_LOADED: library there, nvidia.ko not loaded
GPU_LOST: dict[str, Any] = {**H100_NODE, "device_error": (3, 15)}  # device 3: NVML_ERROR_GPU_IS_LOST

# ------------------------------------------------------------ fake pynvml
_MESSAGES = {
    3: "Not Supported",
    6: "Not Found",
    10: "Timeout",
    9: "Driver Not Loaded",
    12: "NVML Shared Library Not Found",
    15: "GPU is lost",
}


class NVMLError(Exception):
    """pynvml.NVMLError: constructing it with a code returns the matching subclass."""

    _by_value: dict[int, type["NVMLError"]] = {}

    def __new__(cls, value: int):
        if cls is NVMLError:
            cls = NVMLError._by_value.get(value, cls)
        obj = Exception.__new__(cls)
        obj.value = value
        return obj

    def __init__(self, value: int) -> None:
        super().__init__(value)

    def __str__(self) -> str:
        return _MESSAGES.get(self.value, f"NVML Error with code {self.value}")


def _subclass(name: str, value: int) -> type[NVMLError]:
    cls = type(name, (NVMLError,), {})
    NVMLError._by_value[value] = cls
    return cls


NVMLError_NotSupported = _subclass("NVMLError_NotSupported", 3)
NVMLError_NotFound = _subclass("NVMLError_NotFound", 6)
NVMLError_DriverNotLoaded = _subclass("NVMLError_DriverNotLoaded", 9)
NVMLError_Timeout = _subclass("NVMLError_Timeout", 10)
NVMLError_LibraryNotFound = _subclass("NVMLError_LibraryNotFound", 12)
NVMLError_GpuIsLost = _subclass("NVMLError_GpuIsLost", 15)


@dataclass
class _Memory:  # c_nvmlMemory_t
    total: int
    free: int
    used: int = 0


@dataclass(frozen=True)
class _Handle:
    device: int
    mig_slot: int | None = None


@dataclass
class _EventData:  # c_nvmlEventData_t
    device: _Handle
    eventType: int
    eventData: int  # the XID


class _EventSet:
    def __init__(self) -> None:
        self.devices: set[int] = set()
        self.delivered = 0
        self.freed = False


class FakeNvml:
    """Replays one recording through pynvml's function names. Counts init/shutdown calls."""

    NVMLError = NVMLError
    NVMLError_NotFound = NVMLError_NotFound
    NVML_DEVICE_MIG_ENABLE = 1

    def __init__(self, recording: dict[str, Any]) -> None:
        self.rec = recording
        self.inits = 0
        self.shutdowns = 0
        self.event_sets: list[_EventSet] = []

    # -- lifecycle
    def nvmlInit(self) -> None:
        if "init_error" in self.rec:
            raise NVMLError(self.rec["init_error"])
        self.inits += 1

    def nvmlShutdown(self) -> None:
        self.shutdowns += 1

    # -- system
    def nvmlSystemGetDriverVersion(self) -> str:
        return self.rec["driver_version"]

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        return self.rec["cuda_driver_version"]

    # -- devices
    def nvmlDeviceGetCount(self) -> int:
        return len(self.rec["devices"])

    def nvmlDeviceGetHandleByIndex(self, index: int) -> _Handle:
        bad = self.rec.get("device_error")
        if bad and bad[0] == index:
            raise NVMLError(bad[1])
        return _Handle(index)

    def _dev(self, h: _Handle) -> dict[str, Any]:
        dev = self.rec["devices"][h.device]
        if h.mig_slot is None:
            return dev
        return next(m for m in dev["mig"] if m["slot"] == h.mig_slot)

    def nvmlDeviceGetUUID(self, h: _Handle) -> str:
        return self._dev(h)["uuid"]

    def nvmlDeviceGetName(self, h: _Handle) -> bytes:
        return self._dev(h)["name"].encode()  # older pynvml returns bytes; the probe must decode

    def nvmlDeviceGetMemoryInfo(self, h: _Handle) -> _Memory:
        total = self._dev(h)["memory_total"]
        return _Memory(total=total, free=total)

    def nvmlDeviceGetMigMode(self, h: _Handle) -> list[int]:
        mode = self.rec["devices"][h.device]["mig_mode"]
        if mode is None:
            return [0, 0]
        return list(mode)

    def nvmlDeviceGetMaxMigDeviceCount(self, h: _Handle) -> int:
        return self.rec["devices"][h.device].get("max_mig", 0)

    def nvmlDeviceGetMigDeviceHandleByIndex(self, h: _Handle, slot: int) -> _Handle:
        if not any(m["slot"] == slot for m in self.rec["devices"][h.device]["mig"]):
            raise NVMLError(6)
        return _Handle(h.device, slot)


    # -- health
    def _health(self, h: _Handle, key: str) -> Any:
        value = self.rec["devices"][h.device].get(key)
        if value is None:
            raise NVMLError(3)
        return value

    def nvmlDeviceGetTotalEccErrors(self, h: _Handle, error_type: int, counter_type: int) -> int:
        assert error_type == 1  # NVML_MEMORY_ERROR_TYPE_UNCORRECTED: the probe only asks for these
        return self._health(h, "ecc")["volatile" if counter_type == 0 else "aggregate"]

    def nvmlDeviceGetRemappedRows(self, h: _Handle) -> tuple[int, int, int, int]:
        return tuple(self._health(h, "remapped_rows"))

    def nvmlDeviceGetRetiredPages(self, h: _Handle, cause: int) -> list[int]:
        n = self._health(h, "retired_pages")["sbe" if cause == 0 else "dbe"]
        return [0x1000 * (i + 1) for i in range(n)]

    def nvmlDeviceGetRetiredPagesPendingStatus(self, h: _Handle) -> int:
        return self._health(h, "retired_pages")["pending"]

    # -- events
    def nvmlEventSetCreate(self) -> _EventSet:
        s = _EventSet()
        self.event_sets.append(s)
        return s

    def nvmlDeviceRegisterEvents(self, h: _Handle, event_types: int, s: _EventSet) -> None:
        assert event_types & 0x8  # nvmlEventTypeXidCriticalError
        s.devices.add(h.device)

    def nvmlEventSetWait_v2(self, s: _EventSet, timeout_ms: int) -> _EventData:
        pending = [e for e in self.rec.get("xid_events", []) if e["device"] in s.devices]
        if s.delivered >= len(pending):
            raise NVMLError(10)
        e = pending[s.delivered]
        s.delivered += 1
        return _EventData(device=_Handle(e["device"]), eventType=0x8, eventData=e["xid"])

    def nvmlEventSetFree(self, s: _EventSet) -> None:
        s.freed = True


class NotSupportedMigNvml(FakeNvml):
    """A GPU without MIG (V100, L4): nvmlDeviceGetMigMode raises NotSupported."""

    def nvmlDeviceGetMigMode(self, h: _Handle) -> list[int]:
        raise NVMLError(3)
