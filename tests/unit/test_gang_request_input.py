"""GangRequest input (issue 14 item b): odd numbers and types get a PermanentError naming the field, or are
accepted as the numbers they are; never an OverflowError, TypeError or bare pydantic ValidationError."""

from __future__ import annotations

from decimal import Decimal
from fractions import Fraction

import numpy as np
import pytest
from raygpu.testing.builders.clusters import cluster, gang

from raygpu.errors import InfeasibleError, PermanentError
from raygpu.model.gang import MAX_TIMEOUT_S, GangRequest
from raygpu.plan.gang.reservation import plan_gang


def request(**kw) -> GangRequest:
    return GangRequest(**{"name": "j", "cluster": "c", "bundles": [{"GPU": 1}], **kw})


@pytest.mark.parametrize("kwargs,words", [
    (dict(bundles=[{"CPU": 1}, {"GPU": 10**400}]), ["bundle 1 asks GPU=<an integer of 1329 bits>", "too large"]),
    (dict(bundles=[{"GPU": Decimal("1.5")}]), ["bundle 0 asks GPU=Decimal('1.5')", "must be numbers"]),
    (dict(bundles=[{"GPU": None}]), ["bundle 0 asks GPU=None", "must be numbers"]),
    (dict(bundles=5), ["non-empty list of bundles", "got 5"]),
    (dict(timeout_s=10**400), ["timeout_s=<an integer of 1329 bits>", "too large"]),
    (dict(timeout_s=MAX_TIMEOUT_S + 1), ["timeout_s must be", "<= 2147483647"]),
    (dict(timeout_s="60"), ["timeout_s='60'", "must be numbers"]),
    (dict(queue=5), ["queue must be a queue name", "got 5"]),
    (dict(queue=["team-a"]), ["queue must be a queue name", "['team-a']"]),
    (dict(queue="team a/../x"), ["queue must be a queue name"]),
    (dict(queue="q" * 64), ["queue must be a queue name", "chars>"]),
    (dict(owner_job=12), ["owner_job must be a Ray job id", "got 12"]),
])
def test_odd_input_is_a_permanent_error_naming_the_field(kwargs, words):
    with pytest.raises(PermanentError) as err:
        request(**kwargs)
    assert not isinstance(err.value, InfeasibleError)
    for w in words:
        assert w in str(err.value)


def test_numpy_numbers_are_the_numbers_they_are():
    req = request(bundles=[{"GPU": np.int64(2), "CPU": np.float32(0.5)}, {"GPU": np.uint8(1)}],
                  timeout_s=np.int32(60))
    assert [b.resources for b in req.bundles] == [{"GPU": 2.0, "CPU": 0.5}, {"GPU": 1.0}]
    assert req.timeout_s == 60.0 and all(type(v) is float for b in req.bundles for v in b.resources.values())
    plan = plan_gang(gang([{"GPU": np.int64(8)}] * 2), cluster().worker("gpu", gpus=8).obj())
    assert plan.pod_count == 2
    with pytest.raises(PermanentError, match="bundle 0 asks GPU=.*True.*; amounts must be numbers"):
        request(bundles=[{"GPU": np.bool_(True)}])
    with pytest.raises(PermanentError, match="non-empty list of bundles"):
        request(bundles=np.array([]))


@pytest.mark.parametrize("kwargs,check", [
    (dict(bundles=[{"GPU": Fraction(1, 2)}]), lambda r: r.bundles[0].resources == {"GPU": 0.5}),
    (dict(queue="team-a.gpu_1"), lambda r: r.queue == "team-a.gpu_1"),
    (dict(queue=""), lambda r: r.queue == ""),  # empty: use raygpu.io/queue, as before
    (dict(timeout_s=MAX_TIMEOUT_S), lambda r: r.timeout_s == MAX_TIMEOUT_S),
])
def test_good_input_is_kept(kwargs, check):
    assert check(request(**kwargs))
