"""The idle-reclaim benchmark's inputs: the GPU duty-cycle trace (real) and the placement-group arrivals (synthesized).

See ``bench_idle_reclaim.py`` for what each means in the simulation.
"""

from __future__ import annotations

import csv
import io
import random
import tarfile
from collections import Counter, defaultdict
from dataclasses import dataclass, field

from benchmarks._common import TRACES

GENAI = TRACES / "alibaba-genai-v2026"
TRACE = GENAI / "pod_gpu_duty_cycle_anon.tar.gz"
MEMBER = "pod_gpu_duty_cycle_anon.csv"
MAX_GAP_SAMPLES = 5  # a missing stretch up to this long holds the last value


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
