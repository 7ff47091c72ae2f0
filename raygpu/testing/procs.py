"""Processes of the testbed: start detached, record, stop for good.

Every component runs in its own process group (``start_new_session``) so that
``stop`` takes its children with it. ``wait_for`` polls a condition with a
deadline: the testbed never sleeps in place of a condition.
"""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")


class TestbedError(RuntimeError):
    """The testbed could not start or a condition was not reached in time."""


# Ports the testbed hands out come from below the kernel's ephemeral range (outgoing connections take
# their local port from there, and a component binding a port some client connection already holds fails
# with "address already in use": CI saw the KubeRay operator die that way) and above Ray's default worker
# port range (10002-19999). Within one process a port is never handed out twice.
_PORT_LOW = 20000
_handed_out: set[int] = set()


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing holds right now, outside the ephemeral range, not handed out before."""
    high = _ephemeral_low() - 1
    if high - _PORT_LOW >= 256:
        for _ in range(500):
            port = random.randint(_PORT_LOW, high)  # noqa: S311 - not security relevant
            if port not in _handed_out and _bindable(port):
                _handed_out.add(port)
                return port
    while True:  # a kernel with an unusual ephemeral range: let it choose
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port not in _handed_out:
            _handed_out.add(port)
            return port


def spawn(name: str, argv: list[str], log_dir: Path, env: dict[str, str] | None = None,
          cwd: Path | None = None) -> subprocess.Popen:
    """Start ``argv`` in a new session, stdout+stderr to ``log_dir/<name>.log``."""
    log_dir.mkdir(parents=True, exist_ok=True)
    log = open(log_dir / f"{name}.log", "ab")  # noqa: SIM115 - handed to the child
    full_env = dict(os.environ)
    full_env.update(env or {})
    return subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            env=full_env, cwd=cwd, start_new_session=True)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # a zombie still answers kill(0); look at /proc
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def stop(pid: int, timeout_s: float = 10.0) -> None:
    """SIGTERM the process group of ``pid``, SIGKILL it after ``timeout_s``."""
    for sig, wait_s in ((signal.SIGTERM, timeout_s), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(pid, sig)
        except ProcessLookupError:
            return
        except PermissionError:
            os.kill(pid, sig)
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            try:
                os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                pass
            if not alive(pid) and not _group_alive(pid):
                return
            time.sleep(0.1)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def wait_for(what: str, probe: Callable[[], T | None], timeout_s: float, interval_s: float = 0.25,
             log: Path | None = None, pid: int | None = None) -> T:
    """Poll ``probe`` until it returns a truthy value; raise TestbedError after ``timeout_s``.

    ``log`` names a component log whose tail is quoted in the error; ``pid`` the component's process:
    if it exits, waiting on stops at once (a component that died will not become ready).
    """
    deadline = time.monotonic() + timeout_s
    last_exc: Exception | None = None
    while time.monotonic() < deadline:
        if pid is not None and not alive(pid):
            raise TestbedError(f"{what}: the process (pid {pid}) exited before it was ready" + _tail(log))
        try:
            value = probe()
            if value:
                return value
        except Exception as exc:  # noqa: BLE001 - the probe's failure is the answer "not yet"
            last_exc = exc
        time.sleep(interval_s)
    raise TestbedError(f"timed out after {timeout_s:.0f}s waiting for {what}"
                       + (f" (last error: {last_exc})" if last_exc else "") + _tail(log))


def _tail(log: Path | None, lines: int = 25) -> str:
    if log is None or not log.exists():
        return ""
    return "\n--- last lines of %s ---\n%s" % (log, "\n".join(log.read_text(errors="replace").splitlines()[-lines:]))


def port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.2)
        return s.connect_ex(("127.0.0.1", port)) == 0
