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
