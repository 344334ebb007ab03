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
from typing import Callable, Optional

import numpy as np

from wbfe.errors import InvalidOptionError

__all__ = [
    "PowerLawFit",
    "TruncatedPowerLawFit",
    "fit_power_law",
    "fit_truncated_power_law",
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
        return _fit_scan(x, min_tail=1, ww_compatible=True)
    if x.size < min_tail:
        return _failed(method, f"only {x.size} positive value(s), need a tail of at least {min_tail}")
    return _fit_scan(x, min_tail=min_tail, ww_compatible=False)


def _tail_alphas(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """α and n_tail for every candidate xmin = x[i], i < n − 1 (x sorted ascending)."""
    n = x.size
    logx = np.log(x)
    # Suffix sums of log x, shifted by log x[0] to keep the cancellation in S_i − n_i·log x_i small.
    shifted = logx - logx[0]
    suffix = np.cumsum(shifted[::-1])[::-1]
    n_tail = (n - np.arange(n - 1)).astype(np.float64)
    denom = suffix[:-1] - n_tail * shifted[:-1]
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
    method = "ww" if ww_compatible else "csn"
    alphas, n_tail = _tail_alphas(x)
    valid_alpha = np.isfinite(alphas) & (alphas > 1.0)
    if ww_compatible:
        # WWFit: D stays 1 where α <= 1, so such candidates still compete (and win if nothing else).
        ks = np.where(alphas > 1.0, _ks_all(x, alphas, alphas > 1.0), 1.0)
        n_eligible = int(ks.size)
    else:
        eligible = valid_alpha & (n_tail >= min_tail)
        n_eligible = int(np.count_nonzero(eligible))
        if n_eligible == 0:
            reason = (
                "degenerate spectrum: no tail of at least "
                f"{min_tail} values gives a finite alpha > 1"
            )
            return _failed(method, reason)
        ks = _ks_all(x, alphas, eligible)
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


try:
    # The LAPACK gufuncs np.linalg.solve and det call, without their argument checks: ~10 µs of a
    # ~25 µs Newton step on 2 × 2 matrices; same LAPACK routines, so the same numbers.
    from numpy.linalg import _umath_linalg

    def _solve(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return _umath_linalg.solve1(a, b, signature="dd->d")

    def _det(a: np.ndarray) -> float:
        return float(_umath_linalg.det(a, signature="d->d"))

except (ImportError, AttributeError):  # pragma: no cover - numpy without the private module
    _solve, _det = np.linalg.solve, np.linalg.det


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


def _tpl_quadrature(alpha: float, lam: float) -> tuple[np.ndarray, np.ndarray, float]:
    """Nodes u and weights w of ∫_0^∞ exp(h(u)) du, h(u) = (1−α)u − Λ(e^u − 1) (the TPL on y = e^u ≥ 1).

    Composite Gauss–Legendre on panels that start at the peak of the log-concave h with the width
    of the peak and double (up to 1) away from it, until h has dropped by 60. The weights include
    exp(h − h_peak); returns ``(u, w, h_peak)``, so ∫ exp(h) = e^h_peak · Σw and E[f(u)] = Σ w f / Σ w.
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
    e = np.asarray(edges)
    nodes, weights = _gauss_legendre()
    half = 0.5 * (e[1:] - e[:-1])[:, None]
    u = (0.5 * (e[:-1] + e[1:])[:, None] + half * nodes[None, :]).ravel()
    w = (half * weights[None, :]).ravel() * np.exp(s * u - c * np.expm1(u) - h_peak)
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


def _tpl_objective(alpha: float, lam: float, mean_u: float, mean_y: float) -> tuple[float, np.ndarray, np.ndarray]:
    """Mean negative log-likelihood of the TPL on y ≥ 1 with its gradient and Hessian in (α, Λ).

    An exponential family in (−α, −Λ) with statistics (log y, y): the gradient is the data's mean
    statistics minus the model's, the Hessian the model's covariance of (log y, y).
    """
    u, w, h_peak = _tpl_quadrature(alpha, lam)
    total = float(w.sum())
    p = w / total
    y = np.exp(u)
    eu = float(p @ u)
    ey = float(p @ y)
    du, dy = u - eu, y - ey
    cross = p @ (du * dy)
    hess = np.array([[p @ (du * du), cross], [cross, p @ (dy * dy)]])
    value = alpha * mean_u + lam * mean_y - lam + h_peak + math.log(total)
    return value, np.array([mean_u - eu, mean_y - ey]), hess


def _damped_newton(
    evaluate: Callable[[np.ndarray], tuple[float, np.ndarray, np.ndarray]],
    x: np.ndarray,
    max_step: Callable[[np.ndarray, np.ndarray], float],
) -> tuple[np.ndarray, float, bool]:
    """Minimise a smooth function of two variables by Newton steps with backtracking.

    Where the Hessian is not positive definite its diagonal is raised (Levenberg–Marquardt);
    ``max_step(x, step)`` bounds the step length (to stay in the domain). Returns (x, value, converged).
    """
    value, grad, hess = evaluate(x)
    for _ in range(_TPL_MAX_NEWTON):
        shifted, damping = hess, 0.0
        while not (np.isfinite(shifted).all() and shifted[0, 0] > 0.0 and _det(shifted) > 0.0):
            damping = 1e-3 if damping == 0.0 else 10.0 * damping
            shifted = hess + damping * np.diag(np.abs(np.diag(hess)) + 1e-300) if damping < 1e12 else np.eye(2)
        step = -_solve(shifted, grad)  # shifted is positive definite: never singular
        decrement = float(-grad @ step)
        # The decrement is about twice the distance to the minimum: below rounding of it, stop.
        if decrement < 1e-14 * max(1.0, abs(value)):
            return x, value, True
        t = max_step(x, step)
        while t > 1e-12:
            new_x = x + t * step
            new_value, new_grad, new_hess = evaluate(new_x)
            if new_value <= value - 1e-4 * t * decrement:
                break
            t *= 0.5
        else:  # no decrease left to find: converged if the decrement was already small
            return x, value, decrement < 1e-10 * max(1.0, abs(value))
        x, value, grad, hess = new_x, new_value, new_grad, new_hess
    return x, value, False


def _tpl_newton(mean_u: float, mean_y: float, alpha: float, lam: float) -> tuple[float, float, float, bool]:
    """Minimise the mean NLL over α and Λ > 0; returns (α, Λ, NLL, converged).

    The NLL is convex in (α, Λ), so Newton there converges from anywhere, except that an optimum
    at very small Λ sits where the curvature in Λ blows up (Var y ~ Λ^(α−3)) and the steps stall
    against Λ = 0; from where they stall, Newton in (α, log Λ), where the NLL is smooth, finishes.
    """

    def linear(x: np.ndarray) -> tuple[float, np.ndarray, np.ndarray]:
        return _tpl_objective(float(x[0]), float(x[1]), mean_u, mean_y)

    def logarithmic(x: np.ndarray) -> tuple[float, np.ndarray, np.ndarray]:
        lam_ = math.exp(float(x[1]))
        value, g, h = _tpl_objective(float(x[0]), lam_, mean_u, mean_y)
        grad = np.array([g[0], lam_ * g[1]])
        hess = np.array([[h[0, 0], lam_ * h[0, 1]], [lam_ * h[0, 1], lam_ * lam_ * h[1, 1] + lam_ * g[1]]])
        return value, grad, hess

    def to_boundary(x: np.ndarray, step: np.ndarray) -> float:  # at most 90 % of the way to Λ = 0
        return 1.0 if step[1] >= 0.0 else min(1.0, 0.9 * float(x[1]) / float(-step[1]))

    def capped(x: np.ndarray, step: np.ndarray) -> float:  # log Λ moves by at most 5 per step
        return min(1.0, 5.0 / max(abs(float(step[1])), 1e-300))

    x, value, converged = _damped_newton(linear, np.array([alpha, lam]), to_boundary)
    if not converged and x[1] > 0.0:
        x, value, converged = _damped_newton(logarithmic, np.array([x[0], math.log(x[1])]), capped)
        x = np.array([x[0], math.exp(x[1])])
    return float(x[0]), float(x[1]), value, converged


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
    a_hat, lam_scaled, nll, converged = _tpl_newton(mean_log, mean_y, alpha_pl, 0.1 / mean_y)
    if not (converged and math.isfinite(a_hat) and math.isfinite(nll) and lam_scaled > 0.0):
        return TruncatedPowerLawFit(math.nan, math.nan, lo, n, math.nan, "likelihood maximisation did not converge")
    loglik = float(-n * (nll + math.log(lo)))  # density in x carries a 1/xmin Jacobian
    return TruncatedPowerLawFit(a_hat, lam_scaled / lo, lo, n, loglik)
