""".ci/run holds the testbed lock for its whole run (.ci/with-testbed-lock; docs/testbed.md "The testbed lock").

Every test uses a private lock file ($RAYGPU_TESTBED_LOCK in tmp_path), never /tmp/raygpu-testbed.lock.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HELPER = ROOT / ".ci" / "with-testbed-lock"
PROBE = 'flock -n "$RAYGPU_TESTBED_LOCK" true && echo free || echo held'  # another open of the lock file


def env(lock: Path, **extra: str) -> dict[str, str]:
    e = {k: v for k, v in os.environ.items() if k != "RAYGPU_TESTBED_LOCK_HELD"}
    return {**e, "RAYGPU_TESTBED_LOCK": str(lock), **extra}


def run(args: list, lock: Path, **extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(a) for a in args], env=env(lock, **extra), capture_output=True, text=True, timeout=30)


def hold(lock: Path) -> int:
    """Take the lock in this process (as another run would); close the returned descriptor to let it go."""
    fd = os.open(lock, os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    return fd


def is_free(lock: Path) -> bool:
    try:
        os.close(hold(lock))
        return True
    except BlockingIOError:
        return False


def test_the_command_runs_holding_the_lock_and_knows_it(tmp_path):
    lock = tmp_path / "testbed.lock"
    out = run([HELPER, "bash", "-c", PROBE + '; echo "$RAYGPU_TESTBED_LOCK_HELD"'], lock)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["held", str(lock)]
    assert is_free(lock)  # and let go when it ends


def test_the_command_exit_status_is_the_helpers(tmp_path):
    assert run([HELPER, "bash", "-c", "exit 7"], tmp_path / "testbed.lock").returncode == 7


def test_it_waits_while_another_run_holds_the_lock(tmp_path):
    lock, marker = tmp_path / "testbed.lock", tmp_path / "ran"
    fd = hold(lock)
    try:
        proc = subprocess.Popen([str(HELPER), "touch", str(marker)], env=env(lock), stderr=subprocess.PIPE, text=True)
        time.sleep(1.0)
        assert proc.poll() is None and not marker.exists()  # waiting, the command not started
    finally:
        os.close(fd)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0 and marker.exists()
    assert "waiting for the testbed lock" in err


def test_processes_the_command_leaves_running_do_not_keep_the_lock(tmp_path):
    """A leftover testbed process (started by the command, still running after it) must not hold the lock."""
    lock = tmp_path / "testbed.lock"
    out = run([HELPER, "bash", "-c", "sleep 60 </dev/null >/dev/null 2>&1 & echo $!"], lock)
    pid = int(out.stdout)
    try:
        assert os.path.exists(f"/proc/{pid}") and is_free(lock)
    finally:
        os.kill(pid, signal.SIGTERM)


def test_an_outer_holder_is_not_waited_for(tmp_path):
    """`flock LOCK .ci/run` (an inherited descriptor), or $RAYGPU_TESTBED_LOCK_HELD: run at once, no deadlock."""
    lock = tmp_path / "testbed.lock"
    out = run(["flock", lock, HELPER, "bash", "-c", PROBE], lock)
    assert (out.returncode, out.stdout.strip(), out.stderr) == (0, "held", "")
    fd = hold(lock)
    try:
        out = run([HELPER, "bash", "-c", PROBE], lock, RAYGPU_TESTBED_LOCK_HELD=str(lock))
        assert (out.returncode, out.stdout.strip(), out.stderr) == (0, "held", "")
    finally:
        os.close(fd)


def test_ci_run_holds_the_lock_from_its_first_step(tmp_path):
    """.ci/run itself, in a copy whose setup (its first step) reports the lock and stops the run."""
    ci = tmp_path / "repo" / ".ci"
    ci.mkdir(parents=True)
    for name in ("run", "with-testbed-lock"):
        shutil.copy2(ROOT / ".ci" / name, ci / name)
    (ci / "setup").write_text(PROBE + '; echo "$RAYGPU_TESTBED_LOCK_HELD"; exit 3\n')
    lock = tmp_path / "testbed.lock"
    out = run([ci / "run"], lock)
    assert out.returncode == 3, out.stderr
    assert out.stdout.split() == ["held", str(lock)]
    assert is_free(lock)
