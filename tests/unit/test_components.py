"""The testbed's component sets: one cache folder per version set, built with the pinned versions."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from raygpu.testing import components


def test_kuberay_is_its_own_set_keyed_by_its_version(tmp_path, monkeypatch):
    monkeypatch.setenv("RAYGPU_CACHE", str(tmp_path))
    monkeypatch.setitem(components.VERSIONS, "kuberay", "v9.9.9")
    d = components._dirs()
    assert d["kuberay"] == tmp_path / "bin" / "kuberay-v9.9.9"
    assert "kuberay" not in d["k8s"].name  # KubeRay needs newer k8s libraries than the k8s set: not one module
    assert set(components.missing()) == set(d)


def test_ensure_built_hands_the_pinned_versions_to_the_build_script(tmp_path, monkeypatch):
    monkeypatch.setenv("RAYGPU_CACHE", str(tmp_path))
    monkeypatch.setitem(components.VERSIONS, "kuberay", "v9.9.9")
    for name, d in components._dirs().items():
        if name != "kuberay":
            d.mkdir(parents=True)
            (d / ".done").touch()
    calls = []

    def fake_run(argv, env, **_):
        calls.append((argv[-1], env))
        (Path(env["RAYGPU_CACHE"]) / "bin" / f"kuberay-{env['KUBERAY_VERSION']}").mkdir(parents=True)
        return subprocess.CompletedProcess(argv, 0)

    monkeypatch.setattr(components.subprocess, "run", fake_run)
    bins = components.ensure_built(progress=lambda *_: None)
    assert [c[0] for c in calls] == ["kuberay"]
    env = calls[0][1]
    assert {env[components.VERSION_ENV[k]] for k in components.VERSIONS} == set(components.VERSIONS.values())
    assert bins.ray_operator == tmp_path / "bin" / "kuberay-v9.9.9" / "ray-operator"
    assert bins.kuberay_crds == tmp_path / "bin" / "kuberay-v9.9.9" / "crds"


def test_a_failed_build_names_the_set(tmp_path, monkeypatch):
    monkeypatch.setenv("RAYGPU_CACHE", str(tmp_path))
    monkeypatch.setattr(components, "missing", lambda *_: ["kuberay"])
    monkeypatch.setattr(components.subprocess, "run", lambda argv, **_: subprocess.CompletedProcess(argv, 1))
    with pytest.raises(RuntimeError, match="'kuberay' failed"):
        components.ensure_built(progress=lambda *_: None)


def test_the_build_script_defaults_to_the_pinned_versions():
    """Run by hand or by .ci/setup (no environment), the script builds what components.VERSIONS pins."""
    import re
    text = components.BUILD_SCRIPT.read_text()
    for key, env in components.VERSION_ENV.items():
        m = re.search(rf'^{env}="\$\{{{env}:-([^}}]*)\}}"', text, re.M)
        assert m, f"{env} has no default in {components.BUILD_SCRIPT.name}"
        assert m.group(1) == components.VERSIONS[key], env


def test_promtool_and_the_operator_crds_are_sets_of_their_own(tmp_path, monkeypatch):
    monkeypatch.setenv("RAYGPU_CACHE", str(tmp_path))
    assert components.tool("promtool") == tmp_path / "bin" / "promtool-v0.316.0" / "promtool"
    assert components.prometheus_operator_crds() == tmp_path / "bin" / "prometheus-operator-crds-v0.85.0" / "crds"
    text = components.BUILD_SCRIPT.read_text()
    assert "all|promtool)" in text and "all|prometheus-operator-crds)" in text  # .ci/setup (target all) builds both
