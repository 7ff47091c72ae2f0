"""reconcile() on seeded random snapshots decides exactly as the recorded reports say (issue 10: faster, not different).

The golden files of ``golden_decisions.py`` hold the table tests' snapshots and the benchmark's regular
ones; these are irregular on purpose, to reach the corners a fused, faster index could get wrong: two pods
or two nodes of one name, terminated pods next to live ones, requests != limits, a request without cpu,
GPU values of 0, MIG slices and shares, allocatable != capacity, nodes that are in no view, pods bound to
a node the snapshot lacks, Ray nodes without an instance id or with a fractional load, NVML views that are
down (driver, library, other) or show MIG, other RayClusters, pending pods and placement groups.

``tests/unit/golden/reconcile_random.jsonl.gz`` was written by the implementation before the speed-up
(one line per seed: the canonical report). Regenerate ONLY for an intended behaviour change:

    .venv/bin/python -m tests.unit.test_reconcile_random
"""

from __future__ import annotations

import gzip
import json
import random
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from golden_decisions import canon  # noqa: E402

from raygpu.model.views import (  # noqa: E402
    DevicePluginPod,
    K8sNodeView,
    K8sPodView,
    K8sView,
    MigDeviceView,
    NvmlDeviceView,
    NvmlView,
    PgState,
    PlacementGroupView,
    RayNodeView,
    RayView,
    ResourceSliceView,
    Snapshot,
    Taint,
    Toleration,
)
from raygpu.plan.doctor.reconcile import reconcile  # noqa: E402

GOLDEN = Path(__file__).parent / "golden" / "reconcile_random.jsonl.gz"
SEEDS = range(400)
NOW_S = 10_000.0
GiB = 2**30
GPU_NAMES = ("nvidia.com/gpu", "nvidia.com/mig-3g.40gb", "nvidia.com/mig-1g.10gb", "nvidia.com/gpu.shared")
REASONS = ("NVML unavailable: Driver Not Loaded", "NVML unavailable: NVML Shared Library Not Found",
           "NVML unavailable: Unknown Error", None)


def _resources(r: random.Random, gpu_max: int = 8) -> dict[str, float]:
    out: dict[str, float] = {}
    if r.random() < 0.9:
        out["cpu"] = float(r.choice((0, 1, 4, 8, 16, 96)))
    if r.random() < 0.9:
        out["memory"] = float(r.choice((0, 8, 64, 512))) * GiB
    for name in r.sample(GPU_NAMES, r.choice((0, 1, 1, 1, 2))):
        out[name] = float(r.choice((0, 1, 2, 4, gpu_max, 0.5)) if "mig" not in name else r.choice((0, 1, 2, 7)))
    if r.random() < 0.3:
        out["pods"] = 110.0
    if r.random() < 0.1:
        out["example.com/fpga"] = 1.0
    return out


def _node(r: random.Random, name: str) -> K8sNodeView:
    cap = _resources(r)
    alloc = dict(cap)
    if r.random() < 0.3:
        for k in list(alloc):
            if r.random() < 0.5:
                alloc[k] = r.choice((0.0, alloc[k] / 2, alloc[k]))
        if r.random() < 0.2 and alloc:
            del alloc[r.choice(list(alloc))]
    labels = {}
    if r.random() < 0.6:
        labels["nvidia.com/gpu.product"] = r.choice(("NVIDIA-H100-80GB-HBM3", "NVIDIA-A100-SXM4-80GB-MIG-3g.40gb"))
    if r.random() < 0.3:
        labels["nvidia.com/gpu.count"] = r.choice(("8", "0", "x"))
    if r.random() < 0.3:
        labels["nvidia.com/mig.strategy"] = r.choice(("single", "mixed", "none"))
    if r.random() < 0.3:
        labels["pool"] = r.choice(("a", "b"))
    taints = (Taint(key="dedicated", value="x", effect=r.choice(("NoSchedule", "PreferNoSchedule"))),) \
        if r.random() < 0.25 else ()
    return K8sNodeView(name=name, labels=labels, capacity=cap, allocatable=alloc, taints=taints,
                       unschedulable=r.random() < 0.1)


def _pod(r: random.Random, name: str, node_names: list[str]) -> K8sPodView:
    req = _resources(r)
    lim = dict(req)
    if r.random() < 0.25:
        lim = _resources(r)
    if r.random() < 0.1:
        req.pop("cpu", None)
    ray_type = r.choice((None, "worker", "worker", "worker", "head"))
    return K8sPodView(
        name=name, namespace=r.choice(("ns", "ns", "other")), uid=f"u-{r.random()}",
        node_name=r.choice([*node_names, None, None, "nowhere"]) if node_names else r.choice((None, "nowhere")),
        phase=r.choice(("Pending", "Running", "Running", "Running", "Succeeded", "Failed", "Unknown")),
        deleting=r.random() < 0.1,
        requests=req, limits=lim,
        tolerations=(Toleration(key="dedicated", operator="Exists"),) if r.random() < 0.2 else (),
        node_selector={"pool": "a"} if r.random() < 0.2 else {},
        created_at_s=r.choice((0.0, NOW_S - 60, NOW_S)),
        ray_cluster=r.choice((None, "rc", "rc", "rc", "other")) if ray_type or r.random() < 0.5 else None,
        ray_group=r.choice(("gpu", "small", None)) if ray_type != "head" else None,
        ray_node_type=ray_type,
        ray_start_num_gpus=r.choice((None, None, 0.0, 2.0, 8.0)),
    )


def _nvml(r: random.Random, node_id: str) -> NvmlView:
    reason = r.choice(REASONS)
    if reason is not None and r.random() < 0.3:
        return NvmlView(node_id=node_id, available=False, reason=reason)
    devices = []
    for i in range(r.choice((0, 1, 2, 4, 8))):
        mig = r.random() < 0.15
        migs = tuple(MigDeviceView(uuid=f"MIG-{node_id}-{i}-{j}", profile=r.choice(("3g.40gb", "1g.10gb")))
                     for j in range(r.choice((0, 1, 2, 3)) if mig else 0))
        devices.append(NvmlDeviceView(index=i, uuid=f"GPU-{node_id}-{i}", name="NVIDIA H100", memory_total_bytes=80 * GiB,
                                      mig_enabled=mig, mig_devices=migs))
    return NvmlView(node_id=node_id, available=True, devices=tuple(devices))


def random_snapshot(seed: int) -> Snapshot:
    """One irregular snapshot, the same for the same seed (nothing else is random)."""
    r = random.Random(seed)
    node_names = [f"n{i}" for i in range(r.choice((0, 1, 3, 6)))]
    nodes = [_node(r, name) for name in node_names]
    if nodes and r.random() < 0.15:
        nodes.append(_node(r, r.choice(node_names)))  # two nodes of one name: the last one counts
    pod_names = [f"p{i}" for i in range(r.choice((0, 2, 5, 10)))]
    pods = [_pod(r, name, node_names) for name in pod_names]
    for _ in range(r.choice((0, 0, 1, 2))):
        if pod_names:
            pods.append(_pod(r, r.choice(pod_names), node_names))  # a second pod of one name
    r.shuffle(pods)
    ray_nodes, nvml = [], {}
    for i in range(r.choice((0, 2, 6, 12))):
        node_id = f"r{i}"
        total = {"CPU": 8.0}
        gpu = r.choice((0.0, 0.0, 1.0, 2.0, 4.0, 8.0, 0.5))
        if gpu:
            total["GPU"] = gpu
        if r.random() < 0.15:
            total[r.choice(("mig-3g.40gb", "migration", "accelerator_type:H100"))] = 1.0
        avail = dict(total)
        if gpu and r.random() < 0.5:
            avail["GPU"] = r.choice((0.0, gpu / 2, gpu - 0.25, gpu))
        ray_nodes.append(RayNodeView(
            node_id=node_id, alive=r.random() < 0.85, is_head=i == 0,
            instance_id=r.choice([*pod_names, *pod_names, None, "ghost"]) if pod_names else r.choice((None, "ghost")),
            labels={"shape": "mps"} if r.random() < 0.1 else {}, total=total, available=avail))
        if r.random() < 0.7:
            nvml[node_id] = _nvml(r, node_id)
    dp = tuple(DevicePluginPod(name=f"dp-{n}-{k}", namespace="gpu-operator", node_name=n, ready=r.random() < 0.6)
               for n in node_names for k in range(r.choice((0, 1, 1, 2))))
    slices = None if r.random() < 0.7 else tuple(
        ResourceSliceView(name=f"rs-{n}", node_name=n, driver="gpu.nvidia.com", device_count=r.choice((0, 8)))
        for n in node_names if r.random() < 0.5)
    pgs = tuple(PlacementGroupView(pg_id=f"pg{i}", state=r.choice((PgState.PENDING, PgState.CREATED)),
                                   bundles=({"GPU": r.choice((0.5, 1.0, 4.0)), "CPU": 1.0},) * r.choice((1, 2)))
                for i in range(r.choice((0, 0, 1, 3))))
    return Snapshot(
        taken_at_s=NOW_S, cluster=r.choice(("rc", "rc", None)), namespace="ns",
        ray=RayView(reachable=r.random() < 0.95, nodes=tuple(ray_nodes), placement_groups=pgs),
        k8s=K8sView(nodes=tuple(nodes), pods=tuple(pods), device_plugin_pods=dp, resource_slices=slices),
        nvml=nvml,
    )


def report_of(seed: int) -> dict:
    snapshot = random_snapshot(seed)
    grace = (0.0, 120.0)[seed % 2]
    return canon(reconcile(snapshot, NOW_S, orphan_grace_s=grace, include_pending_pgs=seed % 3 != 0))


def _load() -> list[dict]:
    with gzip.open(GOLDEN, "rt") as f:
        return [json.loads(line) for line in f if line.strip()]


def test_the_random_snapshots_reach_the_corners():
    """The generator is worth its golden file: the reports hold findings of most kinds, rows and stranded GPUs."""
    cases = _load()
    assert [c["seed"] for c in cases] == list(SEEDS)
    kinds = {f["kind"] for c in cases for f in c["report"].get("findings", [])}
    assert len(kinds) >= 9, kinds
    assert sum(bool(c["report"].get("rows")) for c in cases) > len(cases) // 2
    stranded = [n for c in cases for n in c["report"].get("stranded", {}).get("nodes", [])]
    assert any(n.get("fragment_gpus") for n in stranded) and any(n.get("cpu_memory_gpus") for n in stranded)
    assert any(n.get("integer_model_gpus") for n in stranded)


@pytest.mark.parametrize("case", _load() if GOLDEN.exists() else [], ids=lambda c: f"seed{c['seed']}")
def test_reconcile_decides_as_recorded(case):
    # compared as JSON text, so that 8 and 8.0 differ
    want, have = (json.dumps(x, indent=1, sort_keys=True) for x in (case["report"], report_of(case["seed"])))
    assert have == want


def main() -> None:
    lines = [json.dumps({"seed": s, "report": report_of(s)}, sort_keys=True) for s in SEEDS]
    with open(GOLDEN, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0, filename="") as f:
        f.write(("\n".join(lines) + "\n").encode())
    print(f"wrote {len(lines)} cases to {GOLDEN}")


if __name__ == "__main__":
    main()
