"""What the keep-warm policy (``raygpu.io/idle-timeout: auto``) learns and decides, as data.

``plan.warm.plan_warm(history, groups, now_s, settings)`` turns a :class:`WarmHistory`
into one :class:`WarmTarget` per worker group: how many idle workers to keep
warm, and why. The history is what the sidecar observed, on its own clock:
per group, the workers demand needed (busy workers + pending placement-group
bundles + Ray's pending resource demand) sampled once per ``step_s``, and how
long pods took from creation to their Ray node joining.

``encode_history`` / ``decode_history`` are the ConfigMap form (one JSON
document, bounded in size: the oldest demand samples go first). Pure data and
pure functions: no I/O, no clock.
"""

from __future__ import annotations

import json
import math

from pydantic import Field, ValidationError

from raygpu.model.base import Frozen

DEFAULT_QUANTILE = 0.8
DEFAULT_HISTORY_S = 6 * 3600.0
DEFAULT_FALLBACK_TIMEOUT_S = 300.0
MIN_SAMPLES = 30  # demand rises needed before the quantile is trusted; until then the fallback timeout
MAX_STARTUP_SAMPLES = 32  # start-up durations kept per group (the newest)
MAX_STATE_BYTES = 64 * 1024  # the ConfigMap's JSON; the oldest demand samples are dropped to fit
STATE_VERSION = 1


class WarmSettings(Frozen):
    """The policy's knobs (annotations ``raygpu.io/warm-quantile``, ``-history``, ``-fallback``).

    ``quantile``: which quantile of the demand rise over one start-up window is kept warm.
    ``history_s``: how far back demand samples count. ``fallback_timeout_s``: the fixed
    idle timeout of a group until it has ``min_samples`` rises and one measured start-up.
    ``step_s``: one demand sample per step (the highest demand seen in it).
    """

    quantile: float = Field(default=DEFAULT_QUANTILE, gt=0, le=1)
    history_s: float = Field(default=DEFAULT_HISTORY_S, gt=0)
    fallback_timeout_s: float = Field(default=DEFAULT_FALLBACK_TIMEOUT_S, ge=0)
    min_samples: int = Field(default=MIN_SAMPLES, ge=1)
    step_s: float = Field(default=60.0, gt=0)


class GroupHistory(Frozen):
    """One worker group's observations: ``demand`` as (bucket start s, workers needed), oldest first, one
    per ``step_s`` bucket; ``startup_s``: pod creation -> Ray node joined, oldest first."""

    demand: tuple[tuple[float, int], ...] = ()
    startup_s: tuple[float, ...] = ()


class WarmHistory(Frozen):
    groups: dict[str, GroupHistory] = Field(default_factory=dict)


class WarmTarget(Frozen):
    """Per group: ``warm`` idle workers to keep (None: not enough history, ``fallback_timeout_s`` applies),
    with the numbers behind it in ``reason``."""

    group: str
    warm: int | None
    reason: str
    fallback_timeout_s: float = DEFAULT_FALLBACK_TIMEOUT_S
    quantile: float = DEFAULT_QUANTILE
    window_s: float | None = None  # the start-up window the rise is measured over
    samples: int = 0  # demand rises the quantile was taken over


def encode_history(history: WarmHistory, max_bytes: int = MAX_STATE_BYTES) -> str:
    """The ConfigMap form: compact JSON of at most ``max_bytes`` bytes. When too big, the oldest demand
    samples of the group that has the most are dropped first (then start-ups), until it fits."""
    groups = {g: {"demand": [[_num(t), n] for t, n in h.demand], "startup_s": [_num(s) for s in h.startup_s]}
              for g, h in sorted(history.groups.items())}
    while True:
        text = json.dumps({"version": STATE_VERSION, "groups": groups}, separators=(",", ":"))
        excess = len(text.encode()) - max_bytes
        if excess <= 0:
            return text
        biggest = max(groups.values(), key=lambda h: (len(h["demand"]), len(h["startup_s"])))
        if not biggest["demand"] and not biggest["startup_s"]:
            return json.dumps({"version": STATE_VERSION, "groups": {}})  # names alone do not fit
        key = "demand" if biggest["demand"] else "startup_s"
        # about 12 bytes a sample; at most an eighth of the group a pass, so the groups shrink evenly
        del biggest[key][:max(1, min(excess // 12, len(biggest[key]) // 8))]


def decode_history(text: str) -> WarmHistory:
    """Parse the ConfigMap form. Raises ValueError (with what is wrong) on anything malformed: the
    caller reports it and starts from the empty history (the fallback)."""
    try:
        doc = json.loads(text)
    except (TypeError, json.JSONDecodeError) as e:
        raise ValueError(f"not JSON: {e}") from None
    if not isinstance(doc, dict) or doc.get("version") != STATE_VERSION or not isinstance(doc.get("groups"), dict):
        raise ValueError(f"expected {{\"version\": {STATE_VERSION}, \"groups\": {{...}}}}")
    try:
        groups = {}
        for name, h in doc["groups"].items():
            demand = tuple((float(t), int(n)) for t, n in h["demand"])
            startup = tuple(float(s) for s in h["startup_s"])
            if any(not math.isfinite(t) or n < 0 for t, n in demand) or any(
                    not math.isfinite(s) or s < 0 for s in startup):
                raise ValueError(f"group {name!r}: negative or non-finite value")
            if any(b[0] <= a[0] for a, b in zip(demand, demand[1:])):
                raise ValueError(f"group {name!r}: demand samples not in time order")
            groups[str(name)] = GroupHistory(demand=demand, startup_s=startup)
        return WarmHistory(groups=groups)
    except (TypeError, KeyError, ValidationError) as e:
        raise ValueError(f"malformed group entry: {type(e).__name__}: {e}") from None


def _num(x: float) -> float | int:
    return int(x) if float(x).is_integer() else round(x, 3)
