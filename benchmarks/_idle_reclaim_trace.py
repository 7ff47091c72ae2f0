"""The idle-reclaim benchmark's inputs: the real traces it replays and the placement-group arrivals (synthesized).

Two traces carry what the simulation needs (per stream, when it needs a worker and when it does not):

* ``genai``: the per-pod GPU duty cycles of ``alibaba-genai-v2026`` (busy while utilisation > the threshold).
* ``openb``: the GPU tasks of ``alibaba-gpu-v2023/openb_pod_list_default.csv``, one 24 h window: each task is
  a stream that exists from its ``creation_time`` to its ``deletion_time`` and is busy all that time.

``alibaba-spot-v2026`` holds only a node table (no job or usage table): nothing in it says when a worker is
needed, so it cannot be replayed. See ``bench_idle_reclaim.py`` for what each means in the simulation.
"""

from __future__ import annotations

import csv
import io
import random
import tarfile
from collections import Counter, defaultdict
from dataclasses import dataclass, field

from benchmarks._common import OPENB, TRACES

GENAI = TRACES / "alibaba-genai-v2026"
TRACE = GENAI / "pod_gpu_duty_cycle_anon.tar.gz"
MEMBER = "pod_gpu_duty_cycle_anon.csv"
MAX_GAP_SAMPLES = 5  # a missing stretch up to this long holds the last value
OPENB_TASKS = OPENB / "openb_pod_list_default.csv"
OPENB_DAY = 138  # the window's first day: 201 GPU tasks arrive in it, near the median day (days 116-147: ~196)
OPENB_STEP_S = 60.0  # the openb window is sampled once a minute (its times are whole seconds)


# ------------------------------------------------------------------ trace
@dataclass(frozen=True)
class Trace:
    step_s: float
    n_steps: int
    pods: tuple[str, ...]  # anonymised pod ids, sorted
    samples: dict[str, dict[int, float]]  # pod -> step index -> utilisation (%)


def load_trace(path=TRACE) -> Trace:
    """Stream the CSV out of the tar.gz (nothing is extracted to disk)."""
    rows: list[tuple[str, float, float]] = []
    with tarfile.open(path, "r:gz") as tar:
        member = next(m for m in tar.getmembers() if m.isfile() and m.name.endswith(".csv"))
        with tar.extractfile(member) as raw:  # type: ignore[union-attr]
            for r in csv.DictReader(io.TextIOWrapper(raw, encoding="utf-8")):
                rows.append((r["container_ip"], float(r["timestamp_anon"]), float(r["value"])))
    t0 = min(ts for _, ts, _ in rows)
    stamps = sorted({ts for _, ts, _ in rows})
    gaps = Counter(round(b - a) for a, b in zip(stamps, stamps[1:]))
    step_s = float(gaps.most_common(1)[0][0])
    samples: dict[str, dict[int, float]] = defaultdict(dict)
    for pod, ts, v in rows:
        samples[pod][int(round((ts - t0) / step_s))] = v
    n = max(max(s) for s in samples.values()) + 1
    return Trace(step_s=step_s, n_steps=n, pods=tuple(sorted(samples)), samples=dict(samples))


def load_openb(day: float = OPENB_DAY, hours: float = 24.0, path=OPENB_TASKS, step_s: float = OPENB_STEP_S) -> Trace:
    """The GPU tasks (``num_gpu`` >= 1) of the openb list that overlap the window [day, day + hours), as a Trace:
    one stream per task, sampled busy (100%) every ``step_s`` from its creation to its deletion (clipped to the
    window), absent before and after. Tasks never scheduled (no ``scheduled_time``: they never ran in the
    source cluster) are left out. Each task takes one whole worker, whatever its GPUs (the trace has no gangs
    and few multi-GPU tasks: 75 of 7,064)."""
    lo, hi = day * 86400.0, day * 86400.0 + hours * 3600.0
    n = int(round((hi - lo) / step_s))
    samples: dict[str, dict[int, float]] = {}
    with open(path, encoding="utf-8") as f:
        for r in csv.DictReader(f):
            if float(r["num_gpu"] or 0) < 1 or not r["scheduled_time"]:
                continue
            start, end = float(r["creation_time"]), float(r["deletion_time"] or hi)
            if end <= lo or start >= hi:
                continue
            first = max(0, int((start - lo) // step_s))
            last = min(n - 1, int((end - lo) // step_s))
            samples[r["name"]] = {i: 100.0 for i in range(first, last + 1)}
    return Trace(step_s=step_s, n_steps=n, pods=tuple(sorted(samples)), samples=samples)


def busy_series(samples: dict[int, float], n_steps: int, threshold: float) -> list[int]:
    """Per step: 1 busy, 0 idle, -1 the pod does not exist (before its first / after its last sample)."""
    out = [-1] * n_steps
    first, last = min(samples), max(samples)
    held, since = 0.0, first
    for i in range(first, min(last, n_steps - 1) + 1):
        if i in samples:
            held, since = samples[i], i
        elif i - since > MAX_GAP_SAMPLES:
            held = 0.0
        out[i] = 1 if held > threshold else 0
    return out


# ------------------------------------------------------------- PG arrivals
@dataclass
class PG:
    pg_id: str  # hex, Ray's 18-byte PG id
    name: str
    bundles: tuple[float, ...]  # GPUs per bundle
    strategy: str
    arrive_s: float
    life_s: float
    placed_s: float | None = None
    removed_s: float | None = None
    nodes: list[str | None] = field(default_factory=list)  # pod name per bundle
    delayed: bool = False
    broken: bool = False


def make_pgs(cluster: int, seed: int, horizon_s: float, rate_per_h: float, spread_share: float,
             life_min: float, gpus_per_pod: float, max_bundles: int = 4) -> list[PG]:
    rng = random.Random(seed * 1_000_003 + cluster)
    out: list[PG] = []
    t = 0.0
    sizes = [g for g in (1.0, 2.0, 4.0) if g <= gpus_per_pod] or [gpus_per_pod]
    while rate_per_h > 0:
        t += rng.expovariate(rate_per_h / 3600.0)
        if t >= horizon_s:
            break
        k = rng.randint(1, max_bundles)
        g = rng.choice(sizes)
        strategy = "STRICT_SPREAD" if k > 1 and rng.random() < spread_share else "PACK"
        life = min(4 * 3600.0, max(60.0, rng.expovariate(1.0 / (life_min * 60.0))))
        n = len(out)
        out.append(PG(pg_id=f"{cluster:04x}{n:032x}", name=f"c{cluster}-pg{n}", bundles=(g,) * k,
                      strategy=strategy, arrive_s=t, life_s=life))
    return out
