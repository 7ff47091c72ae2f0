"""Names raygpu generates (issue 14 item a): valid DNS labels, stable, and one per (cluster, request name)."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from raygpu.testing.builders.clusters import cluster, gang, gpus

from raygpu.model.labels import gang_name, reservation_group_name
from raygpu.plan.gang.reservation import plan_gang

LABEL = re.compile(r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?")  # a DNS label, also a valid label value


def assert_label(name: str) -> None:
    assert LABEL.fullmatch(name), name


@pytest.mark.parametrize("cluster_name,request_name,group,gang", [
    # the names the integration tests and docs show stay as they were
    ("c", "exact", "rg-exact", "c-rg-exact"),
    ("c", "ctrlc", "rg-ctrlc", "c-rg-ctrlc"),
    ("c", "gang-training", "rg-gang-training", "c-rg-gang-training"),
    ("rc", "orphan", "rg-orphan", "rc-rg-orphan"),
    ("c", "job1", "rg-job1", "c-rg-job1"),
    ("c", "pg-1a2b3c4d", "rg-pg-1a2b3c4d", "c-rg-pg-1a2b3c4d"),  # the default request name pg-<8 hex>
    ("rg", "rg", "rg-rg", "rg-rg-rg"),
    # cut, cleaned or ambiguous: hashed, and pinned so a changed hash is noticed
    ("c", "Job 1", "rg-job-1--cbfa023d", "c-rg-job-1--ab433e95"),
    ("a", "b-rg-c", "rg-b-rg-c", "a-rg-b-rg-c--13d0c990"),
    ("a-rg-b", "c", "rg-c", "a-rg-b-rg-c--35c40c32"),
])
def test_names_are_plain_when_short_and_unambiguous(cluster_name, request_name, group, gang):
    assert reservation_group_name(request_name) == group
    assert gang_name(cluster_name, request_name) == gang
    assert_label(group)
    assert_label(gang)


def test_cluster_and_request_that_read_alike_get_different_names():
    """Before: both were ``a-rg-b-rg-c``, one state ConfigMap and PodGroup for two reservations."""
    one = plan_gang(gang(gpus(1), name="b-rg-c", cluster_name="a"), cluster("a").worker("gpu", gpus=8).obj())
    two = plan_gang(gang(gpus(1), name="c", cluster_name="a-rg-b"), cluster("a-rg-b").worker("gpu", gpus=8).obj())
    assert one.gang_name != two.gang_name
    assert (one.reservation_group, two.reservation_group) == ("rg-b-rg-c", "rg-c")


def test_a_request_named_like_a_hashed_name_gets_another_name():
    """Before: ``rg-<cleaned>-<8 hex>`` could be asked for by name (request ``a-559aead0`` took ``A``'s group)."""
    hashed = reservation_group_name("A")
    assert reservation_group_name(hashed[len("rg-"):]) != hashed
    gname = gang_name("c", "Job 1")
    assert gang_name("c", gname[len("c-rg-"):]) != gname


def test_a_100_char_request_name_is_cut_and_kept_apart():
    base = "train-" + "x" * 93
    names = {suffix: (reservation_group_name(base + suffix), gang_name("c", base + suffix)) for suffix in "ab"}
    for group, gname in names.values():
        assert_label(group)
        assert_label(gname)
        assert len(group) == len(gname) == 63 and group.startswith("rg-train-x") and gname.startswith("c-rg-train-x")
    assert names["a"][0] != names["b"][0] and names["a"][1] != names["b"][1]


def test_a_60_char_cluster_name_is_cut_and_kept_apart():
    base = "cluster-" + "y" * 51
    one, two = gang_name(base + "a", "job1"), gang_name(base + "b", "job1")
    assert one != two
    for name in (one, two):
        assert_label(name)
        assert len(name) == 63 and name.startswith("cluster-y")
    assert reservation_group_name("job1") == "rg-job1"  # the worker group does not depend on the cluster


def test_names_are_stable():
    for c, n in [("c", "job1"), ("a", "b-rg-c"), ("c" * 60, "x"), ("c", "n" * 100), ("C.x", "Ünïcode name")]:
        assert gang_name(c, n) == gang_name(c, n) and reservation_group_name(n) == reservation_group_name(n)


# Pieces that make cleaning, cutting and the "-rg-" infix collide if anything can.
_PIECE = st.sampled_from(["a", "b", "rg", "-", "-rg-", "rg-", "-rg", "--", "A", ".", "_", "0", "x" * 30, "1a2b3c4d"])
_TEXT = st.lists(_PIECE, min_size=1, max_size=6).map("".join)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(_TEXT, _TEXT), min_size=2, max_size=8, unique=True))
def test_different_pairs_never_share_a_name(pairs):
    gangs = {gang_name(c, n): (c, n) for c, n in pairs}
    assert len(gangs) == len(pairs), gangs
    groups = {reservation_group_name(n) for n in {n for _, n in pairs}}
    assert len(groups) == len({n for _, n in pairs})
    for name in list(gangs) + list(groups):
        assert_label(name)
