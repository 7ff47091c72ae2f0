"""pytest fixtures for tests on the testbed.

* ``testbed`` (session): the control plane, Kubernetes ``$RAYGPU_TESTBED_KUBERNETES``
  (``1.34`` or ``1.37``; default 1.34; a bad value stops the session with exit 2
  before any test). Reuses a running one of that version started by this checkout
  (``raygpu testbed up --kubernetes X``), else starts it and stops it at the end.
  If it cannot start, every test that needs it errors with the reason: nothing is skipped.
  Holds the testbed lock for the session unless an outer run holds it (``raygpu.testing.testbed_lock``).
* ``ns`` (function): a fresh namespace, deleted afterwards.
* ``pool`` (function): nodes private to the test (label ``raygpu.io/pool``),
  removed afterwards; ``pool.add({"n1": "h100x8"})``.
* ``kube``: a DynamicClient as admin; ``core``: CoreV1Api.
* ``keep_on_failure`` (function): ``keep(name, write)``; if the test fails, ``write(tmp_path / name)`` runs
  (a fault proxy's log, say: ``keep("proxy.log", proxy.write_log)``) and the failure report gets a section
  naming every file under the test's ``tmp_path`` (its sidecar and driver logs included), each with its
  last ``KEEP_TAIL_LINES`` lines. The files stay where pytest keeps ``tmp_path`` (its last 3 runs).

Tests in ``tests/integration`` get the ``testbed`` marker automatically.
"""

from __future__ import annotations

import contextlib
import os
import re
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import pytest

from raygpu.model.labels import LABEL_POOL
from raygpu.testing import addons, components
from raygpu.testing.controlplane import Testbed
from raygpu.testing.testbed_lock import export_inherited_hold, hold_testbed_lock, one_starter


# A local Ray cluster started by a test (ray.cluster_utils.Cluster, ray.init()) would otherwise write
# ~/.ray/auth_token, after which every `ray start` on this machine (the testbed's bridge, a user's) turns
# token auth on by itself. Tests run without Ray auth unless the caller chose a mode.
os.environ.setdefault("RAY_AUTH_MODE", "disabled")


def pytest_configure(config):
    try:
        components.selected_kubernetes()
    except ValueError as exc:  # bad input: say so and stop before anything starts
        pytest.exit(f"raygpu testbed: {exc}", returncode=2)
    if not hasattr(config, "workerinput"):  # the controller: its xdist workers inherit the environment only
        export_inherited_hold()


def pytest_report_header(config):
    k = components.selected_kubernetes()
    return f"raygpu testbed: Kubernetes {k} ({components.KUBERNETES[k]}; ${components.KUBERNETES_ENV})"


def pytest_collection_modifyitems(items):
    for item in items:
        if "tests/integration" in str(item.fspath).replace("\\", "/"):
            item.add_marker(pytest.mark.testbed)


@pytest.fixture(scope="session")
def testbed():
    say = lambda m: print(f"[testbed] {m}", flush=True)  # noqa: E731
    with hold_testbed_lock(progress=say) as taken:  # the whole session: no one restarts the testbed under it
        if not taken and os.environ.get("PYTEST_XDIST_WORKER"):
            # an outer run (.ci/run, `flock LOCK pytest -n 3`) holds the lock for all workers: one worker
            # starts the testbed, the others find it up (its state read after the wait, not before); none
            # stops it under the others (the outer run does)
            with one_starter():
                tb = Testbed()
                if not tb.is_up():
                    tb.up(progress=say)
            yield tb
            return
        tb = Testbed()
        started_here = False
        if not tb.is_up():
            tb.up(progress=say)
            started_here = True
        yield tb
        if started_here:
            tb.down(quiet=True)


@pytest.fixture
def kube(testbed):
    from raygpu.testing.kube import dynamic
    return dynamic(testbed.kubeconfig)


@pytest.fixture
def core(testbed):
    from kubernetes import client
    from raygpu.testing.kube import api_client
    c = api_client(testbed.kubeconfig)
    yield client.CoreV1Api(c)
    c.close()


@contextlib.contextmanager
def made_namespace(core, base: str):
    """A new namespace ``<base>-<5 hex>``, deleted afterwards (best effort)."""
    name = f"{base}-{uuid.uuid4().hex[:5]}"
    core.create_namespace({"metadata": {"name": name}})
    try:
        yield name
    finally:
        try:
            core.delete_namespace(name)
        except Exception:  # noqa: BLE001 - best effort cleanup
            pass


@pytest.fixture
def ns(testbed, core, request):
    with made_namespace(core, re.sub(r"[^a-z0-9-]", "-", request.node.name.lower())[:40].strip("-")) as name:
        yield name


class Pool:
    """Test-private kwok nodes, selected by ``nodeSelector: {raygpu.io/pool: <name>}``."""

    def __init__(self, tb: Testbed, name: str) -> None:
        self.tb, self.name, self.nodes = tb, name, []

    def add(self, nodes: dict[str, str]) -> list[str]:
        named = {f"{self.name}-{k}": v for k, v in nodes.items()}
        addons.add_nodes(self.tb, named, labels={LABEL_POOL: self.name})
        self.nodes += list(named)
        return list(named)

    def remove(self, short_names: list[str]) -> None:
        full = [f"{self.name}-{n}" for n in short_names]
        addons.remove_nodes(self.tb, full)
        self.nodes = [n for n in self.nodes if n not in full]

    def node(self, short: str) -> str:
        return f"{self.name}-{short}"


@pytest.fixture
def pool(testbed, ns):
    p = Pool(testbed, ns)
    yield p
    addons.remove_nodes(testbed, p.nodes)


def repo_root() -> Path:
    return Path(__file__).resolve().parents[2]


# ------------------------------------------------------------------------------------------- keep_on_failure
KEEP_TAIL_LINES = 80  # of each kept file, in the failure report; the whole file stays under tmp_path


@dataclass
class _Kept:
    root: Path
    writers: list[tuple[str, Callable[[Path], Any]]] = field(default_factory=list)
    written: bool = False

    def write_all(self) -> tuple[str, str]:
        """Run every writer, then name each file under ``root`` with its tail: a report section (title, text)."""
        self.written = True
        for name, write in self.writers:
            try:
                write(self.root / name)
            except Exception as e:  # noqa: BLE001 - a writer that fails must not hide the test's own failure
                (self.root / name).write_text(f"keep_on_failure: could not write {name}: {type(e).__name__}: {e}\n")
        parts = []
        for path in sorted(p for p in self.root.rglob("*") if p.is_file()):
            lines = path.read_text(errors="replace").splitlines()
            parts.append(f"==> {path} ({len(lines)} lines; the last {min(len(lines), KEEP_TAIL_LINES)}):")
            parts.extend(lines[-KEEP_TAIL_LINES:])
        return f"output kept under {self.root}", "\n".join(parts) or "(no files)"


_KEEP = pytest.StashKey[_Kept]()


@pytest.fixture
def keep_on_failure(request, tmp_path) -> Callable[[str, Callable[[Path], Any]], None]:
    kept = request.node.stash[_KEEP] = _Kept(tmp_path)

    def keep(name: str, write: Callable[[Path], Any]) -> None:
        if not name or "/" in name:
            raise ValueError(f"keep_on_failure: {name!r} is not a plain file name")
        kept.writers.append((name, write))
    return keep


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    kept = item.stash.get(_KEEP, None)
    if kept is not None and report.failed and not kept.written:
        report.sections.append(kept.write_all())
    return report
