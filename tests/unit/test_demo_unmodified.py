"""``raygpu demo --unmodified``: its table and its verdict, from results (the run itself is
tests/integration/test_deadlock.py's)."""

from __future__ import annotations

import subprocess
import sys

from raygpu.demo.deadlock import TenantResult
from raygpu.demo.unmodified import ARMS, JOB, ArmResult, render, verdict


def arm(name: str, *, done=(60.0, 120.0), held=0, gpu_s=0.0, left=None) -> ArmResult:
    opts = ARMS[name]
    r = ArmResult(mode=f"unmodified/{name}", backend=None, autoscaler=opts["autoscaler"], scale_up=opts["scale_up"],
                  duration_s=130.0, max_gpus_held_by_partial_gangs=held, partial_gang_gpu_s=gpu_s,
                  tenants={t: TenantResult(t, ready_after_s=d and d - 20) for t, d in zip(("tenant-a", "tenant-b"), done)})
    r.completed = dict(zip(("tenant-a", "tenant-b"), done))
    if opts["scale_up"]:
        r.left_behind = left if left is not None else {"tenant-a": {"podgroups": []}, "tenant-b": {"podgroups": []}}
    return r


def test_the_verdict_holds_when_every_gang_scale_up_arm_completes_both_jobs_holding_nothing_half_placed():
    results = {"autoscaler": arm("autoscaler", done=(90.0, None), held=48, gpu_s=3100.0),
               "scale-up+autoscaler": arm("scale-up+autoscaler"), "scale-up": arm("scale-up")}
    assert verdict(results)  # the baseline's half-placement is what the demo shows, not a failure
    table = render(results)
    assert "48 of 64" in table and "3,100" in table and "nothing" in table
    lines = {line.split("  ")[0]: line for line in table.splitlines()}
    assert "completed after 90 s" in lines["tenant-a Ray Train job"]
    assert "never ready: 0/6 pods bound at 130 s" in lines["tenant-b Ray Train job"]


def test_the_verdict_fails_on_a_job_not_done_a_gpu_held_half_placed_or_anything_left():
    assert not verdict({"scale-up": arm("scale-up", done=(60.0, None))})
    assert not verdict({"scale-up": arm("scale-up", held=8, gpu_s=4.0)})
    left = {"tenant-a": {"podgroups": ["tenant-a-pg-1"]}, "tenant-b": {"podgroups": []}}
    r = arm("scale-up+autoscaler", left=left)
    assert not verdict({"scale-up+autoscaler": r})
    assert "1 objects" in render({"scale-up+autoscaler": r})


def test_the_job_never_imports_raygpu_and_compiles():
    assert "import raygpu" not in JOB and "from raygpu" not in JOB and 'assert "raygpu" not in sys.modules' in JOB
    compile(JOB, "job.py", "exec")


def test_bad_demo_flags_exit_2_before_anything_starts():
    for argv in (["--arm", "scale-up"], ["--unmodified", "--backend", "kueue"]):
        out = subprocess.run([sys.executable, "-m", "raygpu.cli", "demo", *argv], capture_output=True, text=True,
                             timeout=60)
        assert out.returncode == 2 and "raygpu demo:" in out.stderr, out
