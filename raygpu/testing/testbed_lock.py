"""The testbed lock, taken in Python: ``.ci/with-testbed-lock``'s rules for the pytest ``testbed`` fixture,
``raygpu testbed up|down`` and ``raygpu demo`` (docs/testbed.md "The testbed lock").

One testbed per machine is shared by everyone on it, and whoever starts or stops it must hold
``$RAYGPU_TESTBED_LOCK`` (default ``/tmp/raygpu-testbed.lock``) so that no one restarts it under a run that
uses it (a CI run, another pytest session). ``hold_testbed_lock()``:

* runs at once when an outer run holds the lock: ``$RAYGPU_TESTBED_LOCK_HELD`` names it (``.ci/run`` sets it,
  and so does this function for what runs inside it, subprocesses included), or this process inherited a
  descriptor of the lock file that holds it (``flock LOCK pytest ...``). Taking it again would wait for
  ourselves forever;
* else takes it, saying so first when it must wait, and holds it until the block ends. The descriptor is
  close-on-exec: no testbed process started inside inherits it, so none keeps the lock after the block.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Callable, Iterator

LOCK_ENV = "RAYGPU_TESTBED_LOCK"
HELD_ENV = "RAYGPU_TESTBED_LOCK_HELD"
DEFAULT_LOCK = "/tmp/raygpu-testbed.lock"


def lock_path() -> str:
    return os.environ.get(LOCK_ENV) or DEFAULT_LOCK


def _inherited_holder(path: str) -> bool:
    """An open descriptor of this process on the lock file whose open file holds the lock (a flock on it
    succeeds at once; one that belongs to someone else's lock fails without waiting)."""
    try:
        target = os.path.realpath(path)
        fds = os.listdir("/proc/self/fd")
    except OSError:
        return False
    for name in fds:
        fd = int(name)
        if fd <= 2:
            continue
        try:
            if os.readlink(f"/proc/self/fd/{name}") != target:
                continue
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except OSError:
            continue
    return False


def export_inherited_hold() -> bool:
    """Where this process holds the lock through an inherited descriptor (``flock LOCK pytest ...``), say so in
    ``$RAYGPU_TESTBED_LOCK_HELD`` for the processes it starts: pytest-xdist's workers do not inherit the
    descriptor (execnet closes it), only the environment, and would otherwise wait for the lock their own
    run holds. Returns whether it did."""
    path = lock_path()
    if os.environ.get(HELD_ENV) == path or not os.path.exists(path) or not _inherited_holder(path):
        return False
    os.environ[HELD_ENV] = path
    return True


@contextlib.contextmanager
def one_starter() -> Iterator[None]:
    """Inside a run that holds the testbed lock for several processes (pytest-xdist's workers): one of them at
    a time checks for and starts the testbed (a second lock file beside the testbed lock, held only for that)."""
    fd = os.open(lock_path() + ".start", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


@contextlib.contextmanager
def hold_testbed_lock(progress: Callable[[str], None] = print) -> Iterator[bool]:
    """Hold the testbed lock for the block (see the module docstring); yields whether it was taken here
    (False: an outer run holds it)."""
    path = lock_path()
    if os.environ.get(HELD_ENV) == path or (os.path.exists(path) and _inherited_holder(path)):
        yield False
        return
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            progress(f"waiting for the testbed lock {path}: another run (.ci/run, a pytest session, "
                     "`raygpu testbed`) is using the testbed")
            fcntl.flock(fd, fcntl.LOCK_EX)
        before = os.environ.get(HELD_ENV)
        os.environ[HELD_ENV] = path
        try:
            yield True
        finally:
            if before is None:
                os.environ.pop(HELD_ENV, None)
            else:
                os.environ[HELD_ENV] = before
    finally:
        os.close(fd)  # releases the lock: this is its only descriptor
