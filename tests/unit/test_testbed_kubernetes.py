"""Issue 13 item 1: the testbed's control plane is selectable (1.34 default, 1.37 with the Workload API)."""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from raygpu.cli import main
from raygpu.testing import components
from raygpu.testing import controlplane
from raygpu.testing.controlplane import CODE_ROOT


@pytest.fixture(autouse=True)
def _no_env(monkeypatch):
    monkeypatch.delenv(components.KUBERNETES_ENV, raising=False)


def test_the_default_kubernetes_is_the_one_scheduler_plugins_is_built_with():
    assert components.KUBERNETES[components.DEFAULT_KUBERNETES] == components.VERSIONS["kubernetes"]
    assert components.versions() == components.VERSIONS


def test_1_37_is_its_own_control_plane_set_beside_the_default_set_and_names_the_skew(tmp_path, monkeypatch):
    monkeypatch.setenv("RAYGPU_CACHE", str(tmp_path))
    d = components._dirs("1.37")
    assert d["k8s-v1.37.2"] == tmp_path / "bin" / "k8s-v1.37.2"  # shared cache: a predictable name
    assert d["k8s"].name == "k8s-v1.34.4-sp-v0.34.7"  # its coscheduling scheduler + controller come from here
    assert "k8s-v1.37.2" not in components._dirs("1.34")
    v = components.versions("1.37")
    assert v["kubernetes"] == "v1.37.2" and v["scheduler-plugins-kubernetes"] == "v1.34.4"
    for path in d.values():
        path.mkdir(parents=True)
        (path / ".done").touch()
    bins = components.ensure_built(progress=lambda *_: None, kubernetes="1.37")
    assert bins.kube_apiserver == d["k8s-v1.37.2"] / "kube-apiserver"
    assert bins.kube_scheduler.parent == bins.kube_controller_manager.parent == bins.kubectl.parent == d["k8s-v1.37.2"]
    assert bins.sp_scheduler == d["k8s"] / "sp-scheduler" and bins.sp_controller == d["k8s"] / "sp-controller"


def test_a_missing_1_37_set_is_built_by_its_own_target(tmp_path, monkeypatch):
    monkeypatch.setenv("RAYGPU_CACHE", str(tmp_path))
    for name, path in components._dirs("1.37").items():
        if name != "k8s-v1.37.2":
            path.mkdir(parents=True)
            (path / ".done").touch()
    calls = []
    monkeypatch.setattr(components.subprocess, "run",
                        lambda argv, env, **_: calls.append((argv[-1], env)) or subprocess.CompletedProcess(argv, 0))
    components.ensure_built(progress=lambda *_: None, kubernetes="1.37")
    assert [c[0] for c in calls] == ["k8s-v1.37.2"]
    assert calls[0][1]["K8S_OTHER_VERSIONS"] == "v1.37.2"


def test_the_build_script_builds_every_other_control_plane_by_default():
    text = components.BUILD_SCRIPT.read_text()
    default = re.search(r'K8S_OTHER_VERSIONS="\$\{K8S_OTHER_VERSIONS:-([^}]*)\}"', text).group(1)
    assert default.split() == components.other_control_planes() == ["v1.37.2"]


FAKE_GO = """#!/usr/bin/env bash
# records the wrapper module the build script wrote; builds nothing
case "$1 $2" in
  "mod download") echo '{"GoMod": "'"$FAKE_GOMOD"'"}' ;;
  "mod tidy") cp go.mod tools.go "$FAKE_OUT/" ;;
  "env GOMODCACHE") echo "$FAKE_OUT/modcache" ;;
  build*) while [ "$1" != -o ]; do shift; done; mkdir -p "$2"; echo "$@" >> "$FAKE_OUT/builds" ;;
esac
"""


def test_the_1_37_wrapper_module_replaces_every_staging_module_and_has_no_scheduler_plugins(tmp_path):
    fake = tmp_path / "fakebin"
    fake.mkdir()
    (fake / "go").write_text(FAKE_GO)
    (fake / "go").chmod(stat.S_IRWXU)
    gomod = tmp_path / "kubernetes.mod"  # the shape of k8s.io/kubernetes v1.37.2's go.mod (replace block)
    staging = ["api", "apimachinery", "client-go", "cri-streaming", "streaming", "kube-scheduler"]
    gomod.write_text("module k8s.io/kubernetes\n\ngo 1.26.0\n\nreplace (\n"
                     + "".join(f"\tk8s.io/{m} => ./staging/src/k8s.io/{m}\n" for m in staging) + ")\n")
    env = dict(os.environ, PATH=f"{fake}:{os.environ['PATH']}", RAYGPU_CACHE=str(tmp_path / "cache"),
               FAKE_GOMOD=str(gomod), FAKE_OUT=str(tmp_path))
    r = subprocess.run(["bash", str(components.BUILD_SCRIPT), "k8s-v1.37.2"], env=env, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    mod = (tmp_path / "go.mod").read_text()
    for m in staging:
        assert f"  k8s.io/{m} => k8s.io/{m} v0.37.2\n" in mod
    assert "k8s.io/kubernetes => k8s.io/kubernetes v1.37.2" in mod
    assert "scheduler-plugins" not in mod + (tmp_path / "tools.go").read_text()
    [build] = (tmp_path / "builds").read_text().splitlines()  # ONE go build: packages compile once
    assert build.split()[1] == str(tmp_path / "cache" / "bin" / "k8s-v1.37.2") + "/"
    assert all(f"k8s.io/kubernetes/cmd/{c}" in build
               for c in ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl"))
    assert (tmp_path / "cache" / "bin" / "k8s-v1.37.2" / ".done").exists()


def test_selection_flag_then_env_then_default(monkeypatch):
    assert components.selected_kubernetes() == "1.34"
    monkeypatch.setenv(components.KUBERNETES_ENV, "1.37")
    assert components.selected_kubernetes() == "1.37" and controlplane.Testbed(Path("/nonexistent")).kubernetes == "1.37"
    assert components.selected_kubernetes("1.34") == "1.34"
    monkeypatch.setenv(components.KUBERNETES_ENV, "1.35")
    with pytest.raises(ValueError, match=r"RAYGPU_TESTBED_KUBERNETES='1.35': the testbed runs Kubernetes 1.34 or 1.37"):
        controlplane.Testbed(Path("/nonexistent"))


def test_a_running_testbed_of_the_other_kubernetes_is_not_ours(tmp_path):
    up = {"pids": {"etcd": os.getpid()}, "ready_s": 42.0, "kubernetes": "1.37",
          "versions": components.versions("1.37"), "code": CODE_ROOT}
    (tmp_path / "state.json").write_text(json.dumps(up))
    assert controlplane.Testbed(tmp_path, "1.37").is_up()
    assert not controlplane.Testbed(tmp_path, "1.34").is_up() and not controlplane.Testbed(tmp_path).is_ours()
    assert controlplane.Testbed.recorded_kubernetes(tmp_path) == "1.37"


def test_1_37_turns_the_workload_api_and_its_topology_on_in_every_control_plane_binary():
    tb = controlplane.Testbed(Path("/nonexistent"), "1.37")
    gates = "--feature-gates=GenericWorkload=true,TopologyAwareWorkloadScheduling=true"
    assert tb._feature_flags(runtime_config=True) == [gates, "--runtime-config=scheduling.k8s.io/v1beta1=true"]
    assert tb._feature_flags() == [gates]  # scheduler (else it ignores a PodGroup's topology), controller-manager
    assert controlplane.Testbed(Path("/nonexistent"), "1.34")._feature_flags(runtime_config=True) == [
        "--feature-gates=DRADeviceTaints=true,ResourceHealthStatus=true"]  # alpha DRA fields the doctor test writes
    # not the scheduler/controller-manager: with DRADeviceTaints they wait for a DeviceTaintRule API 1.34 lacks
    assert controlplane.Testbed(Path("/nonexistent"), "1.34")._feature_flags() == []


def test_cli_bad_kubernetes_exits_2_before_anything_starts(capsys, monkeypatch):
    monkeypatch.setattr(controlplane.Testbed, "up", lambda *a, **k: pytest.fail("started a testbed on bad input"))
    with pytest.raises(SystemExit) as exc:
        main(["testbed", "up", "--kubernetes", "1.35"])
    assert exc.value.code == 2
    assert "argument --kubernetes: invalid choice: '1.35'" in capsys.readouterr().err
    monkeypatch.setenv(components.KUBERNETES_ENV, "v1.37")
    assert main(["testbed", "up"]) == 2
    assert capsys.readouterr().err == ("raygpu testbed: RAYGPU_TESTBED_KUBERNETES='v1.37': the testbed runs "
                                       "Kubernetes 1.34 or 1.37\n")


def test_cli_help_explains_the_versions(capsys):
    with pytest.raises(SystemExit):
        main(["testbed", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "--kubernetes {1.34,1.37}" in out and "1.37 (v1.37.2)" in out and "RAYGPU_TESTBED_KUBERNETES" in out


def test_pytest_with_a_bad_kubernetes_exits_2_before_any_test(tmp_path):
    (tmp_path / "conftest.py").write_text('pytest_plugins = ["raygpu.testing.pytest_plugin"]\n')
    (tmp_path / "test_x.py").write_text("def test_x():\n    raise AssertionError('ran')\n")
    env = dict(os.environ, **{components.KUBERNETES_ENV: "1.99"})
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)], env=env,
                       capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "RAYGPU_TESTBED_KUBERNETES='1.99'" in r.stdout + r.stderr and "AssertionError: ran" not in r.stdout
