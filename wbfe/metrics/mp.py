"""WeightWatcher 0.7.7's Marchenko–Pastur bulk fit, reproduced bit for bit (docs/math.md §4).

The spectrum is rescaled to mean 1, smoothed by a linear-kernel KDE, and matched in least squares
by the MP density over a grid of σ polished by Nelder–Mead, as ``scipy.optimize.brute`` does in
WeightWatcher. The residual has a fast form (a few dot products over the law's support) with a
bound on its rounding; every decision too close for that bound is taken on WeightWatcher's own
residual, so the fitted σ is WeightWatcher's exactly.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass
from typing import Callable, Optional

import numpy as np

__all__ = ["MPFit", "mp_fit"]

_KDE_BANDWIDTH = 0.1
_KDE_GRID = 1000
_KDE_FLOOR = 0.01
# |fast − exact| residual of the MP fit, relative to the magnitude of its terms (rounding of ~1000-term
# sums is ~1e-13 of it): decisions closer than this are taken on the exact residuals.
_FAST_REL_ERR = 1e-11
_NM_MAXFUN = 200  # fmin's default maxiter = maxfun = 200 · (one variable)


@dataclass(frozen=True)
class MPFit:
    """WeightWatcher's Marchenko–Pastur fit of a spectrum.

    Attributes:
        sigma_mp: fitted MP scale σ of the rescaled spectrum (mean eigenvalue 1).
        bulk_max: MP bulk edge σ²(1 + 1/√Q)², in the units of the input eigenvalues.
        bulk_min: lower bulk edge σ²(1 − 1/√Q)², same units.
        num_spikes: eigenvalues above the bulk edge plus its Tracy–Widom margin.
        mp_softrank: bulk_max / max e.
        reason: why the fit failed; ``None`` on success.
    """

    sigma_mp: float
    bulk_max: float
    bulk_min: float
    num_spikes: float
    mp_softrank: float
    reason: Optional[str] = None


def _linear_kde(samples: np.ndarray, grid: np.ndarray, h: float) -> np.ndarray:
    """Linear-kernel KDE, K(u) = max(0, 1 − |u|/h)/h (sklearn's ``linear``), by prefix sums."""
    xs = np.sort(samples)
    cs = np.concatenate(([0.0], np.cumsum(xs)))
    lo = np.searchsorted(xs, grid - h, side="right")
    mid = np.searchsorted(xs, grid, side="right")
    hi = np.searchsorted(xs, grid + h, side="left")
    n_left, n_right = mid - lo, hi - mid
    left = n_left - (n_left * grid - (cs[mid] - cs[lo])) / h
    right = n_right - ((cs[hi] - cs[mid]) - n_right * grid) / h
    return np.maximum(left + right, 0.0) / (xs.size * h)


class _MPResidual:
    """Sum of squared residuals between the KDE of ``to_fit`` and the MP (or quarter-circle) law.

    :meth:`exact` is WeightWatcher's residual operation for operation (an L-point array, numpy's
    pairwise sum), so the σ Nelder–Mead and ``brute`` pick are its own. :meth:`fast` is the same
    quantity from its expansion Σy² + Σ law² − 2 Σ law·y over the support of the law only (where
    it is not 0), a few dot products; it returns ``(value, scale)`` with ``scale`` a bound on the
    sum of the magnitudes of its terms, so ``|fast − exact| <= _FAST_REL_ERR · scale``. The fits
    use the fast value and fall back to the exact one wherever a decision (a comparison of two
    residuals) is closer than that: results are WeightWatcher's bit for bit, at a fraction of
    the cost.
    """

    def __init__(self, to_fit: np.ndarray, Q: float) -> None:  # noqa: N803
        xde = np.linspace(0.0, float(np.max(to_fit)) + 0.5, _KDE_GRID)
        yde = _linear_kde(to_fit, xde, _KDE_BANDWIDTH)
        good = yde > _KDE_FLOOR  # WeightWatcher fits only where the KDE is not nearly zero
        n_dropped = int(np.count_nonzero(yde < _KDE_FLOOR))
        self.xde, self.yde = xde[good], yde[good]
        self.Q = Q
        self.x_peak = float(self.xde[int(np.argmax(self.yde))])
        self.x_last = float(self.xde[-1])
        self.inv_sq = float(np.sqrt(1.0 / Q))
        # WeightWatcher appends a zero residual per dropped grid point; keeping the same array keeps
        # numpy's pairwise summation, hence Nelder–Mead's path, identical to its own.
        self.padded = np.zeros(self.xde.size + n_dropped)
        # Σ 1000² over the fitted points: partial sums are integers·1e6 < 2^53, so exact in any order.
        self.off_grid = float(self.xde.size) * 1e6
        self.y2 = float(np.dot(self.yde, self.yde))
        if Q == 1:
            with np.errstate(invalid="ignore"):
                r = np.sqrt(4 - self.xde**2)
            on = np.isfinite(r)
            self.rr, self.ry = float(np.dot(r[on], r[on])), float(np.dot(r[on], self.yde[on]))
        else:
            self.xs_list = self.xde.tolist()  # bisect on a list: cheaper than searchsorted for one σ
            with np.errstate(divide="ignore"):
                self.h = 1.0 / self.xde**2  # law² = (Q/2πσ²)²·(b − x)(x − a)/x²
                self.g = self.yde / self.xde  # law·y = (Q/2πσ²)·√((b − x)(x − a))·y/x

    def edges(self, sigma: float) -> tuple[float, float]:
        return (sigma * (1 + self.inv_sq)) ** 2, (sigma * (1 - self.inv_sq)) ** 2

    def off(self, b: float, a: float) -> bool:
        """WeightWatcher's rejection of a bulk edge outside the data (its residual is then 1000·L)."""
        return self.Q != 1 and (b < self.x_peak or b > self.x_last or a > self.x_peak)

    def exact(self, sigma: float) -> float:
        b, a = self.edges(sigma)
        if self.off(b, a):
            return self.off_grid
        xde = self.xde
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            if self.Q == 1:
                # WeightWatcher's quarter-circle law on singular values; σ enters only the prefactor.
                law = np.nan_to_num((1 / (np.pi * sigma * sigma)) * np.sqrt(4 - xde**2))
            else:
                prefactor = 1 / (2 * np.pi * sigma * sigma * xde * (1 / self.Q))
                law = np.nan_to_num(prefactor * np.sqrt((b - xde) * (xde - a)))
        padded = self.padded.copy()
        padded[: xde.size] = law - self.yde
        return float(np.sum(padded**2))

    def fast(self, sigma: float) -> tuple[float, float]:
        b, a = self.edges(sigma)
        if self.off(b, a):
            return self.off_grid, 0.0
        if self.Q == 1:
            c = 1 / (np.pi * sigma * sigma)
            t1, t2 = c * c * self.rr, 2.0 * c * self.ry
        else:
            if not a > 0.0:
                return self.exact(sigma), 0.0
            lo, hi = bisect.bisect_right(self.xs_list, a), bisect.bisect_left(self.xs_list, b)
            xs = self.xde[lo:hi]
            d = (b - xs) * (xs - a)  # > 0: a < xs < b
            c = self.Q / (2 * np.pi * sigma * sigma)
            t1, t2 = c * c * float(np.dot(d, self.h[lo:hi])), 2.0 * c * float(np.dot(np.sqrt(d), self.g[lo:hi]))
        value = self.y2 + t1 - t2
        if not math.isfinite(value):
            return self.exact(sigma), 0.0
        return value, self.y2 + t1 + t2

    def grid(self, sigmas: np.ndarray, prune: bool = True) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`fast` of every σ of a grid at once; with ``prune``, +inf for the σ whose lower
        bound (:meth:`_lower_bounds`) shows they are not the grid's minimum."""
        b = (sigmas * (1 + self.inv_sq)) ** 2
        a = (sigmas * (1 - self.inv_sq)) ** 2
        values = np.full(sigmas.size, self.off_grid)
        scales = np.zeros(sigmas.size)
        computed = np.ones(sigmas.size, dtype=bool)
        if self.Q == 1:
            c = 1 / (np.pi * sigmas * sigmas)
            t1, t2 = c * c * self.rr, 2.0 * c * self.ry
            values, scales = self.y2 + t1 - t2, self.y2 + t1 + t2
        else:
            rows = np.flatnonzero(~((b < self.x_peak) | (b > self.x_last) | (a > self.x_peak)))
            computed[:] = False
            if prune and rows.size > 4:
                bound, margin = self._lower_bounds(sigmas[rows], b[rows], a[rows])
                first = rows[np.argsort(bound)[:4]]
                values[first], scales[first] = self._support_sums(sigmas[first], b[first], a[first])
                best = float(np.min(values[first] + _FAST_REL_ERR * scales[first]))
                keep = bound - margin <= best
                values[rows[~keep]] = np.inf
                rows = rows[keep]
            if rows.size:
                values[rows], scales[rows] = self._support_sums(sigmas[rows], b[rows], a[rows])
                computed[rows] = True
        for i in np.flatnonzero(computed & ~np.isfinite(values)):
            values[i], scales[i] = self.exact(float(sigmas[i])), 0.0
        return values, scales

    def _support_sums(self, sigmas: np.ndarray, b: np.ndarray, a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Fast values and scales of σ whose edges pass :meth:`off` (Q ≠ 1)."""
        lo = int(np.searchsorted(self.xde, float(np.min(a)), side="right"))
        hi = int(np.searchsorted(self.xde, float(np.max(b)), side="left"))
        xs = self.xde[lo:hi]
        d = np.subtract(b[:, None], xs)
        d *= xs - a[:, None]
        np.maximum(d, 0.0, out=d)  # 0 off the support of each σ
        t1 = d @ self.h[lo:hi]
        t2 = np.sqrt(d, out=d) @ self.g[lo:hi]
        c = self.Q / (2 * np.pi * sigmas * sigmas)
        t1, t2 = c * c * t1, 2.0 * c * t2
        return self.y2 + t1 - t2, self.y2 + t1 + t2

    def _lower_bounds(self, sigmas: np.ndarray, b: np.ndarray, a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Lower bounds of the residuals of σ (Q ≠ 1) in O(1) each, and their rounding margins.

        By Cauchy–Schwarz Σ law·y ≤ √(Σ law² · Σ_support y²), so the residual is at least
        Σ_off-support y² + (√Σ law² − √Σ_support y²)²; Σ law² = c²·Σ(−1 + (a+b)/x − ab/x²) and
        Σ y² over the support come from prefix sums over the sorted KDE grid.
        """
        if not hasattr(self, "_prefix"):
            x = self.xde
            with np.errstate(divide="ignore"):
                inv = np.where(x > 0.0, 1.0 / x, 0.0)
            self._prefix = tuple(np.concatenate(([0.0], np.cumsum(v))) for v in (inv, inv * inv, self.yde**2))
        s1, s2, sy = self._prefix
        i0 = np.searchsorted(self.xde, a, side="right")
        i1 = np.searchsorted(self.xde, b, side="left")
        count = (i1 - i0).astype(np.float64)
        sum1, sum2 = (a + b) * (s1[i1] - s1[i0]), (a * b) * (s2[i1] - s2[i0])
        c = self.Q / (2 * np.pi * sigmas * sigmas)
        law2 = c * c * np.maximum(sum1 - count - sum2, 0.0)
        y2 = np.maximum(sy[i1] - sy[i0], 0.0)
        bound = self.y2 - y2 + (np.sqrt(law2) - np.sqrt(y2)) ** 2
        # Prefix sums are rounded relative to the whole prefix (s1[i1], s2[i1], sy[-1]).
        magnitude = self.y2 + sy[-1] + c * c * (count + (a + b) * s1[i1] + a * b * s2[i1]) + 2.0 * np.sqrt(law2 * y2)
        return bound, 1e-9 * magnitude + 1e-300


class _NearTie(Exception):
    """Two fast residuals too close to compare: the exact ones decide."""


class _OutOfCalls(Exception):
    """scipy's ``_MaxFuncCallError``."""


def _grid_argmin(residual: _MPResidual, sigmas: np.ndarray) -> int:
    """``argmin`` of the exact residuals on the grid (first minimum), from the fast ones: only the σ
    whose fast value cannot be told from the smallest are evaluated exactly."""
    values, scales = residual.grid(sigmas)
    tol = _FAST_REL_ERR * scales
    candidates = np.flatnonzero(values - tol <= float(np.min(values + tol)))
    if candidates.size == 1:
        return int(candidates[0])
    exact = [residual.exact(float(sigmas[i])) if scales[i] > 0.0 else float(values[i]) for i in candidates]
    return int(candidates[int(np.argmin(exact))])


def _nelder_mead_1d(func: Callable[[float], tuple[float, float]], x0: float, rel_err: float) -> float:
    """``scipy.optimize.fmin(f, x0)`` of a function of one variable, step for step on floats.

    scipy's ``_minimize_neldermead`` with fmin's defaults (initial step 5 %, xatol = fatol = 1e-4,
    200 iterations and evaluations, reflection 1, expansion 2, contraction ½, shrink ½; sorting
    keeps the older vertex first on ties), whose float arithmetic in one dimension is what this
    does. ``func`` returns ``(value, scale)``: when ``rel_err`` > 0 a comparison of values closer
    than ``rel_err``·scale raises :class:`_NearTie` (the values are approximations).
    """
    calls = 0
    xatol = fatol = 1e-4

    def evaluate(x: float) -> tuple[float, float]:
        nonlocal calls
        if calls >= _NM_MAXFUN:
            raise _OutOfCalls
        calls += 1
        return func(x)

    def less(p: tuple[float, float], q: tuple[float, float], or_equal: bool = False) -> bool:
        if abs(p[0] - q[0]) <= rel_err * max(p[1], q[1]) and (p[1] > 0.0 or q[1] > 0.0):
            raise _NearTie
        return p[0] <= q[0] if or_equal else p[0] < q[0]

    def ordered(x0: float, f0: tuple[float, float], x1: float, f1: tuple[float, float]) -> tuple:
        # np.argsort of two values: NaN last, the first on ties.
        if less(f1, f0) or (math.isnan(f0[0]) and not math.isnan(f1[0])):
            return x1, f1, x0, f0
        return x0, f0, x1, f1

    x1 = (1 + 0.05) * x0 if x0 != 0 else 0.00025
    x0, f0, x1, f1 = ordered(x0, evaluate(x0), x1, evaluate(x1))
    iterations = 1
    while calls < _NM_MAXFUN and iterations < _NM_MAXFUN:
        try:
            if abs(x1 - x0) <= xatol:
                gap = abs(f0[0] - f1[0])
                if abs(gap - fatol) <= 2.0 * rel_err * max(f0[1], f1[1]) and (f0[1] > 0.0 or f1[1] > 0.0):
                    raise _NearTie
                if gap <= fatol:
                    break
            xbar = x0
            xr = 2 * xbar - x1
            fxr = evaluate(xr)
            if less(fxr, f0):
                xe = 3 * xbar - 2 * x1
                fxe = evaluate(xe)
                x1, f1 = (xe, fxe) if less(fxe, fxr) else (xr, fxr)
            else:  # with one variable the second-worst vertex is the best one: contract
                shrink = False
                if less(fxr, f1):
                    xc = 1.5 * xbar - 0.5 * x1
                    fxc = evaluate(xc)
                    if less(fxc, fxr, or_equal=True):
                        x1, f1 = xc, fxc
                    else:
                        shrink = True
                else:
                    xcc = 0.5 * xbar + 0.5 * x1
                    fxcc = evaluate(xcc)
                    if less(fxcc, f1):
                        x1, f1 = xcc, fxcc
                    else:
                        shrink = True
                if shrink:
                    x1 = x0 + 0.5 * (x1 - x0)
                    f1 = evaluate(x1)
            iterations += 1
        except _OutOfCalls:
            pass
        x0, f0, x1, f1 = ordered(x0, f0, x1, f1)
    return x0


def _polish(residual: _MPResidual, start: float) -> float:
    try:
        return _nelder_mead_1d(residual.fast, start, _FAST_REL_ERR)
    except _NearTie:
        return _nelder_mead_1d(lambda sigma: (residual.exact(sigma), 0.0), start, 0.0)


def mp_fit(eigs: np.ndarray, N: int, M: int) -> MPFit:  # noqa: N803 - WeightWatcher names
    """Marchenko–Pastur bulk fit exactly as WeightWatcher 0.7.7's ``mp_fit`` (rescale on, bw 0.1).

    The spectrum is rescaled to mean 1; a linear-kernel KDE (bandwidth 0.1, 1000 points on
    [0, max + 0.5], points with density ≤ 0.01 ignored) is matched in least squares by the MP
    density of aspect ratio Q = N/M (the quarter-circle law of √e when Q = 1) over σ on the grid
    [0.05 s, 2 s) in steps of 0.01 s, s = √(max e / (1 + 1/√Q)²), polished by Nelder–Mead
    (``scipy.optimize.brute``). bulk_max = σ²(1 + 1/√Q)²; spikes are eigenvalues above
    bulk_max + √(bulk_max^(2/3)·M^(−2/3)/√Q).

    Args:
        eigs: eigenvalues (zeros included, as WeightWatcher does).
        N: larger side of one matrix (WeightWatcher's N; for some Conv2d layers WeightWatcher
            reports N < M, see :mod:`wbfe._ww_compat`, and passing its N, M reproduces that too).
        M: smaller side of one matrix (WeightWatcher's M).

    Returns:
        An :class:`MPFit`; NaN + reason for an empty or all-zero spectrum.
    """
    e = np.asarray(eigs, dtype=np.float64)
    nan = math.nan
    if e.size == 0 or not float(np.sum(e)) > 0.0:
        return MPFit(nan, nan, nan, nan, nan, "empty or all-zero spectrum")
    Q = N / M
    w_scale = np.sqrt(e.size) / np.sqrt(np.sum(e))
    to_plot = (w_scale * w_scale) * e
    lambda_max = float(np.max(to_plot))
    s = np.sqrt(lambda_max / np.square(1.0 + 1.0 / np.sqrt(Q)))
    to_fit = np.sqrt(to_plot) if Q == 1 else to_plot
    residual = _MPResidual(to_fit, Q)
    # scipy.optimize.brute(residual, (slice,)): the grid's argmin, then fmin from there.
    sigmas = np.mgrid[slice(0.05 * s, 2.0 * s, 0.01 * s)]
    sigma = _polish(residual, float(sigmas[_grid_argmin(residual, sigmas)]))
    bulk_max = (sigma * (1 + 1 / np.sqrt(Q))) ** 2
    bulk_min = (sigma * (1 - 1 / np.sqrt(Q))) ** 2
    tw = 1 / np.sqrt(Q) * np.power(bulk_max, 2 / 3) * np.power(M, -2 / 3)
    num_spikes = int(np.count_nonzero(to_plot > bulk_max + np.sqrt(tw)))
    return MPFit(
        sigma_mp=sigma,
        bulk_max=float(bulk_max / (w_scale * w_scale)),
        bulk_min=float(bulk_min / (w_scale * w_scale)),
        num_spikes=num_spikes,
        mp_softrank=float(bulk_max / lambda_max),
    )
