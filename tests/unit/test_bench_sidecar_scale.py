"""bench_sidecar_scale's report from a run's raw result (the run itself needs the testbed:
tests/integration/test_sidecar_scale.py)."""

from __future__ import annotations

import json

from benchmarks.bench_sidecar_scale import render, summarize


def raw(to_delete: list[str], peak_kib: int) -> dict:
    cycle = {"outcome": "dry-run", "mode": "dry-run", "error": None, "wall_s": 0.5, "cpu_s": 0.3,
             "process_cpu_s": 0.31, "decisions": {"delete/Idle": 1, "keep/Head": 1, "keep/NotIdleLongEnough": 1},
             "to_delete": to_delete, "freed_k8s_nodes": 1, "reclaimable_gpus": 4.0}
    return {"params": {"nodes": 2, "pods": 2, "idle_every": 2, "idle_s": 3600.0, "gpus_per_pod": 4, "threads": 8,
                       "ray_imports": True, "sidecar_timeout_s": 900.0},
            "setup": {"create_nodes_s": 1.0, "nodes_ready_s": 2.0, "create_pods_s": 1.0, "pods_running_s": 2.0},
            "sidecar": {"exit_code": 0, "synced": True, "import_s": 1.0, "sync_s": 0.2, "pods_in_cache": 3,
                        "ray_nodes": 3, "list_calls": {"raycluster": 1, "pods": 1, "reservations": 1},
                        "cycle": cycle, "rss_kib": {"start": 40000, "imported": 80000, "synced": 90000,
                                                    "cycle": 91000}, "peak_rss_kib": peak_kib, "log": "x.log"},
            "expected": {"idle": ["rc-gpu-worker-00000"], "busy": ["rc-gpu-worker-00001"], "head": "rc-head"},
            "after": {"pods": 3, "raycluster_resource_version_unchanged": True, "raycluster_replicas": 2,
                      "workers_to_delete": 0, "events": ["ScaleDownDryRun"]},
            "load_avg": [1.0, 1.5, 2.0]}


def test_report_says_whether_the_plan_and_the_memory_were_as_asked():
    good = summarize(raw(["rc-gpu-worker-00000"], 100 * 1024))
    assert good["plan_as_expected"] and good["within_bound"] and good["peak_rss_mib"] == 100.0
    assert "to_delete" not in good["cycle"] and good["planned_deletions"] == 1
    json.dumps(good)  # --json prints it
    text = render(good, "shared box")
    assert "peak RSS (VmHWM) 100.0 MiB: within the issue's 500 MiB" in text and "note: shared box" in text
    assert "exactly the idle workers: yes" in text and "load avg" in text

    bad = summarize(raw(["rc-gpu-worker-00001"], 600 * 1024))
    assert not bad["plan_as_expected"] and not bad["within_bound"]
    assert "OVER the issue's 500 MiB" in render(bad, None) and "exactly the idle workers: NO" in render(bad, None)
