""".ci/release (issue 26 item 2): bad arguments exit 2 before anything is built, the versions it names agree
with the sources, the --json summary's shape, the chart push, and two builds of the same sources give the same
bytes.

Most cases run ``--dry-run`` (no build). The build cases run the real ``python -m build`` and the testbed's helm
(a few seconds each); the installed wheel is tried in tests/integration/test_release.py.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

from raygpu.testing import components

REPO = Path(__file__).resolve().parents[2]
RELEASE = REPO / ".ci" / "release"
HELM = components.tool("helm")


def release(*args: str, repo: Path = REPO, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(repo / ".ci" / "release"), *args], capture_output=True, text=True,
                          timeout=300, env={**os.environ, **(env or {})})


def pyproject() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text())["project"]


def chart_yaml() -> dict:
    import yaml
    return yaml.safe_load((REPO / "deploy" / "helm" / "raygpu" / "Chart.yaml").read_text())


def image_tag() -> str:
    return subprocess.run(["bash", str(REPO / "deploy" / "image" / "build.sh"), "--print-tag"], capture_output=True,
                          text=True, check=True).stdout.strip()


@pytest.fixture(autouse=True)
def _helm():
    if not HELM.is_file():
        pytest.fail(f"no helm at {HELM}: run `bash raygpu/testing/scripts/build-components.sh helm` (.ci/setup does)")


# ---------------------------------------------------------------- bad arguments: exit 2, nothing built

def nonempty(tmp: Path) -> Path:
    (tmp / "old.whl").write_text("an earlier build")
    return tmp


def a_file(tmp: Path) -> Path:
    (tmp / "f").write_text("")
    return tmp / "f"


@pytest.mark.parametrize("args, says", [
    (["--push"], "--push needs --registry"),
    (["--registry", "https://charts.example.com"], "is not an OCI reference"),
    (["--registry", "oci://"], "is not an OCI reference"),
    (["--registry", "oci://ghcr.io/My-Org"], "is not an OCI reference"),  # OCI paths are lowercase
    (["--image", "raygpu:latest"], "is not an image repository"),  # the release sets the tag
    (["--image", "Ghcr.io/org/RAYGPU"], "is not an image repository"),
    (["--bogus"], "unrecognized arguments: --bogus"),
    (["--out"], "expected one argument"),
])
def test_bad_arguments_exit_2_with_the_reason_before_anything_is_built(args, says, tmp_path):
    out = tmp_path / "out"
    done = release("--out", str(out), *args)
    assert done.returncode == 2 and says in done.stderr, done.stderr
    assert done.stdout == "" and not out.exists()


@pytest.mark.parametrize("make_out, says", [(nonempty, "is not empty"), (a_file, "is a file, not a directory")])
def test_an_out_that_holds_something_is_refused(make_out, says, tmp_path):
    out = make_out(tmp_path)
    before = sorted(p.name for p in tmp_path.iterdir())
    done = release("--out", str(out))
    assert done.returncode == 2 and says in done.stderr, done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_no_helm_exits_2_naming_how_to_build_it(tmp_path):
    done = release("--out", str(tmp_path / "out"), env={"HELM": str(tmp_path / "no-helm")})
    assert done.returncode == 2 and "no helm at" in done.stderr and "build-components.sh helm" in done.stderr
    assert not (tmp_path / "out").exists()


# ---------------------------------------------------------------- the versions agree (exit 1 before building)

def test_the_chart_version_is_the_package_version_and_its_app_version_the_image_tag():
    assert chart_yaml()["version"] == pyproject()["version"]
    assert chart_yaml()["appVersion"] == image_tag() == f"{pyproject()['version']}-ray{ci_ray()}"


def ci_ray() -> str:
    [pin] = [r for r in pyproject()["optional-dependencies"]["test"] if r.startswith("ray[default]==")]
    return pin.removeprefix("ray[default]==")


def scratch_repo(tmp: Path) -> Path:
    """The files .ci/release reads before it builds, copied: a checkout to break."""
    for f in (".ci/release", "pyproject.toml", "CHANGELOG.md", "deploy/helm/raygpu/Chart.yaml",
              "deploy/image/build.sh"):
        (tmp / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / f, tmp / f)
    return tmp


@pytest.mark.parametrize("file, old, new, says", [
    ("deploy/helm/raygpu/Chart.yaml", r"^version: \S+", "version: 9.9.9", "Chart.yaml version 9.9.9 is not"),
    ("deploy/helm/raygpu/Chart.yaml", r'^appVersion: "[^"]+"', 'appVersion: "0.1.0"', "appVersion 0.1.0 is not"),
    ("CHANGELOG.md", r"^## \[\d+\.\d+\.\d+\]", "## [0.0.9]", "CHANGELOG.md has no section"),
])
def test_versions_that_disagree_exit_1_before_anything_is_built(file, old, new, says, tmp_path):
    repo = scratch_repo(tmp_path / "repo")
    text = (repo / file).read_text()
    broken, n = re.subn(old, new, text, count=1, flags=re.M)
    assert n == 1
    (repo / file).write_text(broken)
    done = release("--out", str(tmp_path / "out"), repo=repo, env={"HELM": str(HELM)})
    assert done.returncode == 1 and says in done.stderr, done.stderr
    assert not (tmp_path / "out").exists()


# ---------------------------------------------------------------- the summary

def test_the_json_summary_names_every_artifact_the_versions_and_the_commands(tmp_path):
    out = tmp_path / "dist"
    done = release("--dry-run", "--json", "--out", str(out), "--registry", "oci://registry.example.com:5000/charts/",
                   "--image", "ghcr.io/my-org/raygpu")
    assert done.returncode == 0, done.stderr
    s = json.loads(done.stdout)
    v = pyproject()["version"]
    assert set(s) == {"version", "dry_run", "out", "revision", "dirty", "source_date_epoch", "ray", "artifacts",
                      "chart", "image"}
    assert (s["version"], s["dry_run"], s["out"]) == (v, True, str(out))
    assert re.fullmatch(r"[0-9a-f]{40}", s["revision"]) and isinstance(s["dirty"], bool)
    assert s["ray"] == {"supported": pyproject()["optional-dependencies"]["ray"][0].removeprefix("ray[default]"),
                        "tested": ci_ray()}
    assert s["artifacts"] == [
        {"kind": "wheel", "path": str(out / f"raygpu-{v}-py3-none-any.whl"), "sha256": None},
        {"kind": "sdist", "path": str(out / f"raygpu-{v}.tar.gz"), "sha256": None},
        {"kind": "chart", "path": str(out / f"raygpu-{v}.tgz"), "sha256": None},
    ]
    assert s["chart"] == {"name": "raygpu", "version": v, "app_version": image_tag(), "push": {
        "registry": "oci://registry.example.com:5000/charts", "pushed": False,
        "command": f"{HELM} push {out / f'raygpu-{v}.tgz'} oci://registry.example.com:5000/charts"}}
    assert s["image"] == {"repository": "ghcr.io/my-org/raygpu", "tag": image_tag(),
                          "ref": f"ghcr.io/my-org/raygpu:{image_tag()}",
                          "build_command": "IMAGE=ghcr.io/my-org/raygpu deploy/image/build.sh",
                          "push_command": "IMAGE=ghcr.io/my-org/raygpu deploy/image/build.sh --push"}
    assert not out.exists()  # a dry run builds nothing


def test_the_text_summary_prints_the_image_build_command_and_the_supported_ray(tmp_path):
    done = release("--dry-run", "--out", str(tmp_path / "dist"))
    assert done.returncode == 0, done.stderr
    assert f"image raygpu:{image_tag()}" in done.stdout
    assert "  build: IMAGE=raygpu deploy/image/build.sh\n" in done.stdout
    assert f"CI tests {ci_ray()}" in done.stdout and "chart push" not in done.stdout


# ---------------------------------------------------------------- real builds

FAKE_HELM = """#!/usr/bin/env bash
# helm, except that `helm push` only records its arguments
if [ "$1" = push ]; then printf '%s\\n' "$@" > "$PUSHED"; exit 0; fi
exec "$REAL_HELM" "$@"
"""


def test_two_builds_of_the_same_sources_are_byte_identical_and_push_runs_the_printed_command(tmp_path):
    fake = tmp_path / "helm"
    fake.write_text(FAKE_HELM)
    fake.chmod(0o755)
    pushed = tmp_path / "pushed"
    top_level = sorted(p.name for p in REPO.iterdir())
    first = release("--json", "--out", str(tmp_path / "a"), "--registry", "oci://localhost:5000/charts", "--push",
                    env={"HELM": str(fake), "REAL_HELM": str(HELM), "PUSHED": str(pushed)})
    assert first.returncode == 0, first.stderr
    second = release("--json", "--out", str(tmp_path / "b"))
    assert second.returncode == 0, second.stderr
    a, b = json.loads(first.stdout), json.loads(second.stdout)
    assert [x["sha256"] for x in a["artifacts"]] == [x["sha256"] for x in b["artifacts"]]
    assert all(re.fullmatch(r"[0-9a-f]{64}", x["sha256"]) for x in a["artifacts"])
    sums = (tmp_path / "a" / "SHA256SUMS").read_text()
    assert sums == (tmp_path / "b" / "SHA256SUMS").read_text()
    assert subprocess.run(["sha256sum", "-c", "SHA256SUMS"], cwd=tmp_path / "a", capture_output=True).returncode == 0
    chart = tmp_path / "a" / f"raygpu-{a['version']}.tgz"
    assert pushed.read_text().splitlines() == ["push", str(chart), "oci://localhost:5000/charts"]
    assert a["chart"]["push"]["pushed"] is True and b["chart"]["push"] is None
    with zipfile.ZipFile(a["artifacts"][0]["path"]) as z:
        names = z.namelist()
        meta = z.read(f"raygpu-{a['version']}.dist-info/METADATA").decode()
    assert "raygpu/py.typed" in names and "License-Expression: Apache-2.0" in meta
    assert not [n for n in names if n.startswith("tests/")]
    listed = subprocess.run([str(HELM), "show", "chart", str(chart)], capture_output=True, text=True)
    assert f"version: {a['version']}" in listed.stdout.splitlines()
    assert sorted(p.name for p in REPO.iterdir()) == top_level  # no build/, dist/ or egg-info left in the checkout


# ---------------------------------------------------------------- the changelog

def test_the_changelog_keeps_a_changelog_with_an_unreleased_section_and_this_version():
    text = (REPO / "CHANGELOG.md").read_text()
    sections = re.findall(r"^## \[([^\]]+)\](?: - (\d{4}-\d\d-\d\d))?$", text, re.M)
    assert sections[0] == ("Unreleased", "")
    assert sections[1][0] == pyproject()["version"] and sections[1][1]
    unreleased = text.split("## [Unreleased]", 1)[1].split("\n## [", 1)[0]
    assert re.findall(r"^### (\w+)$", unreleased, re.M)[:3] == ["Added", "Changed", "Fixed"]
    for name, _ in sections:
        assert re.search(rf"^\[{re.escape(name)}\]: https://", text, re.M), f"no link for [{name}]"
