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

Tests in ``tests/integration`` get the ``testbed`` marker automatically.
"""

from __future__ import annotations

import os
import re
import uuid
from pathlib import Path

import pytest

from raygpu.model.labels import LABEL_POOL
from raygpu.testing import addons, components
from raygpu.testing.controlplane import Testbed
from raygpu.testing.testbed_lock import hold_testbed_lock


# A local Ray cluster started by a test (ray.cluster_utils.Cluster, ray.init()) would otherwise write
# ~/.ray/auth_token, after which every `ray start` on this machine (the testbed's bridge, a user's) turns
# token auth on by itself. Tests run without Ray auth unless the caller chose a mode.
os.environ.setdefault("RAY_AUTH_MODE", "disabled")


def pytest_configure(config):
    try:
        components.selected_kubernetes()
    except ValueError as exc:  # bad input: say so and stop before anything starts
        pytest.exit(f"raygpu testbed: {exc}", returncode=2)


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
    with hold_testbed_lock(progress=say):  # the whole session: no one restarts the testbed under it
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


@pytest.fixture
def ns(testbed, core, request):
    base = re.sub(r"[^a-z0-9-]", "-", request.node.name.lower())[:40].strip("-")
    name = f"{base}-{uuid.uuid4().hex[:5]}"
    core.create_namespace({"metadata": {"name": name}})
    yield name
    try:
        core.delete_namespace(name)
    except Exception:  # noqa: BLE001 - best effort cleanup
        pass


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
