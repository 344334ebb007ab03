"""The empirical spectral density of one matrix with its power-law, truncated power-law and HTMP fits: the one ESD
figure, drawn by ``wbfe esd`` (:func:`plot_esd`) and as the report's thumbnails (:func:`esd_figure`)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Optional

import numpy as np

from wbfe.errors import InvalidOptionError
from wbfe.metrics import htmp, powerlaw
from wbfe.options.constraints import Integer
from wbfe.render.text import finite_or_none, number_text
from wbfe.reporting.metrics_info import colour
from wbfe.reporting.plots.canvas import page_figure, page_style, save

__all__ = ["EsdFits", "fit_esd", "esd_scale", "esd_figure", "plot_esd", "ESD_COLOURS"]

# The ESD fits wear the colour of the column they produce.
ESD_COLOURS = {"power law": colour("alpha"), "truncated PL": colour("tpl_alpha"), "HTMP": colour("htmp_kappa")}
# True eigenvalues are drawn between 2^-1006 and 2^1023: the densities over them are counts / (n · bin width), up
# to 1/e times the bins per relative spread (2^16 of room below), and the top bin edge is e·(1 + 1e-12) (a binary
# order above).
_LOWEST_EXP2 = np.finfo(np.float64).minexp + 16
_HIGHEST_EXP2 = np.finfo(np.float64).maxexp - 1


@dataclass(frozen=True)
class EsdFits:
    """The three fits drawn over an ESD (the truncated and HTMP ones None where they failed)."""

    power_law: Any
    truncated: Any
    htmp: Any

    def row(self) -> dict[str, Any]:
        """The fits' parameters under the score's column names, as :func:`esd_figure` reads them."""
        pl, tpl, ht = self.power_law, self.truncated, self.htmp
        row: dict[str, Any] = {"alpha": pl.alpha, "xmin": pl.xmin}
        if tpl is not None:
            row |= {"tpl_alpha": tpl.alpha, "tpl_lambda": tpl.lam}
        if ht is not None:
            row |= {"htmp_kappa": ht.kappa, "gamma": ht.gamma, "htmp_beta": ht.beta, "htmp_tau": ht.tau,
                    "htmp_ks": ht.ks}
        return row


def fit_esd(eigs: np.ndarray, gamma: float, *, min_tail: int = 10) -> EsdFits:
    """Fit a power law (CSN), a truncated power law on the same tail, and the HTMP law to ``eigs`` of a matrix of
    aspect ratio ``gamma`` (HTMP's law needs γ < 1: a square one is fitted just below); InvalidOptionError for a
    ``gamma`` outside (0, 1]. HTMP fails only for fewer than 2 distinct positive eigenvalues."""
    if not 0.0 < gamma <= 1.0:  # min(gamma, 1 - 1e-9) below took any γ > 1 for a square matrix
        raise InvalidOptionError(f"gamma (the smaller over the larger side) must lie in (0, 1], not {gamma!r}")
    positive = np.sort(eigs[eigs > 0.0])
    pl = powerlaw.fit_power_law(positive, min_tail=min_tail)
    tpl = powerlaw.fit_truncated_power_law(positive, xmin=pl.xmin) if math.isfinite(pl.xmin) else None
    try:
        ht = htmp.fit(positive, min(gamma, 1.0 - 1e-9))
    except InvalidOptionError:
        ht = None
    return EsdFits(power_law=pl, truncated=tpl, htmp=ht)


def _drawn_exp2(eigs: np.ndarray, k: int) -> int:
    """The power of two the ESD of ``eigs`` (the true eigenvalues × 2^k) is drawn at: 0 (the true ones) where every
    positive true one lies in [2^-1006, 2^1023), else k."""
    positive = eigs[eigs > 0.0]
    if not k or not positive.size:
        return 0
    # the true smallest is in [2^(low - 1), 2^low), the largest below 2^high: exact, whatever k
    low, high = (math.frexp(float(v))[1] - k for v in (positive.min(), positive.max()))
    return 0 if low - 1 >= _LOWEST_EXP2 and high <= _HIGHEST_EXP2 else k


def esd_scale(eigs: np.ndarray, log_scale: float) -> tuple[int, str]:
    """``(k, note)`` for eigenvalues stored as the true ones × 2^k (:attr:`Spectrum.log_scale` = −k·ln 2, nonzero where
    the Gram matrix would leave float64's range; the fits need them near 1 too). The note says the scale the figure
    keeps (:func:`_drawn_exp2`); it is empty where the true eigenvalues are drawn."""
    k = round(-log_scale / math.log(2.0))
    if not _drawn_exp2(eigs, k):
        return k, ""
    top = math.log10(float(np.max(eigs))) - k * math.log10(2.0)
    return k, f"eigenvalues drawn × 2^{k}: the true ones reach 1e{top:+.0f}"


def esd_figure(eigs: np.ndarray, row: Mapping[str, Any], *, title: str, bins: Optional[int] = None,
               scale_exp2: int = 0, size: tuple[float, float] = (3.5, 2.9), values: bool = False) -> Any:
    """The ESD (log-log density) with the fits whose parameters are in ``row``: the power law (alpha, xmin), the
    truncated power law (tpl_alpha, tpl_lambda) on the same tail and the HTMP law (htmp_kappa, gamma, htmp_beta,
    htmp_tau) — the numbers of the table (or of :meth:`EsdFits.row`), not a second fit. ``bins``: None for 2·√n
    within 6 to 50 (few eigenvalues over many empty bins read as noise); ``scale_exp2``: k where ``eigs`` and ``row``
    are of the true eigenvalues × 2^k (:func:`_drawn_exp2`); ``size`` in inches (a report thumbnail by default);
    ``values``: each fit's parameters in its legend entry, for a figure with no caption."""
    bins = Integer(2, optional=True)("bins", bins)  # 0 was drawn with the default, -1 raised from numpy
    e = np.sort(np.asarray(eigs, dtype=float))
    # true eigenvalues past float64's range, given as inf (or NaN for 0·inf), are not a spectrum: pass them × 2^k
    overflow = not np.isfinite(e).all()
    e = e[e > 0.0]
    k = _drawn_exp2(e, scale_exp2)
    shift = scale_exp2 - k  # what is drawn is the stored × 2^-shift: x that, densities × 2^shift

    def x(v: Any) -> Any:
        return np.ldexp(v, -shift)

    def y(v: Any) -> Any:
        return np.ldexp(v, shift)

    with page_style():
        fig = page_figure(*size, left=0.6, bottom=0.95 + (0.3 if values else 0.0), top=0.25, right=0.12)
        ax = fig.add_subplot()
        ax.set_title(title, fontsize=7.5)
        ax.set(xlabel="eigenvalue of the smaller Gram matrix" + (f" × 2^{k}" if k else ""), ylabel="density")
        if overflow or e.size < 2 or e[0] == e[-1]:
            ax.text(0.5, 0.5, "eigenvalues beyond float64's range:\n`wbfe esd` draws them × 2^k" if overflow
                    else "fewer than 2 distinct\npositive eigenvalues", ha="center", va="center",
                    transform=ax.transAxes)
            return fig
        n = e.size
        bins = bins or int(np.clip(2.0 * np.sqrt(n), 6, 50))
        edges = np.geomspace(e[0], e[-1] * (1 + 1e-12), bins + 1)
        counts, _ = np.histogram(e, bins=edges)
        density = counts / (n * np.diff(edges))
        centres = np.sqrt(edges[:-1] * edges[1:])
        ax.loglog(x(centres[counts > 0]), y(density[counts > 0]), "o", ms=2.8, color="0.35", label=f"ESD (n = {n})")
        grid = np.geomspace(e[0], e[-1], 120)
        alpha, xmin = finite_or_none(row.get("alpha")), finite_or_none(row.get("xmin"))
        if alpha is not None and xmin is not None and alpha > 1.0:
            tail = grid[grid >= xmin]
            n_tail = int(np.count_nonzero(e >= xmin))
            share = n_tail / n  # the fits describe the tail only
            ax.loglog(x(tail), y(share * (alpha - 1) / xmin * (tail / xmin) ** (-alpha)), "-", lw=1.4,
                      color=ESD_COLOURS["power law"], label="power law" + (
                          f": α = {alpha:.3f}, xmin = {x(xmin):.3g}, tail = {n_tail}" if values else ""))
            t_alpha, t_lam = finite_or_none(row.get("tpl_alpha")), finite_or_none(row.get("tpl_lambda"))
            if t_alpha is not None and t_lam is not None and (t_lam > 0 or t_alpha > 1):
                # Λ = 0: truncating did not raise the likelihood, the fit is a plain power law (whose normaliser
                # is (α − 1)/xmin; the Λ > 0 formula has none at Λ = 0)
                log_z = (powerlaw.tpl_log_normaliser(t_alpha, t_lam, xmin) if t_lam > 0
                         else (1 - t_alpha) * math.log(xmin) - math.log(t_alpha - 1))
                lam_text = f"{y(t_lam):.3g}" if t_lam > 0 else "0 (no truncation: a plain power law)"
                ax.loglog(x(tail), y(share * np.exp(-t_alpha * np.log(tail) - t_lam * tail - log_z)), "--", lw=1.2,
                          color=ESD_COLOURS["truncated PL"], label="truncated PL" + (
                              f": α = {t_alpha:.3f}, Λ = {lam_text}" if values else ""))
        kappa, gamma, beta, tau = (finite_or_none(row.get(c)) for c in ("htmp_kappa", "gamma", "htmp_beta", "htmp_tau"))
        if kappa is not None and beta is not None and tau is not None and gamma is not None and gamma < 1.0:
            curve = grid[::4]  # the density is smooth: 30 points draw it (each costs a contour integral)
            with np.errstate(all="ignore"):
                pdf = np.asarray(htmp.pdf(curve, kappa, gamma, beta, tau), dtype=float)
            ok = np.isfinite(pdf) & (pdf > 0)
            ks = number_text(row.get("htmp_ks"), ".3f", "null")
            ax.loglog(x(curve[ok]), y(pdf[ok]), "-", lw=1.2, color=ESD_COLOURS["HTMP"], label="HTMP" + (
                f": κ = {kappa:.3g}, β = {y(beta):.3g}, τ = {x(tau):.3g}, KS = {ks}"
                if values else ""))
        # the fits must not squash the data
        ax.set_ylim(bottom=y(density[counts > 0].min() / 3.0), top=y(density.max() * 3.0))
        ax.grid(True, alpha=0.25, which="major")
        ax.minorticks_off()  # minor log ticks add nothing at this size, and cost much of the drawing
        fig.legend(loc="lower center", ncols=1 if values else 2, frameon=False, fontsize=6.5, handlelength=1.6)
    return fig


def plot_esd(eigs: np.ndarray, fits: EsdFits, path: Path, *, title: str = "", bins: int = 60,
             scale_exp2: int = 0) -> Path:
    """:func:`esd_figure` of ``eigs`` with ``fits``, their parameters in the legend, as a PNG at ``path``;
    ``scale_exp2``: k of :func:`esd_scale` for ``eigs`` that are the true ones × 2^k."""
    fig = esd_figure(eigs, fits.row(), title=title, bins=bins, scale_exp2=scale_exp2, size=(7.0, 5.0), values=True)
    return save(fig, path)
