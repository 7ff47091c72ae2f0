"""raygpu.testing.testbed_lock: the pytest fixture's, `raygpu testbed`'s and the demo's hold on the testbed lock.

Each test uses a private lock file ($RAYGPU_TESTBED_LOCK), never the machine's, and flock(1) as the other run.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from raygpu.testing.testbed_lock import HELD_ENV, LOCK_ENV, hold_testbed_lock


@pytest.fixture
def lock(tmp_path, monkeypatch):
    path = str(tmp_path / "testbed.lock")
    monkeypatch.setenv(LOCK_ENV, path)
    monkeypatch.delenv(HELD_ENV, raising=False)
    return path


def _free(path: str) -> bool:
    """Another process could take the lock now."""
    return subprocess.run(["flock", "-n", path, "true"]).returncode == 0


def _wait_for(cond, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.02)


def _hold(path: str) -> subprocess.Popen:
    """Another run that holds the lock until killed."""
    holder = subprocess.Popen(["flock", path, "sleep", "60"], start_new_session=True)
    _wait_for(lambda: not _free(path))
    return holder


def _end(holder: subprocess.Popen) -> None:
    """End the other run: flock(1) and its command (which inherited the lock's descriptor)."""
    os.killpg(holder.pid, signal.SIGKILL)
    holder.wait()


def test_takes_the_lock_for_the_block_and_marks_it_held_for_what_runs_inside(lock):
    assert _free(lock)
    with hold_testbed_lock(progress=lambda m: pytest.fail(f"waited: {m}")) as taken:
        assert taken
        assert not _free(lock)
        assert os.environ[HELD_ENV] == lock
        with hold_testbed_lock() as again:  # nested (the CLI inside a pytest session): runs at once
            assert again is False
    assert _free(lock)
    assert HELD_ENV not in os.environ


def test_waits_for_another_run_saying_so(lock):
    holder = _hold(lock)
    said: list[str] = []
    inside = threading.Event()
    leave = threading.Event()

    def run():
        with hold_testbed_lock(progress=said.append):
            inside.set()
            leave.wait(10)

    t = threading.Thread(target=run, daemon=True)
    try:
        t.start()
        _wait_for(lambda: said)
        assert "waiting for the testbed lock" in said[0] and lock in said[0]
        assert not inside.is_set()  # still waiting while the other run holds it
    finally:
        _end(holder)
    _wait_for(inside.is_set)
    assert not _free(lock)
    leave.set()
    t.join(10)
    assert _free(lock)


def test_an_outer_run_that_says_it_holds_the_lock_is_not_waited_for(lock, monkeypatch):
    holder = _hold(lock)
    try:
        monkeypatch.setenv(HELD_ENV, lock)  # what .ci/with-testbed-lock exports to the run
        with hold_testbed_lock(progress=lambda m: pytest.fail(f"waited: {m}")) as taken:
            assert taken is False
    finally:
        _end(holder)


def test_an_inherited_descriptor_that_holds_the_lock_does_not_deadlock(lock):
    code = ("from raygpu.testing.testbed_lock import hold_testbed_lock\n"
            "with hold_testbed_lock(progress=lambda m: print('WAITED', m)) as taken:\n"
            "    print('taken', taken)\n")
    env = {k: v for k, v in os.environ.items() if k != HELD_ENV}
    out = subprocess.run(["flock", lock, sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "taken False"  # flock(1)'s descriptor, inherited, holds it


def test_processes_started_inside_do_not_keep_the_lock(lock):
    with hold_testbed_lock():
        child = subprocess.Popen(["sleep", "60"], close_fds=False)  # a testbed component, say
    try:
        assert _free(lock)  # the descriptor is close-on-exec: the child never had it
    finally:
        child.kill()
        child.wait()


def test_a_run_under_flock_tells_the_processes_it_starts_that_the_lock_is_held(lock):
    """`flock LOCK pytest -n 3`: xdist's workers get the environment, not flock's descriptor; the controller
    exports the hold, or each worker would wait for the lock its own run holds."""
    code = ("import os, subprocess, sys; from raygpu.testing.testbed_lock import export_inherited_hold, HELD_ENV;"
            "print(export_inherited_hold(), os.environ.get(HELD_ENV) or '-');"
            "sys.stdout.flush();"
            "subprocess.run([sys.executable, '-c', 'import os; print(os.environ.get(\"%s\"))'], close_fds=True)"
            % HELD_ENV)
    out = subprocess.run(["flock", lock, sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["True", lock, lock]
    # without the lock held, nothing is exported
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.split() == ["False", "-", "None"]
