"""The package as it is distributed: its license, its metadata, and what the built wheel carries.

The wheel is built by pip (``pip wheel --no-deps``, with build isolation: pip fetches the build backend
pyproject.toml names from the package index, as ``.ci/setup``'s install does) from a copy of the sources,
so that no ``build/`` or ``*.egg-info`` is left in the checkout.
"""

from __future__ import annotations

import email.parser
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def pyproject() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text())


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel pip builds from this checkout's sources (only what the Containerfile copies, too)."""
    src = tmp_path_factory.mktemp("src")
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy2(REPO / name, src / name)
    shutil.copytree(REPO / "raygpu", src / "raygpu", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    out = tmp_path_factory.mktemp("wheel")
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "--wheel-dir", str(out),
                           str(src)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    [whl] = out.glob("raygpu-*.whl")
    return whl


def wheel_metadata(whl: Path) -> tuple[list[str], email.message.Message]:
    with zipfile.ZipFile(whl) as z:
        names = z.namelist()
        [meta] = [n for n in names if n.endswith(".dist-info/METADATA")]
        return names, email.parser.Parser().parsestr(z.read(meta).decode())


def test_the_license_is_apache_2_0_in_full_and_pyproject_declares_it():
    text = (REPO / "LICENSE").read_text()
    assert text.split()[:4] == ["Apache", "License", "Version", "2.0,"]
    assert "TERMS AND CONDITIONS FOR USE, REPRODUCTION, AND DISTRIBUTION" in text
    assert "END OF TERMS AND CONDITIONS" in text and "APPENDIX: How to apply the Apache License" in text
    project = pyproject()["project"]
    assert project["license"] == "Apache-2.0"  # an SPDX expression (PEP 639)
    assert project["license-files"] == ["LICENSE"]
    assert not [c for c in project["classifiers"] if c.startswith("License ::")]  # superseded by the expression


def test_pyproject_names_the_project_its_readme_and_that_it_is_typed():
    project = pyproject()["project"]
    assert project["readme"] == "README.md" and (REPO / "README.md").is_file()
    assert {"Homepage", "Repository", "Issues", "Documentation"} <= set(project["urls"])
    assert all(u.startswith("https://github.com/raygpu/raygpu") for u in project["urls"].values())
    assert "Typing :: Typed" in project["classifiers"]
    assert (REPO / "raygpu" / "py.typed").is_file()


def test_the_wheel_carries_the_license_its_expression_and_py_typed(wheel: Path):
    names, meta = wheel_metadata(wheel)
    assert "raygpu/py.typed" in names
    assert meta["License-Expression"] == "Apache-2.0"
    assert meta.get_all("License-File") == ["LICENSE"]
    [lic] = [n for n in names if n.endswith(".dist-info/licenses/LICENSE")]
    with zipfile.ZipFile(wheel) as z:
        assert z.read(lic).decode() == (REPO / "LICENSE").read_text()
    assert meta["Version"] == pyproject()["project"]["version"]
    assert "Typing :: Typed" in meta.get_all("Classifier")
    assert "Repository, https://github.com/raygpu/raygpu" in meta.get_all("Project-URL")


def test_the_image_builds_its_wheel_from_what_the_wheel_needs():
    """The sidecar image's wheel stage copies the sources this file's wheel is built from (LICENSE included:
    ``license-files`` names it, and setuptools only warns when it is missing, then builds a wheel without it)."""
    lines = (REPO / "deploy" / "image" / "Containerfile").read_text().splitlines()
    copied = {Path(a).name for ln in lines if ln.startswith("COPY ")
              for a in ln.split()[1:-1] if not a.startswith("--")}
    assert {"pyproject.toml", "README.md", "LICENSE", "raygpu"} <= copied


# ---------------------------------------------------------------- the version

def run_python(code_or_args: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *code_or_args], capture_output=True, text=True, timeout=60, cwd=REPO)


def test_version_is_the_installed_package_metadata():
    import importlib.metadata

    import raygpu
    assert raygpu.__version__ == importlib.metadata.version("raygpu")


def test_raygpu_version_prints_the_version_and_exits_0():
    import raygpu
    out = run_python(["-m", "raygpu.cli", "--version"])
    assert (out.returncode, out.stdout, out.stderr) == (0, f"raygpu {raygpu.__version__}\n", "")


def test_help_still_works_and_lists_version():
    out = run_python(["-m", "raygpu.cli", "--help"])
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("usage: raygpu [-h] [--version] [--log-level LEVEL]")
    assert "{testbed,demo,plan,doctor,sidecar}" in out.stdout
    bare = run_python(["-m", "raygpu.cli"])  # a sub-command is still required
    assert bare.returncode == 2 and "required: command" in bare.stderr


NO_METADATA = """
import importlib.metadata as m
def version(name):
    raise m.PackageNotFoundError(name)
m.version = version  # as in a source tree on sys.path that pip never installed
import raygpu, raygpu.cli
print(raygpu.__version__)
raygpu.cli.main(["--version"])
"""


def test_a_source_tree_without_metadata_says_so_instead_of_crashing():
    out = run_python(["-c", NO_METADATA])
    assert out.returncode == 0, out.stderr
    version, line = out.stdout.splitlines()
    assert version == "0+unknown"
    assert line.startswith("raygpu 0+unknown (no installed package metadata")
