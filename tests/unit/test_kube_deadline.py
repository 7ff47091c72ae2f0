"""Every Kubernetes call has a deadline, API discovery included; the CLIs turn "no cluster" into one line, exit 2.

The API server here is a local socket that accepts connections (the kernel completes the handshake) and
never answers: the shape of a wedged server or a black-holed load balancer.
"""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path

import pytest

from raygpu.cli import main
from raygpu.errors import TransientError

DEADLINE = (0.3, 0.3)
BOUND_S = 10.0  # 4 attempts (urllib3 retries a timed-out GET 3 times) of 0.3 s each, with room to spare


@pytest.fixture
def silent_server():
    """A listening socket on 127.0.0.1 that never accepts, reads or answers; yields its port."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(64)
    yield s.getsockname()[1]
    s.close()


def kubeconfig_for(tmp_path: Path, port: int) -> str:
    path = tmp_path / "kubeconfig"
    path.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        f"clusters: [{{name: c, cluster: {{server: 'http://127.0.0.1:{port}'}}}}]\n"
        "contexts: [{name: c, context: {cluster: c, user: u}}]\nusers: [{name: u, user: {token: x}}]\n")
    return str(path)


def _in_thread(fn):
    """Run ``fn`` in a daemon thread; (finished within BOUND_S, its result or exception, elapsed s)."""
    out: dict = {}

    def target():
        try:
            out["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - the test inspects it
            out["value"] = e
    t0 = time.monotonic()
    t = threading.Thread(target=target, daemon=True)
    t.start()
    t.join(BOUND_S)
    return not t.is_alive(), out.get("value"), time.monotonic() - t0


def test_adapter_discovery_on_a_silent_server_raises_transient_within_the_deadline(silent_server, tmp_path,
                                                                                    monkeypatch):
    from raygpu.adapters import kube
    monkeypatch.setattr(kube, "REQUEST_TIMEOUT", DEADLINE)
    finished, value, elapsed_s = _in_thread(lambda: kube.KubeAdapter(kubeconfig_for(tmp_path, silent_server)))
    assert finished, f"KubeAdapter() still blocked after {BOUND_S}s on a server that never answers"
    assert isinstance(value, TransientError), repr(value)
    assert "cannot reach the API server" in str(value)
    assert elapsed_s < BOUND_S


def test_requests_that_pass_no_timeout_get_the_default_and_explicit_ones_are_kept():
    from kubernetes.client import ApiClient, Configuration

    from raygpu.adapters.kube import with_default_timeout
    api = ApiClient(Configuration())
    seen = []
    api.rest_client.request = lambda method, url, **kw: seen.append(kw.get("_request_timeout"))
    with_default_timeout(api, (1, 2))
    with_default_timeout(api, (3, 4))  # a second call changes the value, it does not wrap twice
    api.call_api("GET", "http://x/version")
    api.call_api("GET", "http://x/watch", _request_timeout=(30, 150))
    assert seen == [(3, 4), (30, 150)]


def test_plan_on_a_silent_server_exits_2_with_one_line(silent_server, tmp_path, monkeypatch, capsys):
    from raygpu.adapters import kube
    monkeypatch.setattr(kube, "REQUEST_TIMEOUT", DEADLINE)
    argv = ["plan", "--cluster", "rc", "--bundle", "GPU=1", "--kubeconfig", kubeconfig_for(tmp_path, silent_server)]
    finished, code, _ = _in_thread(lambda: main(argv))
    assert finished and code == 2, code
    err = capsys.readouterr().err
    assert err.startswith("raygpu plan: cannot reach the cluster: ") and err.count("\n") == 1, err
    assert "Traceback" not in err


def test_a_throttled_request_is_transient_with_its_retry_after():
    from kubernetes.client import ApiException

    from raygpu.adapters.kube import _convert
    from raygpu.errors import TransientError
    exc = ApiException(status=429, reason="Too Many Requests")
    exc.headers, exc.body = {"Retry-After": "7"}, '{"message": "too many requests"}'
    err = _convert(exc, "patch RayCluster ns/rc")
    assert isinstance(err, TransientError) and err.delay_s == 7.0, err
    exc.headers = {"Retry-After": "soon"}
    assert _convert(exc, "x").delay_s == 1.0


def test_only_the_json_patch_test_wording_makes_a_500_a_conflict():
    """A 500 whose message merely mentions a test and a failure (a namespace test-...-fails) may have landed:
    it is a TransientError, never a ConflictError that would make the caller re-apply its write."""
    from kubernetes.client import ApiException

    from raygpu.adapters.kube import _convert
    from raygpu.errors import ConflictError, TransientError

    def error(status: int, message: str) -> Exception:
        exc = ApiException(status=status, reason="x")
        exc.body = '{"message": "%s"}' % message
        return _convert(exc, "patch RayCluster")
    assert isinstance(error(500, "Internal error for PATCH /apis/ray.io/v1/namespaces/test-it-fails/rayclusters/c"),
                      TransientError)
    assert isinstance(error(500, "testing value /metadata/resourceVersion failed: test failed"), ConflictError)
    assert isinstance(error(422, "the test operation does not apply"), ConflictError)


# ------------------------------------------------- the first contact's deadline (--request-timeout)
@pytest.fixture
def mute_server():
    """A TCP listener on 127.0.0.1 that accepts every connection and never answers a byte; yields its port."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(64)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        s.settimeout(0.1)
        while not stop.is_set():
            try:
                held.append(s.accept()[0])
            except OSError:
                continue
    t = threading.Thread(target=accept, daemon=True)
    t.start()
    yield s.getsockname()[1]
    stop.set()
    t.join(5)
    for c in held:
        c.close()
    s.close()


@pytest.fixture
def hanging_exec_kubeconfig(tmp_path: Path, mute_server: int):
    """A kubeconfig whose user's exec credential plugin writes its pid and then sleeps 600 s; yields its path."""
    pid_file = tmp_path / "plugin.pid"
    plugin = tmp_path / "plugin.sh"
    plugin.write_text(f"#!/bin/sh\necho $$ > {pid_file}\nexec sleep 600\n")
    plugin.chmod(0o755)
    path = tmp_path / "kubeconfig-exec"
    path.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        f"clusters: [{{name: c, cluster: {{server: 'http://127.0.0.1:{mute_server}'}}}}]\n"
        "contexts: [{name: c, context: {cluster: c, user: u}}]\n"
        f"users: [{{name: u, user: {{exec: {{apiVersion: client.authentication.k8s.io/v1, command: '{plugin}'}}}}}}]\n")
    yield str(path)
    if pid_file.exists():  # the plugin is the test's own child: end it by its id
        import os
        import signal
        try:
            os.kill(int(pid_file.read_text()), signal.SIGKILL)
        except (ProcessLookupError, ValueError):
            pass


def test_a_hanging_exec_credential_plugin_fails_within_the_configured_deadline(hanging_exec_kubeconfig, monkeypatch):
    from raygpu.adapters import kube
    monkeypatch.setenv("RAYGPU_REQUEST_TIMEOUT_S", "1")
    finished, value, _ = _in_thread(lambda: kube.KubeAdapter(hanging_exec_kubeconfig))
    assert finished, f"KubeAdapter() still blocked after {BOUND_S}s on an exec plugin that never returns"
    assert isinstance(value, TransientError), repr(value)
    assert "no answer within 1 s" in str(value) and "exec credential plugin" in str(value), str(value)


def test_a_server_that_accepts_and_never_answers_fails_within_the_configured_deadline(mute_server, tmp_path,
                                                                                       monkeypatch):
    from raygpu.adapters import kube
    monkeypatch.setenv("RAYGPU_REQUEST_TIMEOUT_S", "1")  # the per-request deadline stays (5, 30): this one bites
    finished, value, _ = _in_thread(lambda: kube.KubeAdapter(kubeconfig_for(tmp_path, mute_server)))
    assert finished, f"KubeAdapter() still blocked after {BOUND_S}s on a server that accepts and never answers"
    assert isinstance(value, TransientError), repr(value)
    assert "no answer within 1 s" in str(value) and f"API discovery at http://127.0.0.1:{mute_server}" in str(value)


def test_the_keyword_beats_the_environment_and_bad_values_are_refused_before_contact(mute_server, tmp_path,
                                                                                      monkeypatch):
    from raygpu.adapters import kube
    from raygpu.errors import PermanentError
    monkeypatch.setenv("RAYGPU_REQUEST_TIMEOUT_S", "300")
    finished, value, _ = _in_thread(lambda: kube.KubeAdapter(kubeconfig_for(tmp_path, mute_server),
                                                             first_contact_timeout_s=1))
    assert finished and isinstance(value, TransientError) and "no answer within 1 s" in str(value), repr(value)
    for bad in ("nan", "inf", "0", "-1", "601", "soon"):
        monkeypatch.setenv("RAYGPU_REQUEST_TIMEOUT_S", bad)
        with pytest.raises(PermanentError, match="RAYGPU_REQUEST_TIMEOUT_S"):
            kube.KubeAdapter(kubeconfig_for(tmp_path, 1))
    monkeypatch.delenv("RAYGPU_REQUEST_TIMEOUT_S")
    with pytest.raises(PermanentError, match="request timeout"):
        kube.KubeAdapter(kubeconfig_for(tmp_path, 1), first_contact_timeout_s=float("nan"))


@pytest.mark.parametrize("command", [
    ["plan", "--cluster", "rc", "--bundle", "GPU=1"],
    ["doctor", "--cluster", "rc", "--ray-address", "127.0.0.1:1"],
    ["sidecar", "--cluster", "rc", "--namespace", "default", "--metrics-port", "0", "--once"],
])
def test_each_cli_exits_2_within_its_request_timeout_with_the_reason(command, mute_server, tmp_path, capsys):
    argv = [*command, "--request-timeout", "1", "--kubeconfig", kubeconfig_for(tmp_path, mute_server)]
    finished, code, _ = _in_thread(lambda: main(argv))
    assert finished and code == 2, code
    out, err = capsys.readouterr()
    assert "no answer within 1 s" in out + err, out + err
    assert "Traceback" not in out + err


@pytest.mark.parametrize("bad", ["nan", "inf", "0", "-5", "601", "15s"])
def test_a_bad_request_timeout_is_exit_2_before_contact(bad, capsys):
    with pytest.raises(SystemExit) as e:
        main(["plan", "--cluster", "rc", "--bundle", "GPU=1", "--request-timeout", bad,
              "--kubeconfig", "/nonexistent"])
    assert e.value.code == 2
    assert "argument --request-timeout: " in capsys.readouterr().err


def test_placement_group_takes_its_request_timeout_as_a_keyword(mute_server, tmp_path, monkeypatch):
    import ray

    from raygpu import placement_group
    monkeypatch.setattr(ray, "is_initialized", lambda: True)  # a driver, as far as the call's first check goes

    class Context:
        def get_job_id(self) -> str:
            return "01000000"
    monkeypatch.setattr(ray, "get_runtime_context", Context)
    kubeconfig = kubeconfig_for(tmp_path, mute_server)
    finished, value, _ = _in_thread(lambda: placement_group([{"GPU": 1}], cluster="rc", kubeconfig=kubeconfig,
                                                            request_timeout_s=1))
    assert finished and isinstance(value, TransientError), repr(value)
    assert "no answer within 1 s" in str(value) and "API discovery" in str(value), str(value)
