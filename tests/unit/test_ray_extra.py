"""Without the ``ray`` extra: ``import raygpu`` works, and every call that needs Ray says which extra to install.

Each case runs in a fresh interpreter where ``ray`` cannot be imported: ``sys.modules["ray"] = None`` is how
Python marks a module as absent (``import ray`` then raises ModuleNotFoundError with ``name == "ray"``, and
``importlib.util.find_spec("ray")`` answers None), as on a machine where pip never installed Ray.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
INSTALL = 'pip install "raygpu[ray]"'

WITHOUT_RAY = """
import sys
sys.modules["ray"] = None  # not installed
import raygpu
"""

# Each call, as a line of Python run after WITHOUT_RAY; it must raise MissingExtraError.
CALLS = {
    "placement_group": 'raygpu.placement_group([{"GPU": 1}], cluster="rc")',
    "gang_placement_group": 'raygpu.gang_placement_group([{"GPU": 1}], cluster="rc").__enter__()',
    "placement_group_async": 'asyncio.run(raygpu.placement_group_async([{"GPU": 1}], cluster="rc"))',
    "gang_placement_group_async": ('asyncio.run(raygpu.gang_placement_group_async([{"GPU": 1}], '
                                   'cluster="rc").__aenter__())'),
    "GangPlacementGroup's Ray calls": "raygpu.gang.api.RayCalls.real()",
}


def run_without_ray(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", WITHOUT_RAY + textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=120, cwd=REPO)


def test_the_extra_named_is_the_one_pyproject_declares():
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert [r for r in extras["ray"] if r.startswith("ray[")], extras["ray"]


@pytest.mark.parametrize("call", CALLS.values(), ids=CALLS.keys())
def test_a_call_that_needs_ray_names_the_extra(call: str):
    out = run_without_ray(f"""
        import asyncio
        try:
            {call}
        except raygpu.MissingExtraError as e:
            assert isinstance(e, raygpu.PermanentError) and isinstance(e, ImportError), type(e).__mro__
            assert (e.extra, e.name) == ("ray", "ray"), (e.extra, e.name)
            print(e)
        else:
            raise SystemExit("no MissingExtraError")
    """)
    assert out.returncode == 0, out.stderr
    assert INSTALL in out.stdout and "Ray, which is not installed" in out.stdout, out.stdout


def test_what_does_not_need_ray_still_works():
    out = run_without_ray("""
        import raygpu.cli
        from raygpu.adapters.ray_gcs import read_ray_view
        from raygpu.gang.requests import gang_request
        assert "ray" not in [m for m, v in sys.modules.items() if v is not None]
        print(gang_request([{"GPU": 8}] * 2, "PACK", "rc", "ns", None, 600, "dry", None).name)  # the dry run's input
        view = read_ray_view("127.0.0.1:1", timeout_s=1)  # the doctor's Ray side: unreachable, and why
        assert not view.reachable
        print(view.reason)
        raygpu.cli.main(["--version"])
    """)
    assert out.returncode == 0, out.stderr
    dry, reason, version = out.stdout.splitlines()
    assert dry == "dry" and INSTALL in reason and version.startswith("raygpu ")


def test_the_sidecar_refuses_to_start_without_ray_and_says_which_extra():
    out = run_without_ray("""
        import raygpu.cli
        sys.exit(raygpu.cli.main(["sidecar", "--metrics-port", "0", "--kubeconfig", "/nonexistent"]))
    """)
    assert out.returncode == 2, out.stdout + out.stderr
    assert out.stderr.strip() == f"raygpu sidecar: needs Ray's GCS client, and Ray is not installed: {INSTALL}"
