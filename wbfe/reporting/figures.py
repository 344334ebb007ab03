"""The report's figures, made by the figure factory (:mod:`wbfe.reporting.plots.canvas`) with the report's
style and fixed margins, and serialised to SVG or PNG bytes."""

from __future__ import annotations

import io
import math
from typing import Any, Literal, Mapping, Optional, Sequence

import numpy as np

from wbfe.render.text import as_float, finite_or_none
from wbfe.reporting.metrics_info import colour

__all__ = ["render", "depth_figure", "esd_figure", "scatter_figure", "correlation_figure", "short_name", "ESD_COLOURS"]

# The ESD fits wear the colour of the column they produce.
ESD_COLOURS = {"power law": colour("alpha"), "truncated PL": colour("tpl_alpha"), "HTMP": colour("htmp_kappa")}
_RC: Any = {"svg.hashsalt": "wbfe-report", "svg.fonttype": "path", "font.size": 8.0, "axes.titlesize": 8.5,
       "axes.labelsize": 8.0, "xtick.labelsize": 7.0, "ytick.labelsize": 7.0, "legend.fontsize": 7.0}


def _page_figure(width: float, height: float, **margins: float) -> Any:
    """A figure in the page's style, with fixed margins in inches: a layout engine would draw it twice."""
    from wbfe.reporting.plots.canvas import new_figure

    fig = new_figure((width, height))  # the callers are in the page's style (_rc)
    fig.set_dpi(100)
    inches = {"left": 0.55, "right": 0.12, "top": 0.3, "bottom": 0.45, "wspace": 0.25, "hspace": 0.3} | margins
    fig.subplots_adjust(left=inches["left"] / width, right=1 - inches["right"] / width,
                        top=1 - inches["top"] / height, bottom=inches["bottom"] / height,
                        wspace=inches["wspace"], hspace=inches["hspace"])
    return fig


def render(fig: Any, fmt: Literal["svg", "png"]) -> bytes:
    """``fig`` as SVG or PNG bytes, the same bytes for the same figure (no dates, fixed ids)."""
    buffer = io.BytesIO()
    options: Any = ({"metadata": {"Date": None, "Creator": None}} if fmt == "svg"
                    else {"dpi": 110, "metadata": {"Software": None}})
    with _rc():
        fig.savefig(buffer, format=fmt, **options)
    return buffer.getvalue()


def short_name(name: str, limit: int = 38) -> str:
    """``name`` cut in the middle to ``limit`` characters, printable (a figure label must stay short)."""
    name = "".join(c if c.isprintable() else "?" for c in name)
    if len(name) <= limit:
        return name
    keep = limit - 1
    return name[: keep // 2] + "…" + name[len(name) - (keep - keep // 2):]


_RING: Any = {"ms": 7, "mfc": "none", "mec": "black", "mew": 0.8}
_STAR: Any = {"ms": 10, "color": "black", "zorder": 4}


def depth_figure(layers: Sequence[Mapping[str, Any]], metrics: Sequence[str], *, head: Optional[str],
                 marked: Sequence[str] = ()) -> Any:
    """One small panel per metric along depth (x = the layer's # in the table); the head is a star,
    the layers shown as ESD thumbnails are ringed."""
    from matplotlib.lines import Line2D
    from matplotlib.ticker import MaxNLocator

    with _rc():
        ncols = 2 if len(metrics) > 1 else 1
        nrows = math.ceil(len(metrics) / ncols)
        fig = _page_figure(9.6, 1.6 * nrows + 0.75, top=0.45, left=0.5, hspace=0.55, wspace=0.14)
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


def esd_figure(eigs: np.ndarray, row: Mapping[str, Any], *, title: str) -> Any:
    """A thumbnail of one ESD (log-log density) with the fits whose parameters are in ``row``: the
    power law (alpha, xmin), the truncated power law (tpl_alpha, tpl_lambda) on the same tail and
    the HTMP law (htmp_kappa, htmp_beta, htmp_tau) — the numbers of the table, not a second fit."""
    from wbfe.metrics import htmp
    from wbfe.metrics.powerlaw import tpl_log_normaliser

    e = np.sort(np.asarray(eigs, dtype=float))
    e = e[e > 0.0]
    with _rc():
        fig = _page_figure(3.5, 2.9, left=0.6, bottom=0.95, top=0.25, right=0.12)
        ax = fig.add_subplot()
        ax.set_title(title, fontsize=7.5)
        if e.size < 2 or e[0] == e[-1]:
            ax.text(0.5, 0.5, "fewer than 2 distinct\npositive eigenvalues", ha="center", va="center",
                    transform=ax.transAxes)
            return fig
        n = e.size
        bins = int(np.clip(2.0 * np.sqrt(n), 6, 50))  # few eigenvalues spread over many empty bins read as noise
        edges = np.geomspace(e[0], e[-1] * (1 + 1e-12), bins + 1)
        counts, _ = np.histogram(e, bins=edges)
        density = counts / (n * np.diff(edges))
        centres = np.sqrt(edges[:-1] * edges[1:])
        ax.loglog(centres[counts > 0], density[counts > 0], "o", ms=2.8, color="0.35", label=f"ESD (n = {n})")
        grid = np.geomspace(e[0], e[-1], 120)
        alpha, xmin = finite_or_none(row.get("alpha")), finite_or_none(row.get("xmin"))
        if alpha is not None and xmin is not None and alpha > 1.0:
            tail = grid[grid >= xmin]
            share = float(np.count_nonzero(e >= xmin)) / n  # the fits describe the tail only
            ax.loglog(tail, share * (alpha - 1) / xmin * (tail / xmin) ** (-alpha), "-", lw=1.4,
                      color=ESD_COLOURS["power law"], label="power law")
            t_alpha, t_lam = finite_or_none(row.get("tpl_alpha")), finite_or_none(row.get("tpl_lambda"))
            if t_alpha is not None and t_lam is not None and (t_lam > 0 or t_alpha > 1):
                # Λ = 0: truncating did not raise the likelihood, the fit is a plain power law
                log_z = (tpl_log_normaliser(t_alpha, t_lam, xmin) if t_lam > 0
                         else math.log(xmin ** (1 - t_alpha) / (t_alpha - 1)))
                ax.loglog(tail, share * np.exp(-t_alpha * np.log(tail) - t_lam * tail - log_z), "--", lw=1.2,
                          color=ESD_COLOURS["truncated PL"], label="truncated PL")
        kappa, gamma, beta, tau = (finite_or_none(row.get(k)) for k in ("htmp_kappa", "gamma", "htmp_beta", "htmp_tau"))
        if kappa is not None and beta is not None and tau is not None and gamma is not None and gamma < 1.0:
            curve = grid[::4]  # the density is smooth: 30 points draw it (each costs a contour integral)
            with np.errstate(all="ignore"):
                pdf = np.asarray(htmp.pdf(curve, kappa, gamma, beta, tau), dtype=float)
            ok = np.isfinite(pdf) & (pdf > 0)
            ax.loglog(curve[ok], pdf[ok], "-", lw=1.2, color=ESD_COLOURS["HTMP"], label="HTMP")
        ax.set_ylim(bottom=density[counts > 0].min() / 3.0, top=density.max() * 3.0)  # fits must not squash the data
        ax.set(xlabel="eigenvalue", ylabel="density")
        ax.grid(True, alpha=0.25, which="major")
        ax.minorticks_off()  # minor log ticks add nothing at this size, and cost much of the drawing
        fig.legend(loc="lower center", ncols=2, frameon=False, fontsize=6.5, handlelength=1.6)
    return fig


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


def scatter_figure(xs: Sequence[float], ys: Sequence[float], labels: Sequence[str], *, metric: str,
                   quality: str, title: str, max_labels: int = 8) -> Any:
    """Metric (x) against quality (y), one point per model in the metric's colour; the best and
    worst models by quality are labelled where a label fits without overlapping."""
    with _rc():
        fig = _page_figure(3.6, 3.0, left=0.62, bottom=0.48, top=0.28, right=0.12)
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
        from wbfe.reporting.plots.ranking import checkpoint_labels  # the one rule for checkpoint labels

        _place_labels(ax, [(float(x), float(y), short_name(label, 24))
                           for x, y, label in zip(xs, ys, checkpoint_labels(list(labels)))],
                      ends[:max_labels])
    return fig


def correlation_figure(rows: Sequence[Mapping[str, Any]]) -> Any:
    """Spearman ρ with its 95 % interval per metric (a forest plot), each in its metric's colour;
    a hollow marker where the sign is the opposite of the expected one."""
    with _rc():
        longest = max((len(short_name(str(r["metric"]), 30)) for r in rows), default=4)
        fig = _page_figure(7.2, 0.24 * max(len(rows), 1) + 1.0, left=0.2 + 0.062 * longest, bottom=0.62, top=0.15)
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


def _rc() -> Any:
    import matplotlib

    return matplotlib.rc_context(_RC)
