"""The scatter of a ranked zoo, one metric against quality (:func:`scatter_figure`: the report's and ``wbfe rank``'s
one figure), with each point labelled with its model where the label fits."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence, Union

import numpy as np

if TYPE_CHECKING:
    from wbfe.ranking.ranker import RankResult

from wbfe.render.text import is_number, number_text
from wbfe.reporting.metrics_info import colour
from wbfe.reporting.plots.canvas import page_figure, page_style, save, short_name

__all__ = ["scatter_figure", "plot_metric", "plot_ranking", "checkpoint_labels", "rho_text", "p_text"]


_EXTENSION = re.compile(r"\.(safetensors(\.index\.json)?|bin(\.index\.json)?|pt|pth|th|ckpt|gguf|onnx|h5|keras|"
                        r"tflite|npz|msgpack)$", re.I)
# File names that say nothing of the model (a Hugging Face folder's weights): their folder names it.
_GENERIC = re.compile(r"^(model|pytorch_model|adapter_model|tf_model|flax_model|weights|checkpoint)"
                      r"(-\d+-of-\d+)?$", re.I)


def _is_path(model: str) -> bool:
    """Whether a zoo label is a path or URL rather than a name (a hub id ``org/name`` is a name)."""
    return (model.startswith(("/", "~", "./", "../")) or "\\" in model or "://" in model
            or model.count("/") > 1 or ("/" in model and _EXTENSION.search(model) is not None)
            or re.match(r"^[A-Za-z]:", model) is not None)


def checkpoint_labels(models: Sequence[str]) -> list[str]:
    """Short labels for the points of ``models`` (zoo labels): a name as it is, a checkpoint file
    without its extension, and a path or URL by its last parts only, as few as keep the labels
    apart (``/data/zoo/gpt2/model.safetensors`` -> ``gpt2/model``): an absolute path is the
    machine's, not the model's name, and would run across the plot."""
    parts = [[_EXTENSION.sub("", part) if i == 0 else part
              for i, part in enumerate(reversed(re.split(r"[/\\]+", m.split("://", 1)[-1].rstrip("/\\"))))]
             if _is_path(m) else [_EXTENSION.sub("", m)] for m in models]
    # Last components first: one, or two where the file name is generic; more while two labels clash.
    taken = [2 if len(p) > 1 and _GENERIC.match(p[0]) else 1 for p in parts]
    labels = ["/".join(reversed(p[:k])) for p, k in zip(parts, taken)]
    while True:
        clashing = {label for label in labels if labels.count(label) > 1}
        grow = [i for i, label in enumerate(labels) if label in clashing and taken[i] < len(parts[i])]
        if not grow:
            return labels
        for i in grow:
            taken[i] += 1
            labels[i] = "/".join(reversed(parts[i][:taken[i]]))


def rho_text(rho: Any, low: Any, high: Any) -> str:
    """``ρ = -0.50 [-0.90, +0.10]``: Spearman's ρ and its interval as the zoo page and ``wbfe rank``'s scatters
    write it, "n/a" for a value that is missing or not finite."""
    return f"ρ = {number_text(rho, '+.2f')} [{number_text(low, '+.2f')}, {number_text(high, '+.2f')}]"


def p_text(p: Any) -> str:
    """A p-value to 2 significant digits, "n/a" for one that is missing or not finite."""
    return number_text(p, ".2g")


def _place_labels(ax: Any, points: Sequence[tuple[float, float, str]], priority: Sequence[int]) -> None:
    """Annotate points in ``priority`` order, skipping any label that would overlap one already
    drawn or a plotted point (so no two labels collide)."""
    renderer = ax.figure.canvas.get_renderer()
    inside = ax.get_window_extent(renderer)
    marks = ax.transData.transform([(x, y) for x, y, _ in points])
    placed: list[Any] = []
    for index in priority:
        x, y, label = points[index]
        for dx, dy, ha in ((4, 3, "left"), (-4, 3, "right"), (4, -9, "left"), (-4, -9, "right")):
            text = ax.annotate(label, (x, y), xytext=(dx, dy), textcoords="offset points", fontsize=6.3,
                               ha=ha, color="0.15", annotation_clip=True)
            box = text.get_window_extent(renderer).expanded(1.05, 1.15)
            clash = any(box.overlaps(other) for other in placed)
            covers = any(box.contains(px, py) for j, (px, py) in enumerate(marks) if j != index)
            if not clash and not covers and inside.contains(box.x0, box.y0) and inside.contains(box.x1, box.y1):
                placed.append(box)
                break
            text.remove()


def scatter_figure(xs: Sequence[Any], ys: Sequence[Any], labels: Sequence[str], *, metric: str,
                   quality: str, title: str, max_labels: int = 8, size: tuple[float, float] = (3.6, 3.0)) -> Any:
    """Metric (x) against quality (y), one point per model whose both are finite numbers (None, NaN, text left out),
    in the metric's colour; the best and worst models by quality are labelled (``max_labels`` of them, by
    :func:`checkpoint_labels`) where a label fits without overlapping. ``size``: the figure in inches (a report
    thumbnail by default)."""
    kept = [(float(x), float(y), label) for x, y, label in zip(xs, ys, labels)
            if is_number(x) and is_number(y) and math.isfinite(x) and math.isfinite(y)]
    xs, ys, labels = [p[0] for p in kept], [p[1] for p in kept], [p[2] for p in kept]
    with page_style():
        fig = page_figure(*size, left=0.62, bottom=0.48, top=0.28, right=0.12)
        ax = fig.add_subplot()
        ax.set_title(title, fontsize=7.5)
        ax.set(xlabel=metric, ylabel=quality)
        ax.grid(True, alpha=0.3)
        if not xs:
            ax.text(0.5, 0.5, "no model has a finite value", ha="center", va="center", transform=ax.transAxes)
            return fig
        ax.scatter(xs, ys, s=16, color=colour(metric), edgecolor="white", linewidth=0.4, zorder=3)
        ax.margins(x=0.08, y=0.1)
        ax.get_xlim(), ax.get_ylim()  # settles the autoscaled limits, so label boxes are measured where they end up
        order = np.argsort(ys, kind="stable")
        ends = list(dict.fromkeys(int(k) for pair in zip(order[::-1], order) for k in pair))  # best, worst, ...
        _place_labels(ax, [(float(x), float(y), short_name(label, 24))
                           for x, y, label in zip(xs, ys, checkpoint_labels(list(labels)))],
                      ends[:max_labels])
    return fig


def plot_metric(result: "RankResult", metric: str, path: Union[str, Path]) -> Path:
    """Save :func:`scatter_figure` of ``metric`` against the quality, titled with ρ, its interval, p and n; returns
    the path written.

    Raises:
        UnknownNameError: ``metric`` is not in the result.
    """
    row = result.metric(metric)
    models = result.models
    arrow = " (lower is better)" if result.lower_is_better else ""
    title = f"{result.zoo}: {rho_text(row.rho, row.ci_low, row.ci_high)}, p = {p_text(row.p_value)}, n = {row.n}"
    fig = scatter_figure([m.scores.get(metric) for m in models], [m.quality for m in models],
                         [m.model for m in models], metric=metric, quality=f"{result.quality}{arrow}", title=title,
                         max_labels=len(models), size=(7.5, 5.5))
    return save(fig, path)


def _figure_name(metric: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", metric) + ".png"


def plot_ranking(result: "RankResult", directory: Union[str, Path]) -> list[Path]:
    """One scatter PNG per metric of ``result`` in ``directory``, named after the metric (only letters, digits,
    ``_``, ``-`` and ``.``)."""
    return [plot_metric(result, m.metric, Path(directory) / _figure_name(m.metric)) for m in result.metrics]


def earlier_figures(directory: Union[str, Path]) -> list[Path]:
    """The figures an earlier ranking wrote into ``directory``: the PNGs its ``rank.json`` names, where they are
    regular files (none without a readable ranking there)."""
    try:
        metrics = json.loads((Path(directory) / "rank.json").read_text(encoding="utf-8"))["metrics"]
        names = {_figure_name(m["metric"]) for m in metrics}
    except (OSError, ValueError, TypeError, KeyError):
        return []
    return sorted(p for p in (Path(directory) / n for n in names) if p.is_file() and not p.is_symlink())
