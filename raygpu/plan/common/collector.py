"""Python's cyclic garbage collector, paused around a decision cycle by a caller that owns its process.

A decision cycle at 10,000 nodes reads a snapshot of ~450,000 objects and allocates a few hundred
thousand short-lived ones (dicts of decisions, tuples, rows). None of them forms a reference cycle: they
die by reference counting when the planner returns. The cyclic collector still runs every ~700
allocations and walks the young objects, and now and then all of them, snapshot included; measured at
10,000 nodes that is ~15% of the cycle's CPU (docs/benchmarks.md). So the sidecar (around ``plan_cycle``)
and ``raygpu doctor`` (around ``reconcile``) pause it, and it is restored on the way out (a collection then
runs at its normal thresholds).

Pausing is the caller's decision, never a planner's: ``plan_gang`` runs inside a user's Ray driver, and a
library call does not switch off the collector of someone else's process (docs/decisions.md, "GC paused").

Process-wide (``gc.disable`` is): threads that allocate during a cycle (the sidecar's watch threads) get
no cyclic collection for that long, at most the cycle's duration; reference counting still frees their
garbage. Nested and concurrent pauses are counted: the collector is re-enabled when the last one ends,
and only if it was enabled when the first began.
"""

from __future__ import annotations

import functools
import gc
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import ParamSpec, TypeVar

_lock = threading.Lock()
_depth = 0
_was_enabled = False

P = ParamSpec("P")
T = TypeVar("T")


@contextmanager
def collector_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector for the ``with`` block; nests and is safe across threads."""
    global _depth, _was_enabled
    with _lock:
        if _depth == 0:
            _was_enabled = gc.isenabled()
            gc.disable()
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0 and _was_enabled:
                gc.enable()


def pauses_collector(fn: Callable[P, T]) -> Callable[P, T]:
    """Decorator: ``fn`` runs inside :func:`collector_paused`."""

    @functools.wraps(fn)
    def run(*args: P.args, **kwargs: P.kwargs) -> T:
        with collector_paused():
            return fn(*args, **kwargs)

    return run
