"""The fault-injecting proxy (``raygpu.testing.faultproxy``) against a small local HTTPS upstream.

The upstream (tests/unit/faultproxy_upstream.py) is a real TLS server with a CA made by
``raygpu.testing.pki`` (openssl), as the testbed's API server is; the proxy's certificate is signed by
the same CA. Every wait polls with a deadline.
"""

from __future__ import annotations

import http.client
import json
import ssl
import tempfile
import threading
import time
from types import SimpleNamespace

import pytest

from raygpu.testing import pki
from raygpu.testing.faultproxy import Delay, EndWatch, Fail, FaultProxy, Hang, Reset, Rule, start_for
from tests.unit.faultproxy_upstream import TOKEN, Upstream

DEADLINE_S = 5.0


# ---------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    d = tmp_path_factory.mktemp("pki")
    ca = pki.ensure_ca(d)
    return SimpleNamespace(dir=d, ca=ca, upstream=pki.ensure_serving_cert(d, "upstream", ca, ["localhost"]),
                           proxy=pki.ensure_serving_cert(d, "proxy", ca, ["localhost"]))


@pytest.fixture
def upstream(certs):
    up = Upstream(*certs.upstream)
    up.thread.start()
    yield up
    up.stopping.set()
    up.shutdown()
    up.server_close()


@pytest.fixture
def proxy(certs, upstream):
    with FaultProxy(upstream.url, certs.ca[0], *certs.proxy) as p:
        yield p
    assert p.open_sockets() == 0


def client(proxy: FaultProxy, timeout: float | None = DEADLINE_S) -> http.client.HTTPSConnection:
    ctx = ssl.create_default_context(cafile=str(proxy.ca_file))
    return http.client.HTTPSConnection("127.0.0.1", proxy.port, context=ctx, timeout=timeout)


def call(proxy: FaultProxy, method: str, path: str, body: bytes | None = None, headers: dict | None = None):
    """One request on a fresh connection: (status, headers, body)."""
    c = client(proxy)
    try:
        c.request(method, path, body=body, headers=headers or {})
        r = c.getresponse()
        return r.status, dict(r.getheaders()), r.read()
    finally:
        c.close()


def eventually(cond, what: str, timeout_s: float = DEADLINE_S):
    deadline = time.monotonic() + timeout_s
    while not (value := cond()):
        assert time.monotonic() < deadline, f"not within {timeout_s}s: {what}"
        time.sleep(0.02)
    return value


# -------------------------------------------------------------- forwarding
def test_forwards_status_headers_body_and_authorization(proxy, upstream):
    status, headers, body = call(proxy, "POST", "/echo/x?a=1", b'{"k": 1}',
                                 {"Authorization": "Bearer abc", "X-Status": "201", "Content-Type": "application/json"})
    assert status == 201 and headers["X-Upstream"] == "yes"
    assert json.loads(body) == {"method": "POST", "path": "/echo/x?a=1", "body": '{"k": 1}', "auth": "Bearer abc"}
    [seen] = proxy.log
    assert (seen.verb, seen.path, seen.query, seen.action, seen.status, seen.upstream_status, seen.done) == \
        ("POST", "/echo/x", "a=1", "forward", 201, 201, True)


@pytest.mark.parametrize("code,reason,retry_after", [(500, "InternalError", None), (503, "ServiceUnavailable", None),
                                                     (429, "TooManyRequests", "1")])
def test_fail_answers_a_status_like_the_api_servers_without_forwarding(proxy, upstream, code, reason, retry_after):
    rule = proxy.add(Rule(verb="GET", path=r"/echo/.+", action=Fail(code)))
    status, headers, body = call(proxy, "GET", "/echo/a")
    st = json.loads(body)
    assert status == code and st["kind"] == "Status" and st["code"] == code and st["reason"] == reason
    assert headers.get("Retry-After") == retry_after
    assert upstream.paths() == []
    assert proxy.log[0].rule is rule and proxy.log[0].status == code and proxy.log[0].upstream_status is None


def test_times_spends_a_rule_and_verb_path_and_body_select_requests(proxy, upstream):
    rule = proxy.add(Rule(verb="PATCH", path=r"/echo/rc/.+", action=Fail(503), times=2, body_contains="raygpu.io/x"))
    assert call(proxy, "GET", "/echo/rc/a")[0] == 200  # another verb
    assert call(proxy, "PATCH", "/echo/other/a", b"raygpu.io/x")[0] == 200  # another path
    assert call(proxy, "PATCH", "/echo/rc/a", b"no annotation")[0] == 200  # another body
    assert [call(proxy, "PATCH", "/echo/rc/a", b'{"raygpu.io/x": 1}')[0] for _ in range(3)] == [503, 503, 200]
    assert proxy.spent(rule)
    assert [s.status for s in proxy.log if s.rule is rule] == [503, 503]
    proxy.add(Rule(action=Fail(500), when=lambda req: req.headers.get("X-Pick") == "1"))
    assert call(proxy, "GET", "/echo/a", headers={"X-Pick": "1"})[0] == 500
    proxy.clear()
    assert call(proxy, "GET", "/echo/a", headers={"X-Pick": "1"})[0] == 200


def test_delay_forwards_late(proxy, upstream):
    proxy.add(Rule(action=Delay(0.4)))
    t0 = time.monotonic()
    assert call(proxy, "GET", "/echo/slow")[0] == 200
    assert time.monotonic() - t0 >= 0.4 and upstream.paths() == ["/echo/slow"]


def test_reset_breaks_the_connection_without_an_answer(proxy, upstream):
    proxy.add(Rule(path="/echo/r", action=Reset(), times=1))
    with pytest.raises((ConnectionError, ssl.SSLError, http.client.RemoteDisconnected)):
        call(proxy, "GET", "/echo/r")
    assert upstream.paths() == [] and proxy.log[0].status is None and proxy.log[0].done


@pytest.mark.parametrize("action", [Fail(500, forward=True), Reset(forward=True)])
def test_lost_answer_the_write_happens_upstream_but_the_client_hears_a_failure(proxy, upstream, action):
    proxy.add(Rule(verb="POST", action=action, times=1))
    if isinstance(action, Fail):
        assert call(proxy, "POST", "/echo/create", b"obj", {"X-Status": "201"})[0] == 500
    else:
        with pytest.raises((ConnectionError, ssl.SSLError, http.client.RemoteDisconnected)):
            call(proxy, "POST", "/echo/create", b"obj", {"X-Status": "201"})
    assert upstream.seen == [("POST", "/echo/create", b"obj")]
    assert proxy.log[0].upstream_status == 201 and proxy.log[0].status == (500 if isinstance(action, Fail) else None)


def test_write_log_leaves_every_request_with_its_fault_and_whole_body(proxy, upstream, tmp_path):
    """What a failed testbed test leaves behind (keep_on_failure): one line per request, in order."""
    rule = proxy.add(Rule(verb="PATCH", action=Fail(503), times=1))
    body = b'{"metadata": {"annotations": {"raygpu.io/heartbeat-at": "1"}}, "pad": "' + b"x" * 5000 + b'"}'
    assert call(proxy, "PATCH", "/echo/cm", body)[0] == 503
    assert call(proxy, "GET", "/echo/a?watch=1")[0] == 200
    first, second = proxy.write_log(tmp_path / "proxy.log").read_text().splitlines()
    assert first.startswith("0 PATCH /echo/cm action=Fail(") and "status=503 upstream=None" in first
    assert repr(rule) in first and "x" * 5000 in first  # the rule that applied, the whole body
    assert second.startswith("1 GET /echo/a?watch=1 action=forward status=200 upstream=200")


# ----------------------------------------------------------------- hanging
def test_hang_never_answers_until_released(proxy, upstream):
    proxy.add(Rule(path="/echo/h", action=Hang()))
    out: dict = {}

    def blocked():
        try:
            out["r"] = call(proxy, "GET", "/echo/h")
        except Exception as e:  # noqa: BLE001 - the test inspects it
            out["r"] = e
    t = threading.Thread(target=blocked)
    t.start()
    eventually(lambda: proxy.log, "the hung request reached the proxy")
    assert call(proxy, "GET", "/echo/other")[0] == 200  # other requests go on meanwhile
    assert "r" not in out and not proxy.log[0].done
    proxy.release()
    t.join(DEADLINE_S)
    assert isinstance(out["r"], (ConnectionError, ssl.SSLError)), out["r"]
    assert proxy.log[0].done and proxy.log[0].status is None and "/echo/h" not in upstream.paths()


def test_a_hung_request_ends_when_the_client_gives_up(proxy):
    proxy.add(Rule(action=Hang()))
    c = client(proxy, timeout=0.3)
    with pytest.raises(TimeoutError):
        c.request("GET", "/echo/h")
        c.getresponse()
    c.close()
    assert proxy.wait_seen(lambda s: s.path == "/echo/h", DEADLINE_S).status is None


# --------------------------------------------------------------- streaming
def _open_stream(proxy):
    c = client(proxy)
    c.request("GET", "/stream?watch=true")
    r = c.getresponse()
    assert r.status == 200 and r.getheader("Transfer-Encoding") == "chunked"
    return c, r


def test_a_watch_streams_event_by_event_and_endwatch_ends_it_after_n(proxy, upstream):
    proxy.add(Rule(path="/stream", action=EndWatch(after_events=2)))
    c, r = _open_stream(proxy)
    upstream.events().put(b'{"type": "ADDED", "n": 1}\n')
    assert r.readline() == b'{"type": "ADDED", "n": 1}\n'  # before the upstream has sent anything more
    upstream.events().put(b'{"type": "MODIFIED", "n": 2}\n{"type": "MODIFIED", "n": 3}\n')
    assert r.readline() == b'{"type": "MODIFIED", "n": 2}\n'
    assert r.read() == b""  # a clean end of the chunked stream, event 3 never sent
    c.close()
    seen = proxy.wait_seen(lambda s: s.path == "/stream")
    assert seen.action == "EndWatch(after_events=2, after_s=None)" and seen.events == 2 and seen.status == 200


def test_endwatch_after_s_ends_a_silent_watch(proxy, upstream):
    proxy.add(Rule(action=EndWatch(after_s=0.3)))
    proxy.add(Rule(action=Fail(500)))  # an EndWatch rule matches watches only: a plain GET falls through
    assert call(proxy, "GET", "/stream")[0] == 500
    c, r = _open_stream(proxy)
    upstream.events().put(b'{"n": 1}\n')
    assert r.readline() == b'{"n": 1}\n'
    t0 = time.monotonic()
    assert r.read() == b"" and time.monotonic() - t0 < DEADLINE_S
    c.close()
    assert proxy.wait_seen(lambda s: s.path == "/stream" and s.status == 200).events == 1


def test_a_plain_watch_passes_until_the_upstream_ends_it(proxy, upstream):
    c, r = _open_stream(proxy)
    for i in range(3):
        upstream.events().put(b'{"n": %d}\n' % i)
        assert r.readline() == b'{"n": %d}\n' % i
    upstream.events().put(None)
    assert r.read() == b""
    c.close()
    assert proxy.wait_seen(lambda s: s.path == "/stream").events == 3


# ------------------------------------------------------ concurrency, stop
def test_concurrent_requests_are_served_in_parallel(proxy, upstream):
    proxy.add(Rule(path="/echo/slow", action=Delay(0.5)))
    results: list = []
    threads = [threading.Thread(target=lambda i=i: results.append(call(proxy, "GET", f"/echo/slow?i={i}")[0]))
               for i in range(6)]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join(DEADLINE_S)
    assert results == [200] * 6 and time.monotonic() - t0 < 2.0  # 6 x 0.5 s in series would be 3 s


def test_stop_ends_every_thread_and_closes_every_socket(certs, upstream):
    p = FaultProxy(upstream.url, certs.ca[0], *certs.proxy).start()
    p.add(Rule(path="/echo/h", action=Hang()))
    idle = client(p)
    idle.request("GET", "/echo/idle")
    assert idle.getresponse().read()  # a kept-alive connection, now idle
    hung = client(p)
    hung.request("GET", "/echo/h")
    stream, r = _open_stream(p)
    upstream.events().put(b'{"n": 1}\n')
    assert r.readline() == b'{"n": 1}\n'
    eventually(lambda: len(p.log) == 3, "three requests in")
    t0 = time.monotonic()
    p.stop()
    assert time.monotonic() - t0 < DEADLINE_S and p.open_sockets() == 0
    assert not [t.name for t in threading.enumerate() if t.name.startswith("faultproxy-") and t.is_alive()]
    with pytest.raises((ConnectionError, ssl.SSLError, http.client.HTTPException)):
        hung.getresponse()
    for c in (idle, hung, stream):
        c.close()
    with pytest.raises(ConnectionRefusedError):
        call(p, "GET", "/echo/after")


def test_bad_rules_are_refused_with_a_clear_error():
    for make, text in [(lambda: Fail(200), "400-599"), (lambda: Delay(float("nan")), "finite"),
                       (lambda: EndWatch(), "after_events=N or after_s=T"), (lambda: Rule(action=Hang(), times=0), ">= 1"),
                       (lambda: Rule(action=Hang(), path="("), "regular expression"),
                       (lambda: Rule(action="fail"), "not one of")]:
        with pytest.raises(ValueError, match=text):
            make()


def test_start_for_a_testbed_signs_with_its_ca_and_writes_a_token_kubeconfig(certs, upstream, tmp_path):
    import shutil
    pkid = tmp_path / "pki"
    pkid.mkdir()
    for f in ("ca.crt", "ca.key"):
        shutil.copy(certs.dir / f, pkid / f)
    with pytest.raises(RuntimeError, match="not up"):
        start_for(SimpleNamespace(root=tmp_path, state={}))
    with start_for(SimpleNamespace(root=tmp_path, state={"ports": {"apiserver": upstream.server_address[1]}})) as p:
        assert (pkid / "faultproxy.crt").exists() and call(p, "GET", "/echo/tb")[0] == 200
        import yaml
        kc_path = p.kubeconfig_for_token("t0k", tmp_path / "kc")
        assert kc_path.stat().st_mode & 0o777 == 0o600, "a kubeconfig holding a token is private"
        kc = yaml.safe_load(kc_path.read_text())
        assert kc["clusters"][0]["cluster"] == {"server": p.url, "certificate-authority": str(pkid / "ca.crt")}
        assert kc["users"][0]["user"] == {"token": "t0k"}


# ---------------------------------------- the real Kubernetes client, raygpu's adapter
def test_kube_adapter_through_the_proxy_sees_each_fault_as_raygpu_expects(proxy, upstream, tmp_path, monkeypatch):
    from raygpu.adapters import kube
    from raygpu.errors import TransientError
    monkeypatch.setattr(kube, "REQUEST_TIMEOUT", (2, 2))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # the client's discovery cache file goes here
    adapter = kube.KubeAdapter(str(proxy.kubeconfig_for_token(TOKEN, tmp_path / "kc")))
    cm = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "a", "namespace": "ns"}, "data": {"k": "v"}}
    cm_path = "/api/v1/namespaces/ns/configmaps"

    proxy.add(Rule(verb="POST", path=cm_path, action=Fail(500, forward=True), times=1))
    with pytest.raises(TransientError, match="500"):
        adapter.create(cm)
    assert adapter.get("v1", "ConfigMap", "a", "ns")["data"] == {"k": "v"}  # the create had happened

    proxy.add(Rule(verb="GET", path=cm_path + "/a", action=Fail(503), times=1))
    with pytest.raises(TransientError, match="503"):
        adapter.get("v1", "ConfigMap", "a", "ns")
    assert adapter.get("v1", "ConfigMap", "a", "ns") is not None

    rule = proxy.add(Rule(verb="GET", path=cm_path + "/a", action=Reset(), times=1))
    assert adapter.get("v1", "ConfigMap", "a", "ns") is not None  # urllib3 retries an idempotent GET once reset
    assert [s.status for s in proxy.log if s.path == cm_path + "/a"][-2:] == [None, 200]
    assert proxy.spent(rule)

    proxy.add(Rule(verb="POST", path=cm_path, action=Reset(), times=1))
    with pytest.raises(TransientError, match="cannot reach the API server"):  # a POST is not retried
        adapter.create({**cm, "metadata": {"name": "b", "namespace": "ns"}})
    assert ("ns", "b") not in upstream.configmaps


def test_kubernetes_watch_resumes_from_the_last_event_when_the_proxy_ends_its_watch(proxy, upstream, tmp_path):
    from kubernetes import client, config, watch
    api = config.new_client_from_config(config_file=str(proxy.kubeconfig_for_token(TOKEN, tmp_path / "kc")))
    proxy.add(Rule(path="/api/v1/namespaces/ns/configmaps", action=EndWatch(after_events=1), times=1))

    def event(name: str, rv: str) -> bytes:
        obj = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": "ns",
                                                                       "resourceVersion": rv}}
        return json.dumps({"type": "ADDED", "object": obj}).encode() + b"\n"
    upstream.events().put(event("a", "5") + event("lost", "6"))  # the proxy ends the first watch after "a"
    upstream.events(1).put(event("b", "7"))
    w = watch.Watch()
    names = []
    try:
        for ev in w.stream(client.CoreV1Api(api).list_namespaced_config_map, "ns", _request_timeout=DEADLINE_S):
            names.append(ev["object"].metadata.name)
            if len(names) == 2:
                w.stop()
    finally:
        upstream.stopping.set()  # ends the second watch's stream upstream
        api.close()
    assert names == ["a", "b"]
    watches = [s for s in proxy.log if "watch=" in s.query]
    assert watches[0].action.startswith("EndWatch") and watches[0].events == 1
    assert "resourceVersion=5" in watches[1].query and watches[1].action == "forward"
