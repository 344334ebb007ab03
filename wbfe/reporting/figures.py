"""The report's figures, made by the figure factory (:mod:`wbfe.reporting.plots.canvas`) with the page's style
and fixed margins, and serialised to SVG or PNG bytes. The ESD and the zoo scatter are the figures ``wbfe esd`` and
``wbfe rank`` draw too (:mod:`wbfe.reporting.plots.esd`, :mod:`wbfe.reporting.plots.ranking`)."""

from __future__ import annotations

import io
import math
from typing import Any, Literal, Mapping, Optional, Sequence

import numpy as np

from wbfe.render.text import as_float, finite_or_none
from wbfe.reporting.metrics_info import colour
from wbfe.reporting.plots.canvas import page_figure, page_style, short_name
from wbfe.reporting.plots.esd import ESD_COLOURS, esd_figure
from wbfe.reporting.plots.ranking import scatter_figure

__all__ = ["render", "depth_figure", "esd_figure", "scatter_figure", "correlation_figure", "short_name", "ESD_COLOURS"]


def render(fig: Any, fmt: Literal["svg", "png"]) -> bytes:
    """``fig`` as SVG or PNG bytes, the same bytes for the same figure (no dates, fixed ids)."""
    buffer = io.BytesIO()
    options: Any = ({"metadata": {"Date": None, "Creator": None}} if fmt == "svg"
                    else {"dpi": 110, "metadata": {"Software": None}})
    with page_style():
        fig.savefig(buffer, format=fmt, **options)
    return buffer.getvalue()


_RING: Any = {"ms": 7, "mfc": "none", "mec": "black", "mew": 0.8}
_STAR: Any = {"ms": 10, "color": "black", "zorder": 4}


def depth_figure(layers: Sequence[Mapping[str, Any]], metrics: Sequence[str], *, head: Optional[str],
                 marked: Sequence[str] = ()) -> Any:
    """One small panel per metric along depth (x = the layer's # in the table); the head is a star,
    the layers shown as ESD thumbnails are ringed."""
    from matplotlib.lines import Line2D
    from matplotlib.ticker import MaxNLocator

    with page_style():
        ncols = 2 if len(metrics) > 1 else 1
        nrows = math.ceil(len(metrics) / ncols)
        fig = page_figure(9.6, 1.6 * nrows + 0.75, top=0.45, left=0.5, hspace=0.55, wspace=0.14)
        axes = fig.subplots(nrows, ncols, sharex=True, squeeze=False)
        x_all = np.arange(1, len(layers) + 1)
        names = [layer["name"] for layer in layers]
        for i, (metric, ax) in enumerate(zip(metrics, axes.flat)):
            y = np.array([as_float(layer.get(metric)) for layer in layers], dtype=float)
            ok = np.isfinite(y)  # a null (failed fit) is left out; the line joins its neighbours
            # A marker per layer helps up to a few dozen layers; beyond, they merge and only cost
            # (each is an element of the SVG).
            ax.plot(x_all[ok], y[ok], "-", color=colour(metric), lw=1.1,
                    marker="o" if len(layers) <= 48 else None, ms=2.6)
            for name, fmt, style in [(name, "o", _RING) for name in marked] + [(head, "*", _STAR)]:
                if name in names and np.isfinite(y[k := names.index(name)]):
                    ax.plot([k + 1], [y[k]], fmt, **style)
            ax.set_title(metric, loc="left", color=colour(metric), fontweight="bold")
            ax.grid(True, alpha=0.3)
            ax.xaxis.set_major_locator(MaxNLocator(integer=True, nbins=10))
            ax.yaxis.set_major_locator(MaxNLocator(nbins=4))
            if i + ncols >= len(metrics):  # the bottom row, or above an empty panel
                ax.set_xlabel("layer # (as in the table)")
                ax.tick_params(labelbottom=True)
        for ax in axes.flat[len(metrics):]:
            ax.set_visible(False)
        handles = [Line2D([], [], ls="", marker="*", ms=9, color="black", label="head")] if head in names else []
        if any(name in names for name in marked):
            handles.append(Line2D([], [], ls="", marker="o", ms=7, mfc="none", mec="black", label="ESD shown below"))
        if handles:
            fig.legend(handles=handles, loc="upper right", ncols=2, frameon=False, bbox_to_anchor=(1.0, 1.0))
    return fig


def correlation_figure(rows: Sequence[Mapping[str, Any]]) -> Any:
    """Spearman ρ with its 95 % interval per metric (a forest plot), each in its metric's colour;
    a hollow marker where the sign is the opposite of the expected one."""
    with page_style():
        longest = max((len(short_name(str(r["metric"]), 30)) for r in rows), default=4)
        fig = page_figure(7.2, 0.24 * max(len(rows), 1) + 1.0, left=0.2 + 0.062 * longest, bottom=0.62, top=0.15)
        ax = fig.add_subplot()
        for i, row in enumerate(rows):
            rho, lo, hi = (finite_or_none(row.get(k)) for k in ("rho", "ci_low", "ci_high"))
            y, c = len(rows) - 1 - i, colour(row["metric"])
            if rho is None:
                continue
            if lo is not None and hi is not None:
                ax.plot([lo, hi], [y, y], "-", color=c, lw=1.6)
            against = (sign := row.get("expected_sign")) is not None and rho * sign < 0
            ax.plot([rho], [y], "o", ms=5, color=c, mfc="white" if against else c)
        ax.axvline(0.0, color="0.5", lw=0.8)
        ax.set_yticks(range(len(rows)), [short_name(str(r["metric"]), 30) for r in reversed(rows)])
        ax.set(xlim=(-1.05, 1.05), ylim=(-0.7, len(rows) - 0.3),
               xlabel="Spearman ρ with quality (oriented: higher = better), 95 % bootstrap interval\n"
                      "hollow marker: the sign is the opposite of the metric's expected sign")
        ax.grid(True, axis="x", alpha=0.3)
    return fig

