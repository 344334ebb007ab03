"""Predictions of docs/math.md §7 for the hierarchical model (leading order and the finite-d spiked
random-matrix model), and the measurements compared with them.
"""

from __future__ import annotations

import math

import numpy as np

from wbfe.theory.checks import finite_number, refuse_unless
from wbfe.theory.hierarchical.model import MC_SAMPLES, feature_dim, vec_to_sym
from wbfe.theory.teacher_student import fit_slope

__all__ = ["leading_thresholds", "recovered_count", "spike_strengths", "finite_d_thresholds", "finite_d_overlaps",
           "finite_d_level_alphas", "tail_fraction", "overlap_nmse", "fit_tail_constant", "loglog_slope",
           "crossing_alphas", "nmse_exponent", "kernel_floor"]

_MC_SEED = 20260515


def _check_level(level: float, what: str) -> None:
    # None, a string: TypeError from the comparison otherwise
    refuse_unless(finite_number(level) and 0.0 < level < 1.0, f"the {what} level must lie in (0, 1), not {level!r}")


def leading_thresholds(d: int, p: int, gamma: float) -> np.ndarray:
    """α_i = 2 + 2γ·log_d i for i = 1..p (docs/math.md §7)."""
    return 2.0 + 2.0 * gamma * np.log(np.arange(1, p + 1)) / math.log(d)


def recovered_count(alpha: float, d: int, gamma: float, p: int, *, alpha1: float = 2.0) -> int:
    """m(n) = ⌊d^((α − α₁)/(2γ))⌋, clipped to [0, p] (0 below the first threshold)."""
    if alpha < alpha1:
        return 0
    # A tiny slack keeps α exactly on a threshold (d^integer) from flooring one below.
    return int(min(p, math.floor(d ** ((alpha - alpha1) / (2.0 * gamma)) * (1.0 + 1e-12))))


def spike_strengths(b: np.ndarray, activation: str, y_mean: float = 0.0,
                    y_std: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """``(c, v)``: spike strengths c_i = E[y·(h_i² − 1)] and couplings v_i = E[y²·h_i²] for Gaussian latents,
    exact for ``"identity"`` (c_i = 2b_i/y_std, v_i = (1 + 8b_i²)/y_std²), by Monte Carlo with a fixed
    seed for ``"tanh"``."""
    b = np.asarray(b, dtype=np.float64)
    if activation == "identity":
        # Stein: E[s(h_i²−1)] = 2b_i; E[s²h_i²] = b_i²·E[(h²−1)²h²] + Σ_{j≠i} 2b_j² = 8b_i² + 2Σb².
        return 2.0 * b / y_std, (8.0 * b**2 + 2.0 * float(np.sum(b**2))) / y_std**2
    h = np.random.default_rng(_MC_SEED).standard_normal((MC_SAMPLES, b.shape[0]))
    y = (np.tanh((h * h - 1.0) @ b) - y_mean) / y_std
    return ((h * h - 1.0) * y[:, None]).mean(axis=0), ((h * h) * (y * y)[:, None]).mean(axis=0)


def finite_d_thresholds(d: int, c: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Onsets α_i = log_d(D·v_i²/c_i²) of the finite-d spiked model."""
    c, v = np.abs(np.asarray(c, dtype=np.float64)), np.asarray(v, dtype=np.float64)
    with np.errstate(divide="ignore"):
        return np.log(feature_dim(d) * v**2 / c**2) / math.log(d)


def finite_d_overlaps(n: float, d: int, c: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Predicted squared overlaps q_i at n samples in the finite-d spiked model (0 below onset)."""
    c, v = np.abs(np.asarray(c, dtype=np.float64)), np.asarray(v, dtype=np.float64)
    s2 = d * (d + 1) / 2.0 / n
    out, on = np.zeros_like(c), c > v * math.sqrt(s2)
    c, v = c[on], v[on]
    # The smaller root of a·x² − c·x + 1 = 0, a = (v − 1)·s2, written to stay exact as a → 0.
    x = 2.0 / (c + np.sqrt(np.maximum(c * c - 4.0 * ((v - 1.0) * s2), 0.0)))
    out[on] = 1.0 / (1.0 + v * s2 * x * x / (1.0 - s2 * x * x))
    return out


def finite_d_level_alphas(d: int, c: np.ndarray, v: np.ndarray, level: float) -> np.ndarray:
    """α at which the predicted q_i reaches ``level``: σ_L = c·u/(1 + (v−1)u²), u² = r/(v + r), r = 1/L − 1."""
    _check_level(level, "overlap")
    c, v = np.abs(np.asarray(c, dtype=np.float64)), np.asarray(v, dtype=np.float64)
    r = 1.0 / level - 1.0
    u = np.sqrt(r / (v + r))
    sigma = c * u / (1.0 + (v - 1.0) * u * u)
    with np.errstate(divide="ignore"):
        return np.log(feature_dim(d) / sigma**2) / math.log(d)


def tail_fraction(m: int, b: np.ndarray) -> float:
    """Σ_{j>m} b_j² / Σ_j b_j²: the share of the signal in the features not yet recovered."""
    b2 = np.asarray(b, dtype=np.float64) ** 2
    return float(b2[int(m) :].sum() / b2.sum())


def overlap_nmse(q: np.ndarray, b: np.ndarray) -> float:
    """NMSE left by imperfect directions: Σ_j b_j²(1 − q_j²) / Σ_j b_j² (docs/math.md §7)."""
    b2 = np.asarray(b, dtype=np.float64) ** 2
    q = np.asarray(q, dtype=np.float64)
    return float(np.sum(b2 * (1.0 - q * q)) / b2.sum())


def fit_tail_constant(nmse: np.ndarray, tails: np.ndarray) -> float:
    """Least-squares c in log space for NMSE ≈ c·tail, over the points where both are > 0 (NaN if none)."""
    nmse, tails = np.asarray(nmse, dtype=np.float64), np.asarray(tails, dtype=np.float64)
    ok = np.isfinite(nmse) & (nmse > 0.0) & (tails > 0.0)
    if not ok.any():
        return math.nan
    return float(np.exp(np.mean(np.log(nmse[ok]) - np.log(tails[ok]))))


def loglog_slope(n: np.ndarray, values: np.ndarray) -> float:
    """Least-squares slope of log(values) against log(n); NaN with fewer than two usable points."""
    return fit_slope(n, values, min_points=2)


def crossing_alphas(alphas: np.ndarray, q: np.ndarray, level: float) -> np.ndarray:
    """Per feature (column of the (m, p) overlaps ``q`` on the increasing grid ``alphas``), the α at which
    its overlap first reaches ``level`` (linear interpolation); NaN for a feature that never does, the
    first grid point for one already above it there.

    Raises:
        InvalidOptionError: level outside (0, 1) or mismatched shapes.
    """
    alphas, q = np.asarray(alphas, dtype=np.float64), np.asarray(q, dtype=np.float64)
    _check_level(level, "crossing")
    refuse_unless(q.ndim == 2 and q.shape[0] == alphas.shape[0], "q must have one row per alpha")
    out = np.full(q.shape[1], math.nan)
    for i, col in enumerate(q.T):
        j = int(np.argmax(col >= level))  # the first point at or above the level, if any
        if col[j] >= level:
            q0, q1 = col[j - 1], col[j]
            out[i] = alphas[0] if j == 0 else alphas[j - 1] + (level - q0) / (q1 - q0) * (alphas[j] - alphas[j - 1])
    return out


def nmse_exponent(gamma: float) -> float:
    """The learning-curve exponent −1 + 1/(2γ) of docs/math.md §7."""
    return -1.0 + 1.0 / (2.0 * gamma)


def kernel_floor(a: np.ndarray, b: np.ndarray, d: int, *, features: str = "hermite",
                 activation: str = "identity") -> float:
    """1 − Var(degree-2 part)/Var(y), the NMSE floor of a rotation-invariant kernel for d² ≪ n ≪ d⁴
    (docs/math.md §7): 1 for the Gaussian-equivalent features, NaN for a g* other than the identity."""
    if features == "gaussian":
        return 1.0
    if activation != "identity":
        return math.nan
    mats = vec_to_sym(np.asarray(a, dtype=np.float64), d)  # (p, d, d)
    b = np.asarray(b, dtype=np.float64)
    squares = mats @ mats
    m = np.einsum("i,ijk->jk", b, squares)
    tr_sq = np.einsum("ijk,lkj->il", squares, squares)  # Tr(A_i² A_l²)
    prods = np.einsum("ijk,lkm->iljm", mats, mats)  # A_i A_l
    tr_alt = np.einsum("iljm,ilmj->il", prods, prods)  # Tr(A_i A_l A_i A_l)
    var_s = 2.0 * float(b @ b) + float(b @ (8.0 * tr_sq + 4.0 * tr_alt) @ b)
    return 1.0 - 8.0 * float(np.sum(m * m)) / var_s
