import logging

import pytest

pytest_plugins = ["raygpu.testing.pytest_plugin"]


@pytest.fixture(autouse=True)
def _raygpu_logger_restored():
    """A test that runs a command's main (``raygpu sidecar`` calls ``reclaim.logs.setup``) points the ``raygpu``
    logger at that test's captured stdout, stops its propagation and sets its level: put it back after each
    test, so a later test's caplog sees what it logs, and no record is written to a closed capture stream."""
    root = logging.getLogger("raygpu")
    saved = (root.handlers[:], root.level, root.propagate)
    yield
    root.handlers[:], root.level, root.propagate = saved


@pytest.fixture
def no_contact(monkeypatch):
    """Fail the test if a command builds a Kubernetes client."""
    calls = []

    def refuse(*args, **kwargs):
        calls.append(args)
        raise AssertionError("contacted Kubernetes before checking its input")
    monkeypatch.setattr("raygpu.adapters.kube.KubeAdapter.__init__", refuse)
    return calls
