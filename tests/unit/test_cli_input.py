"""CLI input errors: one clear line and exit 2, before anything is contacted; no cluster is exit 2, no traceback."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

from raygpu.cli import main


def _usage_error(argv, capsys) -> str:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    return capsys.readouterr().err.strip().splitlines()[-1]


@pytest.mark.parametrize("argv, says", [
    (["doctor", "--orphan-grace", "nan"], "argument --orphan-grace: must be a finite number of seconds, got 'nan'"),
    (["doctor", "--orphan-grace", "-1"], "argument --orphan-grace: must be >= 0 and <= 3.16224e+07 seconds, got '-1'"),
    (["doctor", "--orphan-grace", "inf"], "must be a finite number of seconds"),
    (["doctor", "--orphan-grace", "soon"], "argument --orphan-grace: 'soon' is not a number of seconds"),
    (["sidecar", "--interval-s", "inf"], "argument --interval-s: must be a finite number of seconds, got 'inf'"),
    (["sidecar", "--interval-s", "0"], "argument --interval-s: must be >= 1 and <= 3600 seconds, got '0'"),
    (["sidecar", "--startup-grace-s", "nan"], "argument --startup-grace-s: must be a finite number"),
    (["sidecar", "--heartbeat-timeout-s", "-5"], "argument --heartbeat-timeout-s: must be > 0"),
    (["sidecar", "--interval-s", "1e-9"], "argument --interval-s: must be >= 1 and <= 3600 seconds, got '1e-9'"),
    (["sidecar", "--interval-s", "86400"], "argument --interval-s: must be >= 1 and <= 3600 seconds"),
    (["sidecar", "--metrics-port", "-1"], "argument --metrics-port: a port is 0..65535, got -1"),
    (["sidecar", "--metrics-port", "70000"], "argument --metrics-port: a port is 0..65535, got 70000"),
    (["plan", "--cluster", "rc", "--bundle", "GPU=1", "--count", "0"], "argument --count: must be between 1 and"),
])
def test_numeric_options_are_checked_before_anything_is_contacted(argv, says, capsys, no_contact):
    assert says in _usage_error(argv, capsys)
    assert no_contact == []


@pytest.mark.parametrize("timeout", ["1", "20", "29.9"])
def test_a_heartbeat_timeout_under_three_driver_beats_is_refused_before_contact(timeout, capsys, no_contact):
    from raygpu.gang.api import HEARTBEAT_EVERY_S
    code = main(["sidecar", "--metrics-port", "0", "--heartbeat-timeout-s", timeout])
    says = capsys.readouterr().err
    assert code == 2 and says.count("\n") == 1, says
    assert f"argument --heartbeat-timeout-s: must be >= {3 * HEARTBEAT_EVERY_S:g}" in says, says
    assert "three" in says and "heartbeat" in says
    assert no_contact == []


def test_a_heartbeat_timeout_floor_of_zero_is_for_the_testbed_only(capsys, no_contact):
    """The hidden --debug-heartbeat-timeout-floor-s lets the integration tests age a dead driver in seconds."""
    code = main(["sidecar", "--metrics-port", "0", "--heartbeat-timeout-s", "2",
                 "--debug-heartbeat-timeout-floor-s", "0", "--kubeconfig", "/nonexistent"])
    assert code == 2 and len(no_contact) == 1, "accepted, then the (refused) contact"
    assert "--debug-heartbeat-timeout-floor-s" not in build_parser_help("sidecar")


def build_parser_help(command: str) -> str:
    from raygpu.cli import build_parser
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    return sub.choices[command].format_help()


def test_sidecar_help_states_the_ranges():
    from raygpu.gang.api import HEARTBEAT_EVERY_S
    text = " ".join(build_parser_help("sidecar").split())
    assert f">= {3 * HEARTBEAT_EVERY_S:g}" in text and "1 to 3600" in text, text


@pytest.mark.parametrize("bundle, says", [
    ("GPU=nan", "amounts must be finite and > 0"),
    ("GPU=-1", "amounts must be finite and > 0"),
    ("GPU", "is not RES=AMOUNT"),
    ("=1", "is not RES=AMOUNT"),
    ("GPU=x", "'x' is not a number"),
])
def test_plan_bad_bundle_exits_2_before_connecting(bundle, says, capsys, no_contact):
    assert main(["plan", "--cluster", "rc", "--bundle", bundle]) == 2
    err = capsys.readouterr().err
    assert err.startswith("raygpu plan: ") and says in err and err.count("\n") == 1, err
    assert no_contact == []


def test_plan_unknown_strategy_exits_2_before_connecting(capsys, no_contact):
    assert main(["plan", "--cluster", "rc", "--bundle", "GPU=1", "--strategy", "PACKED"]) == 2
    assert "unknown placement strategy 'PACKED'" in capsys.readouterr().err
    assert no_contact == []


def test_sidecar_metrics_port_in_use_exits_2_before_connecting(capsys, no_contact):
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen(1)
    try:
        port = taken.getsockname()[1]
        code = main(["sidecar", "--cluster", "rc", "--namespace", "ns", "--metrics-address", "127.0.0.1",
                     "--metrics-port", str(port)])
    finally:
        taken.close()
    assert code == 2
    assert f"raygpu sidecar: cannot serve metrics on 127.0.0.1:{port}: " in capsys.readouterr().err
    assert no_contact == []


@pytest.mark.parametrize("command", [
    ["plan", "--cluster", "rc", "--bundle", "GPU=1"],
    ["sidecar", "--once", "--cluster", "rc", "--namespace", "ns", "--metrics-port", "0"],
])
def test_no_kubeconfig_and_not_in_a_pod_is_one_line_and_exit_2(command, tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("KUBECONFIG", "KUBERNETES_SERVICE_HOST")}
    env["HOME"] = str(tmp_path)  # no ~/.kube/config
    r = subprocess.run([sys.executable, "-m", "raygpu.cli", *command], env=env, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr
    assert r.stderr.strip().splitlines() == [
        f"raygpu {command[0]}: no Kubernetes configuration: no kubeconfig (Invalid kube-config file. No "
        "configuration found.) and not in a pod (Service host/port is not set.); pass --kubeconfig or set KUBECONFIG"]


def test_unreachable_server_is_one_line_and_exit_2(tmp_path):
    # Bound but never listening, and held for the whole test: a connection is refused (RST), and no other
    # process can take the port meanwhile (a port closed before the run could be reused by then: a flake
    # seen while Ray and a testbed ran beside the unit tests).
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
        cfg = tmp_path / "kubeconfig"
        cfg.write_text("apiVersion: v1\nkind: Config\ncurrent-context: c\n"
                       f"clusters: [{{name: c, cluster: {{server: 'http://127.0.0.1:{port}'}}}}]\n"
                       "contexts: [{name: c, context: {cluster: c, user: u}}]\nusers: [{name: u, user: {token: x}}]\n")
        r = subprocess.run([sys.executable, "-m", "raygpu.cli", "plan", "--cluster", "rc", "--bundle", "GPU=1",
                            "--kubeconfig", str(cfg)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("raygpu plan: cannot reach the cluster: API discovery at "), lines


def test_plan_on_a_cluster_with_a_bad_num_gpus_exits_2_with_one_line(monkeypatch, capsys):
    import copy

    from raygpu.model.raycluster import RayClusterView
    from raygpu.testing.builders.recorded import NS, RECORDED
    obj = copy.deepcopy(RECORDED)
    obj["spec"]["workerGroupSpecs"][0]["rayStartParams"]["num-gpus"] = "abc"

    class Fake:
        def __init__(self, kubeconfig=None, first_contact_timeout_s=None):
            pass

        def get_raycluster(self, namespace, name):
            return RayClusterView.from_k8s(obj)

        def create(self, review):  # the dry run asks whether it may read free capacity: no
            return {**review, "status": {"allowed": False}}
    monkeypatch.setattr("raygpu.gang.requests.KubeAdapter", Fake)
    name = obj["metadata"]["name"]
    assert main(["plan", "--cluster", name, "-n", NS, "--bundle", "GPU=1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith(f"raygpu plan: invalid worker group template: RayCluster {NS}/{name} group ")
    assert "rayStartParams.num-gpus='abc' is not a number in [0, 1024]" in err
