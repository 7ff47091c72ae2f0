"""Stranded-GPU arithmetic: (a) integer model, (b) CPU/memory exhaustion, (c) fragments."""

from __future__ import annotations

import pytest
from raygpu.testing.builders.snapshots import GiB, NOW_S, healthy, snap

from raygpu.model.raycluster import GroupTemplate
from raygpu.model.views import PgState
from raygpu.plan.doctor.reconcile import reconcile
from raygpu.plan.doctor.stranded import stranded_gpus

MIG = "nvidia.com/mig-3g.40gb"
BIG_CPU = GroupTemplate(group_name="gpu-group", requests={"cpu": 64, "memory": 64 * GiB}, limits={"nvidia.com/gpu": 4})
HEAD = GroupTemplate(group_name="head", is_head=True, requests={"cpu": 1})

# Cluster totals:                                                                                          free  int.  cpu/mem frag
CASES = [
    ("healthy, full", healthy(), {}, (0, 0, 0, 0)),
    ("free GPUs, nothing pending: idle, not stranded", snap().gpu_node("n1").worker("p1", "n1", 4), {}, (4, 0, 0, 0)),
    ("(a) 0.5 GPU used by fractional tasks", snap().gpu_node("n1").ray_pod("p1", "n1", 8).ray_node("r1", "p1", 8, available=7.5), {}, (0, 0.5, 0, 0)),
    ("(a) 1.75 used leaves 0.25", snap().gpu_node("n1").ray_pod("p1", "n1", 8).ray_node("r1", "p1", 8, available=6.25), {}, (0, 0.25, 0, 0)),
    ("(a) whole-GPU use leaves nothing", snap().gpu_node("n1").ray_pod("p1", "n1", 8).ray_node("r1", "p1", 8, available=6), {}, (0, 0, 0, 0)),
    ("(a) two pods, remainders add", snap().gpu_node("n1").ray_pod("p1", "n1", 4).ray_node("r1", "p1", 4, available=3.5).ray_pod("p2", "n1", 4).ray_node("r2", "p2", 4, available=3.75), {}, (0, 1.25, 0, 0)),
    ("(b) CPU gone, 4 GPUs free", snap().gpu_node("n1", cpu=16).worker("p1", "n1", 4, cpu=16), {}, (4, 0, 4, 0)),
    ("(b) memory gone, 4 GPUs free", snap().gpu_node("n1", memory_gib=128).worker("p1", "n1", 4, memory_gib=128), {}, (4, 0, 4, 0)),
    ("(b) non-Ray pod ate the CPU", snap().gpu_node("n1", cpu=16).worker("p1", "n1", 4, cpu=8).other_pod("etl", "n1", cpu=8), {}, (4, 0, 4, 0)),
    ("(b) template bigger than pods", snap().gpu_node("n1", cpu=64).worker("p1", "n1", 4), {"templates": (HEAD, BIG_CPU)}, (4, 0, 4, 0)),
    ("(b) CPU left: not stranded", snap().gpu_node("n1", cpu=32).worker("p1", "n1", 4, cpu=16), {}, (4, 0, 0, 0)),
    ("(c) 2 free, pending pod wants 4", snap().gpu_node("n1").worker("p1", "n1", 6).ray_pod("p2", None, 4), {}, (2, 0, 0, 2)),
    ("(c) 4 free, pending pod wants 4: fits", snap().gpu_node("n1").worker("p1", "n1", 4).ray_pod("p2", None, 4), {}, (4, 0, 0, 0)),
    ("(c) smallest pending request decides", snap().gpu_node("n1").worker("p1", "n1", 6).ray_pod("p2", None, 8).ray_pod("p3", None, 2), {}, (2, 0, 0, 0)),
    ("(c) pending PG bundle wants 4", snap().gpu_node("n1").worker("p1", "n1", 6).pg("pg1", 4, 4), {}, (2, 0, 0, 2)),
    ("(c) PG bundles ignored on request", snap().gpu_node("n1").worker("p1", "n1", 6).pg("pg1", 4, 4), {"include_pending_pgs": False}, (2, 0, 0, 0)),
    ("(c) created PG is no demand", snap().gpu_node("n1").worker("p1", "n1", 6).pg("pg1", 4, state=PgState.CREATED), {}, (2, 0, 0, 0)),
    ("(c) fractional bundle rounds up to 1", snap().gpu_node("n1").worker("p1", "n1", 7).pg("pg1", 0.5), {}, (1, 0, 0, 0)),
    ("(c) other resource's demand does not fragment", snap().gpu_node("n1", 2, resource=MIG).ray_pod("p2", None, 4), {}, (2, 0, 0, 0)),
    ("(c) before (b): a fragment whatever the CPU", snap().gpu_node("n1", cpu=16).worker("p1", "n1", 6, cpu=16).ray_pod("p2", None, 4), {}, (2, 0, 0, 2)),
    ("(b) only for shapes the free GPUs could take", snap().gpu_node("n1", cpu=16).worker("p1", "n1", 6, cpu=16), {}, (2, 0, 0, 0)),
    ("(b): GPUs enough, CPU gone", snap().gpu_node("n1", cpu=16).worker("p1", "n1", 4, cpu=16).ray_pod("p2", None, 4), {}, (4, 0, 4, 0)),
    ("two nodes add up", snap().gpu_node("n1").worker("p1", "n1", 6).gpu_node("n2").worker("p2", "n2", 7).ray_pod("p3", None, 4), {}, (3, 0, 0, 3)),
]


@pytest.mark.parametrize("name, builder, kwargs, totals", CASES, ids=[c[0] for c in CASES])
def test_cluster_totals(name, builder, kwargs, totals):
    r = stranded_gpus(builder.obj(), **kwargs)
    assert (r.free_gpus, r.integer_model_gpus, r.cpu_memory_gpus, r.fragment_gpus) == pytest.approx(totals)


def test_per_node_rows_and_reasons():
    r = stranded_gpus(snap().cpu_node("c1").gpu_node("n1").worker("p1", "n1", 6).gpu_node("n2").ray_pod("p9", None, 4).obj())
    assert [(n.node, n.free_gpus, n.fragment_gpus) for n in r.nodes] == [("n1", 2, 2), ("n2", 8, 0)]
    assert r.nodes[0].reasons == ("2 nvidia.com/gpu free, smallest pending request is 4",)
    assert r.smallest_pending_gpus == {"nvidia.com/gpu": 4}


def test_cpu_reason_names_the_short_resource():
    r = stranded_gpus(snap().gpu_node("n1", cpu=16).worker("p1", "n1", 4, cpu=16).obj())
    assert "cpu (free 0)" in r.nodes[0].reasons[0] and "memory" not in r.nodes[0].reasons[0]


def test_stranded_total_property_sums_causes():
    r = stranded_gpus(snap().gpu_node("n1", cpu=16).worker("p1", "n1", 4, cpu=16).ray_node("r-p1", "p1", 4, available=3.5).obj())
    assert r.stranded_gpus == pytest.approx(4.5)


def test_reconcile_carries_the_stranded_report_without_findings():
    report = reconcile(snap().gpu_node("n1").worker("p1", "n1", 6).ray_pod("p2", None, 4).obj(), NOW_S)
    assert report.findings == () and report.stranded.fragment_gpus == 2
