"""The async face (raygpu.gang.api): waits never block the event loop, with the blocking calls' contracts.

The handle is the one of test_gang_lifecycle's World (fake Ray, the one fake Kubernetes, a fake clock);
its watchdog is stepped by the test. "Never blocks the loop" is shown by a ticker task that keeps
ticking while a coroutine waits.
"""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from raygpu.errors import InfeasibleError, PermanentError
from raygpu.gang import api
from raygpu.model.gang import ReservationState
from tests.unit.test_gang_lifecycle import TIMEOUT_S, World

pytestmark = pytest.mark.asyncio
S = ReservationState


class Ticker:
    """Counts event-loop turns: if a coroutine blocked the loop, the count would stand still."""

    def __init__(self) -> None:
        self.ticks = 0
        self.task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        while True:
            self.ticks += 1
            await asyncio.sleep(0.01)

    async def advanced_by(self, n: int, timeout_s: float = 5.0) -> None:
        start, deadline = self.ticks, time.monotonic() + timeout_s
        while self.ticks < start + n:
            assert time.monotonic() < deadline, "the event loop did not turn"
            await asyncio.sleep(0.01)


async def until(what: str, cond, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.01)


class AwaitableRef:
    """Ray's ObjectRef is awaitable in asyncio; this one resolves when the test says so."""

    def __init__(self) -> None:
        self.resolved = asyncio.Event()

    def __await__(self):
        return self._wait().__await__()

    async def _wait(self) -> str:
        await self.resolved.wait()
        return "placed"


async def test_ready_async_waits_for_the_pg_without_blocking_the_loop_then_awaits_rays_ref():
    w, ticker = World(), Ticker()
    ref = AwaitableRef()
    waiting = asyncio.create_task(w.pg.ready_async(poll_s=0.01))
    await ticker.advanced_by(5)
    assert not waiting.done()  # no Ray PG yet: the reservation is not bound
    w.pg.watchdog.step()
    w.bound()
    w.nodes_joined()
    w.pg.watchdog.step()  # the reserved nodes joined: the Ray PG is created
    assert w.ray.created
    w.ray.created[0].ready = lambda: ref
    await ticker.advanced_by(5)
    assert not waiting.done()  # Ray has not placed the bundles yet: still awaiting its ref, loop still turning
    ref.resolved.set()
    assert await asyncio.wait_for(waiting, 2.0) == "placed"
    ticker.task.cancel()


async def test_wait_async_is_true_once_the_state_says_ready_and_false_on_its_timeout():
    w, ticker = World(), Ticker()
    assert await w.pg.wait_async(0.05, poll_s=0.01) is False
    waiting = asyncio.create_task(w.pg.wait_async(poll_s=0.01))
    await ticker.advanced_by(3)
    w.pg.watchdog.step()
    w.bound()
    w.nodes_joined()
    w.pg.watchdog.step()
    w.pg.watchdog.step()
    assert w.pg.state == S.READY
    assert await asyncio.wait_for(waiting, 2.0) is True
    ticker.task.cancel()


async def test_past_the_deadline_ready_async_raises_and_wait_async_is_false_even_with_the_watchdog_stuck():
    w = World()  # no watchdog steps at all
    w.clock.now_s += TIMEOUT_S + api.WATCHDOG_JOIN_S + 1
    assert await asyncio.wait_for(w.pg.wait_async(poll_s=0.01), 2.0) is False
    with pytest.raises(PermanentError, match="not ready within timeout_s"):
        await asyncio.wait_for(w.pg.ready_async(poll_s=0.01), 2.0)


async def test_after_a_release_ready_async_raises_and_remove_async_released_everything():
    w = World()
    w.pg.watchdog.step()
    await w.pg.remove_async()
    assert w.released() and w.pg.state == S.RELEASED and w.ray.leaked() == []
    with pytest.raises(PermanentError, match="released"):
        await asyncio.wait_for(w.pg.ready_async(poll_s=0.01), 2.0)
    assert await asyncio.wait_for(w.pg.wait_async(poll_s=0.01), 2.0) is False


async def test_remove_async_runs_off_the_loop():
    w, ticker = World(), Ticker()
    gate, entered = threading.Event(), threading.Event()
    real_remove = w.pg.remove

    def slow_remove() -> None:  # a release whose Kubernetes calls take a while
        entered.set()
        gate.wait(5)
        real_remove()
    w.pg.remove = slow_remove
    removing = asyncio.create_task(w.pg.remove_async())
    await until("the release started", entered.is_set)
    await ticker.advanced_by(5)  # the loop turns while the release is in flight
    gate.set()
    await asyncio.wait_for(removing, 5.0)
    assert w.released()
    ticker.task.cancel()


async def test_placement_group_async_gives_the_blocking_calls_result_and_error(monkeypatch):
    w = World()
    seen = []

    def fake_placement_group(bundles, strategy="PACK", **kwargs):
        seen.append((bundles, strategy, kwargs))
        if kwargs.get("cluster") == "nope":
            raise InfeasibleError("no such cluster")
        return w.pg
    monkeypatch.setattr(api, "placement_group", fake_placement_group)
    assert await api.placement_group_async([{"GPU": 8}], "SPREAD", cluster="c") is w.pg
    assert seen[0] == ([{"GPU": 8}], "SPREAD", {"cluster": "c"})
    with pytest.raises(InfeasibleError, match="no such cluster"):
        await api.placement_group_async([{"GPU": 8}], cluster="nope")


async def test_a_cancelled_placement_group_async_releases_the_reservation_once_it_exists(monkeypatch):
    w = World()
    w.pg.watchdog.step()
    gate, entered = threading.Event(), threading.Event()

    def slow_placement_group(bundles, strategy="PACK", **kwargs):
        entered.set()
        gate.wait(5)  # the reservation is being made when the task is cancelled
        return w.pg
    monkeypatch.setattr(api, "placement_group", slow_placement_group)
    task = asyncio.create_task(api.placement_group_async([{"GPU": 8}], cluster="c"))
    await until("the reservation started", entered.is_set)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert not w.released()
    gate.set()  # the reservation now exists: nobody holds it, so it is released
    await until("the orphaned reservation released", w.released)
    assert w.ray.leaked() == []


async def test_the_async_context_manager_releases_on_exit_and_on_cancellation(monkeypatch):
    worlds = [World(), World()]
    handed = iter(worlds)
    monkeypatch.setattr(api, "placement_group", lambda bundles, strategy="PACK", **kw: next(handed).pg)
    async with api.gang_placement_group_async([{"GPU": 8}], cluster="c") as pg:
        assert pg is worlds[0].pg
        assert not worlds[0].released()
    assert worlds[0].released()

    inside = asyncio.Event()

    async def job() -> None:
        async with api.gang_placement_group_async([{"GPU": 8}], cluster="c"):
            inside.set()
            await asyncio.sleep(60)
    task = asyncio.create_task(job())
    await asyncio.wait_for(inside.wait(), 2.0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert worlds[1].released() and worlds[1].ray.leaked() == []
