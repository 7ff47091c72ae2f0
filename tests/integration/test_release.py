"""Issue 26 item 2: the wheel .ci/release builds installs in a fresh virtual environment and works there.

The wheel is installed with its dependencies (from the package index; pip's cache serves most) into a venv
made with ``python -m venv`` and without Ray: what ``pip install raygpu`` gives a user who has not asked for
the ``ray`` extra. Every command runs from a directory outside the checkout, so nothing is imported from the
source tree. ``raygpu plan`` then reads a real RayCluster on the testbed (its head cannot schedule: no Ray
process is started).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from raygpu.testing import manifests as m
from raygpu.testing.kube import apply

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """{"summary": .ci/release's --json, "venv": Path, "python": Path, "raygpu": Path, "cwd": Path}."""
    root = tmp_path_factory.mktemp("release")
    done = subprocess.run([sys.executable, str(REPO / ".ci" / "release"), "--json", "--out", str(root / "dist")],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    [wheel] = [a["path"] for a in summary["artifacts"] if a["kind"] == "wheel"]
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    pip = subprocess.run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install",
                          "--quiet", "--disable-pip-version-check", wheel], capture_output=True, text=True,
                         timeout=600)
    assert pip.returncode == 0, pip.stdout + pip.stderr
    cwd = root / "elsewhere"
    cwd.mkdir()
    return {"summary": summary, "venv": venv, "python": venv / "bin" / "python", "raygpu": venv / "bin" / "raygpu",
            "cwd": cwd}


def run(installed: dict, *argv: str | Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    return subprocess.run([str(a) for a in argv], capture_output=True, text=True, timeout=120, cwd=installed["cwd"],
                          env=env)


def test_the_installed_wheel_prints_its_version_and_help(installed):
    version = installed["summary"]["version"]
    out = run(installed, installed["raygpu"], "--version")
    assert (out.returncode, out.stdout, out.stderr) == (0, f"raygpu {version}\n", "")
    where = run(installed, installed["python"], "-c", "import raygpu; print(raygpu.__version__, raygpu.__file__)")
    assert where.returncode == 0, where.stderr
    v, path = where.stdout.split()
    assert v == version and Path(path).is_relative_to(installed["venv"])  # the venv's copy, not the checkout's
    helped = run(installed, installed["raygpu"], "--help")
    assert helped.returncode == 0 and "{testbed,demo,plan,doctor,sidecar}" in helped.stdout, helped.stderr
    assert "--log-level" in helped.stdout


def test_the_license_is_in_the_installed_metadata(installed):
    code = ("import importlib.metadata as m; d = m.distribution('raygpu'); "
            "print(d.metadata['License-Expression']); print(sorted(str(f) for f in d.files if 'LICENSE' in str(f)))")
    out = run(installed, installed["python"], "-c", code)
    assert out.returncode == 0, out.stderr
    expression, files = out.stdout.splitlines()
    assert expression == "Apache-2.0" and "licenses/LICENSE" in files


def test_without_the_ray_extra_placement_group_names_the_extra_to_install(installed):
    code = ("import importlib.util, raygpu\n"
            "assert importlib.util.find_spec('ray') is None, 'ray is installed in the fresh venv'\n"
            "try:\n    raygpu.placement_group([{'GPU': 1}], cluster='c')\n"
            "except ImportError as e:\n    print(type(e).__name__, e)\n")
    out = run(installed, installed["python"], "-c", code)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("MissingExtraError ") and "pip install \"raygpu[ray]\"" in out.stdout, out.stdout


def test_raygpu_plan_from_the_installed_wheel_reads_a_raycluster_on_the_testbed(installed, testbed, ns, pool, kube):
    pool.add({"g1": "h100x8", "g2": "h100x8"})  # GPU nodes only: the head (on a cpu16 node) stays Pending
    apply(kube, m.raycluster("c", ns, [m.worker_group("gpu", replicas=0, pool=pool.name)], pool=pool.name))
    out = run(installed, installed["raygpu"], "plan", "--cluster", "c", "-n", ns, "--bundle", "GPU=8,CPU=4",
              "--count", "2", "--strategy", "STRICT_SPREAD", "--kubeconfig", testbed.kubeconfig, "--json")
    assert out.returncode == 0, out.stderr
    plan = json.loads(out.stdout)
    assert (plan["cluster"], plan["namespace"], plan["strategy"], plan["backend"]) == ("c", ns, "STRICT_SPREAD", "none")
    assert plan["need"]["pod_count"] == 2 and plan["need"]["template_group"] == "gpu"
    assert plan["bundle_to_pod"] == [0, 1]
    bad = run(installed, installed["raygpu"], "plan", "--cluster", "c", "-n", ns, "--bundle", "GPU=16",
              "--kubeconfig", testbed.kubeconfig)  # more GPUs than a worker of the group has
    assert bad.returncode == 1 and bad.stderr.startswith("infeasible: "), bad.stderr
