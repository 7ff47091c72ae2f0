"""benchmarks.fetch_traces: the pinned checksums, the cache's path logic, and the clear exit 2 when offline or
a download does not match (issue 16 item 7). No network: a fake opener serves the bytes of ../shared/traces
(the same files, copied from alibaba/clusterdata at the pinned commit)."""

from __future__ import annotations

import io
import subprocess
import urllib.error
from pathlib import Path

import pytest

from benchmarks import fetch_traces as ft
from benchmarks._common import traces_dir

SHARED = traces_dir()  # ../shared/traces on this machine
needs_shared = pytest.mark.skipif(not (SHARED / ft.FILES[0].local).is_file(),
                                  reason=f"the shared traces are not at {SHARED}")


def serve(folder: Path, *, tamper: str = "", calls: list[str] | None = None):
    """An opener that answers each pinned URL with the bytes of the matching file in ``folder``."""
    by_url = {ft.BASE_URL + tf.upstream: tf for tf in ft.FILES}

    def opener(url: str):
        if calls is not None:
            calls.append(url)
        data = (folder / by_url[url].local).read_bytes()
        return io.BytesIO(data + b"x" if tamper and url.endswith(tamper) else data)
    return opener


def offline(url: str):
    raise urllib.error.URLError("[Errno -3] Temporary failure in name resolution")


@needs_shared
def test_the_pinned_checksums_are_those_of_the_shared_traces():
    assert ft.problems(SHARED) == []
    assert {tf.local for tf in ft.FILES} == {str(p.relative_to(SHARED)) for p in SHARED.rglob("*")
                                             if p.is_file() and p.name != "README.md"}


def test_every_url_names_the_pinned_commit_of_alibaba_clusterdata():
    assert len(ft.COMMIT) == 40 and ft.COMMIT.startswith("7a6c496e")
    assert ft.BASE_URL == f"https://raw.githubusercontent.com/alibaba/clusterdata/{ft.COMMIT}/"
    assert all(len(tf.sha256) == 64 and not tf.upstream.startswith("/") for tf in ft.FILES)


@needs_shared
def test_fetch_writes_every_file_verified_then_downloads_nothing_twice(tmp_path, capsys):
    calls: list[str] = []
    assert ft.main(["--dest", str(tmp_path)], opener=serve(SHARED, calls=calls)) == 0
    assert len(calls) == len(ft.FILES) and ft.problems(tmp_path) == []
    assert not list(tmp_path.rglob("*.part"))
    calls.clear()
    assert ft.main(["--dest", str(tmp_path)], opener=serve(SHARED, calls=calls)) == 0
    assert calls == []  # all there and verified
    assert "0 file(s) downloaded" in capsys.readouterr().out


@needs_shared
def test_a_checksum_mismatch_exits_2_and_keeps_no_file(tmp_path, capsys):
    assert ft.main(["--dest", str(tmp_path)], opener=serve(SHARED, tamper="node_info_df.csv")) == 2
    err = capsys.readouterr().err
    assert "checksum mismatch" in err and "node_info_df.csv" in err
    assert not (tmp_path / "alibaba-spot-v2026" / "node_info_df.csv").exists()
    assert not list(tmp_path.rglob("*.part"))


@needs_shared
def test_a_corrupt_cached_file_is_downloaded_again(tmp_path):
    assert ft.main(["--dest", str(tmp_path)], opener=serve(SHARED)) == 0
    bad = tmp_path / ft.FILES[0].local
    bad.write_bytes(b"truncated")
    assert ft.main(["--dest", str(tmp_path), "--check"], opener=offline) == 2
    calls: list[str] = []
    assert ft.main(["--dest", str(tmp_path)], opener=serve(SHARED, calls=calls)) == 0
    assert calls == [ft.BASE_URL + ft.FILES[0].upstream] and ft.problems(tmp_path) == []


def test_offline_exits_2_saying_so(tmp_path, capsys):
    assert ft.main(["--dest", str(tmp_path)], opener=offline) == 2
    err = capsys.readouterr().err
    assert "cannot download https://raw.githubusercontent.com/alibaba/clusterdata/" in err and "offline?" in err
    assert not [p for p in tmp_path.rglob("*") if p.is_file()]


def test_check_on_an_empty_folder_lists_what_is_missing(tmp_path, capsys):
    assert ft.main(["--dest", str(tmp_path), "--check"], opener=offline) == 2
    assert capsys.readouterr().err.count("missing: ") == len(ft.FILES)


def test_the_cache_defaults_under_raygpu_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("RAYGPU_CACHE", str(tmp_path))
    assert ft.default_cache() == tmp_path / "traces"
    monkeypatch.delenv("RAYGPU_CACHE")
    assert ft.default_cache() == Path.home() / ".cache" / "raygpu" / "traces"


def test_benchmarks_use_the_cache_when_no_shared_traces_are_next_to_the_checkout(monkeypatch, tmp_path):
    checkout = tmp_path / "clone" / "raygpu"
    checkout.mkdir(parents=True)
    monkeypatch.delenv("RAYGPU_TRACES", raising=False)
    monkeypatch.setenv("RAYGPU_CACHE", str(tmp_path / "cache"))
    assert traces_dir(checkout) == checkout.parent / "shared" / "traces"  # nothing anywhere: the first, to skip
    (tmp_path / "cache" / "traces").mkdir(parents=True)
    assert traces_dir(checkout) == tmp_path / "cache" / "traces"
    (checkout.parent / "shared" / "traces").mkdir(parents=True)
    assert traces_dir(checkout) == checkout.parent / "shared" / "traces"  # the shared copy wins
    monkeypatch.setenv("RAYGPU_TRACES", str(tmp_path / "elsewhere"))
    assert traces_dir(checkout) == tmp_path / "elsewhere"


def test_a_git_worktree_finds_the_traces_next_to_its_main_repository(monkeypatch, tmp_path):
    """/work/main and its worktree /work/wt/x: ../shared/traces of the main repository (else the smoke tests
    of every worktree skip, the traces being right there)."""
    main, wt = tmp_path / "main", tmp_path / "wt" / "x"
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(main)]
    main.mkdir()
    for args in (["init", "-q"], ["commit", "-q", "--allow-empty", "-m", "x"], ["worktree", "add", "-q", str(wt)]):
        subprocess.run(git + args, check=True, capture_output=True, timeout=30)
    monkeypatch.delenv("RAYGPU_TRACES", raising=False)
    monkeypatch.setenv("RAYGPU_CACHE", str(tmp_path / "cache"))
    (tmp_path / "shared" / "traces").mkdir(parents=True)
    assert traces_dir(wt) == tmp_path / "shared" / "traces"
    assert traces_dir(main) == tmp_path / "shared" / "traces"


def test_the_cli_help_runs():
    import subprocess
    import sys
    out = subprocess.run([sys.executable, "-m", "benchmarks.fetch_traces", "--help"], capture_output=True,
                         text=True, cwd=Path(__file__).resolve().parents[2], timeout=60)
    assert out.returncode == 0 and "--check" in out.stdout and ft.COMMIT[:8] not in out.stderr
