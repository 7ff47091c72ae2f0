"""PACK's first fit (issue 14 item d): the tree search places every bundle on the same pod as the plain
"first used pod with room, else a new one" loop it replaced, float for float."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from raygpu.testing.builders.clusters import cluster

from raygpu.model.gang import Bundle, Strategy
from raygpu.plan.gang.capacity import template_capacity
from raygpu.plan.gang.reservation import _Candidate, _misfit, _pack

GROUP = cluster().worker("gpu", gpus=8, cpus=96, memory="512Gi").obj().worker_groups[0]
CAND = _Candidate(GROUP, 0, template_capacity(GROUP))


def plain_first_fit_decreasing(bundles: tuple[Bundle, ...]) -> list[int]:
    """The reference: the loop PACK used before, O(bundles x pods)."""
    order = sorted(range(len(bundles)), key=lambda i: (
        -max(v / CAND.cap[r] for r, v in bundles[i].resources.items()), i))
    free: list[dict[str, float]] = []
    assign = [0] * len(bundles)
    for i in order:
        pod = next((p for p, left in enumerate(free) if _misfit(bundles[i].resources, left) is None), None)
        if pod is None:
            free.append(dict(CAND.cap))
            pod = len(free) - 1
        for r, v in bundles[i].resources.items():
            free[pod][r] -= v
        assign[i] = pod
    return assign


# Shares of one pod per resource, including ones that add up to a pod up to float error (1/3, 1/7, 0.1).
_SHARE = st.sampled_from([1.0, 0.5, 1 / 3, 0.25, 1 / 7, 0.1, 0.3, 0.7]) | st.floats(0.01, 1.0)
_BUNDLE = st.dictionaries(st.sampled_from(sorted(CAND.cap)), _SHARE, min_size=1).map(
    lambda shares: Bundle(resources={r: s * CAND.cap[r] for r, s in shares.items()}))


@settings(max_examples=200, deadline=None)
@given(st.lists(_BUNDLE, min_size=1, max_size=70).map(tuple))
def test_tree_first_fit_places_like_the_plain_loop(bundles):
    assert _pack(bundles, Strategy.PACK, CAND) == plain_first_fit_decreasing(bundles)


def test_many_identical_bundles_fill_pods_in_order():
    bundles = tuple(Bundle(resources={"GPU": 1.0, "CPU": 4.0}) for _ in range(1000))
    assert _pack(bundles, Strategy.PACK, CAND) == [i // 8 for i in range(1000)]


def test_pods_that_each_lack_one_resource_are_searched_like_the_plain_loop():
    """Half the pods keep CPU but no GPU, half GPU but no CPU; the small bundles go past all of them."""
    big = [{"GPU": 8.0, "CPU": 50.0} if i % 2 else {"GPU": 1.0, "CPU": 96.0} for i in range(100)]
    bundles = tuple(Bundle(resources=r) for r in big + [{"GPU": 1.0, "CPU": 1.0}] * 100 + [{"CPU": 40.0}] * 20)
    assert _pack(bundles, Strategy.PACK, CAND) == plain_first_fit_decreasing(bundles)
