"""The async face of a gang placement group, for asyncio drivers (Ray Serve, asyncio apps).

Nothing here blocks the event loop: waiting is ``await asyncio.sleep`` between looks at the handle's
state (which the watchdog thread keeps current), and the Kubernetes work (reserve, release) runs in a
worker thread. The contracts are those of the blocking calls in raygpu.gang.api, with the same
deadlines and errors:

    pg = await raygpu.placement_group_async([{"GPU": 8}] * 2, cluster="rc")
    await pg.ready_async()            # like ray.get(pg.ready())
    ...
    await pg.remove_async()

    async with raygpu.gang_placement_group_async([{"GPU": 8}] * 2, cluster="rc") as pg:
        await pg.ready_async()

Cancelling a task that awaits ``placement_group_async`` does not leak the reservation: one that was
already being made is released as soon as it exists. Cancelling ``ready_async``/``wait_async`` only
stops waiting (the reservation is the caller's to remove, as with a blocking wait).
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import threading
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, AsyncIterator

from raygpu.errors import PermanentError
from raygpu.model.gang import ReservationState

if TYPE_CHECKING:
    from raygpu.gang.api import GangPlacementGroup

POLL_S = 0.1  # how often an awaiting coroutine looks at the handle's state


class AsyncFace:
    """``ready_async``, ``wait_async``, ``remove_async`` and ``interrupt_async`` of GangPlacementGroup."""

    def _not_ready_error(self) -> PermanentError:
        return PermanentError(f"reservation {self.plan.reservation_group} not ready within timeout_s="
                              f"{self.reservation.request.timeout_s:g} (state {self.state.value}); "
                              "the watchdog rolls it back")

    def _released_error(self) -> PermanentError:
        return PermanentError(f"reservation {self.plan.reservation_group} "
                              + (f"rolled back: {self.error}" if self.error else "released"))

    async def ready_async(self, poll_s: float = POLL_S) -> Any:
        """Wait, without blocking the loop, until every bundle is placed; the Ray PG's ready value.

        ``await pg.ready_async()`` is ``ray.get(pg.ready())`` for asyncio: it waits for the Ray placement
        group to exist (the reserved pods' Ray nodes joined), then awaits Ray's ready ObjectRef. Raises
        PermanentError as ``ready()`` does: once a release or rollback began, or past the reservation's
        deadline plus the watchdog's join time.
        """
        while not self._released and not self._pg_created.is_set():
            if self._overdue():
                raise self._not_ready_error()
            await asyncio.sleep(poll_s)
        if self._released:
            raise self._released_error()
        ref = self.placement_group.ready()
        return await ref if inspect.isawaitable(ref) else ref

    async def wait_async(self, timeout_s: float | None = None, poll_s: float = POLL_S) -> bool:
        """``wait()`` for asyncio: True once the state ConfigMap says ready; False on ``timeout_s``, a
        rollback or the reservation's deadline. Never waits past the deadline plus the join time."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout_s is None else loop.time() + timeout_s
        while not self._released:
            if self.state == ReservationState.READY:
                return True
            if (deadline is not None and loop.time() > deadline) or self._overdue():
                return False
            await asyncio.sleep(poll_s)
        while not self._done.is_set() and (deadline is None or loop.time() < deadline):
            await asyncio.sleep(poll_s)  # the release attempt in flight ends (as wait() waits for it)
        return False

    async def remove_async(self) -> None:
        """``remove()`` in a worker thread: the placement group and the reservation released (idempotent).
        Raises the release's error, as ``remove()`` does; awaiting it again tries again."""
        await asyncio.to_thread(self.remove)

    async def interrupt_async(self, reason: str = "cancelled") -> None:
        """``interrupt()`` in a worker thread: released within its budget, the rest left to the finisher."""
        await asyncio.to_thread(self.interrupt, reason)


async def placement_group_async(bundles: list[dict[str, float]], strategy: str | None = None,
                                **kwargs: Any) -> "GangPlacementGroup":
    """``raygpu.placement_group(...)`` for asyncio: the reservation is made in a worker thread.

    Same arguments, result and errors. If the awaiting task is cancelled while the reservation is being
    made, the reservation is released (``interrupt()``) as soon as it exists, and the cancellation raised.
    """
    from raygpu.gang.api import placement_group
    fut = asyncio.get_running_loop().run_in_executor(None, functools.partial(placement_group, bundles, strategy,
                                                                             **kwargs))
    try:
        return await asyncio.shield(fut)
    except asyncio.CancelledError:
        fut.add_done_callback(_release_when_made)
        raise


def _release_when_made(fut: "asyncio.Future[GangPlacementGroup]") -> None:
    if fut.cancelled() or fut.exception() is not None:
        return
    pg = fut.result()
    threading.Thread(target=pg.interrupt, args=("the awaiting task was cancelled",), daemon=False,
                     name=f"raygpu-cancel-{pg.plan.gang_name}").start()


@asynccontextmanager
async def gang_placement_group_async(bundles: list[dict[str, float]], strategy: str | None = None,
                                     **kwargs: Any) -> AsyncIterator["GangPlacementGroup"]:
    """``async with raygpu.gang_placement_group_async(...) as pg:`` - released on exit, error or cancellation
    (a cancellation releases within the interrupt budget, as Ctrl-C does for the blocking form)."""
    pg = await placement_group_async(bundles, strategy, **kwargs)
    try:
        yield pg
    except (asyncio.CancelledError, KeyboardInterrupt):
        await asyncio.shield(pg.interrupt_async("the awaiting task was cancelled"))
        raise
    finally:
        await asyncio.shield(pg.remove_async())  # a no-op after interrupt
