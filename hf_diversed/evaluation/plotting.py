"""Quality-vs-speed plots of ``hf-diversed bench`` summaries (matplotlib, Agg backend, no display needed)."""

from __future__ import annotations

import math
import os
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

from .bench.frontier import fitted_frontier, method_label

__all__ = ["plot_quality_frontiers", "plot_quality_speed", "plot_tune_choice"]

_MARKERS = ("s", "D", "^", "v", "P", "X")
_X_LABELS = {
    "speedup": "speedup over autoregressive (×)",
    "acceptance_rate": "acceptance rate (accepted / drafted)",
    "seconds_per_token": "real time per token (s, batch-1 loop)",
}


def _ok(value) -> bool:
    return value is not None and isinstance(value, (int, float)) and math.isfinite(value)


def point_label(row: dict, multi_n: bool = False) -> str:
    """A method's legend entry; a DIVERSED head is named by the last two parts of its path or Hub id, which tell
    apart heads of different runs and tasks (``gsm8k-full/opt0.1-lambda-0.01``)."""
    label = row["method"]
    if row.get("head") and label == "diversed":
        label += f" {'/'.join(Path(str(row['head'])).parts[-2:])}"
    return label + (f" N={row['N']}" if multi_n and row.get("N") else "")


def _x_value(row: dict, x: str):
    if x == "speedup" and row["method"] == "ar":
        return 1.0
    return row.get(x)


def _draw_panel(ax, panel: list[dict], x: str, title: str) -> None:
    """One quality-vs-``x`` panel: the static sweep as a line per N, exact SD and the fitted frontier on the
    acceptance axis, every other method a point with its 95% interval, the target alone a dashed line."""
    multi_n = len({r.get("N") for r in panel if r.get("N")}) > 1
    reference = next((r for r in panel if r["method"] == "ar" and _ok(r.get("quality"))), None)
    reference = reference or next((r for r in panel if r["method"] == "exact" and _ok(r.get("quality"))), None)
    if reference is not None:  # exact SD has the target's law: its quality is the target alone's
        ax.axhline(reference["quality"], color="grey", linestyle="--", linewidth=1, label="target alone")
    sweeps: dict[object, list[dict]] = defaultdict(list)
    for row in panel:
        if row["method"].startswith("static:") and _ok(_x_value(row, x)) and _ok(row.get("quality")):
            sweeps[row.get("N")].append(row)
    for n_value, sweep in sorted(sweeps.items(), key=lambda kv: kv[0] or 0):
        sweep.sort(key=lambda r: float(r["method"].split(":")[1]))
        xs = [_x_value(r, x) for r in sweep]
        ys = [r["quality"] for r in sweep]
        label = "static ensemble (w sweep)" + (f", N={n_value}" if multi_n else "")
        ax.plot(xs, ys, marker="o", linewidth=1.5, label=label)
        for r, xv, yv in zip(sweep, xs, ys, strict=True):
            ax.annotate(f"w={float(r['method'].split(':')[1]):g}", (xv, yv), textcoords="offset points",
                        xytext=(4, 4), fontsize=7)  # fmt: skip
    if x == "acceptance_rate":  # the frontier the verdicts read: sweep and exact SD (w = 1), non-increasing fit
        for n_value in sorted(sweeps, key=lambda v: v or 0):
            ends = [r for r in panel if r["method"] == "exact" and r.get("N") == n_value]
            points = [(r[x], r["quality"]) for r in sweeps[n_value] + ends if _ok(r.get(x)) and _ok(r["quality"])]
            if len(points) >= 2:
                accs, fitted = fitted_frontier(points)
                label = "frontier (non-increasing fit, exact SD as w=1)" + (f", N={n_value}" if multi_n else "")
                ax.plot(accs, fitted, color="black", linestyle=":", linewidth=1.2, label=label)
    # the target alone is a point where it has an x of its own (its speed), not on the acceptance axis
    points = [
        r
        for r in panel
        if not r["method"].startswith("static:") and not (r["method"] == "ar" and x == "acceptance_rate")
    ]
    # a method keeps its color from panel to panel (the panel's order, not the x order, picks it); the colors
    # follow the sweeps' lines, a new marker every ten
    n_sweeps = len({r.get("N") for r in panel if r["method"].startswith("static:")})
    styles = {
        point_label(r, multi_n): i + n_sweeps
        for i, r in enumerate(r for r in panel if not r["method"].startswith("static:"))
    }
    points = sorted((r for r in points if _ok(_x_value(r, x)) and _ok(r.get("quality"))), key=lambda r: _x_value(r, x))
    for row in points:
        xv, yv = _x_value(row, x), row["quality"]
        ci, err = row.get("quality_ci"), row.get("quality_stderr")
        if ci and all(_ok(c) for c in ci):  # the 95% interval, asymmetric (Wilson / bootstrap)
            yerr = [[max(0.0, yv - ci[0])], [max(0.0, ci[1] - yv)]]
        else:
            yerr = [err] if _ok(err) else None
        # named in the legend, not beside the point: a dozen methods crowd one acceptance range
        style = styles[point_label(row, multi_n)]
        ax.errorbar([xv], [yv], yerr=yerr, fmt=_MARKERS[style // 10 % len(_MARKERS)], color=f"C{style % 10}",
                    markersize=5, capsize=2, label=point_label(row, multi_n))  # fmt: skip
    metric = next((r.get("metric") for r in panel if r.get("metric")), "quality")
    ax.set_title(title)
    ax.set_xlabel(_X_LABELS[x])
    ax.set_ylabel(f"{metric} (×100)")
    ax.grid(True, alpha=0.3)
    handles, labels = ax.get_legend_handles_labels()
    if handles:
        unique = dict(zip(labels, handles, strict=True))
        ax.legend(unique.values(), unique.keys(), fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0))


def _figure(n: int):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure  # no pyplot: no global backend/state, always Agg

    # one panel a row: each panel's legend stands to its right
    fig = Figure(figsize=(8.4, 4.2 * n), layout="constrained")
    FigureCanvasAgg(fig)
    return fig, fig.subplots(n, 1, squeeze=False).flat


def _save(fig, path: str | os.PathLike) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120, bbox_inches="tight")  # the legends sit beside their panels
    return path


def _check_x(x: str) -> None:
    if x not in _X_LABELS:
        raise ValueError(f"x must be one of {', '.join(_X_LABELS)}; got {x!r}")


def plot_quality_speed(rows: Sequence[dict], path: str | os.PathLike, *, x: str = "speedup") -> Path | None:
    """Plot task quality (y) against ``x`` ("speedup", "acceptance_rate" or "seconds_per_token") for bench summary
    rows.

    One panel per (task, temperature), in the order the rows come. The static-ensemble sweep (``static:W``)
    is drawn as a connected frontier line with its w values as labels (one line per draft length N); every
    other method is a point with its 95% quality interval, named in the legend beside the panel; the target
    alone's quality (``ar``, else exact SD's, the same law) is a dashed horizontal reference line. Returns the
    path, or None when no row has both values (nothing is written then).
    """
    _check_x(x)
    panels: dict[tuple, list[dict]] = defaultdict(list)
    for row in rows:
        panels[(row["task"], row["temperature"])].append(row)
    panels = {k: v for k, v in panels.items() if any(_ok(r.get("quality")) for r in v)}
    if not panels:
        return None
    fig, axes = _figure(len(panels))
    for ax, ((task, temperature), panel) in zip(axes, panels.items(), strict=True):
        _draw_panel(ax, panel, x, f"{task}, T={temperature:g}")
    return _save(fig, path)


def plot_quality_frontiers(
    rows: Sequence[dict], path: str | os.PathLike, *, xs: Sequence[str] = ("seconds_per_token", "acceptance_rate")
) -> Path | None:
    """The same rows (one task and temperature) drawn once per ``x`` in ``xs``, a panel each, one above the other:
    e.g. quality against real time per token and against acceptance. None when no row has a quality."""
    for x in xs:
        _check_x(x)
    rows = list(rows)
    if not any(_ok(r.get("quality")) for r in rows):
        return None
    fig, axes = _figure(len(xs))
    first = rows[0]
    for ax, x in zip(axes, xs, strict=True):
        _draw_panel(ax, rows, x, f"{first['task']}, T={first['temperature']:g}")
    return _save(fig, path)


def plot_tune_choice(rows: Sequence[dict], path: str | os.PathLike, *, chosen: str, max_drop: float) -> Path | None:
    """``hf-diversed tune``'s calibration: quality against acceptance (the sweep, the fitted frontier, every rule
    with its interval, as :func:`plot_quality_speed` draws them) with the chosen rule ringed and the budget's level
    (the target's quality − ``max_drop``) dotted. None when no row has a quality."""
    rows = [r for r in rows if r["method"] != "ar"]
    if not any(_ok(r.get("quality")) for r in rows):
        return None
    fig, (ax,) = _figure(1)
    first = rows[0]
    _draw_panel(ax, rows, "acceptance_rate", f"{first['task']}, T={first['temperature']:g}: tune")
    exact = next((r for r in rows if r["method"] == "exact" and _ok(r.get("quality"))), None)
    if exact is not None:
        ax.axhline(exact["quality"] - max_drop, color="red", linestyle=":", linewidth=1,
                   label=f"target − {max_drop:g} (budget, read on paired intervals)")  # fmt: skip
    pick = next((r for r in rows if method_label(r) == chosen), None)
    if pick is not None and _ok(pick.get("acceptance_rate")) and _ok(pick.get("quality")):
        ax.plot([pick["acceptance_rate"]], [pick["quality"]], marker="o", markersize=14, markerfacecolor="none",
                markeredgecolor="red", linestyle="none", label=f"chosen: {point_label(pick)}")  # fmt: skip
    handles, labels = ax.get_legend_handles_labels()
    unique = dict(zip(labels, handles, strict=True))
    ax.legend(unique.values(), unique.keys(), fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0))
    return _save(fig, path)
