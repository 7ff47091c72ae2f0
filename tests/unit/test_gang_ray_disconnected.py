"""After ``ray.shutdown()`` raygpu never calls Ray again: Ray's placement-group calls would ``ray.init()`` a new
local Ray instance on their own (``auto_init_ray``), from the watchdog's thread or at interpreter exit (Ray's
atexit hook runs before raygpu's). The watchdog releases the reservation instead: the job ended and Ray removed
its (non-detached) placement group with it."""

from __future__ import annotations

import dataclasses

import pytest
import ray

from raygpu.gang.api import RayCalls, RayDisconnected
from raygpu.model.gang import ReservationState
from tests.unit.test_gang_lifecycle import World

S = ReservationState


def test_ray_calls_refuse_without_a_connected_driver_and_start_no_local_ray():
    assert not ray.is_initialized(), "the unit tests never connect a driver"
    calls = RayCalls.real()
    for call in (lambda: calls.placement_group([{"CPU": 1}]), lambda: calls.placement_group_table(None),
                 lambda: calls.remove_placement_group(None), calls.nodes):
        with pytest.raises(RayDisconnected):
            call()
        assert not ray.is_initialized(), "no local Ray instance was started"
    assert calls.connected() is False


class DisconnectingWorld(World):
    """A World whose fake Ray can be disconnected: every Ray call then fails the test."""

    def __init__(self) -> None:
        self.connected = True
        self.calls_after: list[str] = []
        super().__init__()
        fake = self.pg._ray

        def only_connected(name, fn):
            def call(*a, **kw):
                if not self.connected:
                    self.calls_after.append(name)
                    raise RayDisconnected("disconnected")
                return fn(*a, **kw)
            return call
        self.pg._ray = dataclasses.replace(
            fake, connected=lambda: self.connected,
            **{f: only_connected(f, getattr(fake, f)) for f in
               ("placement_group", "placement_group_table", "remove_placement_group", "nodes")})


def ready_world() -> DisconnectingWorld:
    w = DisconnectingWorld()
    w.bound()
    w.nodes_joined()
    w.pg.watchdog.step()
    w.pg.watchdog.step()
    assert w.pg.state == S.READY
    return w


def test_a_ready_gang_whose_driver_disconnected_is_released_by_the_watchdog_without_calling_ray():
    w = ready_world()
    w.connected = False  # the user's ray.shutdown() without remove_placement_group()
    assert w.pg.watchdog.step() == "done"
    assert w.released() and w.pg.state == S.ROLLED_BACK, w.said  # ended with a reason, not by remove()
    assert "disconnected" in (w.pg.error or ""), w.pg.error
    assert w.calls_after == ["remove_placement_group"], "only the removal was tried, and it started nothing"
    assert not any("failed" in m for m in w.said), w.said
    w.pg.remove()  # a no-op afterwards, no error
    assert w.released()


def test_a_waiting_gang_whose_driver_disconnected_is_rolled_back_at_once_not_at_its_deadline():
    w = DisconnectingWorld()
    w.pg.watchdog.step()
    assert w.pg.state == S.RESERVED
    w.connected = False
    assert w.pg.watchdog.step() == "done"
    assert w.released() and w.calls_after == [] and w.ray.created == []


def test_remove_after_ray_shutdown_releases_the_reservation_and_reports_no_ray_failure():
    w = ready_world()
    w.connected = False
    w.pg.remove()
    assert w.released() and w.pg.state == S.RELEASED
    assert not any("failed" in m for m in w.said), w.said
