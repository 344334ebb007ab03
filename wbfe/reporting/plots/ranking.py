"""Scatter plots of a ranked zoo: one figure per metric, each point labelled with its model."""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import TYPE_CHECKING, Sequence, Union

if TYPE_CHECKING:
    from wbfe.ranking.ranker import RankResult

from wbfe.reporting.plots.canvas import new_axes, save

__all__ = ["plot_metric", "plot_ranking", "checkpoint_labels"]


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


def _fmt(value: float, digits: int = 2) -> str:
    return f"{value:.{digits}f}" if math.isfinite(value) else "n/a"


def plot_metric(result: "RankResult", metric: str, path: Union[str, Path]) -> Path:
    """Save a scatter plot of ``metric`` (x) against the quality (y) for every ranked model, titled with
    Spearman ρ, its bootstrap interval, the permutation p-value and n; returns the path written.

    Raises:
        UnknownNameError: ``metric`` is not in the result.
    """
    row = result.metric(metric)
    labelled = zip(result.models, checkpoint_labels([m.model for m in result.models]))
    points = [(m.scores.get(metric), m.quality, label) for m, label in labelled]
    points = [(float(x), float(y), label) for x, y, label in points
              if x is not None and math.isfinite(float(x)) and math.isfinite(float(y))]
    fig, ax = new_axes((7.5, 5.5), layout="constrained")
    if points:
        xs, ys, labels = zip(*points)
        ax.scatter(xs, ys, s=28, color="tab:blue", zorder=3)
        for x, y, label in points:
            ax.annotate(label, (x, y), xytext=(3, 2), textcoords="offset points", fontsize=6,
                        annotation_clip=False)
    else:
        ax.text(0.5, 0.5, "no model has a finite value", ha="center", va="center", transform=ax.transAxes)
    arrow = " (lower is better)" if result.lower_is_better else ""
    ax.set(xlabel=metric, ylabel=f"{result.quality}{arrow}")
    title = (f"{result.zoo}: ρ = {_fmt(row.rho)} [{_fmt(row.ci_low)}, {_fmt(row.ci_high)}], "
             f"p = {row.p_value:.2g}, n = {row.n}")
    ax.set_title(title, fontsize=9)
    ax.grid(True, alpha=0.3)
    return save(fig, path)


def plot_ranking(result: "RankResult", directory: Union[str, Path]) -> list[Path]:
    """One scatter PNG per metric of ``result`` in ``directory``, named after the metric (only letters, digits,
    ``_``, ``-`` and ``.``)."""
    return [plot_metric(result, m.metric, Path(directory) / (re.sub(r"[^A-Za-z0-9_.-]+", "_", m.metric) + ".png"))
            for m in result.metrics]
