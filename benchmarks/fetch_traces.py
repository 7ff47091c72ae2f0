"""Fetch the benchmarks' Alibaba clusterdata traces into a cache folder outside the repository.

    python -m benchmarks.fetch_traces            # download into ~/.cache/raygpu/traces (or $RAYGPU_CACHE/traces)
    python -m benchmarks.fetch_traces --check    # only verify what is there (no network)

Every file comes from alibaba/clusterdata at the pinned commit ``COMMIT`` and must have the pinned SHA-256:
a file is written under its final name only after its checksum matched (download to a temporary file in
the same folder, verify, rename), so the cache never holds a partial or altered file. Files already there
with the right checksum are not downloaded again. The benchmarks find the cache through
``benchmarks._common.traces_dir()`` when ``../shared/traces`` is absent.

Exit codes: 0 every file present and verified; 2 offline or the server unreachable, a checksum mismatch
(the file is not kept), or bad usage. The data stays out of the repository: its README allows research
use; cite alibaba/clusterdata in any result.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import tempfile
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Callable

COMMIT = "7a6c496e4f4b6ce6150be8f881cb051bf2abff42"
BASE_URL = f"https://raw.githubusercontent.com/alibaba/clusterdata/{COMMIT}/"
TIMEOUT_S = 60.0


@dataclass(frozen=True)
class TraceFile:
    local: str  # path under the traces folder (the layout of ../shared/traces)
    upstream: str  # path in alibaba/clusterdata at COMMIT
    sha256: str


_OPENB = "cluster-trace-gpu-v2023/csv/"
FILES: tuple[TraceFile, ...] = (
    TraceFile("alibaba-gpu-v2023/openb_node_list_gpu_node.csv", _OPENB + "openb_node_list_gpu_node.csv",
              "2beca64b4d3dfa342036a34b56a495c6cef9225db836c81f541282cb1df320b5"),
    TraceFile("alibaba-gpu-v2023/openb_node_list_all_node.csv", _OPENB + "openb_node_list_all_node.csv",
              "5a85c2af79c66a1efff8bbcbda430400aae56d8431370d738480967e1a9c6b15"),
    TraceFile("alibaba-gpu-v2023/openb_pod_list_default.csv", _OPENB + "openb_pod_list_default.csv",
              "1ee7ed79c27a3b0861cda8ddba86a004c6aba904caafa329a76ae93ca63834a8"),
    TraceFile("alibaba-gpu-v2023/openb_pod_list_multigpu50.csv", _OPENB + "openb_pod_list_multigpu50.csv",
              "206f2f5959db30ecb7c44e7f13197c8ec50b7a35558ad3777cc3662ef0fe5373"),
    TraceFile("alibaba-gpu-v2023/openb_pod_list_gpushare100.csv", _OPENB + "openb_pod_list_gpushare100.csv",
              "12dbc07d6a49bf8641e2275a2ff5bf7be74b5df7d148d531e135b140b95f9a3d"),
    TraceFile("alibaba-spot-v2026/node_info_df.csv", "cluster-trace-v2026-spot-gpu/node_info_df.csv",
              "1aba161961a5a4a1a61aa581383c5e5abe3400b59f8597ba8c4eef7597bc9d18"),
    TraceFile("alibaba-genai-v2026/pod_gpu_duty_cycle_anon.tar.gz",
              "cluster-trace-v2026-GenAI/pod_gpu_duty_cycle_anon.tar.gz",
              "c4070218189b2811995c30dd9fefb8a793a83a54dccebe7b41cab2d123916855"),
)

Opener = Callable[[str], BinaryIO]  # url -> a readable response (urllib's urlopen, or a test's)


class FetchError(Exception):
    """A file could not be fetched and verified; the message says which and why."""


def default_cache() -> Path:
    """``$RAYGPU_CACHE/traces``, default ``~/.cache/raygpu/traces`` (the testbed's cache root)."""
    return Path(os.environ.get("RAYGPU_CACHE", Path.home() / ".cache" / "raygpu")) / "traces"


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def problems(folder: Path) -> list[str]:
    """What is wrong with ``folder`` as a traces folder: one line per missing file or checksum mismatch."""
    out = []
    for tf in FILES:
        p = folder / tf.local
        if not p.is_file():
            out.append(f"missing: {p}")
        elif (got := sha256_of(p)) != tf.sha256:
            out.append(f"checksum mismatch: {p}: sha256 {got}, expected {tf.sha256}")
    return out


def _urlopen(url: str) -> BinaryIO:
    return urllib.request.urlopen(url, timeout=TIMEOUT_S)  # noqa: S310 - a pinned https URL


def fetch(dest: Path, *, opener: Opener = _urlopen, base_url: str = BASE_URL,
          progress: Callable[[str], None] = print) -> list[Path]:
    """Download every file of ``FILES`` missing or wrong in ``dest``; return the paths written.

    A file replaces what is at its path only once its SHA-256 matched. Raises FetchError (offline, HTTP
    error, checksum mismatch) at the first file that fails; files verified before it stay."""
    written = []
    for tf in FILES:
        final = dest / tf.local
        if final.is_file() and sha256_of(final) == tf.sha256:
            continue
        final.parent.mkdir(parents=True, exist_ok=True)
        url = base_url + tf.upstream
        progress(f"fetching {url}")
        fd, tmp_name = tempfile.mkstemp(prefix=final.name + ".", suffix=".part", dir=final.parent)
        tmp = Path(tmp_name)
        try:
            h = hashlib.sha256()
            with os.fdopen(fd, "wb") as out:
                try:
                    with opener(url) as resp:
                        for block in iter(lambda: resp.read(1 << 20), b""):
                            h.update(block)
                            out.write(block)
                except (urllib.error.URLError, OSError) as e:  # HTTPError is a URLError
                    raise FetchError(f"cannot download {url}: {getattr(e, 'reason', e)} "
                                     "(offline? copy ../shared/traces or set RAYGPU_TRACES instead)") from e
            if h.hexdigest() != tf.sha256:
                raise FetchError(f"checksum mismatch for {url}: sha256 {h.hexdigest()}, expected {tf.sha256}; "
                                 "the file was not kept")
            os.replace(tmp, final)
            written.append(final)
        finally:
            tmp.unlink(missing_ok=True)
    return written


def main(argv: list[str] | None = None, *, opener: Opener = _urlopen) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.fetch_traces", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dest", type=Path, default=None,
                    help=f"traces folder (default: $RAYGPU_CACHE/traces, here {default_cache()})")
    ap.add_argument("--check", action="store_true", help="only verify the files in --dest; download nothing")
    args = ap.parse_args(argv)
    dest = (args.dest or default_cache()).expanduser()
    if not args.check:
        try:
            written = fetch(dest, opener=opener)
        except FetchError as e:
            print(f"fetch_traces: {e}", file=sys.stderr)
            return 2
        print(f"{len(written)} file(s) downloaded, {len(FILES) - len(written)} already there")
    bad = problems(dest)
    for line in bad:
        print(f"fetch_traces: {line}", file=sys.stderr)
    if bad:
        return 2
    print(f"traces ready in {dest} (alibaba/clusterdata@{COMMIT[:8]}, {len(FILES)} files verified)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
