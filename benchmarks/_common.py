"""Shared helpers of the benchmarks: machine info, trace paths, tables, plots.

``machine()`` is defined once here, so every benchmark notes the same facts
about the box it ran on.
"""

from __future__ import annotations

import csv
import os
import platform
from pathlib import Path
from typing import Any, Iterable, Sequence

ROOT = Path(__file__).resolve().parents[1]
BENCH = Path(__file__).resolve().parent
RESULTS = BENCH / "results"


def machine() -> dict[str, object]:
    return {
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "load_avg_1m": round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None,  # a busy box skews timings
    }


def traces_dir(root: Path = ROOT) -> Path:
    """The one place the benchmarks (and their smoke tests) find the Alibaba traces: $RAYGPU_TRACES, else
    ``../shared/traces`` next to this checkout, else next to the repository it was cloned from (a CI clone in a
    temporary directory), else next to the repository a ``git worktree`` of it belongs to, else the cache
    ``python -m benchmarks.fetch_traces`` fills ($RAYGPU_CACHE/traces, default ~/.cache/raygpu/traces), else the
    first (benchmarks then skip, saying so). ``root``: the checkout."""
    if os.environ.get("RAYGPU_TRACES"):
        return Path(os.environ["RAYGPU_TRACES"])
    candidates = [root.parent / "shared" / "traces"]
    try:
        import subprocess
        origin = subprocess.run(["git", "-C", str(root), "config", "--get", "remote.origin.url"],
                                capture_output=True, text=True, timeout=5).stdout.strip()
        if origin and "://" not in origin and Path(origin).is_dir():
            candidates.append(Path(origin).resolve().parent / "shared" / "traces")
        # a worktree's git-common-dir is the main repository's .git: <main>/.git -> <main>/../shared/traces
        common = subprocess.run(["git", "-C", str(root), "rev-parse", "--path-format=absolute", "--git-common-dir"],
                                capture_output=True, text=True, timeout=5).stdout.strip()
        if common and Path(common).name == ".git":
            candidates.append(Path(common).parent.parent / "shared" / "traces")
    except (OSError, subprocess.SubprocessError):
        pass
    from benchmarks.fetch_traces import default_cache
    candidates.append(default_cache())
    return next((c for c in candidates if c.is_dir()), candidates[0])


TRACES = traces_dir()
OPENB = TRACES / "alibaba-gpu-v2023"

__all__ = ["machine", "traces_dir", "TRACES", "OPENB", "RESULTS", "read_csv", "need_traces", "print_table", "machine_line",
           "percentile", "save_plot"]


def need_traces(*paths: Path) -> bool:
    """True when every path exists; else print why and return False (the caller exits 0: a clean skip)."""
    missing = [p for p in paths if not p.exists()]
    if missing:
        print(f"SKIP: trace file(s) not found: {', '.join(map(str, missing))} "
              "(the read-only traces live in ../shared/traces/; without it, `python -m benchmarks.fetch_traces` "
              "downloads them into ~/.cache/raygpu/traces; or set RAYGPU_TRACES to point elsewhere)")
        return False
    return True


def read_csv(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100); 0.0 for no values."""
    if not values:
        return 0.0
    s = sorted(values)
    k = max(0, min(len(s) - 1, int(round(q / 100 * len(s) + 0.5)) - 1))
    return float(s[k])


def machine_line(m: dict[str, Any] | None = None) -> str:
    m = m or machine()
    return (f"machine: {m['platform']}, {m['cpu_count']} CPUs, Python {m['python']}, "
            f"load avg {m['load_avg_1m']}")


def print_table(rows: Iterable[dict[str, Any]], columns: Sequence[tuple[str, str, str]]) -> None:
    """Print rows as a fixed-width table; columns are (key, header, format spec)."""
    rows = list(rows)
    cells = [[("-" if r.get(k) is None else format(r[k], spec)) for k, _, spec in columns] for r in rows]
    widths = [max([len(h)] + [len(c[i]) for c in cells]) for i, (_, h, _) in enumerate(columns)]
    print(" ".join(h.rjust(w) for (_, h, _), w in zip(columns, widths)))
    for c in cells:
        print(" ".join(x.rjust(w) for x, w in zip(c, widths)))


def save_plot(fig: Any, name: str) -> str:
    """Save a matplotlib figure under benchmarks/results/ and return its path."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / name
    fig.savefig(path, dpi=110, bbox_inches="tight")
    import matplotlib.pyplot as plt

    plt.close(fig)
    return str(path)
