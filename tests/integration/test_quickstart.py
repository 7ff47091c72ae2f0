"""docs/quickstart.md, run as written, against the testbed used as an existing cluster (issue 26 item 3).

Every fenced block that follows a ``<!-- quickstart-step NAME -->`` comment in the page runs, in the page's
order, with ``bash -euo pipefail`` in a scratch folder whose ``deploy`` is the checkout's; a block marked
``<!-- quickstart-step NAME file=FILE -->`` is written to FILE there instead. The commands are the page's,
unchanged: only the environment variables the page documents differ from a user's (``KUBECONFIG``: a copy
of the testbed's admin kubeconfig; ``NAMESPACE``: the test's fresh namespace; ``RAY_ADDRESS``: the head's
GCS as ``raygpu testbed status --json`` reports it, from the step that first needs Ray). Each step's outcome
is checked by the entry of ``CHECKS`` of the same name: a step added to the page without a check, or a
check whose step is gone, fails the test.

Runs alone (``serial``): the page's RayCluster has no node selector (as a user's would not), so its pods
may land on any node of the testbed, another test's private pool included.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pytest

import raygpu
from raygpu.adapters.kube import KubeAdapter
from raygpu.testing import components
from tests.integration.gang_helpers import nothing_left
from tests.integration.util import wait_for

pytestmark = pytest.mark.serial  # its RayCluster's pods may land on any node (module docstring)

REPO = Path(__file__).resolve().parents[2]
PAGE = REPO / "docs" / "quickstart.md"
CLUSTER = "gpu-cluster"  # the page's RayCluster
NEEDS_RAY = {"gang", "doctor"}  # steps that read $RAY_ADDRESS (the driver's ray.init(), the doctor)
STEP_TIMEOUT_S = 420

STEP = re.compile(r"^<!-- quickstart-step (?P<name>[a-z0-9-]+)(?: file=(?P<file>[A-Za-z0-9_.-]+))? -->\n"
                  r"```(?P<lang>[a-z]*)\n(?P<body>.*?)^```$", re.S | re.M)


@dataclass(frozen=True)
class Step:
    name: str
    file: str | None  # write the block to this file instead of running it
    lang: str
    body: str


def page_steps(text: str) -> list[Step]:
    """The marked blocks of ``text``, in order; a marker not followed by a fenced block is an error."""
    steps = [Step(m["name"], m["file"], m["lang"], m["body"]) for m in STEP.finditer(text)]
    markers = len(re.findall(r"^<!-- quickstart-step ", text, re.M))  # at a line start: not prose quoting one
    assert markers == len(steps), f"{markers} quickstart-step markers, {len(steps)} followed by a fenced block"
    names = [s.name for s in steps]
    assert len(set(names)) == len(names), f"step names repeat: {names}"
    return steps


# ----------------------------------------------------------------------------------------- each step's outcome
def _version(out: str, ctx: dict) -> None:
    assert f"raygpu {raygpu.__version__}" in out, out  # the checkout's own raygpu is the one on PATH
    assert re.search(r"^ray 2\.60\.0 raygpu ", out, re.M), out  # the testbed's Ray: the head's version


def _cluster(out: str, ctx: dict) -> None:
    assert "rayclusters.ray.io" in out, out
    gpus = [line.split()[-1] for line in out.splitlines()[1:] if line.split() and line.split()[-1].isdigit()]
    assert any(int(g) >= 1 for g in gpus), out  # some node advertises nvidia.com/gpu


def _install(out: str, ctx: dict) -> None:
    kube: KubeAdapter = ctx["kube"]
    view = kube.get_raycluster(ctx["ns"], CLUSTER)
    assert [g.group_name for g in view.worker_groups] == ["gpu"], view.worker_groups
    assert view.annotations.get("raygpu.io/reclaim") == "dry-run"
    accounts = {a["metadata"]["name"] for a in kube.list("v1", "ServiceAccount", ctx["ns"])}
    assert {"raygpu-sidecar", "raygpu-driver"} <= accounts, accounts
    assert "condition met" in out, out  # kubectl wait: the RayCluster is ready


def _plan(out: str, ctx: dict) -> None:
    assert f"plan for {ctx['ns']}/{CLUSTER}: 2 bundles, STRICT_SPREAD" in out, out
    assert "reserve 2 pod(s) of worker group 'gpu'" in out and "backend none" in out, out
    assert nothing_left(ctx["kube"], ctx["ns"], CLUSTER) is not None  # a dry run: nothing was created


def _gang(out: str, ctx: dict) -> None:
    m = re.search(r"^placement group first-gang: READY, bundles on pods (\[.*\])$", out, re.M)
    assert m, out
    pods = json.loads(m.group(1).replace("'", '"'))
    assert len(set(pods)) == 2 and all(p.startswith(f"{CLUSTER}-rg-first-gang") for p in pods), pods
    assert out.rstrip().endswith("released"), out
    kube = ctx["kube"]
    assert wait_for("the reservation released after the driver", lambda: nothing_left(kube, ctx["ns"], CLUSTER), 90)


def _doctor(out: str, ctx: dict) -> None:
    assert f"ray: {ctx['ray_address']} (from $RAY_ADDRESS)" in out, out  # not from the testbed's bridge
    assert out.rstrip().endswith("exit 0: healthy"), out


CHECKS: dict[str, Callable[[str, dict], None]] = {
    "version": _version, "cluster": _cluster, "install": _install, "plan": _plan, "gang": _gang, "doctor": _doctor,
}
FILES = {"values": "quickstart-values.yaml", "driver": "first_gang.py"}  # the blocks the page has saved as files


# ------------------------------------------------------------------------------------------------------ tests
def test_the_page_marks_every_checked_step_and_file():
    steps = page_steps(PAGE.read_text())
    assert [s.name for s in steps if s.file is None] == list(CHECKS), [s.name for s in steps]
    assert {s.name: s.file for s in steps if s.file is not None} == FILES
    assert all(s.lang == "bash" for s in steps if s.file is None)


def _tool_dirs() -> list[str]:
    dirs = []
    for name in ("helm", "kubectl"):
        path = components.tool(name)
        assert path.exists(), f"{name} is not built at {path}: run .ci/setup"
        dirs.append(str(path.parent))
    return dirs


def _head_address(ns: str) -> str | None:
    """The GCS address of the page's RayCluster, from ``raygpu testbed status --json`` (docs/testbed.md), run in
    the test's own environment: its ``RAYGPU_TESTBED_DIR`` says which testbed this session uses."""
    out = subprocess.run([os.path.join(os.path.dirname(sys.executable), "raygpu"), "testbed", "status", "--json"],
                         capture_output=True, text=True, timeout=60)
    heads = json.loads(out.stdout)["ray_clusters"] if out.stdout.strip() else []
    return next((rc["address"] for rc in heads if rc["namespace"] == ns and rc["cluster"] == CLUSTER), None)


def test_the_quickstart_runs_as_written(testbed, ns, tmp_path, keep_on_failure):
    keep_on_failure("steps.log", lambda _path: None)  # each step's output is in tmp_path/steps.log: shown on failure
    work = tmp_path / "work"
    work.mkdir()
    (work / "deploy").symlink_to(REPO / "deploy")  # the page runs in a checkout: helm installs deploy/helm/raygpu
    kubeconfig = tmp_path / "kubeconfig"
    shutil.copyfile(testbed.kubeconfig, kubeconfig)  # the cluster's kubeconfig, as a user has it: not the testbed's
    # The user's environment: this checkout's Python environment and the tools first on PATH; none of the
    # testbed's own settings (RAYGPU_*), and the page's variables set below.
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("RAYGPU_") and k not in ("KUBECONFIG", "RAY_ADDRESS", "NAMESPACE")}
    env["PATH"] = os.pathsep.join([os.path.dirname(sys.executable), *_tool_dirs(), env.get("PATH", "")])
    env.update(KUBECONFIG=str(kubeconfig), NAMESPACE=ns)
    ctx = {"ns": ns, "kube": KubeAdapter(str(kubeconfig)), "ray_address": None}
    for step in page_steps(PAGE.read_text()):
        if step.file is not None:
            (work / step.file).write_text(step.body)
            continue
        if step.name in NEEDS_RAY and ctx["ray_address"] is None:
            ctx["ray_address"] = env["RAY_ADDRESS"] = wait_for(
                f"the Ray head of {ns}/{CLUSTER} in `raygpu testbed status`", lambda: _head_address(ns), 120)
        out = subprocess.run(["bash", "-euo", "pipefail", "-c", step.body], cwd=work, env=env, capture_output=True,
                             text=True, timeout=STEP_TIMEOUT_S)
        with open(tmp_path / "steps.log", "a") as log:
            log.write(f"==== step {step.name}: exit {out.returncode}\n{out.stdout}--- stderr\n{out.stderr}\n")
        assert out.returncode == 0, (f"step {step.name!r} exited {out.returncode}\n--- stdout\n{out.stdout[-4000:]}"
                                     f"\n--- stderr\n{out.stderr[-4000:]}")
        CHECKS[step.name](out.stdout, ctx)
