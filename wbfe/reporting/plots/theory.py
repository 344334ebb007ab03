"""Figures of the teacher–student theory and its simulation checks, drawn from the values
:mod:`wbfe.theory.reports` computed."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from wbfe.render.files import PathLike
from wbfe.reporting.plots.canvas import new_axes, save

__all__ = ["plot_staircase", "plot_eps", "plot_kc", "plot_hmc", "plot_student"]

_SIZE = (6.0, 4.2)
# r (and ε) are drawn as log10 values on linear axes: matplotlib's log axis over a sweep of ~600 decades overflowed
# (its margins and decade ticks past float64's range: warnings, limits fallen back to 1..10, or an OverflowError).
_LOG_R = "log10 r, r = n/(kd)"


def plot_staircase(sw: Any, path: PathLike, *, max_features: int = 40) -> Path:
    """qᵢ against r for the first ``max_features`` features: the staircase of sharp transitions."""
    fig, ax = new_axes(_SIZE)
    # Log-spaced feature indices: the early transitions are the informative ones.
    idx = np.unique(np.geomspace(1, sw.k, min(max_features, sw.k)).astype(int)) - 1
    for i in idx:
        ax.plot(np.log10(sw.r), sw.q[:, i], lw=1.0)
    ax.set(xlabel=_LOG_R, ylabel="overlap q_i",
           title=f"overlaps of {len(idx)} of k={sw.k} features (log-spaced i); q_sigma={sw.q_sigma:.3f}")
    return save(fig, path, dpi=110, tight=True)


def plot_eps(sw: Any, fit: Any, path: PathLike) -> Path:
    """ε against r (log-log) with the fitted and predicted slopes of the two regimes."""
    fig, ax = new_axes(_SIZE)
    ax.plot(np.log10(sw.r), np.log10(sw.eps), "k-", lw=1.2, label="eps^BO (fixed point)")
    if fit is not None:
        for name, color in (("feature_learning", "tab:blue"), ("refinement", "tab:red")):
            slope = getattr(fit, name)
            pred = getattr(fit, f"{name}_predicted")
            lo, hi = getattr(fit, f"{name}_window")
            if not math.isfinite(slope):
                continue
            mask = (sw.n >= lo) & (sw.n <= hi)
            log_r, log_e = np.log10(sw.r[mask]), np.log10(sw.eps[mask])
            xs = log_r[[0, -1]]
            ax.plot(xs, log_e.mean() + slope * (xs - xs.mean()), "-", color=color, lw=2.5, alpha=0.6,
                    label=f"{name}: fitted {slope:.3f}")
            ax.plot(xs, log_e.mean() + pred * (xs - xs.mean()), "--", color=color, lw=1.2,
                    label=f"{name}: predicted {pred:.3f}")
    ax.set(xlabel=_LOG_R, ylabel="log10 eps")
    ax.legend(fontsize=7)
    return save(fig, path, dpi=110, tight=True)


def plot_kc(sw: Any, path: PathLike) -> Path:
    """The effective width k_c against r."""
    fig, ax = new_axes(_SIZE)
    ax.step(np.log10(sw.r), sw.k_c, where="post", color="k")
    ax.set_yscale("symlog", linthresh=1.0)
    ax.set_ylim(0, 1.5 * max(sw.k, 1))
    ax.axhline(sw.k, color="gray", ls=":", lw=1)
    ax.set(xlabel=_LOG_R, ylabel=f"k_c (teacher width k = {sw.k})")
    return save(fig, path, dpi=110, tight=True)


def plot_hmc(points: Sequence[Any], r_theory: np.ndarray, eps_theory: np.ndarray, path: PathLike) -> Path:
    """HMC Gibbs error/2 (mean ± 2 s.e. over seeds) against the theory's ε(r)."""
    fig, ax = new_axes(_SIZE)
    ax.plot(r_theory, eps_theory, "k-", label="eps^BO (theory)")
    ax.errorbar([p.r for p in points], [p.gibbs_half for p in points],
                yerr=[2 * p.sem if math.isfinite(p.sem) else 0.0 for p in points], fmt="o", color="tab:red",
                capsize=3, label="HMC Gibbs error / 2 (±2 s.e.)")
    ax.set(xlabel="r = n/(kd)", ylabel="error")
    ax.legend(fontsize=8)
    return save(fig, path, dpi=110, tight=True)


def plot_student(result: Any, path: PathLike) -> Path:
    """Adam student test error against width, with the theory's k_c marked."""
    fig, ax = new_axes(_SIZE)
    sem = [2 * s if math.isfinite(s) else 0.0 for s in result.sem]
    ax.errorbar(result.widths, result.test_error, yerr=sem, fmt="o-", capsize=3, label="Adam student")
    ax.axvline(result.k_c, color="tab:red", ls="--", label=f"k_c = {result.k_c} (theory)")
    ax.axhline(result.eps_theory, color="gray", ls=":", label=f"eps^BO = {result.eps_theory:.3g}")
    ax.set(xscale="log", yscale="log", xlabel="student width k_s", ylabel="test error",
           title=f"n={result.n}, d={result.d}, k={result.k}, Delta={result.delta}")
    ax.legend(fontsize=8)
    return save(fig, path, dpi=110, tight=True)

