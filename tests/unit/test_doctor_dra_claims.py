"""GPUs a pod gets through DRA ResourceClaims count as given: Ray vs pod compares against limits + claims.

A Ray worker whose GPUs come only from a ResourceClaim (no ``nvidia.com/gpu`` limit) was reported as
``phantom-gpus`` (Ray counts 8, "the pod was given 0"). One case per line of the decision.
"""

from __future__ import annotations

from raygpu.testing.builders.dra import claim, gpu_slice, with_dra
from raygpu.testing.builders.snapshots import NOW_S, snap

from raygpu.model.findings import FindingKind, Severity
from raygpu.model.views import ResourceSliceView
from raygpu.plan.doctor.checks_index import SnapshotIndex
from raygpu.plan.doctor.reconcile import reconcile

NV = "gpu.nvidia.com"
SLICES = [gpu_slice("n1", 8)]


def ray_on_claims(num_gpus: float | None = 8, ray_gpus: float = 8, *, limit: float = 0, node_gpus: float = 0,
                  nvml: int | None = None):
    """Node n1 (GFD labels; ``node_gpus`` of nvidia.com/gpu) and Ray worker p1 there, Ray counting ``ray_gpus``."""
    b = snap().gpu_node("n1", node_gpus).ray_pod("p1", "n1", limit, num_gpus=num_gpus).ray_node("r1", "p1", ray_gpus)
    if nvml is not None:
        b = b.nvml("r1", nvml)
    return b.obj()


def found(s, kind: FindingKind | None = None):
    return [f for f in reconcile(s, NOW_S).findings if kind is None or f.kind is kind]


def row(s):
    return reconcile(s, NOW_S).rows[0]


def test_claim_only_pod_with_all_its_gpus_counted_by_ray_is_healthy():
    s = with_dra(ray_on_claims(), SLICES, claims=[claim("c1", "n1", *range(8), pods=("p1",))])
    assert found(s) == []
    assert (row(s).ray_gpus, row(s).pod_gpus) == (8, 8)


def test_claim_only_pod_given_fewer_gpus_than_ray_counts_is_phantom_and_names_the_claim():
    s = with_dra(ray_on_claims(), SLICES, claims=[claim("c1", "n1", 0, 1, 2, 3, pods=("p1",))])
    (f,) = found(s)
    assert (f.kind, f.severity, f.evidence.ray, f.evidence.pod) == (FindingKind.PHANTOM_GPUS, Severity.CRITICAL, 8, 4)
    assert f.message == "Ray counts 8 GPUs on p1 but the pod was given 4 (no GPU limit; claim c1: 4)"
    assert f"ResourceClaim c1: 4 GPU devices ({NV})" in f.evidence.facts
    assert "num-gpus of group gpu-group to 4" in f.remedy


def test_claim_and_limit_are_summed():
    # 4 GPUs from the device plugin's nvidia.com/gpu limit, 4 more through a claim: 8 given
    s = with_dra(ray_on_claims(limit=4, node_gpus=4), [gpu_slice("n1", 4, first=4)],
                 claims=[claim("c1", "n1", 4, 5, 6, 7, pods=("p1",))])
    assert found(s, FindingKind.PHANTOM_GPUS) == found(s, FindingKind.STRANDED_GPUS) == []
    assert row(s).pod_gpus == 8
    more = with_dra(ray_on_claims(num_gpus=12, ray_gpus=12, limit=4, node_gpus=4), [gpu_slice("n1", 4, first=4)],
                    claims=[claim("c1", "n1", 4, 5, 6, 7, pods=("p1",))])
    (f,) = found(more, FindingKind.PHANTOM_GPUS)
    assert f.evidence.pod == 8 and "nvidia.com/gpu=4; claim c1: 4" in f.message


def test_claim_reserved_for_another_pod_or_namespace_is_not_counted():
    for c in (claim("c1", "n1", *range(8), pods=("p2",)), claim("c1", "n1", *range(8), pods=("p1",), namespace="x"),
              claim("c1", "n1", *range(8))):  # reserved for no pod yet
        (f,) = found(with_dra(ray_on_claims(), SLICES, claims=[c]))
        assert (f.kind, f.evidence.pod) == (FindingKind.PHANTOM_GPUS, 0)
        assert f.message.endswith("was given 0 (no GPU limit)")


def test_non_gpu_dra_devices_are_not_counted():
    vfio = gpu_slice("n1", 8, type_="vfio")  # passthrough to a VM: no container GPU
    channels = gpu_slice("n1", 8, driver="compute-domain.nvidia.com", name="imex")  # IMEX channels
    for slices, c in (([vfio], claim("c1", "n1", *range(8), pods=("p1",))),
                      ([channels], claim("c1", "n1", *range(8), pods=("p1",), driver="compute-domain.nvidia.com"))):
        (f,) = found(with_dra(ray_on_claims(), slices, claims=[c]), FindingKind.PHANTOM_GPUS)
        assert f.evidence.pod == 0


def test_without_readable_claims_the_report_is_as_before():
    unread = with_dra(ray_on_claims(), SLICES)  # resource_claims None: not served or not readable
    assert unread.k8s.resource_claims is None
    before = reconcile(unread, NOW_S)
    (f,) = before.findings
    assert (f.kind, f.evidence.pod, before.rows[0].pod_gpus) == (FindingKind.PHANTOM_GPUS, 0, 0)
    assert SnapshotIndex.build(unread).claim_gpus == {}
    assert reconcile(with_dra(unread, claims=[]), NOW_S) == before  # no claim at all: the same report


def test_shared_claim_counts_for_each_reserving_pod():
    # every consumer of a shared claim can use all of its devices, as each pod's Ray node counts them
    s = snap().gpu_node("n1", 0).ray_pod("p1", "n1", num_gpus=2).ray_node("r1", "p1", 2) \
        .ray_pod("p2", "n1", num_gpus=2).ray_node("r2", "p2", 2).obj()
    s = with_dra(s, SLICES, claims=[claim("shared", "n1", 0, 1, pods=("p1", "p2"))])
    assert found(s) == []
    assert row(s).pod_gpus == 4 == row(s).ray_gpus


def test_a_device_reached_through_two_claims_counts_once():
    s = with_dra(ray_on_claims(), SLICES, claims=[claim("a", "n1", *range(8), pods=("p1",)),
                                                  claim("b", "n1", 0, pods=("p1",))])
    assert found(s) == []
    assert SnapshotIndex.build(s).claim_gpus[("default", "p1")].facts() == (
        f"ResourceClaim a: 8 GPU devices ({NV})", f"ResourceClaim b: 1 GPU device ({NV})")


def test_claim_made_for_a_gpu_limit_is_not_counted_twice():
    # KEP-5004: nvidia.com/gpu: 8 served by DRA; the scheduler's claim holds the same 8 GPUs the limit counts
    s = with_dra(ray_on_claims(num_gpus=None, limit=8), SLICES,
                 claims=[claim("p1-extended-resources-0", "n1", *range(8), pods=("p1",), extended=True)])
    assert found(s) == []
    assert row(s).pod_gpus == 8


def test_claim_only_pod_ray_does_not_count_is_stranded_and_says_why():
    s = with_dra(ray_on_claims(num_gpus=None, ray_gpus=0), SLICES, claims=[claim("c1", "n1", *range(8), pods=("p1",))])
    (f,) = found(s)
    assert (f.kind, f.severity, f.evidence.pod, f.evidence.ray) == (FindingKind.STRANDED_GPUS, Severity.CRITICAL, 8, 0)
    assert "KubeRay derives num-gpus from container limits only, not from ResourceClaims" in f.evidence.facts


def test_nvml_seeing_the_claims_gpus_is_no_container_mismatch():
    s = with_dra(ray_on_claims(nvml=8), SLICES, claims=[claim("c1", "n1", *range(8), pods=("p1",))])
    assert found(s) == []


def test_orphan_claim_pod_holds_gpus():
    s = snap().gpu_node("n1", 0).ray_pod("p1", "n1", num_gpus=8, created_at_s=0).ray_node("r0", "other", 0).obj()
    s = with_dra(s, SLICES, claims=[claim("c1", "n1", *range(8), pods=("p1",))])
    (f,) = found(s, FindingKind.ORPHAN_POD)
    assert (f.severity, f.evidence.pod) == (Severity.CRITICAL, 8)


def test_device_of_no_listed_slice_is_judged_by_driver_and_name():
    bare = ResourceSliceView(name="n1", node_name="n1", driver=NV, device_count=8)  # devices not read
    s = with_dra(ray_on_claims(), [bare], claims=[claim("c1", "n1", *range(8), pods=("p1",))])
    assert found(s, FindingKind.PHANTOM_GPUS) == []
