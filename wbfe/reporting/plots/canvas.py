"""The one figure factory: a figure of its own on an Agg canvas (drawing never touches pyplot's state or the
caller's backend), the page's style (the report's figures, and the ESD and zoo scatter wherever they are drawn),
and the one way a plot is written to a PNG file."""

from __future__ import annotations

import io
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Optional

from wbfe.render.files import PathLike, write_atomic

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["new_figure", "new_axes", "save", "page_style", "page_figure", "short_name"]

Layout = Optional[Literal["constrained", "compressed", "tight"]]
_PAGE_RC: Any = {"svg.hashsalt": "wbfe-report", "svg.fonttype": "path", "font.size": 8.0, "axes.titlesize": 8.5,
                 "axes.labelsize": 8.0, "xtick.labelsize": 7.0, "ytick.labelsize": 7.0, "legend.fontsize": 7.0}


def new_figure(figsize: tuple[float, float], *, layout: Layout = None) -> "Figure":
    """A :class:`~matplotlib.figure.Figure` on its own Agg canvas, unknown to pyplot: nothing needs closing."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=figsize, layout=layout)
    FigureCanvasAgg(fig)
    return fig


def new_axes(figsize: tuple[float, float], *, layout: Layout = None) -> tuple["Figure", Any]:
    """:func:`new_figure` with one axes."""
    fig = new_figure(figsize, layout=layout)
    return fig, fig.subplots()


def save(fig: "Figure", path: "PathLike", *, dpi: int = 120, tight: bool = False) -> Path:
    """Write ``fig`` as a PNG at ``path`` (atomically: :func:`wbfe.render.files.write_atomic`), laid out
    tightly first with ``tight``; returns the path."""
    if tight:
        fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=dpi)
    return write_atomic(path, buffer.getvalue())


def page_style() -> Any:
    """The page's style (fonts, fixed SVG ids) as a context: figures are drawn, and saved, inside it."""
    import matplotlib

    return matplotlib.rc_context(_PAGE_RC)


def page_figure(width: float, height: float, **margins: float) -> "Figure":
    """A figure in the page's style, with fixed margins in inches: a layout engine would draw it twice."""
    fig = new_figure((width, height))  # the callers are in the page's style (page_style)
    fig.set_dpi(100)
    inches = {"left": 0.55, "right": 0.12, "top": 0.3, "bottom": 0.45, "wspace": 0.25, "hspace": 0.3} | margins
    fig.subplots_adjust(left=inches["left"] / width, right=1 - inches["right"] / width,
                        top=1 - inches["top"] / height, bottom=inches["bottom"] / height,
                        wspace=inches["wspace"], hspace=inches["hspace"])
    return fig


def short_name(name: str, limit: int = 38) -> str:
    """``name`` cut in the middle to ``limit`` characters, printable (a figure label must stay short)."""
    name = "".join(c if c.isprintable() else "?" for c in name)
    if len(name) <= limit:
        return name
    keep = limit - 1
    return name[: keep // 2] + "…" + name[len(name) - (keep - keep // 2):]
