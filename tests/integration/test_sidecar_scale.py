"""Issue 10 (5), small: the sidecar scale run (raygpu.testing.scale, as benchmarks/bench_sidecar_scale.py runs it)
on 200 kwok nodes and 400 Ray pods of one RayCluster, Ray's view synthesized from the pods.

The sidecar talks to the testbed's real API server with its real watch cache. What the run must show, whatever
the machine: one full sync (one LIST per kind, every pod in the cache), and one dry-run cycle that plans exactly
the idle workers for deletion and keeps every busy one and the head, writing nothing but its Event. Memory and
times are reported, never asserted (benchmarks measure them).
"""

from __future__ import annotations

import pytest
from raygpu.testing.scale import ScaleSpec, run_scale

pytestmark = pytest.mark.serial  # 2,000 nodes: it loads the whole testbed

NODES, PODS = 200, 400


def test_sidecar_scale_small(testbed, tmp_path):
    r = run_scale(testbed, ScaleSpec(nodes=NODES, pods=PODS), progress=lambda msg: print(msg, flush=True),
                  work_dir=tmp_path)
    side, cycle, expected = r["sidecar"], r["sidecar"]["cycle"], r["expected"]
    print({k: side[k] for k in ("sync_s", "peak_rss_kib", "rss_kib")}, {k: cycle[k] for k in ("wall_s", "cpu_s")},
          "load", r["load_avg"])
    log = f"(sidecar log: {side['log']})"
    assert side["exit_code"] == 0 and side["synced"], log
    assert side["list_calls"] == {"raycluster": 1, "pods": 1, "reservations": 1}, log  # one full sync, no resync
    assert side["pods_in_cache"] == side["ray_nodes"] == PODS + 1, log  # every worker and the head, each a Ray node

    # every other worker is idle for Ray (1 h > the 10 min default timeout): exactly those are planned, no other
    assert len(expected["idle"]) == len(expected["busy"]) == PODS // 2
    assert (cycle["outcome"], cycle["mode"]) == ("dry-run", "dry-run"), cycle
    assert sorted(cycle["to_delete"]) == sorted(expected["idle"]), log
    assert cycle["decisions"] == {"delete/Idle": PODS // 2, "keep/NotIdleLongEnough": PODS // 2, "keep/Head": 1}
    assert cycle["reclaimable_gpus"] == 4 * PODS // 2
    # worker i sits on node i % NODES, so both workers of a node share its state: the idle half frees whole nodes
    assert cycle["freed_k8s_nodes"] == NODES // 2

    # a dry run writes no patch (KubeRay, told the RayCluster is managed elsewhere, touched nothing either)
    after = r["after"]
    assert after["raycluster_resource_version_unchanged"] and after["raycluster_replicas"] == PODS, after
    assert after["workers_to_delete"] == 0 and after["pods"] == PODS + 1, after
    assert after["events"] == ["ScaleDownDryRun"], after

    # memory and times are reported (the kernel's count for the sidecar's own process)
    rss = side["rss_kib"]
    assert side["peak_rss_kib"] > 0 and all(0 < v <= side["peak_rss_kib"] for v in rss.values()), rss
    assert side["pid"] > 0 and side["sync_s"] > 0 and cycle["wall_s"] > 0 and cycle["cpu_s"] > 0
