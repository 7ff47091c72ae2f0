"""probe_nvml() against recorded NVML answers replayed by a hand-written fake pynvml."""

from __future__ import annotations

import builtins

import pytest
from raygpu.testing.nvml_recordings import (
    A100_MIG_NODE,
    A100_MIG_UNNAMED,
    GPU_LOST,
    H100_NODE,
    NO_DRIVER,
    NO_LIBRARY,
    FakeNvml,
    NotSupportedMigNvml,
)

from raygpu.adapters.nvml import mig_profile, probe_nvml
from raygpu.model.views import NvmlView

MiB = 2**20

# recording -> (available, devices, gpu_units, first device name, driver, cuda)
SUMMARY = [
    ("8 x H100", FakeNvml(H100_NODE), (True, 8, 8, "NVIDIA H100 80GB HBM3", "535.129.03", "12.2")),
    ("A100 with MIG 3g.40gb x2", FakeNvml(A100_MIG_NODE), (True, 1, 2, "NVIDIA A100-SXM4-80GB", "550.54.15", "12.4")),
    ("GPU without MIG support", NotSupportedMigNvml(H100_NODE), (True, 8, 8, "NVIDIA H100 80GB HBM3", "535.129.03", "12.2")),
    ("no libnvidia-ml", FakeNvml(NO_LIBRARY), (False, 0, 0, None, None, None)),
    ("driver not loaded", FakeNvml(NO_DRIVER), (False, 0, 0, None, None, None)),
    ("GPU lost mid-read", FakeNvml(GPU_LOST), (False, 0, 0, None, "535.129.03", "12.2")),
]


@pytest.mark.parametrize("name, fake, expected", SUMMARY, ids=[c[0] for c in SUMMARY])
def test_summary(name, fake, expected):
    v = probe_nvml("node-a", nvml=fake)
    first = v.devices[0].name if v.devices else None
    assert (v.available, len(v.devices), v.gpu_units, first, v.driver_version, v.cuda_version) == expected


REASONS = [
    ("no libnvidia-ml", NO_LIBRARY, "NVML unavailable: NVML Shared Library Not Found"),
    ("driver not loaded", NO_DRIVER, "NVML unavailable: Driver Not Loaded"),
    ("GPU lost", GPU_LOST, "NVML unavailable: device 3: GPU is lost"),
]


@pytest.mark.parametrize("name, recording, reason", REASONS, ids=[c[0] for c in REASONS])
def test_unavailable_reason_is_nvml_own_message(name, recording, reason):
    assert probe_nvml("node-a", nvml=FakeNvml(recording)).reason == reason


def test_h100_uuids_memory_and_indexes():
    v = probe_nvml("node-a", nvml=FakeNvml(H100_NODE))
    assert [d.index for d in v.devices] == list(range(8))
    assert all(d.uuid.startswith("GPU-") and d.memory_total_bytes == 81559 * MiB and not d.mig_enabled for d in v.devices)
    assert len({d.uuid for d in v.devices}) == 8


MIG = [
    ("profile from the device name", A100_MIG_NODE),
    ("profile from memory (old driver names)", A100_MIG_UNNAMED),
]


@pytest.mark.parametrize("name, recording", MIG, ids=[c[0] for c in MIG])
def test_mig_instances(name, recording):
    (dev,) = probe_nvml("node-a", nvml=FakeNvml(recording)).devices
    assert dev.mig_enabled
    assert [(m.uuid[:4], m.profile, m.memory_total_bytes) for m in dev.mig_devices] == [("MIG-", "3g.40gb", 40192 * MiB)] * 2


PROFILES = [
    ("name wins", "NVIDIA H100 80GB HBM3 MIG 1g.10gb", 10 * 2**30, 80 * 2**30, "1g.10gb"),
    ("media extension kept", "NVIDIA H100 80GB HBM3 MIG 1g.10gb+me", 10 * 2**30, 80 * 2**30, "1g.10gb+me"),
    ("A100-80 1/8 memory", None, 9728 * MiB, 81920 * MiB, "1g.10gb"),
    ("A100-80 2/8 memory", None, 19968 * MiB, 81920 * MiB, "2g.20gb"),
    ("A100-80 half memory", None, 40192 * MiB, 81920 * MiB, "3g.40gb"),
    ("A100-80 all memory", None, 80 * 2**30, 81920 * MiB, "7g.80gb"),
    ("A100-40 half memory", None, 20 * 2**30, 40 * 2**30, "3g.20gb"),
    ("H100 NVL 1/8 memory", None, 11 * 2**30, 95830 * MiB, "1g.12gb"),
]


@pytest.mark.parametrize("name, dev_name, mem, parent, profile", PROFILES, ids=[c[0] for c in PROFILES])
def test_mig_profile(name, dev_name, mem, parent, profile):
    assert mig_profile(dev_name, mem, parent) == profile


def test_shutdown_follows_every_successful_init():
    fake = FakeNvml(GPU_LOST)
    probe_nvml("node-a", nvml=fake)
    assert (fake.inits, fake.shutdowns) == (1, 1)


def test_failed_init_is_not_shut_down():
    fake = FakeNvml(NO_DRIVER)
    probe_nvml("node-a", nvml=fake)
    assert (fake.inits, fake.shutdowns) == (0, 0)


def test_missing_pynvml_is_a_reason_not_an_exception(monkeypatch):
    real_import = builtins.__import__

    def no_pynvml(name, *args, **kwargs):
        if name == "pynvml":
            raise ImportError("No module named 'pynvml'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_pynvml)
    v = probe_nvml("node-a")
    assert (v.available, v.reason) == (False, "NVML unavailable: pynvml not installed (No module named 'pynvml')")


def test_a_broken_binding_never_raises():
    class Broken(FakeNvml):
        def nvmlDeviceGetCount(self):
            raise AttributeError("nvmlDeviceGetCount")

    v = probe_nvml("node-a", nvml=Broken(H100_NODE))
    assert isinstance(v, NvmlView) and v.reason == "NVML unavailable: nvmlDeviceGetCount"


def test_probe_feeds_the_doctor():
    """A driver-not-loaded probe on a GPU node makes a kernel-driver finding, end to end."""
    from raygpu.testing.builders.snapshots import NOW_S, snap

    from raygpu.model.findings import Layer
    from raygpu.plan.doctor.reconcile import reconcile

    b = snap().gpu_node("n1", 0).ray_pod("p1", "n1").ray_node("r1", "p1")
    b.nvml_views["r1"] = probe_nvml("r1", nvml=FakeNvml(NO_DRIVER))
    report = reconcile(b.obj(), NOW_S)
    assert report.findings[0].layer is Layer.KERNEL_DRIVER
