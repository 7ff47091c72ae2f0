"""KubeAdapter.api_group_kinds: what a real (HTTP) discovery answer says the server serves of one API group."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from raygpu.adapters.kube import KubeAdapter
from raygpu.errors import TransientError
from tests.unit.test_kube_deadline import kubeconfig_for

GROUP = "scheduling.k8s.io"


def resources(*kinds: str) -> dict:
    return {"kind": "APIResourceList", "resources": [
        {"name": k.lower() + "s", "kind": k, "namespaced": True} for k in kinds] + [
        {"name": k.lower() + "s/status", "kind": k, "namespaced": True} for k in kinds]}


def serve(paths: dict[str, object]):
    """An HTTP API server answering ``paths`` (a dict is JSON, an int a bare status), 404 for anything else."""
    seen: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
            seen.append(self.path)
            body = paths.get(self.path.split("?")[0], 404)
            status = body if isinstance(body, int) else 200
            data = json.dumps({"kind": "Status", "code": status} if isinstance(body, int) else body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args) -> None:
            pass
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, seen


BASE = {"/version": {"major": "1", "minor": "37", "gitVersion": "v1.37.2"},
        "/api": {"kind": "APIVersions", "versions": ["v1"]}, "/api/v1": resources("Pod"),
        "/apis": {"kind": "APIGroupList", "groups": []}}


def group(*versions: str) -> dict:
    return {"kind": "APIGroup", "name": GROUP, "versions": [{"groupVersion": f"{GROUP}/{v}", "version": v}
                                                           for v in versions]}


@pytest.mark.parametrize("paths,expected", [
    ({f"/apis/{GROUP}": group("v1", "v1beta1", "v1alpha3"), f"/apis/{GROUP}/v1": resources("PriorityClass"),
      f"/apis/{GROUP}/v1beta1": resources("Workload", "PodGroup"),
      f"/apis/{GROUP}/v1alpha3": resources("Workload", "PodGroup", "CompositePodGroup")},
     {"v1": {"PriorityClass"}, "v1beta1": {"Workload", "PodGroup"},
      "v1alpha3": {"Workload", "PodGroup", "CompositePodGroup"}}),
    ({f"/apis/{GROUP}": group("v1"), f"/apis/{GROUP}/v1": resources("PriorityClass")}, {"v1": {"PriorityClass"}}),
    ({}, {}),  # no such group
])
def test_api_group_kinds_reads_each_version_without_subresources(tmp_path, paths, expected):
    server, seen = serve({**BASE, **paths})
    try:
        kube = KubeAdapter(kubeconfig_for(tmp_path, server.server_address[1]), request_timeout=(2, 2))
        assert kube.api_group_kinds(GROUP) == {v: frozenset(k) for v, k in expected.items()}
        assert f"/apis/{GROUP}" in seen
    finally:
        server.shutdown()


def test_a_failing_discovery_is_transient(tmp_path):
    server, _ = serve({**BASE, f"/apis/{GROUP}": 503})
    try:
        kube = KubeAdapter(kubeconfig_for(tmp_path, server.server_address[1]), request_timeout=(2, 2))
        with pytest.raises(TransientError, match=f"API discovery /apis/{GROUP}"):
            kube.api_group_kinds(GROUP)
    finally:
        server.shutdown()


def test_a_credential_refresh_that_hangs_ends_within_the_first_contact_deadline():
    """The client re-runs an exec plugin when its token expires, before a request: the same bound applies."""
    import time as time_

    from kubernetes.client import ApiClient, Configuration
    server, _ = serve(BASE)
    release = threading.Event()
    hang = {"on": False}

    def refresh(cfg) -> None:  # the client's hook; hangs like an exec plugin once "on"
        if hang["on"]:
            release.wait(30)
    try:
        cfg = Configuration(host=f"http://127.0.0.1:{server.server_address[1]}", api_key={"BearerToken": "t"})
        cfg.refresh_api_key_hook = refresh  # the client calls it before each request that sends the token
        kube = KubeAdapter(api_client=ApiClient(cfg), first_contact_timeout_s=1)
        hang["on"] = True
        t0 = time_.monotonic()
        with pytest.raises(TransientError, match="no answer within 1 s .* refreshing the kubeconfig's credential"):
            kube.get("v1", "Pod", "p", "default")
        assert time_.monotonic() - t0 < 10
    finally:
        release.set()
        server.shutdown()
