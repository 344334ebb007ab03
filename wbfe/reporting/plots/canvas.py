"""The one figure factory: a figure of its own on an Agg canvas (drawing never touches pyplot's state or the
caller's backend), and the one way a plot is written to a PNG file."""

from __future__ import annotations

import io
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Optional, Union

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["new_figure", "new_axes", "save"]

Layout = Optional[Literal["constrained", "compressed", "tight"]]


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


def save(fig: "Figure", path: Union[str, Path], *, dpi: int = 120, tight: bool = False) -> Path:
    """Write ``fig`` as a PNG at ``path`` (atomically: :func:`wbfe.render.files.write_atomic`), laid out
    tightly first with ``tight``; returns the path."""
    from wbfe.render.files import write_atomic

    if tight:
        fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=dpi)
    return write_atomic(path, buffer.getvalue())
