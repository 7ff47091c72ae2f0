"""Polling helpers for integration tests: conditions with deadlines, never bare sleeps."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from typing import Any, Callable

from raygpu.testing.procs import wait_for

__all__ = ["wait_for", "pods", "ray_status", "ray_address", "holds_for", "popen_as_foreground"]


def pods(core, ns: str, selector: str = "") -> list[dict[str, Any]]:
    resp = core.list_namespaced_pod(ns, label_selector=selector, _preload_content=False)
    return json.loads(resp.data)["items"]


def ray_address(testbed, ns: str, cluster: str, timeout_s: float = 90) -> str:
    from raygpu.testing.bridge import head_address

    return wait_for(f"Ray head of {ns}/{cluster} started by the bridge",
                    lambda: head_address(testbed.root / "ray", ns, cluster), timeout_s,
                    log=testbed.logs / "bridge.log")


def ray_status(address: str):
    """Ray autoscaler v2 cluster status: alive nodes with instance_id and ray_node_type_name."""
    from ray.autoscaler.v2.sdk import get_cluster_status
    return get_cluster_status(address)


def alive_ray_nodes(address: str) -> list:
    st = ray_status(address)
    return list(st.active_nodes) + list(st.idle_nodes)


def holds_for(what: str, probe: Callable[[], bool], hold_s: float, interval_s: float = 0.5) -> None:
    """Assert ``probe()`` stays true for ``hold_s`` (used only *after* the system acted, to show it stays put)."""
    deadline = time.monotonic() + hold_s
    while time.monotonic() < deadline:
        assert probe(), f"{what} stopped holding"
        time.sleep(interval_s)


def popen_as_foreground(argv: list[str], **kwargs) -> subprocess.Popen:
    """Start ``argv`` with SIGINT at its default disposition, as a terminal's foreground job has it.

    A test run started in the background of a non-interactive shell (``cmd &``, as a CI harness or
    ``nohup`` may do) inherits SIGINT *ignored* (POSIX), and an ignored signal stays ignored across
    fork and exec: a Python child then never raises KeyboardInterrupt, and a test's ``kill -INT``
    stands for no user's Ctrl-C. Setting a handler here for the duration of the fork makes the exec'd
    child start with SIG_DFL (exec resets handled signals to their default). Main thread only.
    """
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        return subprocess.Popen(argv, **kwargs)
    finally:
        signal.signal(signal.SIGINT, previous)
