"""The testbed scale run's own checks (raygpu.testing.scale); the run itself is tests/integration/test_sidecar_scale.py."""

from __future__ import annotations

from unittest import mock

import pytest

from raygpu.testing import scale
from raygpu.testing.scale import ScaleSpec


@pytest.mark.parametrize("kw", [{"nodes": 0}, {"pods": 0}, {"idle_every": 0}, {"threads": 0},
                                {"nodes": 1, "pods": 101}])
def test_scale_spec_refuses_impossible_sizes(kw):
    with pytest.raises(ValueError):
        ScaleSpec(**kw)


class _Reply:
    data = b"{}"

    def release_conn(self) -> None:
        pass


def test_bulk_create_sends_nothing_more_after_a_failure():
    sent: list[int] = []

    def create(api, body):
        sent.append(body["i"])
        if body["i"] == 3:
            raise RuntimeError("409 AlreadyExists")
        return _Reply()
    with mock.patch.object(scale, "api_client", lambda kubeconfig: mock.MagicMock()), \
            pytest.raises(RuntimeError, match="409"):
        scale._bulk(mock.Mock(kubeconfig="k"), [{"i": i} for i in range(5000)], create, 2, lambda msg: None, "pods")
    assert 3 in sent and len(sent) < 50, len(sent)  # the few already in flight, not the 5,000 queued


def test_bulk_create_sends_every_body_once():
    sent: list[int] = []
    with mock.patch.object(scale, "api_client", lambda kubeconfig: mock.MagicMock()):
        scale._bulk(mock.Mock(kubeconfig="k"), [{"i": i} for i in range(500)],
                    lambda api, body: sent.append(body["i"]) or _Reply(), 4, lambda msg: None, "pods")
    assert sorted(sent) == list(range(500))
