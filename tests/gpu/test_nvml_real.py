"""The real NVML probe on this machine's GPUs. Skipped, with NVML's own reason, where there are none."""

from __future__ import annotations

import pytest

from raygpu.adapters.nvml import probe_nvml

pytestmark = pytest.mark.gpu


def _nvml_init_error() -> str | None:
    """None when nvmlInit works here, else why it does not (NVML's own message)."""
    try:
        import pynvml
    except ImportError as exc:
        return f"nvidia-ml-py is not installed: {exc}"
    try:
        pynvml.nvmlInit()
    except Exception as exc:  # NVMLError_LibraryNotFound, NVMLError_DriverNotLoaded, ...
        return f"{type(exc).__name__}: {exc}"
    pynvml.nvmlShutdown()
    return None


_INIT_ERROR = _nvml_init_error()
requires_gpu = pytest.mark.skipif(
    _INIT_ERROR is not None,
    reason=f"no NVIDIA GPU/driver on this machine (nvmlInit failed: {_INIT_ERROR})",
)


@requires_gpu
def test_probe_sees_this_machines_gpus():
    import pynvml

    view = probe_nvml("local")
    assert view.available, view.reason
    assert len(view.devices) > 0
    assert all(d.uuid.startswith("GPU-") for d in view.devices), [d.uuid for d in view.devices]
    pynvml.nvmlInit()
    try:
        assert len(view.devices) == pynvml.nvmlDeviceGetCount()
    finally:
        pynvml.nvmlShutdown()
    assert view.driver_version and view.cuda_version
    # A capture to replace the transcribed values in tests/unit/nvml_recordings.py.
    print(view.model_dump_json(indent=2))


def test_skip_reason_is_nvmls_own_message():
    """Where there is no GPU, the skip names the real NVML error, not a placeholder."""
    if _INIT_ERROR is None:
        pytest.skip("this machine has a GPU: nvmlInit succeeded")
    assert _INIT_ERROR and "nvmlInit failed" not in _INIT_ERROR
    assert probe_nvml("local").available is False


@requires_gpu
def test_probe_reads_memory_error_counters_and_watches_xids_on_a_real_gpu():
    """Health (issue 28): the ECC counters and row-remap or page-retirement state, each as NVML answers here
    (None where this GPU does not support the query), and a bounded XID wait that returns on time."""
    import time

    import pynvml

    t0 = time.monotonic()
    view = probe_nvml("local", xid_wait_ms=300)
    took_s = time.monotonic() - t0
    assert view.available, view.reason
    pynvml.nvmlInit()
    try:
        for d in view.devices:
            h = pynvml.nvmlDeviceGetHandleByIndex(d.index)
            assert d.health is not None
            try:
                ecc = pynvml.nvmlDeviceGetTotalEccErrors(h, pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
                                                         pynvml.NVML_VOLATILE_ECC)
            except pynvml.NVMLError:
                ecc = None
            assert d.health.ecc_volatile_uncorrected == ecc
            try:
                rows = pynvml.nvmlDeviceGetRemappedRows(h)
            except pynvml.NVMLError:
                rows = None
            assert (d.health.remap_pending is None) == (rows is None)
    finally:
        pynvml.nvmlShutdown()
    assert view.xid_wait_ms in (300, None)  # None: no GPU here supports XID events (MIG on)
    assert took_s < 30, f"the probe took {took_s:.1f} s with a 0.3 s XID wait"
    print(view.model_dump_json(indent=2))
