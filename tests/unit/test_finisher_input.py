"""``python -m raygpu.gang.finisher``: bad input is refused before contact; its log is private and never a link."""

from __future__ import annotations

import json
import os
import stat
import tempfile

import pytest

from raygpu.gang import finisher


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "-1", "1e9"])
def test_a_drain_timeout_that_is_not_finite_or_out_of_range_is_refused(value, capsys, no_contact):
    code = finisher.main(["--namespace", "ns", "--cluster", "c", "--reservation", "c-rg-x",
                          f"--drain-timeout-s={value}"])
    line = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert code == 2 and line["event"] == "refused", line
    assert "--drain-timeout-s must be a finite number of seconds >= 0 and <= 86400" in line["reason"], line
    assert no_contact == []


class FakePopen:
    started: list = []

    def __init__(self, cmd, stdout=None, **kw):
        FakePopen.started.append((cmd, stdout))


def test_the_log_is_opened_in_a_private_directory_and_never_through_a_planted_link(tmp_path, monkeypatch):
    shared_tmp = tmp_path / "tmp"
    shared_tmp.mkdir()
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    # what another local user plants at the path the finisher used to take, guessable from the names
    (shared_tmp / "raygpu-finisher-ns-c-rg-x.log").symlink_to(victim)
    monkeypatch.setattr(tempfile, "tempdir", str(shared_tmp))
    monkeypatch.setattr(finisher.subprocess, "Popen", FakePopen)
    FakePopen.started = []
    log_path = finisher.spawn("ns", "c", "c-rg-x")
    assert victim.read_text() == "precious\n", "the finisher wrote through a planted link"
    assert len(FakePopen.started) == 1
    st = os.lstat(log_path)
    assert stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o600
    d = os.lstat(os.path.dirname(log_path))
    assert stat.S_ISDIR(d.st_mode) and stat.S_IMODE(d.st_mode) == 0o700 and d.st_uid == os.getuid()
    assert os.path.dirname(log_path) != str(shared_tmp), "a fresh private directory, not the shared one"
    second = finisher.spawn("ns", "c", "c-rg-x")
    assert second != log_path, "each hand-off its own directory: nothing to predict"
