"""The empirical spectral density of one matrix with its power-law, truncated power-law and HTMP fits."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from wbfe.errors import InvalidOptionError
from wbfe.metrics import htmp, powerlaw
from wbfe.reporting.plots.canvas import new_axes, save

__all__ = ["EsdFits", "fit_esd", "esd_scale", "plot_esd"]


@dataclass(frozen=True)
class EsdFits:
    """The three fits drawn over an ESD (each None when it failed, with the reason kept)."""

    power_law: Any
    truncated: Any
    htmp: Any
    htmp_reason: str = ""


def fit_esd(eigs: np.ndarray, gamma: float, *, min_tail: int = 10) -> EsdFits:
    """Fit a power law (CSN), a truncated power law on the same tail, and the HTMP law to ``eigs``."""
    positive = np.sort(eigs[eigs > 0.0])
    pl = powerlaw.fit_power_law(positive, min_tail=min_tail)
    tpl = powerlaw.fit_truncated_power_law(positive, xmin=pl.xmin) if math.isfinite(pl.xmin) else None
    try:
        ht, reason = htmp.fit(positive, min(gamma, 1.0 - 1e-9)), ""
    except InvalidOptionError as exc:
        ht, reason = None, str(exc)
    return EsdFits(power_law=pl, truncated=tpl, htmp=ht, htmp_reason=reason)


def esd_scale(eigs: np.ndarray, log_scale: float) -> tuple[int, str]:
    """``(k, note)`` for eigenvalues stored as the true ones × 2^k (:attr:`Spectrum.log_scale` = −k·ln 2, nonzero where
    the Gram matrix would leave float64's range; the fits need them near 1 too): ``(0, "")`` for the true ones."""
    k = round(-log_scale / math.log(2.0))
    if not k:
        return 0, ""
    top = math.log10(float(np.max(eigs))) - k * math.log10(2.0)
    return k, f"eigenvalues drawn × 2^{k}: the true ones reach 1e{top:+.0f}"


def plot_esd(eigs: np.ndarray, fits: EsdFits, path: Path, *, title: str = "", bins: int = 60,
             scale_exp2: int = 0) -> Path:
    """Draw the ESD on log-log axes with the fitted densities and their parameters in the legend, as a PNG at ``path``;
    ``scale_exp2``: k of :func:`esd_scale` for ``eigs`` that are the true ones × 2^k, said on the axis."""
    e = np.sort(eigs[eigs > 0.0])
    n = e.size
    edges = np.geomspace(e[0], e[-1] * (1 + 1e-12), bins + 1)
    counts, _ = np.histogram(e, bins=edges)
    density = counts / (n * np.diff(edges))
    centres = np.sqrt(edges[:-1] * edges[1:])
    fig, ax = new_axes((7, 5))
    ax.loglog(centres[counts > 0], density[counts > 0], "o", ms=4, color="0.3", label=f"ESD ({n} eigenvalues)")
    grid = np.geomspace(e[0], e[-1], 400)
    pl, tpl, ht = fits.power_law, fits.truncated, fits.htmp
    if pl is not None and math.isfinite(pl.alpha):
        tail = grid[grid >= pl.xmin]
        share = pl.n_tail / n  # the fits describe the tail only: scale them to its share of the ESD
        ax.loglog(tail, share * (pl.alpha - 1) / pl.xmin * (tail / pl.xmin) ** (-pl.alpha), "-", color="C1",
                  label=f"power law: α = {pl.alpha:.3f}, xmin = {pl.xmin:.3g}, tail = {pl.n_tail}")
        if tpl is not None and math.isfinite(tpl.alpha) and tpl.lam > 0.0:
            log_z = powerlaw.tpl_log_normaliser(tpl.alpha, tpl.lam, tpl.xmin)
            ax.loglog(tail, share * np.exp(-tpl.alpha * np.log(tail) - tpl.lam * tail - log_z), "--", color="C2",
                      label=f"truncated PL: α = {tpl.alpha:.3f}, Λ = {tpl.lam:.3g}")
        elif tpl is not None and math.isfinite(tpl.alpha):
            # Λ = 0: no truncation raised the likelihood, and the fit is a plain power law (whose
            # normaliser is (α − 1)/xmin; the Λ > 0 formula has none at Λ = 0).
            ax.loglog(tail, share * (tpl.alpha - 1) / tpl.xmin * (tail / tpl.xmin) ** (-tpl.alpha), "--", color="C2",
                      label=f"truncated PL: α = {tpl.alpha:.3f}, Λ = 0 (no truncation: a plain power law)")
    if ht is not None:
        ax.loglog(grid, htmp.pdf(grid, ht.kappa, ht.gamma, ht.beta, ht.tau), "-", color="C0",
                  label=f"HTMP: κ = {ht.kappa:.3g}, β = {ht.beta:.3g}, τ = {ht.tau:.3g}, KS = {ht.ks:.3f}")
    elif fits.htmp_reason:
        ax.plot([], [], " ", label=f"HTMP: not fitted ({fits.htmp_reason[:50]})")
    unit = f" × 2^{scale_exp2}" if scale_exp2 else ""
    ax.set(xlabel=f"eigenvalue of the smaller Gram matrix{unit}", ylabel="density", title=title)
    ax.legend(fontsize=8, loc="lower left")
    return save(fig, path, tight=True)
