"""``FreeIndex``'s one-pass queries answer as the queries they fold together (``plan.common.free_index``).

``pick`` is ``buckets`` + ``best_free`` + ``best_cands`` in one pass (the simulation of ``plan.pending`` asks it
once per bundle); ``less`` moves a node to its free resources less a demand with what is left worked out
once per (free resources, demand); ``set_role`` moves it to another role on what it has (``set_roles``: many at
once, answering as one ``set_role`` after another). Seeded random
indexes, changed by random steps, compared with those queries and with plain arithmetic after every step.
"""

from __future__ import annotations

import random

import pytest

from raygpu.plan.common.free_index import CAND, FREE, FreeIndex

DEMANDS = ({"GPU": 1.0}, {"GPU": 2.0, "CPU": 4.0}, {"GPU": 4.0, "CPU": 8.0}, {"CPU": 2.0})
SELECTORS = ([], [{"zone": "a"}], [{"zone": "in(a,b)"}], [{"zone": "!a"}])


def _reference_pick(ix: FreeIndex, demand, selectors, skip, spare):
    """What ``plan.pending._pick`` did before ``FreeIndex.pick``: every bucket's best of each role."""
    best_free, best_cand = None, None
    for bucket in ix.buckets(demand, selectors):
        nid = ix.best_free(bucket, skip)
        if nid is not None:
            key = (bucket.free.get("GPU", 0.0), nid)
            best_free = key if best_free is None or key < best_free else best_free
        for rank, cid in ix.best_cands(bucket, skip):
            key = (spare[ix.group[cid]] <= 0, rank)
            best_cand = (key, cid) if best_cand is None or key < best_cand[0] else best_cand
    if best_free is not None:
        return best_free[1], False
    if best_cand is not None:
        return best_cand[1], True
    return None, False


def _random_index(seed: int) -> FreeIndex:
    rng = random.Random(f"index {seed}")
    ix = FreeIndex()
    for i in range(rng.randrange(5, 60)):
        gpus = float(rng.choice((1, 2, 4, 8)))
        free = {"GPU": gpus, "CPU": 2.0 * gpus} if rng.random() < 0.8 else {"CPU": 4.0, "GPU": gpus}
        role = CAND if rng.random() < 0.6 else FREE
        ix.add(f"n{i:03d}", {"zone": rng.choice("ab")}, free, role, rng.choice(("g1", "g2")),
               (rng.randrange(3), rng.random(), f"n{i:03d}"))
    return ix


@pytest.mark.parametrize("seed", range(40))
def test_pick_less_and_set_role_answer_as_the_queries_they_fold(seed):
    rng = random.Random(seed)
    ix = _random_index(seed)
    mirror = _random_index(seed)  # the same index, changed by plain moves and asked the old way
    spare = {"g1": rng.randrange(-1, 3), "g2": rng.randrange(-1, 3)}
    picked = 0
    for _ in range(120):
        demand, selectors = rng.choice(DEMANDS), rng.choice(SELECTORS)
        skip = set(rng.sample(sorted(ix.free), k=min(3, len(ix.free)))) if rng.random() < 0.3 else set()
        got = ix.pick(demand, selectors, skip, spare)
        assert got == _reference_pick(mirror, demand, selectors, skip, spare)
        nid, is_cand = got
        if nid is None:
            continue
        picked += 1
        assert is_cand == (ix.role[nid] == CAND)
        if rng.random() < 0.2:  # a role change on the same free resources
            role = FREE if ix.role[nid] == CAND else CAND
            ix.set_role(nid, role)
            mirror.move(nid, mirror.free[nid], role)
        else:  # the unit is placed: what is left of its node, the same on both
            have = mirror.free[nid]
            mirror.move(nid, {k: have.get(k, 0.0) - demand.get(k, 0.0) for k in set(have) | set(demand)}, FREE)
            ix.less(nid, demand, FREE)
        assert ix.free[nid] == mirror.free[nid] and ix.role[nid] == mirror.role[nid]
        spare[ix.group[nid]] -= is_cand
    assert picked > 10  # the walk placed units, not only asked


def test_less_shares_what_is_left_by_the_nodes_of_one_bucket_without_sharing_their_fate():
    ix = FreeIndex()
    for n in ("a", "b"):
        ix.add(n, {}, {"GPU": 4.0, "CPU": 8.0}, CAND, "g", (0, n))
    ix.less("a", {"GPU": 4.0, "CPU": 8.0})
    ix.less("b", {"GPU": 4.0, "CPU": 8.0})
    assert ix.free["a"] is ix.free["b"]  # worked out once
    assert ix.free["a"] == {"GPU": 0.0, "CPU": 0.0} and ix.role["a"] == CAND  # role kept when none is given
    ix.less("a", {"GPU": -1.0})  # a new map: b's is not changed in place
    assert ix.free["a"] == {"GPU": 1.0, "CPU": 0.0} and ix.free["b"] == {"GPU": 0.0, "CPU": 0.0}
    assert ix.pick({"GPU": 1.0}, [], set(), {"g": 1}) == ("a", True)


@pytest.mark.parametrize("seed", range(40))
def test_set_roles_answers_as_one_set_role_after_another(seed):
    rng = random.Random(f"roles {seed}")
    ix, mirror = _random_index(seed), _random_index(seed)
    for _ in range(6):
        role = rng.choice((FREE, CAND))
        nodes = rng.sample(sorted(ix.free), k=rng.randrange(0, len(ix.free) + 1))
        ix.set_roles(nodes, role)
        for n in nodes:
            mirror.set_role(n, role)
        assert ix.role == mirror.role and ix.free == mirror.free
        spare = {"g1": rng.randrange(-1, 3), "g2": rng.randrange(-1, 3)}
        for demand in DEMANDS:
            for selectors in SELECTORS:
                skip = set(rng.sample(sorted(ix.free), k=min(2, len(ix.free))))
                assert ix.pick(demand, selectors, skip, spare) == mirror.pick(demand, selectors, skip, spare)
                assert sorted(n for b in ix.buckets(demand, selectors) for n in ix.cands(b)) == \
                    sorted(n for b in mirror.buckets(demand, selectors) for n in mirror.cands(b))
