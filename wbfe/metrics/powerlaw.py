"""Power-law and truncated power-law fits of an eigenvalue tail (docs/math.md §4).

Continuous power law (Clauset, Shalizi & Newman 2009): for each candidate ``xmin`` (every value but
the largest) the MLE is α = 1 + n_tail / Σ_tail ln(x/xmin); the chosen ``xmin`` minimises the KS
distance max_k |1 − (x_k/xmin)^(1−α) − k/n_tail| over the sorted tail x_0 = xmin ≤ x_1 ≤ …, the
one-sided empirical CDF k/n used by Clauset's ``plfit``, the ``powerlaw`` package and WeightWatcher.
σ = (α − 1)/√n_tail.

Two modes:

- default: candidates need a tail of at least ``min_tail`` values and α > 1; failure is NaN + reason.
- ``ww_compatible``: WeightWatcher 0.7.7's ``WWFit`` exactly (``weightwatcher/WW_powerlaw.py``):
  no minimum tail, candidates with α ≤ 1 get D = 1 (not excluded), ties resolved to the smallest
  ``xmin``, and for fewer than 20 values its "small-N" estimator (bias-corrected
  α = 1 + (n−1)/Σ ln(x/xmin), tails of at least 8; its D − 0.868/√n_tail objective is computed
  but overwritten by argmin D in ``WWFit.__init__``, so xmin minimises D).
  WeightWatcher reports α = inf for a constant spectrum; here that is a failure (NaN + reason).

Truncated power law p(x) ∝ x^(−α)·exp(−Λx) on x ≥ xmin: its own MLE, with the normaliser
Z = ∫_xmin^∞ x^(−α) e^(−Λx) dx = Λ^(α−1)·Γ(1−α, Λ·xmin) computed by quadrature in log space
(valid for any real α when Λ > 0, α < 1 included; no incomplete-gamma sign cases).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Callable, NamedTuple, Optional, Sequence, cast

import numpy as np

from wbfe.errors import InvalidOptionError

__all__ = [
    "PowerLawFit",
    "TruncatedPowerLawFit",
    "fit_power_law",
    "fit_truncated_power_law",
    "fit_truncated_power_law_many",
    "fit_power_law_many",
    "tpl_log_normaliser",
    "WW_SMALL_N",
]

#: Below this many values WeightWatcher 0.7.7 switches to its small-N estimator.
WW_SMALL_N = 20
_WW_SMALL_N_MIN_TAIL = 8
# Candidates × tail values evaluated at once; bounds the memory of the vectorised KS scan.
_BLOCK_ELEMENTS = 1 << 20
# The KS scan bounds each candidate's distance on every _KS_STRIDE-th value first, then computes the
# exact distance of the _KS_FIRST lowest bounds and of any other bound below the best of those.
_KS_STRIDE = 8
_KS_FIRST = 8
_KS_EXACT_BELOW = 128
_TPL_MAX_NEWTON = 100
_GL_NODES = 20
_TPL_DROP = 60.0  # integrand ignored below e^-60 of its peak
_PL_BATCH_MIN = 3  # fewer equal-length samples are fitted one by one
_PL_BATCH_MAX_N = 48  # longer samples are fitted one by one (measured crossover, see fit_power_law_many)
_TPL_BATCH_MIN = 3  # below this many fits, a loop of single fits is as fast
_ONE_SEGMENT = np.zeros(1, dtype=np.intp)


@dataclass(frozen=True)
class PowerLawFit:
    """Result of a continuous power-law fit.

    Attributes:
        alpha: exponent α (NaN on failure).
        sigma: standard error (α − 1)/√n_tail.
        xmin: start of the fitted tail.
        xmax: largest value.
        n_tail: number of values ≥ xmin.
        ks: KS distance D of the chosen fit.
        n_candidates: candidate xmin values that were eligible.
        method: ``"csn"``, ``"ww"`` or ``"ww-small-n"``.
        reason: why the fit failed; ``None`` on success.
    """

    alpha: float
    sigma: float
    xmin: float
    xmax: float
    n_tail: int
    ks: float
    n_candidates: int
    method: str
    reason: Optional[str] = None

    @property
    def ok(self) -> bool:
        """True when the fit succeeded."""
        return self.reason is None


@dataclass(frozen=True)
class TruncatedPowerLawFit:
    """Result of a truncated power-law MLE on x ≥ xmin.

    Attributes:
        alpha: exponent α (any real; α < 1 is normalisable because Λ > 0).
        lam: truncation rate Λ >= 0; exactly 0 when no truncation raises the likelihood (the
            maximum is then the plain power law, on the boundary of the parameter space).
        xmin: lower end of the fitted data.
        n_tail: number of values fitted.
        loglik: maximised log-likelihood (sum over the tail).
        reason: why the fit failed; ``None`` on success.
    """

    alpha: float
    lam: float
    xmin: float
    n_tail: int
    loglik: float
    reason: Optional[str] = None

    @property
    def ok(self) -> bool:
        """True when the fit succeeded."""
        return self.reason is None


def _failed(method: str, reason: str, n_candidates: int = 0) -> PowerLawFit:
    nan = math.nan
    return PowerLawFit(nan, nan, nan, nan, 0, nan, n_candidates, method, reason)


def fit_power_law(
    values: np.ndarray, *, min_tail: int = 10, ww_compatible: bool = False
) -> PowerLawFit:
    """Clauset–Shalizi–Newman continuous power-law fit with the xmin chosen by KS distance.

    Args:
        values: positive samples (eigenvalues); order does not matter.
        min_tail: smallest tail accepted (default mode only; must be ≥ 2).
        ww_compatible: reproduce WeightWatcher 0.7.7's ``WWFit`` choices exactly.

    Returns:
        A :class:`PowerLawFit`; on failure every number is NaN and ``reason`` says why.

    Raises:
        InvalidOptionError: ``min_tail`` < 2 (a ``ValueError``).
    """
    x = _pl_input(values, min_tail=min_tail, ww_compatible=ww_compatible)
    if isinstance(x, PowerLawFit):
        return x
    return _fit_scan(x, min_tail=1 if ww_compatible else min_tail, ww_compatible=ww_compatible)


def _pl_input(values: np.ndarray, *, min_tail: int, ww_compatible: bool) -> "np.ndarray | PowerLawFit":
    """The sorted sample for the xmin scan, or the fit when it is decided without one."""
    if min_tail < 2:
        raise InvalidOptionError(f"min_tail must be at least 2, not {min_tail}")
    x = np.sort(np.asarray(values, dtype=np.float64).ravel())
    method = "ww" if ww_compatible else "csn"
    if x.size and not np.all(np.isfinite(x)):
        return _failed(method, "non-finite values")
    if x.size and x[0] <= 0.0:
        return _failed(method, "non-positive values (drop zero eigenvalues first)")
    if ww_compatible:
        if x.size < 2:
            return _failed(method, f"only {x.size} value(s), need at least 2")
        if x.size < WW_SMALL_N:
            return _fit_ww_small_n(x)
        return x
    if x.size < min_tail:
        return _failed(method, f"only {x.size} positive value(s), need a tail of at least {min_tail}")
    return x


def _tail_alphas(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """α and n_tail for every candidate xmin = x[i], i < n − 1 (x sorted ascending along its last
    axis; a 2-D x is a stack of samples, each row's α the same numbers as alone)."""
    n = x.shape[-1]
    logx = np.log(x)
    # Suffix sums of log x, shifted by log x[0] to keep the cancellation in S_i − n_i·log x_i small.
    shifted = logx - logx[..., :1]
    suffix = np.cumsum(shifted[..., ::-1], axis=-1)[..., ::-1]
    n_tail = (n - np.arange(n - 1)).astype(np.float64)
    denom = suffix[..., :-1] - n_tail * shifted[..., :-1]
    with np.errstate(divide="ignore", invalid="ignore"):
        alphas = 1.0 + n_tail / denom
    return alphas, n_tail


def _ks_rows(x: np.ndarray, rows: np.ndarray, alphas: np.ndarray, cols: Optional[np.ndarray] = None) -> np.ndarray:
    """KS distances of the candidates ``rows`` (ascending), each against its own tail (vectorised).

    With ``cols`` (ascending indices into ``x``), only those tail points count: a lower bound of
    the distance made of the very same numbers, so it never exceeds it, not even by rounding.
    """
    start = int(rows[0])
    cols = np.arange(start, x.size) if cols is None else cols[cols >= start]
    k = cols[None, :] - rows[:, None]  # rank within each tail
    n_tail = (x.size - rows).astype(np.float64)[:, None]
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        # Same operations as WeightWatcher (ratio ** (1 − α)) so its choices are reproduced bit for bit.
        theo = 1.0 - (x[cols][None, :] / x[rows, None]) ** (-alphas[rows, None] + 1.0)
        diff = np.abs(theo - k / n_tail)
    diff[k < 0] = -np.inf
    return np.max(diff, axis=1) if cols.size else np.full(rows.size, -np.inf)


def _ks_blocks(x: np.ndarray, rows: np.ndarray, alphas: np.ndarray, cols: Optional[np.ndarray] = None) -> np.ndarray:
    width = x.size if cols is None else max(1, cols.size)
    step = max(1, _BLOCK_ELEMENTS // width)
    return np.concatenate([_ks_rows(x, rows[i : i + step], alphas, cols) for i in range(0, rows.size, step)])


def _ks_all(x: np.ndarray, alphas: np.ndarray, eligible: np.ndarray) -> np.ndarray:
    """KS distances of the eligible candidates; +inf for the others, and for those a lower bound
    shows cannot be the (first) minimum.

    Every distance computed is the exact one (each element as WeightWatcher computes it, and a max
    is exact), so the argmin and its distance are those of the full scan. The bound of a
    candidate is the max over every ``_KS_STRIDE``-th point of the data; the exact distance is
    then computed only for candidates whose bound does not exceed the best distance found.
    """
    ks = np.full(x.size - 1, np.inf)
    idx = np.flatnonzero(eligible)
    if idx.size <= _KS_EXACT_BELOW:
        if idx.size:
            ks[idx] = _ks_blocks(x, idx, alphas)
        return ks
    bounds = _ks_blocks(x, idx, alphas, np.arange(0, x.size, _KS_STRIDE))
    if np.isnan(bounds).any():
        ks[idx] = _ks_blocks(x, idx, alphas)
        return ks
    first = np.sort(idx[np.argsort(bounds, kind="stable")[:_KS_FIRST]])
    ks[first] = _ks_blocks(x, first, alphas)
    best = float(np.min(ks[first]))
    rest = idx[(bounds <= best) & np.isinf(ks[idx])]
    if rest.size:
        ks[rest] = _ks_blocks(x, rest, alphas)
    return ks


def _fit_scan(x: np.ndarray, *, min_tail: int, ww_compatible: bool) -> PowerLawFit:
    alphas, n_tail = _tail_alphas(x)
    valid = alphas > 1.0 if ww_compatible else np.isfinite(alphas) & (alphas > 1.0) & (n_tail >= min_tail)
    ks = _ks_all(x, alphas, valid) if ww_compatible or valid.any() else np.full(alphas.size, np.inf)
    return _pick_xmin(x, alphas, n_tail, valid, ks, min_tail=min_tail, ww_compatible=ww_compatible)


def _pick_xmin(
    x: np.ndarray, alphas: np.ndarray, n_tail: np.ndarray, valid: np.ndarray, ks: np.ndarray, *, min_tail: int, ww_compatible: bool
) -> PowerLawFit:
    """The fit at the first minimum of the KS distances ``ks`` of the ``valid`` candidates."""
    method = "ww" if ww_compatible else "csn"
    if ww_compatible:
        # WWFit: D stays 1 where α <= 1, so such candidates still compete (and win if nothing else).
        ks = np.where(valid, ks, 1.0)
        n_eligible = int(ks.size)
    else:
        n_eligible = int(np.count_nonzero(valid))
        if n_eligible == 0:
            reason = (
                "degenerate spectrum: no tail of at least "
                f"{min_tail} values gives a finite alpha > 1"
            )
            return _failed(method, reason)
    i = int(np.argmin(ks))  # first minimum, as WeightWatcher
    alpha = float(alphas[i])
    if not (math.isfinite(alpha) and alpha > 1.0):
        return _failed(method, f"degenerate tail: alpha = {alpha} at the best xmin", n_eligible)
    nt = int(n_tail[i])
    return PowerLawFit(
        alpha=alpha,
        sigma=(alpha - 1.0) / math.sqrt(nt),
        xmin=float(x[i]),
        xmax=float(x[-1]),
        n_tail=nt,
        ks=float(ks[i]),
        n_candidates=n_eligible,
        method=method,
    )


def _fit_scan_many(x: np.ndarray, *, min_tail: int, ww_compatible: bool) -> list[PowerLawFit]:
    """:func:`_fit_scan` of each row of ``x`` (equal-length sorted samples of at most
    ``_PL_BATCH_MAX_N`` values, so every KS distance is computed exactly, as alone).

    The distances of all candidates of all rows come from one 3-D array (in blocks): the same
    elementwise operations as :func:`_ks_rows`, and a max, so the same numbers.
    """
    b, n = x.shape
    alphas, n_tail = _tail_alphas(x)
    valid = alphas > 1.0 if ww_compatible else np.isfinite(alphas) & (alphas > 1.0) & (n_tail >= min_tail)
    rows = int(np.flatnonzero(valid.any(axis=0))[-1]) + 1 if valid.any() else 0  # candidates 0..rows−1
    ks = np.full(alphas.shape, np.inf)
    if rows:
        k = np.arange(n)[None, :] - np.arange(rows)[:, None]  # rank within each tail
        step = max(1, _BLOCK_ELEMENTS // (rows * n))
        for lo in range(0, b, step):
            xs, a = x[lo : lo + step], alphas[lo : lo + step, :rows]
            with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
                theo = 1.0 - (xs[:, None, :] / xs[:, :rows, None]) ** (-a[:, :, None] + 1.0)
                diff = np.abs(theo - k / n_tail[:rows, None])
            diff[:, k < 0] = -np.inf
            ks[lo : lo + step, :rows] = np.max(diff, axis=2)
        ks[~valid] = np.inf
    return [
        _pick_xmin(x[j], alphas[j], n_tail, valid[j], ks[j], min_tail=min_tail, ww_compatible=ww_compatible)
        for j in range(b)
    ]


def _fit_ww_small_n(x: np.ndarray) -> PowerLawFit:
    """WeightWatcher 0.7.7 ``WWFit`` for n < 20 values, as it really behaves.

    ``fit_powerlaw_smallN`` computes the bias-corrected α = 1 + (n−1)/Σ ln(x/xmin) on tails of at
    least 8 values and picks xmin by D − 0.868/√n_tail, but ``WWFit.__init__`` then overwrites that
    choice with argmin D over all candidates (D = 1 where a candidate was skipped). The effective
    rule, reproduced here, is therefore: bias-corrected α, xmin minimising D among tails ≥ 8.
    """
    method = "ww-small-n"
    n = x.size
    logx = np.log(x)
    n_cand = n - 1
    alphas = np.zeros(n_cand)
    ds = np.ones(n_cand)
    any_kept = False
    for i in range(n_cand):  # n < 20: a loop is clearer than a block scan here
        nt = n - i
        if nt < _WW_SMALL_N_MIN_TAIL:
            continue
        s = float(np.sum(logx[i:]) - nt * logx[i])
        if s <= 1e-12:
            continue
        alphas[i] = 1.0 + (nt - 1.0) / s
        if alphas[i] <= 1.0:
            continue
        theo = 1.0 - (x[i:] / x[i]) ** (1.0 - alphas[i])
        ds[i] = float(np.max(np.abs(np.arange(nt, dtype=np.float64) / float(nt) - theo)))
        any_kept = True
    if not any_kept:
        # WeightWatcher's fallback: the whole sample as the tail (it reports α = 0 if that is constant).
        s = float(np.sum(logx) - n * logx[0])
        if s <= 1e-12:
            return _failed(method, "degenerate spectrum: all values equal")
        alphas[0] = 1.0 + (n - 1.0) / s
        theo = 1.0 - (x / x[0]) ** (1.0 - alphas[0])
        ds[0] = float(np.max(np.abs(np.arange(n, dtype=np.float64) / float(n) - theo)))
    i = int(np.argmin(ds))
    alpha = float(alphas[i])
    if not (math.isfinite(alpha) and alpha > 1.0):
        return _failed(method, f"degenerate tail: alpha = {alpha} at the best xmin", n_cand)
    nt = n - i
    return PowerLawFit(
        alpha=alpha,
        sigma=(alpha - 1.0) / math.sqrt(nt),
        xmin=float(x[i]),
        xmax=float(x[-1]),
        n_tail=nt,
        ks=float(ds[i]),
        n_candidates=max(0, n - _WW_SMALL_N_MIN_TAIL + 1),
        method=method,
    )


@lru_cache(maxsize=1)
def _gauss_legendre() -> tuple[np.ndarray, np.ndarray]:
    return np.polynomial.legendre.leggauss(_GL_NODES)


def _panel_edges(peak: float, scale: float, stop: Callable[[float], bool], lower: float) -> list[float]:
    """Edges going away from ``peak`` (to ``lower`` if it is below the peak, else to +∞): widths
    scale/2, scale, 2·scale, … capped at 1, until ``stop(edge)`` or ``lower`` is reached."""
    direction = -1.0 if lower < peak else 1.0
    edges = [peak]
    width = min(0.5 * scale, 1.0)
    while True:
        edge = edges[-1] + direction * width
        if direction < 0 and edge <= lower:
            edges.append(lower)
            return edges
        edges.append(edge)
        if stop(edge):
            return edges
        width = min(2.0 * width, 1.0)


def _tpl_panels(alpha: float, lam: float) -> tuple[list[float], float]:
    """Panel edges for ∫_0^∞ exp(h(u)) du, h(u) = (1−α)u − Λ(e^u − 1), and h at its peak.

    The panels start at the peak of the log-concave h with the width of the peak and double (up
    to 1) away from it, until h has dropped by 60 (or u reaches 0 on the left).
    """
    s = 1.0 - alpha
    c = lam
    if s > c:  # interior peak at e^u = s/c, curvature −s there
        u_peak = math.log(s / c)
        scale = 1.0 / math.sqrt(s)
    else:  # peak at u = 0: decay rate c − s, curvature c
        u_peak = 0.0
        scale = min(1.0 / (c - s) if c > s else math.inf, 1.0 / math.sqrt(c), 1.0)
    h_peak = s * u_peak - c * math.expm1(u_peak)

    def dropped(u: float) -> bool:
        return s * u - c * math.expm1(u) - h_peak < -_TPL_DROP

    edges = _panel_edges(u_peak, scale, dropped, math.inf)
    if u_peak > 0.0:
        edges = _panel_edges(u_peak, scale, dropped, 0.0)[::-1] + edges[1:]
    return edges, h_peak


def _tpl_nodes(alpha: np.ndarray, lam: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The quadratures of :func:`_tpl_quadrature` for every (α_k, Λ_k), their panels stacked.

    Returns ``(u, w, h_peak, starts)``: u and w have a row per panel, fit k owns rows
    ``starts[k]:starts[k+1]``. Every node and weight comes from elementwise operations only, so
    it is the same number whichever batch the fit is in.
    """
    edges: list[float] = []
    n_edges: list[int] = []
    peaks: list[float] = []
    for a, c in zip(alpha.tolist(), lam.tolist()):
        e, h_peak = _tpl_panels(a, c)
        edges.extend(e)
        n_edges.append(len(e))
        peaks.append(h_peak)
    e_all = np.asarray(edges)
    keep = np.ones(e_all.size - 1, dtype=bool)
    keep[np.cumsum(n_edges)[:-1] - 1] = False  # no panel from one fit's last edge to the next's first
    lo, hi = e_all[:-1][keep], e_all[1:][keep]
    nodes, weights = _gauss_legendre()
    half = 0.5 * (hi - lo)[:, None]
    u = 0.5 * (lo + hi)[:, None] + half * nodes[None, :]
    n_panels = np.asarray(n_edges) - 1
    h_peak = np.asarray(peaks)
    s = np.repeat(1.0 - alpha, n_panels)[:, None]
    c = np.repeat(lam, n_panels)[:, None]
    w = (half * weights[None, :]) * np.exp(s * u - c * np.expm1(u) - np.repeat(h_peak, n_panels)[:, None])
    starts = np.concatenate(([0], np.cumsum(n_panels)[:-1]))
    return u, w, h_peak, starts


def _tpl_quadrature(alpha: float, lam: float) -> tuple[np.ndarray, np.ndarray, float]:
    """Nodes u and weights w of ∫_0^∞ exp(h(u)) du, h(u) = (1−α)u − Λ(e^u − 1) (the TPL on y = e^u ≥ 1).

    Composite Gauss–Legendre on the panels of :func:`_tpl_panels`, a row per panel. The weights
    include exp(h − h_peak); returns ``(u, w, h_peak)``, so ∫ exp(h) = e^h_peak · Σw and
    E[f(u)] = Σ w f / Σ w. The numbers are those :func:`_tpl_nodes` gives the fit in any batch.
    """
    edges, h_peak = _tpl_panels(alpha, lam)
    s = 1.0 - alpha
    e = np.asarray(edges)
    nodes, weights = _gauss_legendre()
    half = 0.5 * (e[1:] - e[:-1])[:, None]
    u = 0.5 * (e[:-1] + e[1:])[:, None] + half * nodes[None, :]
    w = (half * weights[None, :]) * np.exp(s * u - lam * np.expm1(u) - h_peak)
    return u, w, h_peak


def tpl_log_normaliser(alpha: float, lam: float, xmin: float) -> float:
    """log Z, Z = ∫_xmin^∞ x^(−α)·exp(−Λx) dx = Λ^(α−1)·Γ(1−α, Λ·xmin).

    Computed in u = log(x/xmin), where the integrand is log-concave, by the quadrature of
    :func:`_tpl_quadrature`.

    Args:
        alpha: exponent (any real).
        lam: truncation rate Λ > 0.
        xmin: lower limit > 0.

    Returns:
        log Z (about 1e-13 relative error against mpmath over the fitting range).

    Raises:
        ValueError: ``lam`` or ``xmin`` not positive.
    """
    if not (lam > 0.0 and xmin > 0.0):
        raise ValueError(f"need lam > 0 and xmin > 0, not lam={lam!r}, xmin={xmin!r}")
    c = lam * xmin
    _, w, h_peak = _tpl_quadrature(alpha, c)
    return (1.0 - alpha) * math.log(xmin) - c + h_peak + math.log(float(np.sum(w)))


# (value, gradient (2), Hessian entries (0,0), (0,1), (1,1)) of one fit's objective, or of many.
_Eval = tuple[float, float, float, float, float, float]
_EvalMany = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]


def _log(values: np.ndarray) -> np.ndarray:
    # math.log per value, not np.log: the scalar path's numbers, whatever SIMD np.log uses.
    return np.array([math.log(v) if v > 0.0 else (-math.inf if v == 0.0 else math.nan) for v in values.tolist()])


def _tpl_objective_many(alpha: np.ndarray, lam: np.ndarray, mean_u: np.ndarray, mean_y: np.ndarray) -> _EvalMany:
    """Mean negative log-likelihood of the TPL on y ≥ 1 with its gradient and Hessian in (α, Λ),
    for every fit k at (alpha[k], lam[k]) on data with means mean_u[k] of log y and mean_y[k] of y.

    An exponential family in (−α, −Λ) with statistics (log y, y): the gradient is the data's mean
    statistics minus the model's, the Hessian the model's covariance of (log y, y). Sums are
    over each panel's nodes, then over the fit's panels in order (np.add.reduceat): fit k's
    numbers do not depend on the other fits of the batch, bit for bit.
    """
    u, w, h_peak, starts = _tpl_nodes(alpha, lam)
    n_panels = np.diff(np.append(starts, u.shape[0]))

    def total_of(a: np.ndarray) -> np.ndarray:
        return np.add.reduceat(a.sum(axis=1), starts)

    def per_node(a: np.ndarray) -> np.ndarray:
        return np.repeat(a, n_panels)[:, None]

    total = total_of(w)
    p = w / per_node(total)
    y = np.exp(u)
    eu = total_of(p * u)
    ey = total_of(p * y)
    du = u - per_node(eu)
    dy = y - per_node(ey)
    h_uu = total_of(p * (du * du))
    h_uy = total_of(p * (du * dy))
    h_yy = total_of(p * (dy * dy))
    value = alpha * mean_u + lam * mean_y - lam + h_peak + _log(total)
    return value, mean_u - eu, mean_y - ey, h_uu, h_uy, h_yy


def _tpl_objective(alpha: float, lam: float, mean_u: float, mean_y: float) -> _Eval:
    """:func:`_tpl_objective_many` for one fit, on Python floats: the same operations in the same
    order, so the same numbers, at half the cost."""
    u, w, h_peak = _tpl_quadrature(alpha, lam)

    def total_of(a: np.ndarray) -> float:
        return float(np.add.reduceat(a.sum(axis=1), _ONE_SEGMENT)[0])

    total = total_of(w)
    p = w / total
    y = np.exp(u)
    eu = total_of(p * u)
    ey = total_of(p * y)
    du = u - eu
    dy = y - ey
    h_uu = total_of(p * (du * du))
    h_uy = total_of(p * (du * dy))
    h_yy = total_of(p * (dy * dy))
    value = alpha * mean_u + lam * mean_y - lam + h_peak + float(_log(np.array([total]))[0])
    return value, mean_u - eu, mean_y - ey, h_uu, h_uy, h_yy


# The Newton iteration below exists twice, for one fit on Python floats (fast for one) and for
# many fits on arrays in lockstep. Both use only +, −, ×, ÷, comparisons and math.log/math.exp
# on single values, in the same order, so the two give the same numbers bit for bit
# (tests/test_powerlaw_batch.py); a change to one must be made to the other.

def _damping_sequence() -> tuple[float, ...]:
    out: list[float] = []
    damping = 0.0
    while True:
        damping = 1e-3 if damping == 0.0 else 10.0 * damping
        if not damping < 1e12:
            return tuple(out)
        out.append(damping)


_DAMPINGS = _damping_sequence()


def _ldl(h00: float, h01: float, h11: float) -> tuple[float, float]:
    """β = h01/h00 and the Schur complement h11 − β·h01 of [[h00, h01], [h01, h11]] = L·D·Lᵀ."""
    beta = h01 / h00 if h00 != 0.0 else math.nan
    return beta, h11 - beta * h01


def _newton_step(g0: float, g1: float, h00: float, h01: float, h11: float) -> tuple[float, float]:
    """−H⁻¹g by LDLᵀ, with H's diagonal raised (Levenberg–Marquardt) until H is positive definite.

    LDLᵀ without pivoting is backward stable for a positive definite H; the Hessian here is a
    covariance, nearly singular when the tail is narrow (log y and y nearly proportional).
    """
    s00, s11 = h00, h11
    beta, schur = _ldl(s00, h01, s11)
    if not (math.isfinite(s00) and math.isfinite(h01) and math.isfinite(s11) and s00 > 0.0 and schur > 0.0):
        for damping in _DAMPINGS:
            s00 = h00 + damping * (abs(h00) + 1e-300)
            s11 = h11 + damping * (abs(h11) + 1e-300)
            beta, schur = _ldl(s00, h01, s11)
            if math.isfinite(s00) and math.isfinite(h01) and math.isfinite(s11) and s00 > 0.0 and schur > 0.0:
                break
        else:
            s00, beta, schur = 1.0, 0.0, 1.0
    step1 = (beta * g0 - g1) / schur
    return -g0 / s00 - beta * step1, step1


def _newton_step_many(g0: np.ndarray, g1: np.ndarray, h00: np.ndarray, h01: np.ndarray, h11: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """:func:`_newton_step` of every fit at once."""

    def ldl(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        beta = np.where(a != 0.0, b / np.where(a != 0.0, a, 1.0), math.nan)
        return beta, c - beta * b

    def pd(a: np.ndarray, b: np.ndarray, c: np.ndarray, schur: np.ndarray) -> np.ndarray:
        return np.isfinite(a) & np.isfinite(b) & np.isfinite(c) & (a > 0.0) & (schur > 0.0)

    s00, s11 = h00.copy(), h11.copy()
    beta, schur = ldl(s00, h01, s11)
    bad = np.flatnonzero(~pd(s00, h01, s11, schur))
    for damping in _DAMPINGS:
        if not bad.size:
            break
        s00[bad] = h00[bad] + damping * (np.abs(h00[bad]) + 1e-300)
        s11[bad] = h11[bad] + damping * (np.abs(h11[bad]) + 1e-300)
        beta[bad], schur[bad] = ldl(s00[bad], h01[bad], s11[bad])
        bad = bad[~pd(s00[bad], h01[bad], s11[bad], schur[bad])]
    s00[bad], beta[bad], schur[bad] = 1.0, 0.0, 1.0
    step1 = (beta * g0 - g1) / schur
    return -g0 / s00 - beta * step1, step1


def _tpl_evaluate(x0: float, x1: float, log_lam: bool, mean_u: float, mean_y: float) -> _Eval:
    """The objective at α = x0 and Λ = x1, or Λ = e^x1 (derivatives then in log Λ) if ``log_lam``."""
    if not log_lam:
        return _tpl_objective(x0, x1, mean_u, mean_y)
    lam = math.exp(x1)
    value, g0, g1, h00, h01, h11 = _tpl_objective(x0, lam, mean_u, mean_y)
    return value, g0, lam * g1, h00, lam * h01, lam * lam * h11 + lam * g1


def _tpl_evaluate_many(x0: np.ndarray, x1: np.ndarray, log_lam: np.ndarray, mean_u: np.ndarray, mean_y: np.ndarray) -> _EvalMany:
    """:func:`_tpl_evaluate` of every fit at once."""
    lam = x1.copy()
    lam[log_lam] = [math.exp(v) for v in x1[log_lam].tolist()]
    value, g0, g1, h00, h01, h11 = _tpl_objective_many(x0, lam, mean_u, mean_y)
    ll = lam[log_lam]
    h01[log_lam] = ll * h01[log_lam]
    h11[log_lam] = ll * ll * h11[log_lam] + ll * g1[log_lam]
    g1[log_lam] = ll * g1[log_lam]
    return value, g0, g1, h00, h01, h11


def _max_step(x1: float, step1: float, log_lam: bool) -> float:
    if log_lam:  # log Λ moves by at most 5 per step
        size = abs(step1)
        bound = 5.0 / (1e-300 if 1e-300 > size else size)
    elif step1 >= 0.0:
        return 1.0
    else:  # at most 90 % of the way to Λ = 0
        bound = 0.9 * x1 / -step1
    return bound if bound < 1.0 else 1.0


def _max_step_many(x1: np.ndarray, step1: np.ndarray, log_lam: np.ndarray) -> np.ndarray:
    size = np.abs(step1)
    bound = np.where(log_lam, 5.0 / np.where(1e-300 > size, 1e-300, size), 0.9 * x1 / -step1)
    bound = np.where(bound < 1.0, bound, 1.0)
    return np.where(~log_lam & (step1 >= 0.0), 1.0, bound)


def _at_least_one(values: np.ndarray) -> np.ndarray:
    size = np.abs(values)
    return np.where(size > 1.0, size, 1.0)


def _damped_newton(x0: float, x1: float, log_lam: bool, mean_u: float, mean_y: float) -> tuple[float, float, float, bool]:
    """Minimise the objective (:func:`_tpl_evaluate`) by Newton steps with backtracking.

    Where the Hessian is not positive definite its diagonal is raised (Levenberg–Marquardt);
    :func:`_max_step` bounds the step length (to stay in the domain). Returns (x0, x1, value, converged).
    """
    value, g0, g1, h00, h01, h11 = _tpl_evaluate(x0, x1, log_lam, mean_u, mean_y)
    for _ in range(_TPL_MAX_NEWTON):
        s0, s1 = _newton_step(g0, g1, h00, h01, h11)
        decrement = -(g0 * s0 + g1 * s1)
        scale = abs(value) if abs(value) > 1.0 else 1.0
        # The decrement is about twice the distance to the minimum: below rounding of it, stop.
        if decrement < 1e-14 * scale:
            return x0, x1, value, True
        t = _max_step(x1, s1, log_lam)
        while t > 1e-12:
            new_x0, new_x1 = x0 + t * s0, x1 + t * s1
            new = _tpl_evaluate(new_x0, new_x1, log_lam, mean_u, mean_y)
            if new[0] <= value - 1e-4 * t * decrement:
                break
            t *= 0.5
        else:  # no decrease left to find: converged if the decrement was already small
            return x0, x1, value, decrement < 1e-10 * scale
        x0, x1 = new_x0, new_x1
        value, g0, g1, h00, h01, h11 = new
    return x0, x1, value, False


def _tpl_newton(mean_u: float, mean_y: float, alpha: float, lam: float) -> tuple[float, float, float, bool]:
    """Minimise the mean NLL over α and Λ > 0; returns (α, Λ, NLL, converged).

    The NLL is convex in (α, Λ), so Newton there converges from anywhere, except that an optimum
    at very small Λ sits where the curvature in Λ blows up (Var y ~ Λ^(α−3)) and the steps stall
    against Λ = 0; from where they stall, Newton in (α, log Λ), where the NLL is smooth, finishes.
    """
    alpha, lam, value, converged = _damped_newton(alpha, lam, False, mean_u, mean_y)
    if not converged and lam > 0.0:
        alpha, log_lam, value, converged = _damped_newton(alpha, math.log(lam), True, mean_u, mean_y)
        lam = math.exp(log_lam)
    return alpha, lam, value, converged


def _tpl_newton_many(
    mean_u: np.ndarray, mean_y: np.ndarray, alpha: np.ndarray, lam: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """:func:`_tpl_newton` of every fit, the iterations of all in lockstep.

    Each round evaluates the objective once for every fit that needs it (the start of a phase, or
    a line-search trial), then each fit takes the branch its own numbers choose; the per-fit
    operations are those of :func:`_damped_newton`, in the same order.
    """
    n = mean_u.size
    x0, x1 = alpha.copy(), lam.copy()
    log_lam = np.zeros(n, dtype=bool)
    value, g0, g1, h00, h01, h11 = (np.zeros(n) for _ in range(6))
    s0, s1, t, decrement, scale = (np.zeros(n) for _ in range(5))
    n_iter = np.zeros(n, dtype=np.int64)
    converged = np.zeros(n, dtype=bool)
    starting = np.arange(n)  # phase starts: evaluate at x
    trying = np.zeros(0, dtype=np.int64)  # line search: evaluate at x + t·step
    with np.errstate(all="ignore"):
        while starting.size or trying.size:
            idx = np.concatenate((starting, trying))
            p0 = np.concatenate((x0[starting], x0[trying] + t[trying] * s0[trying]))
            p1 = np.concatenate((x1[starting], x1[trying] + t[trying] * s1[trying]))
            ev = _tpl_evaluate_many(p0, p1, log_lam[idx], mean_u[idx], mean_y[idx])
            k = starting.size
            accept = ev[0][k:] <= value[trying] - 1e-4 * t[trying] * decrement[trying]
            taken = np.concatenate((np.ones(k, dtype=bool), accept))
            moved = idx[taken]
            x0[moved], x1[moved] = p0[taken], p1[taken]
            for state, new in zip((value, g0, g1, h00, h01, h11), ev):
                state[moved] = new[taken]
            rejected = trying[~accept]
            t[rejected] *= 0.5
            exhausted = rejected[~(t[rejected] > 1e-12)]
            ended = [exhausted]
            ended_ok = [decrement[exhausted] < 1e-10 * scale[exhausted]]
            trying = rejected[t[rejected] > 1e-12]

            out = moved[n_iter[moved] >= _TPL_MAX_NEWTON]
            ended.append(out)
            ended_ok.append(np.zeros(out.size, dtype=bool))
            stepping = moved[n_iter[moved] < _TPL_MAX_NEWTON]
            n_iter[stepping] += 1
            a, b = _newton_step_many(g0[stepping], g1[stepping], h00[stepping], h01[stepping], h11[stepping])
            s0[stepping], s1[stepping] = a, b
            decrement[stepping] = -(g0[stepping] * a + g1[stepping] * b)
            scale[stepping] = _at_least_one(value[stepping])
            small = decrement[stepping] < 1e-14 * scale[stepping]
            ended.append(stepping[small])
            ended_ok.append(np.ones(int(small.sum()), dtype=bool))
            going = stepping[~small]
            t[going] = _max_step_many(x1[going], s1[going], log_lam[going])
            stuck = going[~(t[going] > 1e-12)]
            ended.append(stuck)
            ended_ok.append(decrement[stuck] < 1e-10 * scale[stuck])
            trying = np.concatenate((trying, going[t[going] > 1e-12]))

            done, ok = np.concatenate(ended), np.concatenate(ended_ok)
            converged[done] = ok
            finished = done[log_lam[done]]
            x1[finished] = [math.exp(v) for v in x1[finished].tolist()]
            starting = done[~log_lam[done] & ~ok & (x1[done] > 0.0)]
            x1[starting] = [math.log(v) for v in x1[starting].tolist()]
            log_lam[starting] = True
            n_iter[starting] = 0
    return x0, x1, value, converged


class _TplData(NamedTuple):
    xmin: float
    n_tail: int
    mean_log: float
    mean_y: float
    alpha_pl: float


def _tpl_prepare(values: np.ndarray, xmin: Optional[float]) -> "TruncatedPowerLawFit | _TplData":
    """The data's statistics for the Newton iteration, or the finished fit when none is needed."""
    x = np.asarray(values, dtype=np.float64).ravel()
    x = x[np.isfinite(x) & (x > 0.0)]
    if x.size == 0:
        return TruncatedPowerLawFit(math.nan, math.nan, math.nan, 0, math.nan, "no positive values")
    lo = float(np.min(x)) if xmin is None else float(xmin)
    tail = x[x >= lo]
    n = tail.size
    if n < 3:
        reason = f"only {n} value(s) >= xmin, need 3"
        return TruncatedPowerLawFit(math.nan, math.nan, lo, n, math.nan, reason)
    # Work in y = x/xmin ≥ 1 so Λ' = Λ·xmin is O(1) whatever the scale of the spectrum.
    y = tail / lo
    mean_log = float(np.mean(np.log(y)))
    mean_y = float(np.mean(y))
    if mean_log <= 1e-14 * max(1.0, mean_y):
        reason = "degenerate tail: all values equal xmin"
        return TruncatedPowerLawFit(math.nan, math.nan, lo, n, math.nan, reason)
    alpha_pl = 1.0 + 1.0 / mean_log
    # The untruncated power law is the boundary Λ = 0 of a convex problem: it is the MLE when the
    # likelihood cannot rise by truncating, i.e. when the data's mean is at least the power law's.
    if alpha_pl > 2.0 and mean_y >= (alpha_pl - 1.0) / (alpha_pl - 2.0):
        nll = alpha_pl * mean_log - math.log(alpha_pl - 1.0)
        return TruncatedPowerLawFit(alpha_pl, 0.0, lo, n, float(-n * (nll + math.log(lo))))
    return _TplData(lo, n, mean_log, mean_y, alpha_pl)


def _tpl_result(data: _TplData, a_hat: float, lam_scaled: float, nll: float, converged: bool) -> TruncatedPowerLawFit:
    lo, n = data.xmin, data.n_tail
    if not (converged and math.isfinite(a_hat) and math.isfinite(nll) and lam_scaled > 0.0):
        return TruncatedPowerLawFit(math.nan, math.nan, lo, n, math.nan, "likelihood maximisation did not converge")
    loglik = float(-n * (nll + math.log(lo)))  # density in x carries a 1/xmin Jacobian
    return TruncatedPowerLawFit(a_hat, lam_scaled / lo, lo, n, loglik)


def fit_truncated_power_law(
    values: np.ndarray, *, xmin: Optional[float] = None
) -> TruncatedPowerLawFit:
    """Maximum-likelihood (α, Λ) of p(x) ∝ x^(−α)·exp(−Λx) on x ≥ xmin.

    Args:
        values: positive samples; those below ``xmin`` are ignored.
        xmin: lower end of the fit; default the smallest value.

    Returns:
        A :class:`TruncatedPowerLawFit`; NaN + reason when the tail is too small or degenerate.
    """
    data = _tpl_prepare(values, xmin)
    if isinstance(data, TruncatedPowerLawFit):
        return data
    return _tpl_result(data, *_tpl_newton(data.mean_log, data.mean_y, data.alpha_pl, 0.1 / data.mean_y))


def fit_truncated_power_law_many(
    samples: Sequence[np.ndarray], xmins: Sequence[Optional[float]]
) -> list[TruncatedPowerLawFit]:
    """:func:`fit_truncated_power_law` of each ``samples[k]`` with ``xmin=xmins[k]``, bit for bit.

    The Newton iterations of all fits run in lockstep on arrays (about 5× less time per fit than
    a loop from 8 fits up); every fit's numbers are computed by the same operations in the same
    order as alone, so result k equals the single fit exactly, whatever else is in the batch.
    Samples may have different lengths. Batches below 3 run the single fit in a loop.

    Raises:
        InvalidOptionError: ``samples`` and ``xmins`` differ in length (a ``ValueError``).
    """
    if len(samples) != len(xmins):
        raise InvalidOptionError(f"{len(samples)} samples but {len(xmins)} xmins")
    if len(samples) < _TPL_BATCH_MIN:
        return [fit_truncated_power_law(v, xmin=m) for v, m in zip(samples, xmins)]
    prepared: list[TruncatedPowerLawFit | _TplData] = [_tpl_prepare(v, m) for v, m in zip(samples, xmins)]
    todo = [(k, d) for k, d in enumerate(prepared) if isinstance(d, _TplData)]
    if todo:
        data = [d for _, d in todo]
        alpha, lam, nll, converged = _tpl_newton_many(
            np.array([d.mean_log for d in data]),
            np.array([d.mean_y for d in data]),
            np.array([d.alpha_pl for d in data]),
            np.array([0.1 / d.mean_y for d in data]),
        )
        for j, (k, d) in enumerate(todo):
            prepared[k] = _tpl_result(d, float(alpha[j]), float(lam[j]), float(nll[j]), bool(converged[j]))
    return [cast(TruncatedPowerLawFit, d) for d in prepared]


def fit_power_law_many(
    samples: Sequence[np.ndarray], *, min_tail: int = 10, ww_compatible: bool = False
) -> list[PowerLawFit]:
    """:func:`fit_power_law` of each sample with the same options, bit for bit.

    Samples of one length up to ``_PL_BATCH_MAX_N`` values (at least ``_PL_BATCH_MIN`` of them)
    are scanned together, every candidate of every sample in one array; the scan of a longer
    sample is already vectorised and pruned, and batching it does not pay (measured: 0.8× at 64
    values), so it and everything else (failures, WeightWatcher's small-N mode) runs alone.

    Raises:
        InvalidOptionError: ``min_tail`` < 2 (a ``ValueError``).
    """
    prepared = [_pl_input(v, min_tail=min_tail, ww_compatible=ww_compatible) for v in samples]
    fits: list[Optional[PowerLawFit]] = [p if isinstance(p, PowerLawFit) else None for p in prepared]
    by_length: dict[int, list[int]] = {}
    for k, p in enumerate(prepared):
        if not isinstance(p, PowerLawFit):
            by_length.setdefault(p.size if p.size <= _PL_BATCH_MAX_N else -1 - k, []).append(k)
    tail_min = 1 if ww_compatible else min_tail
    for members in by_length.values():
        if len(members) < _PL_BATCH_MIN:
            for k in members:
                fits[k] = _fit_scan(cast(np.ndarray, prepared[k]), min_tail=tail_min, ww_compatible=ww_compatible)
            continue
        stacked = np.stack([cast(np.ndarray, prepared[k]) for k in members])
        for k, fit in zip(members, _fit_scan_many(stacked, min_tail=tail_min, ww_compatible=ww_compatible)):
            fits[k] = fit
    return cast(list[PowerLawFit], fits)
