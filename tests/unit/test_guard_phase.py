"""model/guard.py: the hold's phases, one table of legal edges (ALLOWED_HOLD_TRANSITIONS)."""

from __future__ import annotations

import itertools

import pytest

from raygpu.errors import PermanentError
from raygpu.model.guard import ALLOWED_HOLD_TRANSITIONS, HELD, HoldPhase, check_hold_transition

P = HoldPhase
LEGAL = {
    (P.WAITING, P.CHOOSING), (P.WAITING, P.RELEASED),
    (P.CHOOSING, P.BLOCKING), (P.CHOOSING, P.STOPPED), (P.CHOOSING, P.FAILED), (P.CHOOSING, P.RELEASED),
    (P.BLOCKING, P.SWAPPING), (P.BLOCKING, P.STOPPED), (P.BLOCKING, P.FAILED), (P.BLOCKING, P.RELEASED),
    (P.SWAPPING, P.SWAPPED), (P.SWAPPING, P.STOPPED), (P.SWAPPING, P.FAILED), (P.SWAPPING, P.RELEASED),
    (P.SWAPPED, P.UNBLOCKED), (P.SWAPPED, P.STOPPED), (P.SWAPPED, P.FAILED), (P.SWAPPED, P.RELEASED),
    (P.UNBLOCKED, P.STOPPED), (P.UNBLOCKED, P.FAILED), (P.UNBLOCKED, P.RELEASED),
    (P.STOPPED, P.WAITING), (P.STOPPED, P.FAILED), (P.STOPPED, P.RELEASED),
    (P.FAILED, P.RELEASED),
}


def test_the_table_is_exactly_the_legal_edges_and_names_every_phase():
    assert {(a, b) for a, nxt in ALLOWED_HOLD_TRANSITIONS.items() for b in nxt} == LEGAL
    assert set(ALLOWED_HOLD_TRANSITIONS) == set(HoldPhase)
    assert HELD == {P.CHOOSING, P.BLOCKING, P.SWAPPING, P.SWAPPED, P.UNBLOCKED}
    assert not ALLOWED_HOLD_TRANSITIONS[P.RELEASED]  # the only terminal phase


@pytest.mark.parametrize("a,b", sorted(LEGAL))
def test_a_legal_edge_is_taken(a, b):
    assert check_hold_transition(a, b) is b


@pytest.mark.parametrize("a,b", sorted(set(itertools.product(HoldPhase, HoldPhase)) - LEGAL))
def test_an_illegal_edge_raises_naming_what_is_allowed(a, b):
    with pytest.raises(PermanentError, match=f"illegal hold transition {a.value} -> {b.value}"):
        check_hold_transition(a, b)


def test_every_phase_but_released_can_end_and_a_lost_hold_is_back_in_line_only_through_stopped():
    assert all(P.RELEASED in ALLOWED_HOLD_TRANSITIONS[p] for p in HoldPhase if p != P.RELEASED)
    assert {a for a, b in LEGAL if b == P.WAITING} == {P.STOPPED}
    assert {a for a, b in LEGAL if b == P.STOPPED} == HELD
