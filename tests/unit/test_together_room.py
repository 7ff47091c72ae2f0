"""The room test's sums (``plan.reclaim.together._sum``) add as a plain loop does: in the order given, from 0.0.

The supply of every counted node is summed in C now; a float sum in another order (sorted, pairwise, or
compensated as ``sum`` is from Python 3.12) can differ in the last bit, and the room test compares sums.
"""

from __future__ import annotations

import random
from collections import defaultdict

from raygpu.plan.reclaim.together import _sum


def _loop(resources):
    out = defaultdict(float)
    for r in resources:
        for k, v in r.items():
            out[k] += max(v, 0.0)
    return dict(out)


def test_the_sum_is_the_loops_to_the_last_bit():
    # 1e16 + 1.0 + 1.0 is 1e16 added in order; any other order (or a compensated sum) gives 1e16 + 2
    assert _sum([{"GPU": 1e16}, {"GPU": 1.0, "CPU": -3.0}, {"GPU": 1.0}]) == {"GPU": 1e16, "CPU": 0.0}
    rng = random.Random(7)
    for _ in range(500):
        rs = [{k: rng.choice((rng.random() * 1e9, -rng.random(), 0.1, 1 / 3, -0.0, 1e16)) for k in
               rng.sample("ABCDE", rng.randrange(0, 5))} for _ in range(rng.randrange(0, 30))]
        got, want = _sum(iter(rs)), _loop(rs)
        assert list(got.items()) == list(want.items())  # same keys, first seen first, same values
