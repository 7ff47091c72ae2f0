"""deploy/image: the sidecar image's Containerfile and tag scheme, checked statically (no container engine here).

The image is FROM rayproject/ray at the Ray version CI tests (the test extra's pin in pyproject.toml, inside
the ray extra's range), installs raygpu with an extra that exists, runs as a non-root user with `raygpu sidecar`
as entrypoint, and is tagged <raygpu version>-ray<Ray version> everywhere a tag is written (build.sh, the chart,
the example RayCluster).
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import tomllib
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
IMAGE_DIR = REPO / "deploy" / "image"
CONTAINERFILE = IMAGE_DIR / "Containerfile"


def pyproject() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text())


def ci_ray() -> str:
    """The Ray CI tests: the test extra pins it exactly (.ci/setup installs ".[test]")."""
    [pin] = [r for r in pyproject()["project"]["optional-dependencies"]["test"] if r.startswith("ray[default]")]
    m = re.fullmatch(r"ray\[default\]==(\d+\.\d+\.\d+)", pin)
    assert m, f"the test extra must pin the one Ray CI tests exactly, not {pin!r}"
    return m.group(1)


def test_the_ray_extra_is_a_range_from_the_tested_ray_to_the_next_major():
    from packaging.requirements import Requirement
    [req] = [Requirement(r) for r in pyproject()["project"]["optional-dependencies"]["ray"] if r.startswith("ray[")]
    assert req.extras == {"default"}
    assert {(s.operator, s.version) for s in req.specifier} == {(">=", ci_ray()), ("<", "3")}
    assert req.specifier.contains(ci_ray())


def expected_tag() -> str:
    return f"{pyproject()['project']['version']}-ray{ci_ray()}"


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of the Containerfile, continuation lines joined, comments dropped."""
    text = re.sub(r"\\\n", " ", CONTAINERFILE.read_text())
    return [(ln.split(None, 1)[0].upper(), ln.split(None, 1)[1] if " " in ln.strip() else "")
            for ln in (raw.strip() for raw in text.splitlines()) if ln and not ln.startswith("#")]


def arg_defaults() -> dict[str, str]:
    return dict(a.split("=", 1) for i, a in instructions() if i == "ARG" and "=" in a)


def test_every_stage_is_rayproject_ray_at_the_pinned_version():
    args = arg_defaults()
    assert args["RAY_VERSION"] == ci_ray()
    froms = [a.split()[0] for i, a in instructions() if i == "FROM"]
    assert len(froms) >= 1
    for image in froms:
        resolved = re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], image)
        assert resolved == f"docker.io/rayproject/ray:{ci_ray()}", image


def test_it_installs_raygpu_with_extras_that_exist_from_wheels_only():
    runs = " ".join(a for i, a in instructions() if i == "RUN")
    extras = set(re.findall(r'\[(\w+)\]"', runs))
    assert extras == {"ray"} and extras <= set(pyproject()["project"]["optional-dependencies"])
    [install] = [c for c in re.split(r"[;&|]+", runs) if re.search(r"\bpip install\b", c)]
    assert {"--no-cache-dir", "--only-binary=:all:"} <= set(shlex.split(install))  # no compiler, no cache left
    assert not re.search(r"\b(apt-get|apt|yum|dnf|apk) (install|add)\b", runs), "no build tools in the image"
    assert arg_defaults()["RAYGPU_VERSION"] == pyproject()["project"]["version"]


def test_it_runs_as_a_non_root_user_with_the_sidecar_as_entrypoint():
    ins = instructions()
    last_stage = ins[max(n for n, (i, _) in enumerate(ins) if i == "FROM"):]
    users = [a for i, a in last_stage if i == "USER"]
    assert users and users[-1].split(":")[0] not in ("root", "0"), users
    [entry] = [a for i, a in ins if i == "ENTRYPOINT"]
    assert json.loads(entry) == ["raygpu", "sidecar"]
    assert pyproject()["project"]["scripts"]["raygpu"] == "raygpu.cli:main"
    from raygpu.cli import main  # `raygpu sidecar --help` is a real subcommand
    try:
        main(["sidecar", "--help"])
    except SystemExit as e:
        assert e.code == 0


def test_build_sh_tags_by_the_documented_scheme():
    out = subprocess.run(["bash", str(IMAGE_DIR / "build.sh"), "--print-tag"], capture_output=True, text=True,
                         timeout=30)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == expected_tag() == "0.1.0-ray2.60.0"
    bad = subprocess.run(["bash", str(IMAGE_DIR / "build.sh"), "--latest"], capture_output=True, text=True,
                         timeout=30)
    assert bad.returncode == 2 and "usage" in bad.stderr


def test_the_example_raycluster_and_the_chart_use_an_image_tagged_by_the_scheme():
    rc = yaml.safe_load((REPO / "deploy" / "examples" / "raycluster-with-sidecar.yaml").read_text())
    containers = {c["name"]: c for c in rc["spec"]["headGroupSpec"]["template"]["spec"]["containers"]}
    repo, _, tag = containers["raygpu-sidecar"]["image"].rpartition(":")
    assert repo and tag == expected_tag()
    assert containers["ray-head"]["image"] == f"rayproject/ray:{ci_ray()}" and rc["spec"]["rayVersion"] == ci_ray()
    chart = yaml.safe_load((REPO / "deploy" / "helm" / "raygpu" / "Chart.yaml").read_text())
    assert chart["appVersion"] == expected_tag() and chart["version"] == pyproject()["project"]["version"]


def test_docs_say_how_to_build_and_push_it():
    text = (REPO / "docs" / "deploy.md").read_text()
    assert "deploy/image/build.sh --push" in text and "<raygpu version>-ray<Ray version>" in text
