"""Scatter plots of a ranked zoo: one figure per metric, each point labelled with its model."""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import TYPE_CHECKING, Optional, Union

if TYPE_CHECKING:
    from wbfe.ranking.ranker import RankResult

__all__ = ["plot_metric", "plot_ranking", "metric_filename", "checkpoint_label"]


def metric_filename(metric: str) -> str:
    """The PNG file name used for ``metric`` (only letters, digits, ``_``, ``-`` and ``.``)."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", metric) + ".png"


def checkpoint_label(model: str) -> str:
    # Checkpoint file names label the points: their extension only adds clutter.
    return re.sub(r"\.(safetensors|bin|pt|pth|th|ckpt)$", "", model)


def _fmt(value: float, digits: int = 2) -> str:
    return f"{value:.{digits}f}" if math.isfinite(value) else "n/a"


def plot_metric(result: "RankResult", metric: str, path: Union[str, Path], *, dpi: int = 120) -> Path:
    """Save a scatter plot of ``metric`` (x) against the quality (y) for every ranked model.

    The title carries Spearman ρ with its bootstrap interval, the permutation p-value and n. The
    file is written atomically (temporary file in the same folder, then renamed).

    Args:
        result: a :class:`~wbfe.ranking.ranker.RankResult`.
        metric: one of ``result.metrics``' names.
        path: the PNG to write.
        dpi: resolution.

    Returns:
        The written path.

    Raises:
        UnknownNameError: ``metric`` is not in the result.
    """
    from wbfe.render.files import save_figure
    from wbfe.reporting.plots.canvas import new_figure

    row = result.metric(metric)
    points = [(m.scores.get(metric), m.quality, m.model) for m in result.models]
    points = [(float(x), float(y), checkpoint_label(label)) for x, y, label in points
              if x is not None and math.isfinite(float(x)) and math.isfinite(float(y))]
    fig = new_figure((7.5, 5.5), layout="constrained")
    ax = fig.subplots()
    if points:
        xs, ys, labels = zip(*points)
        ax.scatter(xs, ys, s=28, color="tab:blue", zorder=3)
        for x, y, label in points:
            ax.annotate(label, (x, y), xytext=(3, 2), textcoords="offset points", fontsize=6,
                        annotation_clip=False)
    else:
        ax.text(0.5, 0.5, "no model has a finite value", ha="center", va="center", transform=ax.transAxes)
    arrow = " (lower is better)" if result.lower_is_better else ""
    ax.set_xlabel(metric)
    ax.set_ylabel(f"{result.quality}{arrow}")
    title = (f"{result.zoo}: ρ = {_fmt(row.rho)} [{_fmt(row.ci_low)}, {_fmt(row.ci_high)}], "
             f"p = {row.p_value:.2g}, n = {row.n}")
    ax.set_title(title, fontsize=9)
    ax.grid(True, alpha=0.3)
    return save_figure(fig, Path(path), dpi=dpi)


def plot_ranking(result: "RankResult", directory: Union[str, Path], *, metrics: Optional[list[str]] = None) -> list[Path]:
    """One scatter PNG per metric (all of ``result.metrics`` unless ``metrics`` is given) in ``directory``."""
    folder = Path(directory)
    names = metrics if metrics is not None else [m.metric for m in result.metrics]
    return [plot_metric(result, name, folder / metric_filename(name)) for name in names]
