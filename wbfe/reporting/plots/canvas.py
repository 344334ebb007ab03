"""A figure of its own on an Agg canvas: drawing never touches pyplot's state or the caller's backend."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal, Optional

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["new_figure"]


def new_figure(figsize: tuple[float, float], *,
               layout: Optional[Literal["constrained", "compressed", "tight"]] = None) -> "Figure":
    """A :class:`~matplotlib.figure.Figure` attached to a ``FigureCanvasAgg``, unknown to pyplot.

    Nothing needs closing: the figure is freed with its last reference.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=figsize, layout=layout)
    FigureCanvasAgg(fig)
    return fig
