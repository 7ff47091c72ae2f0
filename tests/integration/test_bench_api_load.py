"""Issue 6 (5): the API-load benchmark runs on the testbed (``--quick``) and its output is well formed.

It checks what the numbers must say whatever the machine: both clients were
counted by the audit log, neither was denied anything, and the sidecar (a
cycle every 5 s) did not go to the API server once per cycle: its watch cache
answers. Never a speed.
"""

from __future__ import annotations

import pytest
import json
import subprocess
import sys
from pathlib import Path

pytestmark = pytest.mark.serial  # measures the API server's load: nothing else may run

ROOT = Path(__file__).resolve().parents[2]


def test_api_load_quick(testbed):
    out = subprocess.run([sys.executable, "-m", "benchmarks.bench_api_load", "--quick", "--json", "--no-plot"],
                         capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-4000:]
    result = json.loads(out.stdout)
    assert result["benchmark"] == "api_load" and result["machine"]["cpu_count"] >= 1
    side, ray = result["rows"]
    assert (side["client"], ray["client"]) == ("raygpu sidecar", "Ray autoscaler")
    assert side["denied"] == ray["denied"] == 0, result["rows"]
    assert side["startup_requests"] > 0  # its LISTs and WATCHes: it was counted
    cycles = result["params"]["window_s"] / result["params"]["sidecar_interval_s"]
    assert side["requests"] < cycles, side  # no request per cycle at steady state
    assert ray["requests"] > 0 and ray["per_min"] > 0, ray  # Ray's provider reads the cluster every update
    assert sum(ray["by_kind"].values()) == ray["requests"]
