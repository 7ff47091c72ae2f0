"""Logs (issue 26 item 7): the driver library logs its progress through ``logging`` (logger ``raygpu.gang.api``),
callback or not, with a line every ``WAIT_LINE_EVERY_S`` while a reservation waits; the sidecar's text lines carry
the date and the zone; ``--log-level`` on the command line, before or after the command's name.

The watchdog is driven step by step on a fake clock against the one fake Kubernetes and a fake Ray, as in
test_gang_lifecycle.py.
"""

from __future__ import annotations

import logging
import re
import sys
import time

import pytest

from raygpu.cli import main
from raygpu.gang import api
from raygpu.gang.api import GangPlacementGroup, Progress, RayCalls
from raygpu.gang.reservation import reserve
from raygpu.model.gang import ReservationState
from raygpu.model.labels import LABEL_RESERVATION
from raygpu.model.views import K8sPodView
from raygpu.reclaim.logs import JsonFormatter, TextFormatter
from raygpu.testing.builders.clusters import cluster, gang, gpus
from raygpu.testing.fake_kube import FakeKube

S = ReservationState
TIMEOUT_S = 600.0


class Clock:
    def __init__(self) -> None:
        self.now_s = 1000.0

    def __call__(self) -> float:
        return self.now_s


class Driver:
    """One reservation of 2 x 8 GPUs on cluster ``c`` (backend none), its handle made with ``progress``."""

    def __init__(self, progress=None) -> None:
        self.kube = FakeKube(cluster("c").worker("gpu", gpus=8).raw(), kuberay=True)
        self.nodes: list[dict] = []
        self.clock = Clock()
        rsv = reserve(self.kube, gang(gpus(8, 2), backend="none", timeout_s=TIMEOUT_S), time.time(),
                      progress=Progress.of(progress))
        self.group = rsv.plan.reservation_group
        calls = RayCalls(placement_group=lambda *a, **k: _Pg(), placement_group_table=lambda pg: {"state": "CREATED"},
                         remove_placement_group=lambda pg: None, nodes=lambda: list(self.nodes))
        self.pg = GangPlacementGroup(rsv, progress, ray_calls=calls, clock=self.clock, start_watchdog=False)

    def pods(self, n: int, phase: str, scheduled: int) -> None:
        self.kube.extra_pods = [K8sPodView(name=f"{self.group}-{i}", namespace="default",
                                           node_name=f"k{i}" if i < scheduled else None, phase=phase,
                                           labels={LABEL_RESERVATION: self.group}, ray_cluster="c",
                                           ray_group=self.group, ray_node_type="worker") for i in range(n)]

    def after(self, seconds: float) -> None:
        self.clock.now_s += seconds
        self.pg.watchdog.step()


class _Pg:
    id = b"\x01" * 18

    def ready(self) -> str:
        return "ready-ref"


def logged(caplog: pytest.LogCaptureFixture, level: int = logging.INFO) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "raygpu.gang.api" and r.levelno == level]


# ---------------------------------------------------------------- the driver library

def test_without_a_callback_a_wait_of_minutes_is_logged_at_info(caplog):
    caplog.set_level(logging.INFO, logger="raygpu")
    d = Driver(progress=None)
    assert [m for m in logged(caplog) if m.startswith("plan: ")]  # reserve's own line, logged too
    d.pods(2, "Pending", scheduled=0)
    d.after(1)
    d.after(api.WAIT_LINE_EVERY_S - 2)  # 29 s: no wait line yet
    assert not [m for m in logged(caplog) if "still" in m]
    d.after(1)
    d.after(api.WAIT_LINE_EVERY_S - 1)  # one line per period, not one per step
    d.after(1)
    assert [m for m in logged(caplog) if "still" in m] == [
        f"reservation {d.group}: still reserved after 30 s of timeout_s=600 (2/2 pods exist, 0 scheduled, 0 Running)",
        f"reservation {d.group}: still reserved after 60 s of timeout_s=600 (2/2 pods exist, 0 scheduled, 0 Running)",
    ]


def test_the_wait_line_says_what_is_missing_at_each_stage_and_stops_once_ready(caplog):
    caplog.set_level(logging.INFO, logger="raygpu")
    d = Driver()
    d.pods(2, "Pending", scheduled=1)
    d.after(api.WAIT_LINE_EVERY_S)
    d.pods(2, "Running", scheduled=2)
    d.after(1)
    d.after(1)
    assert d.pg.state == S.BOUND
    d.nodes = [{"Alive": True, "Labels": {LABEL_RESERVATION: d.group}}]  # one of the two Ray nodes joined
    d.after(api.WAIT_LINE_EVERY_S)
    waits = [m.split(": ", 1)[1] for m in logged(caplog) if "still" in m]
    assert waits == ["still reserved after 30 s of timeout_s=600 (2/2 pods exist, 1 scheduled, 0 Running)",
                     "still bound after 62 s of timeout_s=600 (2 pods Running; 1/2 of their Ray nodes joined)"]
    assert f"reservation {d.group}: bound" in logged(caplog)  # each state the watchdog saw
    d.nodes = d.nodes * 2
    d.after(1)
    d.after(1)
    assert d.pg.state == S.READY
    d.after(api.WAIT_LINE_EVERY_S * 3)
    assert len([m for m in logged(caplog) if "still" in m]) == 2  # ready: no more wait lines


def test_a_callback_gets_the_same_lines_as_the_log(caplog):
    caplog.set_level(logging.INFO, logger="raygpu")
    said: list[str] = []
    d = Driver(progress=said.append)
    d.pods(2, "Pending", scheduled=0)
    d.after(api.WAIT_LINE_EVERY_S)
    d.pg.remove()
    assert said and said == logged(caplog)
    assert said[-1] == f"reservation {d.group} released"


def test_a_warning_is_logged_once_at_warning_and_reaches_the_callback_once():
    said: list[str] = []
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append
    logging.getLogger("raygpu.gang.api").addHandler(handler)
    try:
        Progress(said.append).warning("watchdog: lost access")
    finally:
        logging.getLogger("raygpu.gang.api").removeHandler(handler)
    assert said == ["watchdog: lost access"]
    assert [(r.levelname, r.getMessage()) for r in records] == [("WARNING", "watchdog: lost access")]


def test_progress_of_wraps_once():
    p = Progress(print)
    assert Progress.of(p) is p and Progress.of(None).callback is None


# ---------------------------------------------------------------- the sidecar's text and JSON lines

@pytest.fixture
def zone(monkeypatch):
    """The local zone set to UTC+05:30 (a POSIX TZ string: no tz database needed), restored afterwards."""
    monkeypatch.setenv("TZ", "IST-5:30")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def record(created_s: float, msg: str = "cycle", **fields) -> logging.LogRecord:
    r = logging.LogRecord("raygpu.sidecar", logging.INFO, __file__, 1, msg, None, None)
    r.created, r.fields = created_s, fields
    return r


def test_a_text_line_carries_the_date_and_the_zone(zone):
    line = TextFormatter().format(record(1796523465.25, outcome="ok"))  # 2026-12-06 02:17:45.25 UTC
    assert line == "2026-12-06T07:47:45.250+05:30 INFO    cycle outcome=ok"
    stamp = line.split(" ", 1)[0]
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}[+-]\d\d:\d\d", stamp)


def test_a_json_line_is_in_utc_whatever_the_local_zone(zone):
    import json
    out = json.loads(JsonFormatter().format(record(1796523465.25, outcome="ok")))
    assert out["ts"] == "2026-12-06T02:17:45.250+00:00" and out["outcome"] == "ok"


# ---------------------------------------------------------------- --log-level

PLAN_BAD_BUNDLE = ["plan", "--cluster", "rc", "--bundle", "GPU=x"]  # exits 2 before contacting anything


@pytest.mark.parametrize("argv, level", [
    (["--log-level", "debug", *PLAN_BAD_BUNDLE], logging.DEBUG),
    ([*PLAN_BAD_BUNDLE, "--log-level", "INFO"], logging.INFO),
    (["--log-level", "error", *PLAN_BAD_BUNDLE, "--log-level", "warning"], logging.WARNING),  # the later wins
])
def test_log_level_sends_raygpu_records_of_that_level_to_stderr(argv, level, no_contact, capsys):
    assert main(argv) == 2
    root = logging.getLogger("raygpu")
    assert root.level == level and [h.stream for h in root.handlers] == [sys.stderr]
    assert isinstance(root.handlers[0].formatter, TextFormatter)
    assert no_contact == []


def test_without_log_level_no_handler_is_installed(no_contact):
    before = logging.getLogger("raygpu").handlers[:]
    assert main(PLAN_BAD_BUNDLE) == 2
    assert logging.getLogger("raygpu").handlers == before


@pytest.mark.parametrize("argv", [
    ["--log-level", "verbose", *PLAN_BAD_BUNDLE],
    [*PLAN_BAD_BUNDLE, "--log-level", "5"],
    ["testbed", "status", "--log-level", "trace"],  # a sub-sub-command takes it too
])
def test_a_bad_log_level_exits_2_with_the_reason_before_anything_is_contacted(argv, no_contact, capsys):
    with pytest.raises(SystemExit) as e:
        main(argv)
    err = capsys.readouterr().err
    assert e.value.code == 2 and no_contact == []
    assert "argument --log-level:" in err and "is not one of debug, info, warning, error" in err


def test_the_sidecar_logs_to_stdout_at_the_level_given():
    argv = ["sidecar", "--once", "--kubeconfig", "/nonexistent/kubeconfig", "--metrics-port", "0", "--cluster", "c",
            "--namespace", "n"]
    assert main([*argv, "--log-level", "warning"]) == 2  # the kubeconfig is missing: after the logs are set up
    root = logging.getLogger("raygpu")
    assert root.level == logging.WARNING and [h.stream for h in root.handlers] == [sys.stdout]
    assert main(argv) == 2
    assert logging.getLogger("raygpu").level == logging.INFO  # the sidecar's default
