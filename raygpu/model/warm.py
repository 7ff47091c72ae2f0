"""What the keep-warm policy (``raygpu.io/idle-timeout: auto``) learns and decides, as data.

``plan.warm.plan_warm(history, groups, now_s, settings)`` turns a :class:`WarmHistory`
into one :class:`WarmTarget` per worker group: how many idle workers to keep
warm, and why. The history is what the sidecar observed, on its own clock:
per group, the workers demand needed (busy workers + pending placement-group
bundles + Ray's pending resource demand) sampled once per ``step_s``, and how
long pods took from creation to their Ray node joining.

``encode_history`` / ``decode_history`` are the ConfigMap form (one JSON
document, bounded in size: the oldest demand samples go first). ``load_history``
reads that form defensively, as anyone who can edit the ConfigMap (or a clock
that stepped) may have left it: every number within its bound, no sample past
now, at most ``MAX_STATE_BYTES``; what it drops or cuts it returns as
:class:`StateRepair` s for the caller to report. Pure data and pure functions: no
I/O, no clock (``now_s`` is an argument).
"""

from __future__ import annotations

import json
import math

from pydantic import Field, ValidationError

from raygpu.model.base import Frozen

DEFAULT_QUANTILE = 0.8
DEFAULT_HISTORY_S = 6 * 3600.0
DEFAULT_FALLBACK_TIMEOUT_S = 300.0
# An idle worker beyond the target stays half a measured start-up first (raygpu.io/warm-hold). On the idle-reclaim
# benchmark (docs/benchmarks-capacity.md, section 4) it is what brings auto under 0.85x the launches of the fixed
# timeout with no more idle GPU-h on both replayed traces; 0 (at once) did not on the genai trace.
DEFAULT_HOLD_STARTUPS = 0.5
MIN_SAMPLES = 30  # demand rises needed before the quantile is trusted; until then the fallback timeout
MAX_STARTUP_SAMPLES = 32  # start-up durations kept per group (the newest)
MAX_STATE_BYTES = 64 * 1024  # the ConfigMap's JSON; the oldest demand samples are dropped to fit
# Bounds on every number a history holds (``load_history`` drops a sample past them, ``record`` never writes one):
MAX_DEMAND_WORKERS = 100_000  # workers one group needs at once: ten times the largest cluster raygpu is measured on
MAX_STARTUP_S = 24 * 3600.0  # a pod start-up (creation -> Ray node joined) longer than a day is no start-up
STATE_VERSION = 1


class WarmSettings(Frozen):
    """The policy's knobs (annotations ``raygpu.io/warm-quantile``, ``-history``, ``-fallback``, ``-hold``).

    ``quantile``: which quantile of the demand rise over one start-up window is kept warm.
    ``history_s``: how far back demand samples count. ``fallback_timeout_s``: the fixed
    idle timeout of a group until it has ``min_samples`` rises and one measured start-up.
    ``step_s``: one demand sample per step (the highest demand seen in it). ``hold_startups``: how long an
    idle worker beyond the target stays before it goes, in the group's median start-ups (``raygpu.io/warm-hold``).
    """

    quantile: float = Field(default=DEFAULT_QUANTILE, gt=0, le=1)
    history_s: float = Field(default=DEFAULT_HISTORY_S, gt=0)
    fallback_timeout_s: float = Field(default=DEFAULT_FALLBACK_TIMEOUT_S, ge=0)
    min_samples: int = Field(default=MIN_SAMPLES, ge=1)
    step_s: float = Field(default=60.0, gt=0)
    # hold_startups: an idle worker beyond the target goes only once idle this many measured start-ups (the
    # group's median; ski rental's break-even at 1: idle as long as a new pod takes to start). 0: at once.
    hold_startups: float = Field(default=DEFAULT_HOLD_STARTUPS, ge=0, le=100)


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
    hold_s: float = 0.0  # idle time before a worker beyond the target goes (settings.hold_startups x start-up)


class StateRepair(Frozen):
    """What ``load_history`` dropped or cut from a stored history, and why: ``reason`` is the Warning Event's
    (``WarmStateOutOfBounds``, ``WarmStateFutureSamples``, ``WarmStateTooLarge``), ``message`` its text."""

    reason: str
    message: str


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
    """Parse the ConfigMap form, as it is: numbers are not bounded here (``load_history`` does). Raises
    ValueError (with what is wrong) when it is not that form (not JSON, another version, a group entry
    of the wrong shape or types, demand samples not in time order): the caller reports it and starts from
    the empty history (the fallback)."""
    try:
        doc = json.loads(text)
    except (TypeError, json.JSONDecodeError) as e:
        raise ValueError(f"not JSON: {e}") from None
    if not isinstance(doc, dict) or doc.get("version") != STATE_VERSION or not isinstance(doc.get("groups"), dict):
        raise ValueError(f"expected {{\"version\": {STATE_VERSION}, \"groups\": {{...}}}}")
    try:
        groups = {}
        for name, h in doc["groups"].items():
            demand = tuple((float(t), _count(n)) for t, n in h["demand"])
            startup = tuple(float(s) for s in h["startup_s"])
            if any(b[0] <= a[0] for a, b in zip(demand, demand[1:])):
                raise ValueError(f"group {name!r}: demand samples not in time order")
            groups[str(name)] = GroupHistory(demand=demand, startup_s=startup)
        return WarmHistory(groups=groups)
    except (TypeError, KeyError, OverflowError, ValidationError) as e:
        raise ValueError(f"malformed group entry: {type(e).__name__}: {e}") from None


def load_history(text: str, now_s: float) -> tuple[WarmHistory, tuple[StateRepair, ...]]:
    """The stored history ``text`` as the sidecar may trust it at ``now_s``, and what was repaired.

    ``decode_history`` first (its ValueError is the caller's: nothing of the state is usable). Then, sample by
    sample: a demand sample whose time is not finite and >= 0 or whose demand is not within
    [0, MAX_DEMAND_WORKERS], or a start-up not within [0, MAX_STARTUP_S], is dropped (``WarmStateOutOfBounds``;
    start-ups beyond the newest MAX_STARTUP_SAMPLES too); a demand sample dated after ``now_s`` is dropped
    (``WarmStateFutureSamples``: a clock that stepped back, or an edit); a text over MAX_STATE_BYTES is cut as
    ``encode_history`` would have written it, the oldest demand samples of the largest group first
    (``WarmStateTooLarge``). Work linear in the text's size."""
    history = decode_history(text)
    groups: dict[str, GroupHistory] = {}
    bad: dict[str, tuple[int, int, int]] = {}  # group -> demand samples, start-ups out of bounds; start-ups over 32
    for name, h in history.groups.items():
        demand = tuple((t, n) for t, n in h.demand if 0 <= t < math.inf and 0 <= n <= MAX_DEMAND_WORKERS)
        ups = tuple(s for s in h.startup_s if 0 <= s <= MAX_STARTUP_S)
        if len(demand) != len(h.demand) or len(ups) != len(h.startup_s) or len(ups) > MAX_STARTUP_SAMPLES:
            bad[name] = (len(h.demand) - len(demand), len(h.startup_s) - len(ups),
                         max(0, len(ups) - MAX_STARTUP_SAMPLES))
        groups[name] = GroupHistory(demand=demand, startup_s=ups[-MAX_STARTUP_SAMPLES:])
    repairs = []
    if bad:
        d, u, extra = (sum(x[i] for x in bad.values()) for i in range(3))
        parts = [f"{_samples(d, 'demand sample')} out of bounds (time finite and >= 0, demand 0-{MAX_DEMAND_WORKERS})"
                 ] if d else []
        parts += [f"{_samples(u, 'start-up')} out of bounds (0-{MAX_STARTUP_S:.0f}s)"] if u else []
        parts += [f"{_samples(extra, 'start-up')} beyond the newest {MAX_STARTUP_SAMPLES}"] if extra else []
        repairs.append(StateRepair(reason="WarmStateOutOfBounds", message=f"{'; '.join(parts)} dropped ("
                                   + ", ".join(f"group {g}: {sum(x)}" for g, x in sorted(bad.items())) + ")"))
    history, future = drop_future(WarmHistory(groups=groups), now_s)
    if future is not None:
        repairs.append(future)
    size = len(text.encode())
    if size > MAX_STATE_BYTES:
        before = sum(len(h.demand) for h in history.groups.values())
        history = decode_history(encode_history(history, MAX_STATE_BYTES))
        after = sum(len(h.demand) for h in history.groups.values())
        repairs.append(StateRepair(reason="WarmStateTooLarge", message=(
            f"{size} bytes, over the {MAX_STATE_BYTES}-byte cap: cut to its newest part ({after} of {before} "
            "demand samples kept)")))
    return history, tuple(repairs)


def drop_future(history: WarmHistory, now_s: float, why: str = "a clock that stepped back, or an edit"
                ) -> tuple[WarmHistory, StateRepair | None]:
    """``history`` without its demand samples dated after ``now_s`` (each group's are in time order: the
    newest are checked first), and the ``WarmStateFutureSamples`` repair that says so (None: none was)."""
    cut: dict[str, int] = {}
    for name, h in history.groups.items():
        if h.demand and h.demand[-1][0] > now_s:
            cut[name] = sum(1 for t, _ in h.demand if t > now_s)
    if not cut:
        return history, None
    groups = {name: GroupHistory(demand=tuple(x for x in h.demand if x[0] <= now_s), startup_s=h.startup_s)
              if name in cut else h for name, h in history.groups.items()}
    return WarmHistory(groups=groups), StateRepair(reason="WarmStateFutureSamples", message=(
        f"{_samples(sum(cut.values()), 'demand sample')} dated after now dropped ("
        + ", ".join(f"group {g}: {n}" for g, n in sorted(cut.items())) + f"): {why}"))


def _count(n: object) -> int:
    """A stored demand count: an int as it is; a float only when integral, else -1 (1.5, NaN and infinity are
    out of bounds: ``load_history`` drops them)."""
    if isinstance(n, int):
        return n
    f = float(n)  # type: ignore[arg-type]  # a str or a list: the ValueError or TypeError of a malformed entry
    return int(f) if f.is_integer() else -1


def _samples(n: int, what: str) -> str:
    return f"{n} {what}" + ("" if n == 1 else "s")


def _num(x: float) -> float | int:
    return int(x) if float(x).is_integer() else round(x, 3)
