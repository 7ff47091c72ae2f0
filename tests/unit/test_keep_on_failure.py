"""``keep_on_failure`` (raygpu.testing.pytest_plugin): a failed testbed test leaves its whole output behind and
names it in the failure report; a passing one writes nothing."""

from __future__ import annotations

import re
from pathlib import Path

pytest_plugins = ["pytester"]

DEMO = '''
def test_fails(keep_on_failure, tmp_path):
    (tmp_path / "sidecar.log").write_text("\\n".join(f"sidecar line {i}" for i in range(200)))
    keep_on_failure("proxy.log", lambda p: p.write_text("PATCH /cm status=503\\n"))
    keep_on_failure("broken.log", lambda p: 1 / 0)
    assert False, "boom"


def test_passes(keep_on_failure, tmp_path):
    keep_on_failure("proxy.log", lambda p: p.write_text("never"))
'''


def test_a_failed_test_keeps_every_file_and_the_report_names_each_with_its_tail(pytester):
    pytester.makeconftest("pytest_plugins = ['raygpu.testing.pytest_plugin']")
    pytester.makeini("[pytest]\nasyncio_default_fixture_loop_scope = function\n")
    pytester.makepyfile(test_demo=DEMO)
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, failed=1)
    out = result.stdout.str()
    root = re.search(r"output kept under (\S+)", out).group(1)
    assert root.endswith("test_fails0")
    assert f"==> {root}/proxy.log (1 lines; the last 1):\nPATCH /cm status=503" in out
    assert f"==> {root}/broken.log" in out and "could not write broken.log: ZeroDivisionError" in out
    assert f"==> {root}/sidecar.log (200 lines; the last 80):" in out
    assert "sidecar line 199" in out and "sidecar line 120" in out and "sidecar line 119" not in out
    assert "never" not in out  # a passing test writes nothing
    kept = Path(root)
    assert (kept / "proxy.log").read_text() == "PATCH /cm status=503\n"  # the whole output stays on disk
    assert len((kept / "sidecar.log").read_text().splitlines()) == 200
    assert not list(kept.parent.glob("test_passes*/proxy.log"))
