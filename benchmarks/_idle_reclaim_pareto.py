"""The idle-reclaim benchmark's Pareto view: the fixed-timeout curve, ``auto`` and the oracle, and the goal check.

Goal (issue 12): at equal idle GPU-h, ``auto`` has PG wait p95 <= 0.5x and launches <= 0.9x of the Ray v2
fixed-timeout curve, linearly interpolated in idle GPU-h between the two fixed timeouts around ``auto``.
Outside the curve's range there is no interpolation, and the check says so.
"""

from __future__ import annotations

from typing import Any

from benchmarks._common import save_plot

P95_GOAL, LAUNCH_GOAL = 0.5, 0.9


def interpolate(fixed: list[dict[str, Any]], idle: float, key: str) -> float | None:
    """``key`` of the fixed-timeout curve at ``idle`` GPU-h (linear between neighbours); None outside it."""
    pts = sorted((r["idle_gpu_h"], r[key]) for r in fixed)
    for (x0, y0), (x1, y1) in zip(pts, pts[1:]):
        if x0 <= idle <= x1:
            return y0 if x1 == x0 else y0 + (y1 - y0) * (idle - x0) / (x1 - x0)
    return None


def goal_check(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Compare ``auto`` and ``oracle`` with the ray-v2 curve at their idle GPU-h; ``lines`` says it plainly."""
    fixed = [r for r in rows if r["policy"] == "ray-v2"]
    out: dict[str, Any] = {"lines": []}
    for pol in ("auto", "oracle"):
        row = next((r for r in rows if r["policy"] == pol), None)
        if row is None or len(fixed) < 2:
            continue
        idle = row["idle_gpu_h"]
        ref = {k: interpolate(fixed, idle, k) for k in ("pg_wait_p95_s", "launches", "waiting_gpu_h")}
        if any(v is None for v in ref.values()):
            lo, hi = min(r["idle_gpu_h"] for r in fixed), max(r["idle_gpu_h"] for r in fixed)
            out[pol] = {"idle_gpu_h": idle, "in_range": False}
            out["lines"].append(f"{pol}: idle {idle:.1f} GPU-h is outside the fixed curve ({lo:.1f}-{hi:.1f}): "
                                "no interpolation, goal not checked")
            continue
        ratios = {k: (row[k] / v if v else None) for k, v in ref.items()}
        res = {"idle_gpu_h": idle, "in_range": True, "fixed_at_equal_idle": {k: round(v, 2) for k, v in ref.items()},
               "ratios": {k: None if v is None else round(v, 3) for k, v in ratios.items()}}
        if pol == "auto":
            res["p95_met"] = ratios["pg_wait_p95_s"] is not None and ratios["pg_wait_p95_s"] <= P95_GOAL
            res["launches_met"] = ratios["launches"] is not None and ratios["launches"] <= LAUNCH_GOAL
        out[pol] = res
        verdict = ""
        if pol == "auto":
            verdict = (f"; goal p95 <= {P95_GOAL}x {'MET' if res['p95_met'] else 'NOT MET'}, "
                       f"launches <= {LAUNCH_GOAL}x {'MET' if res['launches_met'] else 'NOT MET'}")
        out["lines"].append(
            f"{pol} vs fixed timeout at equal idle {idle:.1f} GPU-h: PG wait p95 {row['pg_wait_p95_s']:.0f}s vs "
            f"{ref['pg_wait_p95_s']:.0f}s ({_x(ratios['pg_wait_p95_s'])}), launches {row['launches']} vs "
            f"{ref['launches']:.0f} ({_x(ratios['launches'])}), waiting {row['waiting_gpu_h']:.1f} vs "
            f"{ref['waiting_gpu_h']:.1f} GPU-h ({_x(ratios['waiting_gpu_h'])}){verdict}")
    return out


def _x(r: float | None) -> str:
    return "n/a" if r is None else f"{r:.2f}x"


def pareto_plot(rows: list[dict[str, Any]], name: str, title: str) -> str:
    """Idle GPU-h (x) against waiting GPU-h (y), marker area proportional to launches."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5.5))
    top = max(r["launches"] for r in rows) or 1
    size = [40 + 600 * r["launches"] / top for r in rows]
    fixed = sorted((r for r in rows if r["policy"] in ("ray-v2", "raygpu")), key=lambda r: r["idle_gpu_h"])
    ray = [r for r in fixed if r["policy"] == "ray-v2"]
    ax.plot([r["idle_gpu_h"] for r in ray], [r["waiting_gpu_h"] for r in ray], color="tab:blue", lw=1, zorder=1)
    for r, s in zip(rows, size):
        style = {"ray-v2": ("o", "tab:blue"), "raygpu": ("s", "tab:cyan"), "auto": ("*", "tab:red"),
                 "oracle": ("D", "tab:green")}[r["policy"]]
        ax.scatter(r["idle_gpu_h"], r["waiting_gpu_h"], s=s, marker=style[0], color=style[1], alpha=0.6,
                   edgecolor="black", zorder=2)
        label = (f"{r['policy']} {r['idle_timeout_s']:.0f}s" if r["policy"] in ("ray-v2", "raygpu") else r["policy"])
        ax.annotate(f"{label}\n{r['launches']} launches, p95 {r['pg_wait_p95_s']:.0f}s",
                    (r["idle_gpu_h"], r["waiting_gpu_h"]), fontsize=7, textcoords="offset points",
                    xytext=(6, 6) if r["policy"] in ("ray-v2", "raygpu") else (8, -22))
    ax.set_xlabel("idle GPU-h (live workers with no task and no bundle)")
    ax.set_ylabel("waiting GPU-h (busy streams without a worker)")
    ax.set_title(title + "\nmarker area ~ launches; lower-left is better", fontsize=8)
    ax.grid(alpha=0.3)
    return save_plot(fig, name)
