"""The testbed's process helpers: port choice and waiting on a component that may die."""

from __future__ import annotations

import itertools
import socket
import subprocess
import sys
import time

import pytest

from raygpu.testing import procs
from raygpu.testing.procs import free_port, wait_for


def test_free_ports_are_distinct_bindable_and_outside_the_ephemeral_range():
    low = procs._ephemeral_low()
    ports = [free_port() for _ in range(40)]
    assert len(set(ports)) == len(ports)
    for p in ports:
        assert procs._PORT_LOW <= p < low
        with socket.socket() as s:
            s.bind(("127.0.0.1", p))  # raises if taken


def test_free_port_skips_a_port_that_is_listening(monkeypatch):
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        taken = held.getsockname()[1]
        def fresh():  # ports free right now, chosen by the kernel (taken + 1 was sometimes in use by then)
            while True:
                with socket.socket() as s:
                    s.bind(("127.0.0.1", 0))
                    yield s.getsockname()[1]
        seq = itertools.chain([taken, taken], fresh())
        monkeypatch.setattr(procs, "_PORT_LOW", 1024)
        monkeypatch.setattr(procs, "_ephemeral_low", lambda: 65536)
        monkeypatch.setattr(procs.random, "randint", lambda a, b: next(seq))
        monkeypatch.setattr(procs, "_handed_out", set())
        assert free_port() != taken


def test_wait_for_stops_at_once_when_the_process_died(tmp_path):
    log = tmp_path / "c.log"
    log.write_text("listen tcp 127.0.0.1:42799: bind: address already in use\n")
    proc = subprocess.Popen([sys.executable, "-c", "raise SystemExit(1)"])
    proc.wait()
    t0 = time.monotonic()
    with pytest.raises(procs.TestbedError, match="exited before it was ready") as err:
        wait_for("component /readyz", lambda: False, 60, log=log, pid=proc.pid)
    assert time.monotonic() - t0 < 30
    assert "address already in use" in str(err.value)


def test_wait_for_returns_the_probe_value_while_the_process_lives():
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        calls = []

        def probe():
            calls.append(1)
            return "ready" if len(calls) >= 3 else None
        assert wait_for("x", probe, 20, interval_s=0.01, pid=proc.pid) == "ready"
    finally:
        proc.kill()
        proc.wait()


def test_a_start_killed_half_way_is_not_up(tmp_path):
    """A testbed start killed after etcd and the API server started (no cleanup runs on SIGKILL) left them
    running and no ``ready_s``: the next test run reused it and waited for kwok nodes that no kwok served."""
    import json
    import os

    from raygpu.testing import components
    from raygpu.testing.controlplane import CODE_ROOT, Testbed
    state = {"pids": {"etcd": os.getpid(), "kube-apiserver": os.getpid()}, "versions": components.VERSIONS,
             "code": CODE_ROOT}
    (tmp_path / "state.json").write_text(json.dumps(state))
    assert not Testbed(tmp_path).is_up()
    (tmp_path / "state.json").write_text(json.dumps({**state, "ready_s": 42.0}))
    assert Testbed(tmp_path).is_up()
    (tmp_path / "state.json").write_text(json.dumps({**state, "ready_s": 42.0, "pids": {"kwok": 2 ** 22 + 7}}))
    assert not Testbed(tmp_path).is_up()


def test_a_testbed_of_another_checkout_or_other_versions_is_not_reused(tmp_path):
    """A helper's or an old clone's testbed (its bridge runs that checkout's raygpu; its KubeRay another
    version) was reused by the next run of this checkout: tests ran against what they did not pin."""
    import json
    import os

    from raygpu.testing import components
    from raygpu.testing.controlplane import CODE_ROOT, Testbed
    up = {"pids": {"etcd": os.getpid()}, "ready_s": 42.0, "versions": components.VERSIONS, "code": CODE_ROOT}
    (tmp_path / "state.json").write_text(json.dumps(up))
    assert Testbed(tmp_path).is_up() and Testbed(tmp_path).is_ours()
    (tmp_path / "state.json").write_text(json.dumps({**up, "code": "/elsewhere/raygpu"}))
    assert not Testbed(tmp_path).is_up()
    (tmp_path / "state.json").write_text(json.dumps({**up, "versions": {**components.VERSIONS, "kuberay": "v0.0.1"}}))
    assert not Testbed(tmp_path).is_up()
    (tmp_path / "state.json").write_text(json.dumps({k: v for k, v in up.items() if k != "code"}))
    assert not Testbed(tmp_path).is_up()  # started by code from before this check: not provably ours
