"""The CI lint `.ci/import_cycles.py` finds import cycles between modules (lazy and TYPE_CHECKING imports count)
and passes on raygpu/ as it is."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import grimp
import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / ".ci" / "import_cycles.py"


def _lint():
    spec = importlib.util.spec_from_file_location("import_cycles", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _package(tmp_path: Path, name: str, files: dict[str, str]) -> None:
    (tmp_path / name).mkdir()
    (tmp_path / name / "__init__.py").write_text("")
    for mod, text in files.items():
        (tmp_path / name / f"{mod}.py").write_text(text)


@pytest.mark.parametrize("b_imports_a", [
    "from cyc_pkg.a import X\n",  # top level
    "def f():\n    from cyc_pkg.a import X\n",  # lazy, in a function
    "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from cyc_pkg.a import X\n",  # for a type only
])
def test_a_cycle_between_two_modules_is_found_however_it_is_imported(tmp_path, monkeypatch, b_imports_a):
    _package(tmp_path, "cyc_pkg", {"a": "from cyc_pkg.b import Y\nX = 1\n", "b": b_imports_a + "Y = 2\n",
                                   "c": "from cyc_pkg.a import X\n"})
    monkeypatch.syspath_prepend(str(tmp_path))
    found = _lint().cycles(grimp.build_graph("cyc_pkg", cache_dir=None), "cyc_pkg")
    assert found == [["cyc_pkg.a", "cyc_pkg.b"]]


def test_a_longer_cycle_is_one_component_and_a_chain_is_none(tmp_path, monkeypatch):
    _package(tmp_path, "ring_pkg", {"a": "import ring_pkg.b\n", "b": "import ring_pkg.c\n", "c": "import ring_pkg.a\n",
                                    "d": "import ring_pkg.a\n"})
    _package(tmp_path, "chain_pkg", {"a": "import chain_pkg.b\n", "b": "import chain_pkg.c\n", "c": "X = 1\n"})
    monkeypatch.syspath_prepend(str(tmp_path))
    lint = _lint()
    assert lint.cycles(grimp.build_graph("ring_pkg", cache_dir=None), "ring_pkg") == [
        ["ring_pkg.a", "ring_pkg.b", "ring_pkg.c"]]
    assert lint.cycles(grimp.build_graph("chain_pkg", cache_dir=None), "chain_pkg") == []


def test_raygpu_has_no_import_cycle():
    out = subprocess.run([sys.executable, str(SCRIPT), "raygpu"], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stdout + out.stderr
