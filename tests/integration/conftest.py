"""Fixtures shared by the integration tests (the testbed's own fixtures are in raygpu.testing.pytest_plugin)."""

from __future__ import annotations

import pytest
import ray

from raygpu.testing import manifests as m
from raygpu.testing.kube import apply
from tests.integration.util import ray_address


@pytest.fixture
def cluster(testbed, ns, pool, kube):
    """RayCluster 'c' with an 8-GPU worker group (0 replicas) on a private pool of 2 GPU nodes; a Ray driver."""
    pool.add({"cpu": "cpu16", "g1": "h100x8", "g2": "h100x8"})
    apply(kube, m.raycluster("c", ns, [m.worker_group("gpu", replicas=0, pool=pool.name)], pool=pool.name))
    ray.init(address=ray_address(testbed, ns, "c"), logging_level="ERROR", log_to_driver=False)
    yield "c"
    ray.shutdown()
