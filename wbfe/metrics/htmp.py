"""The high-temperature Marchenko–Pastur (HTMP) law, its fit, F∞ and h against h* (docs/math.md §3).

The formulas, the fit and the group's columns, diagnosis and NaN reasons are described in docs/math.md §3; every Tricomi
U comes from :mod:`wbfe.metrics.special`."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Optional, Sequence, Union

import numpy as np
from scipy.interpolate import PPoly, make_interp_spline
from scipy.optimize import brentq, minimize_scalar
from scipy.special import gammaln

from wbfe.errors import InvalidOptionError
from wbfe.linalg.spectra import Spectrum
from wbfe.metrics._group import GroupResult, MetricGroup, MetricOptions, check_gamma, out_of_range, rescaled
from wbfe.metrics.bfe import bfe_at_fixed_lambda
from wbfe.metrics.special import ArrayLike, log_abs_hyperu_neg, log_hyperu, log_hyperu_neg
from wbfe.options import positive_lambda

__all__ = ["pdf", "logpdf", "cdf", "sample", "mean", "variance", "log_moment", "f_inf", "h_star", "fit", "fit_many",
           "HTMPFit", "diagnose", "KAPPA_RANGE", "MIN_EIGS", "DIAGNOSIS_RTOL", "GROUP"]

KAPPA_RANGE = (0.01, 300.0)
MIN_EIGS = 10
DIAGNOSIS_RTOL = 0.05
# κ to 1 %: a quarter of its statistical error at n = 1,000 or less; each step costs a U grid.
_LOG_KAPPA_XTOL = 1e-2
# Below n = 1,000 the tolerance grows like the error, × sqrt(1000/n) (at most × _MAX_SEARCH_SCALE).
_SEARCH_N = 1000
_MAX_SEARCH_SCALE = 5.0
# Half-width of the log β window of every κ but the first (see fit's profile).
_BETA_WINDOW = 0.5
# First step of the κ search from its start: a few statistical errors of log κ at n = 1,000.
_LOG_KAPPA_STEP = 0.2
# log U on the fit's knots to 1e-10: looser targets let U's self-check pass wrong values (tests/test_special.py).
_FIT_RTOL = 1e-10
# Knot steps in log y over the bulk (at most; 0.6/sqrt(c + 1) where that is finer) and right of it.
_BULK_STEP = 0.2
_TAIL_STEP = 0.5


def _params(kappa: float, gamma: float, beta: float = 1.0, tau: float = 0.0) -> tuple[float, float, float]:
    """Validate and return (a, b, c) = (κ/2, 1 − δ, κ/(2γ))."""
    for name, value in (("kappa", kappa), ("beta", beta)):
        if not (math.isfinite(value) and value > 0.0):
            raise InvalidOptionError(f"{name} must be a positive number, not {value!r}")
    check_gamma(gamma)
    if not (math.isfinite(tau) and tau >= 0.0):
        raise InvalidOptionError(f"tau must be a number >= 0, not {tau!r}")
    a = 0.5 * kappa
    c = a / gamma
    return a, 1.0 - (c - a), c


def _log_norm(a: float, c: float) -> float:
    return float(gammaln(1.0 + a) + gammaln(c))


def _cdf_y(a: float, b: float, y: np.ndarray) -> np.ndarray:
    """The CDF of y = β(λ − τ) >= 0 (what :func:`cdf` and :func:`sample` read): arg U(a, b, −y − i0) / (πa) in [0, 1]."""
    return np.clip(np.asarray(log_hyperu_neg(a, b, y)).imag / (math.pi * a), 0.0, 1.0)


def logpdf(x: ArrayLike, kappa: float, gamma: float, beta: float, tau: float = 0.0) -> ArrayLike:
    """Log density of the HTMP law at eigenvalue(s) x, shaped like x; −inf for x <= τ."""
    a, b, c = _params(kappa, gamma, beta, tau)
    xa = np.asarray(x, dtype=np.float64)
    y = beta * (np.atleast_1d(xa).ravel() - tau)
    out = np.full(y.shape, -math.inf)
    pos = y > 0.0
    yp = y[pos]
    log_abs_u = np.asarray(log_hyperu_neg(a, b, yp)).real
    out[pos] = math.log(beta) + (c - a - 1.0) * np.log(yp) - yp - _log_norm(a, c) - 2.0 * log_abs_u
    return float(out[0]) if xa.ndim == 0 else out.reshape(xa.shape)


def pdf(x: ArrayLike, kappa: float, gamma: float, beta: float, tau: float = 0.0) -> ArrayLike:
    """Density of the HTMP law at eigenvalue(s) x (0 for x <= τ); see :func:`logpdf`."""
    return np.exp(logpdf(x, kappa, gamma, beta, tau))


def cdf(x: ArrayLike, kappa: float, gamma: float, beta: float, tau: float = 0.0) -> ArrayLike:
    """CDF of the HTMP law, F = arg U(a, b, −β(x − τ) − i0) / (πa), in [0, 1] and shaped like x."""
    a, b, _ = _params(kappa, gamma, beta, tau)
    xa = np.asarray(x, dtype=np.float64)
    out = _cdf_y(a, b, np.maximum(beta * (np.atleast_1d(xa).ravel() - tau), 0.0))
    return float(out[0]) if xa.ndim == 0 else out.reshape(xa.shape)


def mean(kappa: float, gamma: float, beta: float, tau: float = 0.0) -> float:
    """Mean τ + κ/(2γβ)."""
    _params(kappa, gamma, beta, tau)
    return tau + kappa / (2.0 * gamma * beta)


def variance(kappa: float, gamma: float, beta: float, tau: float = 0.0) -> float:
    """Variance (κ/(2γ))(κ/2 + 1)/β² (τ shifts, it does not spread)."""
    _params(kappa, gamma, beta, tau)
    return kappa / (2.0 * gamma) * (0.5 * kappa + 1.0) / beta**2


def log_moment(kappa: float, gamma: float, beta: float, tau: float = 0.0) -> float:
    """E[log λ] = −log β − (2/κ)·log U(κ/2, b, βτ); at τ = 0 a ratio of Gamma functions."""
    a, b, c = _params(kappa, gamma, beta, tau)
    log_u = float(gammaln(c - a) - gammaln(c)) if tau == 0.0 else float(log_hyperu(a, b, beta * tau))
    return -math.log(beta) - log_u / a


def f_inf(lam: float, kappa: float, gamma: float, beta: float, tau: float = 0.0) -> float:
    """Limiting BFE-W of an HTMP spectrum at prior precision λ: λ/2·E[λ] − ½·E[log λ] + ½·log(2π/λ)."""
    lam = positive_lambda(lam)
    return bfe_at_fixed_lambda(mean(kappa, gamma, beta, tau), log_moment(kappa, gamma, beta, tau), lam)


def h_star(lam: float, gamma: float, kappa: Optional[float] = None, c: Optional[float] = None) -> float:
    """Optimal h* = κ/β* at prior precision λ: 2γ/λ without a gap, 2γκ / [λ(κ + 2γ·c)] with gap constant c = βτ."""
    lam = positive_lambda(lam)
    check_gamma(gamma)
    if c is None or c == 0.0:
        return 2.0 * gamma / lam
    if not (math.isfinite(c) and c > 0.0):
        raise InvalidOptionError(f"gap constant c must be >= 0, not {c!r}")
    if kappa is None or not (math.isfinite(kappa) and kappa > 0.0):
        raise InvalidOptionError("h_star with a gap needs a positive kappa")
    return 2.0 * gamma * kappa / (lam * (kappa + 2.0 * gamma * c))


def _y_range(a: float, c: float) -> tuple[float, float]:
    """y-interval holding all but ~1e-12 of the mass of the law of y = β(λ − τ)."""
    delta = c - a
    # Near 0, F(y) ≈ y^δ Γ(c) / (Γ(1+a) Γ(δ) Γ(1+δ)); below y_lo it is under 1e-12.
    log_f0 = float(gammaln(c) - gammaln(1.0 + a) - gammaln(delta) - gammaln(1.0 + delta))
    log_lo = max(min((math.log(1e-12) - log_f0) / delta, math.log(c) - 2.0), -700.0)
    sd = math.sqrt(c * (a + 1.0))
    return math.exp(log_lo), c + 40.0 * sd + 60.0


def sample(n: int, kappa: float, gamma: float, beta: float, tau: float = 0.0, seed: int = 0) -> np.ndarray:
    """Draw n eigenvalues (unsorted, seeded by ``seed``) from the HTMP law by inverting its CDF on a fine grid."""
    a, b, c = _params(kappa, gamma, beta, tau)
    if n < 0:
        raise InvalidOptionError(f"n must be >= 0, not {n!r}")
    y_lo, y_hi = _y_range(a, c)
    grid = np.exp(np.linspace(math.log(y_lo), math.log(y_hi), 1500))
    grid = np.unique(np.concatenate([grid, np.linspace(y_lo, y_hi, 500)]))
    cum = np.maximum.accumulate(_cdf_y(a, b, grid))
    u = np.random.default_rng(seed).random(n)
    log_y = np.interp(u, cum, np.log(grid))
    # Below the grid the CDF is y^δ·const: invert that power law instead of clamping.
    low = u < cum[0]
    log_y[low] = math.log(grid[0]) + np.log(u[low] / cum[0]) / (c - a)
    return tau + np.exp(log_y) / beta


@dataclass(frozen=True)
class HTMPFit:
    """Maximum-likelihood HTMP fit of one spectrum (τ fixed, κ and β fitted).

    ``at_bound``: κ ended at an end of KAPPA_RANGE (κ = 300 means Marchenko–Pastur-like); ``message`` says why the fit
    did not converge, or is ``""``."""

    kappa: float
    beta: float
    tau: float
    gamma: float
    ks: float
    loglik: float
    n: int
    converged: bool
    at_bound: bool = False
    message: str = ""

    @property
    def h(self) -> float:
        """Scaled heavy-tailedness κ/β."""
        return self.kappa / self.beta


class _ProfileModel:
    """log ρ_κ(y) for one κ as a function of t = log y (cheap to re-scale by β), and its CDF. Only log|U| is
    interpolated (quintic spline on the knots, one U each: the cost of the fit); the rest of log ρ_y = (δ − 1)t − e^t −
    log Γ(1+a) − log Γ(c) − 2 log|U| is exact."""

    def __init__(self, kappa: float, gamma: float, log_y_lo: float, log_y_hi: float) -> None:
        a, b, c = _params(kappa, gamma)
        self.a = a
        # Fine knots over the bulk (y within c ± 8 sd), coarse ones over the smooth tails.
        sd = math.sqrt(c * (a + 1.0))
        # Below y = c/50 log|U| is smooth enough for the step-1 grid.
        fine_lo = max(log_y_lo, math.log(max(c - 8.0 * sd, 0.02 * c)))
        fine_hi = min(log_y_hi, math.log(c + 8.0 * sd))
        spacing = min(_BULK_STEP, 0.6 / math.sqrt(c + 1.0))
        # Left of the bulk f is smooth on the scale 1/min(δ, 1) in log y; right of it, on ~1/y.
        far = min(fine_lo, math.log(1e-3 / (1.0 + a + c)))
        # Four abutting grids (steps 2, 1, `spacing`, _TAIL_STEP): overlaps would add U evaluations.
        mid_end = max(far, min(fine_lo, log_y_hi))
        right_start = max(fine_hi, mid_end) if fine_hi > fine_lo else mid_end

        def grid(lo: float, hi: float, step: float, most: int = 10_000) -> np.ndarray:
            return np.linspace(lo, hi, int(min(math.ceil(max(hi - lo, 0.0) / step), most)) + 2)

        parts = [grid(log_y_lo, far, 2.0), grid(far, mid_end, 1.0), grid(right_start, log_y_hi, _TAIL_STEP)]
        if fine_hi > fine_lo:
            parts.append(grid(fine_lo, fine_hi, spacing, 400))
        t = np.unique(np.concatenate(parts))
        self.b, self.knots = b, t
        self._slope = c - a - 1.0
        self._log_norm = _log_norm(a, c)
        self._cumulative: Optional[tuple[np.ndarray, np.ndarray]] = None
        # The likelihood needs only |U|; the CDF (arg U) is built for the one κ that wins.
        log_abs_u = np.asarray(log_abs_hyperu_neg(a, b, np.exp(t), rtol=_FIT_RTOL))
        # A knot where U could not be certified is left out rather than poisoning the spline.
        ok = np.isfinite(log_abs_u)
        # As a piecewise polynomial: cheaper to evaluate than the B-spline.
        self._log_abs_u = PPoly.from_spline(make_interp_spline(t[ok], log_abs_u[ok], k=5))

    def log_density(self, t: np.ndarray) -> np.ndarray:
        """log ρ_y(e^t), the density of y = β(λ − τ), at t = log y."""
        return self._slope * t - np.exp(t) - self._log_norm - 2.0 * self._log_abs_u(t)

    def cdf(self, log_y: np.ndarray) -> np.ndarray:
        """The CDF at y = e^log_y: arg U/(πa) at the first knot, plus the density spline integrated
        from there (trapezoidal rule on 40 points per knot; no other U is needed)."""
        if self._cumulative is None:  # once per model: the models of a batch serve many spectra
            t = np.linspace(self.knots[0], self.knots[-1], 40 * self.knots.size)
            density_t = np.exp(self.log_density(t) + t)  # ρ in t = log y: ρ_y(e^t)·e^t
            first = complex(log_hyperu_neg(self.a, self.b, math.exp(self.knots[0]), rtol=_FIT_RTOL))
            steps = 0.5 * (density_t[1:] + density_t[:-1]) * np.diff(t)
            self._cumulative = t, first.imag / (math.pi * self.a) + np.concatenate(([0.0], np.cumsum(steps)))
        return np.interp(log_y, *self._cumulative)

    def loglik(self, log_beta: float, log_x: np.ndarray) -> float:
        # Point by point: the sums Σ log x, Σ x move β under a rescaling of e (tests/test_scale_range).
        return float(np.sum(log_beta + self.log_density(log_beta + log_x)))


def _maximise(f: Callable[[float], float], lo: float, hi: float, start: float, step: float,
              xtol: float, max_evals: int = 60, grid: Optional[float] = None,
              sd_fraction: Optional[float] = None) -> tuple[float, bool]:
    """The point of [lo, hi] where a smooth unimodal f is largest, to about ``xtol``: ``(x, converged)``. Successive
    parabolic interpolation from ``start ± step`` (a profile likelihood is nearly quadratic near its maximum: fewer
    evaluations than Brent's bounded method). With ``grid``, f is evaluated only at multiples of it, so the searches of
    a batch meet at the same points. With ``sd_fraction`` (f a log-likelihood), the tolerance is at least that fraction
    of the statistical error read off the parabola: a flat profile is not searched to a precision it lacks."""
    seen: dict[float, float] = {}

    def at(x: float) -> bool:
        """Evaluate f at x (clipped into [lo, hi]); False if it was evaluated there already."""
        x = min(max(x, lo), hi)
        # The ends stay as they are: a fit at an end of KAPPA_RANGE says so (at_bound).
        if grid is not None and lo < x < hi and lo <= round(x / grid) * grid <= hi:
            x = round(x / grid) * grid
        if x in seen:
            return False
        seen[x] = f(x)
        return True

    for x in (start, start - step, start + step):
        at(x)
    while len(seen) < max_evals:
        xs = sorted(seen)
        ys = [seen[x] for x in xs]
        i = int(np.argmax(ys))
        best = xs[i]
        if i in (0, len(xs) - 1):
            inward = xs[1] if i == 0 else xs[-2]
            if best in (lo, hi):  # at an end of the interval: done once its neighbour is close
                if abs(inward - best) <= xtol or not at(best + (xtol if i == 0 else -xtol)):
                    return best, True
            elif not at(best + 2.0 * (best - inward)):
                return best, True
            continue
        (x1, y1), (x3, y3) = (xs[i - 1], ys[i - 1]), (xs[i + 1], ys[i + 1])
        # Vertex of the parabola through the three points (zero curvature: bisect the wider side).
        d1, d3 = best - x1, x3 - best
        denominator = d1 * (ys[i] - y3) + d3 * (ys[i] - y1)
        tol = xtol
        if sd_fraction is not None and denominator > 0.0:
            curvature = 2.0 * denominator / (d1 * d3 * (d1 + d3))  # −f'' of the parabola
            tol = max(xtol, sd_fraction / math.sqrt(curvature))
        if x3 - x1 <= 2.0 * tol:
            return best, True
        if denominator > 0.0:
            vertex = best - 0.5 * (d1 * d1 * (ys[i] - y3) - d3 * d3 * (ys[i] - y1)) / denominator
        else:
            vertex = best + (0.5 * d3 if d3 > d1 else -0.5 * d1)
        if abs(vertex - best) < 0.5 * tol:
            return best, True
        long_side = d3 if d3 > d1 else -d1
        if abs(long_side) > 5.0 * min(d1, d3) and (vertex - best) * long_side > 0.0:
            # A lopsided bracket whose parabola creeps towards its long side: a golden-section step.
            vertex = best + math.copysign(max(abs(vertex - best), 0.38 * abs(long_side)), long_side)
        # Never closer than xtol/2 to a point already evaluated.
        vertex = min(max(vertex, x1 + 0.5 * xtol), x3 - 0.5 * xtol)
        if not at(vertex):
            return best, True
    xs = sorted(seen, key=seen.__getitem__)
    return xs[-1], False


@dataclass(frozen=True)
class _Prepared:
    """One spectrum ready to fit: sorted eigenvalues, the τ used, x = e − τ and its moments."""

    e: np.ndarray
    tau: float
    log_x: np.ndarray
    m1: float
    log_k0: float


def _prepare(eigs: np.ndarray, gamma: float, tau: Optional[float]) -> _Prepared:
    """Validate one spectrum for :func:`fit` (raises InvalidOptionError as documented there)."""
    e = np.sort(np.asarray(eigs, dtype=np.float64).ravel())
    if e.size < 2 or not np.all(np.isfinite(e)) or e[0] <= 0.0:
        raise InvalidOptionError("fit needs at least 2 finite, positive eigenvalues")
    # τ one spacing below the smallest eigenvalue, never below 0 (docs/math.md: just below min(e)); the spacing to
    # the next distinct value: a repeated minimum's 0 would put τ at min(e), outside its range.
    nxt = e[min(int(np.searchsorted(e, e[0], side="right")), e.size - 1)]
    tau_used = max(0.0, float(e[0] - (nxt - e[0]))) if tau is None else float(tau)
    if not (0.0 <= tau_used < e[0]):
        raise InvalidOptionError(f"tau must lie in [0, min(eigs)), not {tau_used!r}")
    x = e - tau_used
    m1 = float(np.mean(x))
    if not float(np.var(x)) > 0.0:
        raise InvalidOptionError("fit needs a spectrum that is not constant")
    log_x = np.log(x)
    return _Prepared(e=e, tau=tau_used, log_x=log_x, m1=m1,
                     log_k0=_log_kappa_start(float(np.mean(log_x)) - math.log(m1), gamma))


def _jensen_gap(log_k: float, gamma: float) -> float:
    """E[log x] − log E[x] of the HTMP law at τ = 0 (see :func:`log_moment`, :func:`mean`)."""
    a = 0.5 * math.exp(log_k)
    c = a / gamma
    return -math.log(c) - float(gammaln(c - a) - gammaln(c)) / a


def _log_kappa_start(gap: float, gamma: float) -> float:
    """log κ whose law has the data's E[log x] − log E[x] (β-free; clipped to KAPPA_RANGE). This gap, rather than
    var/mean², leaves the heavy tail less sway: a start closer to the maximum."""
    lo_k, hi_k = (math.log(k) for k in KAPPA_RANGE)
    if gap <= _jensen_gap(lo_k, gamma):
        return lo_k
    if gap >= _jensen_gap(hi_k, gamma):
        return hi_k
    return float(brentq(lambda lk: _jensen_gap(lk, gamma) - gap, lo_k, hi_k, xtol=1e-6))


# The profiled log β stays within ±_BETA_SPAN of moment matching.
_BETA_SPAN = 2.5


class _Models:
    """The profile models of one γ: alone, one per β window; in a batch (``shared``), one per κ for all spectra."""

    def __init__(self, gamma: float, spectra: Sequence[_Prepared], shared: bool) -> None:
        self.gamma = gamma
        self.shared = shared
        # log y = log β + log x, log β within ±_BETA_SPAN of log(c/m1), and half a unit beyond.
        margin = _BETA_SPAN + 0.5
        self.rel_lo = min(float(p.log_x[0]) - math.log(p.m1) for p in spectra) - margin
        self.rel_hi = max(float(p.log_x[-1]) - math.log(p.m1) for p in spectra) + margin
        self.cache: dict[float, _ProfileModel] = {}

    def get(self, log_k: float, p: _Prepared, lo_b: float, hi_b: float) -> _ProfileModel:
        """The model at κ = e^log_k for spectrum ``p``'s log β in [lo_b, hi_b]."""
        kappa = math.exp(log_k)
        if not self.shared:
            return _ProfileModel(kappa, self.gamma, lo_b + float(p.log_x[0]) - 0.5, hi_b + float(p.log_x[-1]) + 0.5)
        if log_k not in self.cache:
            log_c = log_k - math.log(2.0 * self.gamma)
            self.cache[log_k] = _ProfileModel(kappa, self.gamma, log_c + self.rel_lo, log_c + self.rel_hi)
        return self.cache[log_k]


def fit(eigs: np.ndarray, gamma: float, *, tau: Optional[float] = None) -> HTMPFit:
    """Maximum-likelihood fit of the HTMP law to positive eigenvalues (zeros removed by the caller), τ fixed.

    τ None is one spacing below min(eigs), floored at 0. κ is searched in log space to a quarter of its statistical
    error, on a lattice that the fits of a batch (:func:`fit_many`) share. Raises InvalidOptionError for γ outside (0,
    1), fewer than 2 eigenvalues, a non-positive or non-finite eigenvalue, τ >= min(eigs), or a constant spectrum."""
    check_gamma(gamma)
    prepared = _prepare(eigs, gamma, tau)
    return _fit_prepared(prepared, gamma, _Models(gamma, [prepared], shared=False))


def fit_many(
    spectra: Sequence[np.ndarray], gamma: float, *, tau: Optional[float] = None
) -> list[Union[HTMPFit, InvalidOptionError]]:
    """:func:`fit` of many spectra of one γ (an MoE layer's experts), sharing the U grids.

    One U grid per κ of the lattice, spanning every spectrum's β window, serves the whole batch; each result equals
    ``fit(spectra[i], gamma, tau=tau)`` to well under the κ tolerance, or is the InvalidOptionError that :func:`fit`
    raises for it. Raises InvalidOptionError for γ outside (0, 1)."""
    check_gamma(gamma)
    prepared: list[Union[_Prepared, InvalidOptionError]] = []
    for eigs in spectra:
        try:
            prepared.append(_prepare(eigs, gamma, tau))
        except InvalidOptionError as exc:
            prepared.append(exc)
    valid = [p for p in prepared if isinstance(p, _Prepared)]
    if not valid:
        return [p for p in prepared if isinstance(p, InvalidOptionError)]
    models = _Models(gamma, valid, shared=True)
    return [_fit_prepared(p, gamma, models) if isinstance(p, _Prepared) else p for p in prepared]


def _fit_prepared(p: _Prepared, gamma: float, models: _Models) -> HTMPFit:
    log_x, m1 = p.log_x, p.m1
    lo_k, hi_k = (math.log(k) for k in KAPPA_RANGE)
    cache: dict[float, tuple[float, float, _ProfileModel]] = {}

    def profile(log_k: float) -> tuple[float, float, _ProfileModel]:
        if log_k in cache:
            return cache[log_k]
        log_b0 = math.log(math.exp(log_k) / (2.0 * gamma) / m1)
        # log β sits at a near-constant offset from moment matching: search ±_BETA_WINDOW around the
        # nearest κ's offset first, the full ±_BETA_SPAN only if that ends on the window's edge.
        spans = [(log_b0 - _BETA_SPAN, log_b0 + _BETA_SPAN)]
        if cache:
            near = min(cache, key=lambda k: abs(k - log_k))
            guess = log_b0 + cache[near][0] - math.log(math.exp(near) / (2.0 * gamma) / m1)
            spans.insert(0, (max(guess - _BETA_WINDOW, spans[0][0]), min(guess + _BETA_WINDOW, spans[0][1])))
        for lo_b, hi_b in spans:
            model = models.get(log_k, p, lo_b, hi_b)
            res = minimize_scalar(
                lambda lb: -model.loglik(lb, log_x), bounds=(lo_b, hi_b), method="bounded", options={"xatol": 1e-7}
            )
            log_b = float(res.x)
            if lo_b + 1e-3 < log_b < hi_b - 1e-3:
                break
        cache[log_k] = (log_b, -float(res.fun), model)
        return cache[log_k]

    scale = min(_MAX_SEARCH_SCALE, math.sqrt(max(1.0, _SEARCH_N / p.e.size)))
    xtol, first_step = _LOG_KAPPA_XTOL * scale, max(_LOG_KAPPA_STEP, 2.0 * _LOG_KAPPA_XTOL * scale)

    def search(lo: float, hi: float, start: float, step: float) -> tuple[float, bool]:
        return _maximise(lambda lk: profile(lk)[1], lo, hi, start, step, xtol, grid=xtol, sd_fraction=0.25)

    # The start on a coarse lattice: the nearby starts of a batch's spectra coincide.
    coarse = 0.5 * first_step
    start = min(max(round(p.log_k0 / coarse) * coarse, lo_k), hi_k)
    lo = max(lo_k, start - 2.0)
    hi = min(hi_k, start + 2.0)
    log_k, success = search(lo, hi, start, first_step)
    # The moment start can be off by more than e²: widen towards the range ends while improving.
    while log_k - lo < 1e-3 and lo > lo_k or hi - log_k < 1e-3 and hi < hi_k:
        if log_k - lo < 1e-3:
            lo, hi = max(lo_k, lo - 3.0), lo + 0.1
        else:
            lo, hi = hi - 0.1, min(hi_k, hi + 3.0)
        log_k, success = search(lo, hi, log_k, 4.0 * first_step)
    log_b, loglik, model = profile(log_k)
    kappa = math.exp(log_k)
    at_bound = log_k - lo_k < 1e-3 or hi_k - log_k < 1e-3
    beta_edge = abs(log_b - math.log(kappa / (2.0 * gamma) / m1)) > _BETA_SPAN - 1e-3
    message = ("profiled beta reached the edge of its search interval" if beta_edge
               else f"kappa at the end of its range {KAPPA_RANGE}" if at_bound else "")
    fitted = np.clip(model.cdf(log_b + log_x), 0.0, 1.0)
    n = p.e.size
    ranks = np.arange(1, n + 1) / n
    ks = float(max(np.max(ranks - fitted), np.max(fitted - (ranks - 1.0 / n))))
    return HTMPFit(
        kappa=kappa, beta=math.exp(log_b), tau=p.tau, gamma=float(gamma), ks=ks, loglik=loglik, n=int(n),
        converged=success and not beta_edge, at_bound=bool(at_bound), message=message,
    )


def diagnose(h: float, h_opt: float, *, rtol: float = DIAGNOSIS_RTOL) -> str:
    """``"under-fit side"`` if h > h*(1+rtol), ``"over-fit side"`` if h < h*/(1+rtol), else ``"near optimum"``."""
    if h > h_opt * (1.0 + rtol):
        return "under-fit side"
    if h < h_opt / (1.0 + rtol):
        return "over-fit side"
    return "near optimum"


_NUMERIC = ("htmp_kappa", "htmp_beta", "htmp_tau", "htmp_ks", "h", "h_star", "f_inf")


def _fail_all(result: GroupResult, reason: str) -> GroupResult:
    result.fail_all(_NUMERIC, reason)
    result.values["diagnosis"] = f"no fit: {reason}"
    result.reasons["diagnosis"] = reason
    return result


@dataclass(frozen=True)
class _Ready:
    """A spectrum that passed the group's checks: what its fit needs and what the row needs."""

    positive: np.ndarray
    lam: float
    n_zero: int


def _check(spec: Spectrum, options: MetricOptions) -> Union[_Ready, GroupResult]:
    """The spectrum's nonzero eigenvalues and λ, or the all-NaN result saying why there is no fit."""
    eigs = np.asarray(spec.eigs, dtype=np.float64)
    if not spec.gamma < 1.0:
        return _fail_all(GroupResult(), "square matrix: HTMP needs gamma < 1 (delta = 0 is not normalisable)")
    positive = eigs[eigs > 0.0]
    if positive.size < MIN_EIGS:
        return _fail_all(GroupResult(), f"only {positive.size} nonzero eigenvalue(s), need {MIN_EIGS}")
    if options.lam == "opt":
        lam = 1.0 / float(np.mean(eigs))
    else:
        # λ in the units of the stored eigenvalues (see Spectrum.log_scale): λ·e is what counts.
        lam = rescaled(positive_lambda(options.lam), 1.0, spec.log_scale)
        if math.isnan(lam):
            return _fail_all(GroupResult(), out_of_range(spec.log_scale))
    return _Ready(positive=positive, lam=lam, n_zero=eigs.size - positive.size)


def _row(spec: Spectrum, ready: _Ready, fitted: Union[HTMPFit, InvalidOptionError]) -> GroupResult:
    result = GroupResult()
    if isinstance(fitted, InvalidOptionError):
        return _fail_all(result, f"degenerate spectrum: {fitted}")
    if not fitted.converged:
        return _fail_all(result, f"HTMP fit did not converge: {fitted.message}")
    gamma, lam = spec.gamma, ready.lam
    h_opt = h_star(lam, gamma, fitted.kappa, fitted.beta * fitted.tau)
    result.values.update(
        htmp_kappa=fitted.kappa,
        htmp_ks=fitted.ks,
        # F∞ is unchanged when the eigenvalues and 1/λ are scaled alike.
        f_inf=f_inf(lam, fitted.kappa, gamma, fitted.beta, fitted.tau),
        diagnosis=diagnose(fitted.h, h_opt),
    )
    # β is a rate (1/e); τ, h = κ/β and h* = 2γ/λ·(...) are in the units of e.
    for column, value, power in (("htmp_beta", fitted.beta, -1.0), ("htmp_tau", fitted.tau, 1.0),
                                 ("h", fitted.h, 1.0), ("h_star", h_opt, 1.0)):
        result.put_rescaled(column, value, power, spec.log_scale)
    notes = []
    if ready.n_zero:
        notes.append(f"{ready.n_zero} exact zero eigenvalue(s) (rank-deficient) dropped before the fit")
    if fitted.at_bound:
        notes.append(fitted.message)
    if notes:
        result.reasons["htmp_kappa"] = "; ".join(notes)
    return result


def _compute(spec: Spectrum, options: MetricOptions) -> GroupResult:
    ready = _check(spec, options)
    if isinstance(ready, GroupResult):
        return ready
    try:
        fitted: Union[HTMPFit, InvalidOptionError] = fit(ready.positive, spec.gamma)
    except InvalidOptionError as exc:
        fitted = exc
    return _row(spec, ready, fitted)


def _compute_many(specs: Sequence[Spectrum], options: MetricOptions) -> list[GroupResult]:
    """``[_compute(s, options) for s in specs]``, the spectra of one γ fitted as one batch (:func:`fit_many`)."""
    results: list[Optional[GroupResult]] = [None] * len(specs)
    by_gamma: dict[float, list[tuple[int, _Ready]]] = {}
    for i, spec in enumerate(specs):
        ready = _check(spec, options)
        if isinstance(ready, GroupResult):
            results[i] = ready
        else:
            by_gamma.setdefault(spec.gamma, []).append((i, ready))
    for gamma, members in by_gamma.items():
        for (i, ready), fitted in zip(members, fit_many([ready.positive for _, ready in members], gamma)):
            results[i] = _row(specs[i], ready, fitted)
    return [r for r in results if r is not None]


_COLUMNS = (*_NUMERIC, "diagnosis")

GROUP = MetricGroup(
    name="htmp",
    columns=_COLUMNS,
    tail_columns=_COLUMNS,  # every column comes from the fit
    summary_columns=("htmp_kappa", "h", "f_inf"),
    compute=_compute,
    compute_many=_compute_many,
    description="HTMP fit (kappa, beta, tau, KS), F-infinity and h against h*",
)
