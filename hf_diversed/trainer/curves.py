"""Learning curves of a head's training run, drawn from its ``log_history.jsonl`` (matplotlib, Agg backend)."""

from __future__ import annotations

import json
import os
from bisect import bisect_right
from pathlib import Path

__all__ = ["CURVES_FILE", "by_rollout_batch", "load_history", "plot_learning_curves", "plot_runs"]

CURVES_FILE = "learning_curves.png"
_PANELS = (("reward", "task reward"), ("acceptance_rate", "acceptance (accepted / drafted)"), ("mean_w", "mean w"))


def load_history(path: str | os.PathLike) -> list[dict]:
    """The lines of a ``log_history.jsonl``, one per (step, split): a run resumed from a checkpoint logs again the
    steps done after it, and the later line wins. A torn last line of a killed run is skipped."""
    lines: dict[tuple, dict] = {}
    for text in Path(path).read_text(encoding="utf-8").splitlines():
        try:
            line = json.loads(text)
        except json.JSONDecodeError:
            continue
        key = (line.get("step"), line.get("split"))
        lines.pop(key, None)  # keep the order of the last write
        lines[key] = line
    return list(lines.values())


def plot_learning_curves(history: str | os.PathLike | list[dict], path: str | os.PathLike) -> Path | None:
    """Reward, acceptance and mean w against the step: the training batches (thin line), the held-out evaluations
    (markers; step 0 is the untrained head, whose value is also drawn as a dashed line). Returns the path, or None
    when the history has no line to draw."""
    lines = load_history(history) if not isinstance(history, list) else history
    train = [h for h in lines if h.get("split") == "train"]
    evals = [h for h in lines if h.get("split") == "eval"]
    if not train and not evals:
        return None
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(12, 3.6), layout="constrained")
    FigureCanvasAgg(figure)
    untrained = next((h for h in evals if h["step"] == 0), None)
    for axis, (key, label) in zip(figure.subplots(1, len(_PANELS)), _PANELS, strict=True):
        points = [(h["step"], h[key]) for h in train if key in h]
        if points:
            axis.plot(*zip(*points, strict=True), lw=0.8, alpha=0.5, color="tab:gray", label="training batch")
        points = sorted({h["step"]: h[key] for h in evals if key in h}.items())
        if points:
            axis.plot(*zip(*points, strict=True), marker="o", color="tab:blue", label="held-out evaluation")
        if untrained is not None and key in untrained:
            axis.axhline(untrained[key], ls="--", color="tab:red", lw=1, label="untrained head")
        axis.set_xlabel("step")
        axis.set_title(label)
        axis.grid(alpha=0.3)
    figure.axes[0].legend(fontsize=8)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    return path


def by_rollout_batch(history: list[dict]) -> list[dict]:
    """The lines of a history with ``step`` counted in rollout batches, numbered from 1: a run that logs one training
    line per update (``rollout_batch`` set, each batch trained by several updates, in any order) keeps the first line
    of each batch, and an evaluation after update u sits at the number of batches first trained by update u; a run
    logged per batch is returned as it is."""
    train = sorted((h for h in history if h.get("split") == "train"), key=lambda h: h["step"])
    if not any("rollout_batch" in h for h in train):
        return list(history)
    first: dict[int, dict] = {}
    for h in train:
        first.setdefault(int(h["rollout_batch"]), h)
    starts = sorted(h["step"] for h in first.values())
    lines = [{**h, "step": batch + 1} for batch, h in first.items()]
    evals = [{**h, "step": bisect_right(starts, h["step"])} for h in history if h.get("split") == "eval"]
    return sorted(lines, key=lambda h: h["step"]) + evals


def plot_runs(runs: dict[str, str | os.PathLike | list[dict]], path: str | os.PathLike) -> Path:
    """Several runs' reward, acceptance and mean w on one figure, against rollout batches (:func:`by_rollout_batch`):
    per run, the training batches' running mean over 8 batches (line) and the held-out evaluations (markers)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(12, 3.6), layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.subplots(1, len(_PANELS))
    for (label, history), color in zip(runs.items(), ("tab:blue", "tab:orange", "tab:green", "tab:red"), strict=False):
        lines = by_rollout_batch(load_history(history) if not isinstance(history, list) else history)
        train = [h for h in lines if h.get("split") == "train"]
        evals = sorted((h for h in lines if h.get("split") == "eval"), key=lambda h: h["step"])
        for axis, (key, title) in zip(axes, _PANELS, strict=True):
            values = [h[key] for h in train if key in h]
            if values:
                smooth = [sum(values[max(0, i - 7) : i + 1]) / len(values[max(0, i - 7) : i + 1])
                          for i in range(len(values))]  # fmt: skip
                axis.plot([h["step"] for h in train if key in h], smooth, lw=1, alpha=0.6, color=color,
                          label=f"{label}: training (mean of 8 batches)")  # fmt: skip
            points = [(h["step"], h[key]) for h in evals if key in h]
            if points:
                axis.plot(*zip(*points, strict=True), marker="o", ls="--", color=color, label=f"{label}: held-out")
            axis.set_xlabel("rollout batch")
            axis.set_title(title)
            axis.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    return path
