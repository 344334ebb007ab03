"""WeightWatcher 0.7.7's Marchenko–Pastur bulk fit, reproduced bit for bit (docs/math.md §4).

The batched fit (:func:`mp_fit_many`) uses a fast form of the residual (a few dot products over the law's support) with
a bound on its rounding; every decision too close for that bound is taken on WeightWatcher's own residual."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Generator, Optional, Sequence

import numpy as np
from numpy.typing import ArrayLike

from wbfe.errors import InvalidOptionError

__all__ = ["MPFit", "mp_fit", "mp_fit_many"]

_KDE_BANDWIDTH = 0.1
_KDE_GRID = 1000
_KDE_FLOOR = 0.01
# |fast − exact| residual of the batched MP fit, relative to the magnitude of its terms (rounding of ~1000-term
# sums is ~1e-13 of it): decisions closer than this are taken on the exact residuals.
_FAST_REL_ERR = 1e-11
_NM_MAXFUN = 200  # fmin's default maxiter = maxfun = 200 · (one variable)


@dataclass(frozen=True)
class MPFit:
    """WeightWatcher's Marchenko–Pastur fit of a spectrum (docs/math.md §4); ``reason`` says why it failed.

    ``sigma_mp`` is σ of the spectrum rescaled to mean 1; ``bulk_max`` and ``bulk_min`` are in the units of the input
    eigenvalues."""

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
    left = n_left * grid  # left = n_left − (n_left·grid − (c_mid − c_lo))/h, in place
    left -= cs[mid] - cs[lo]
    left /= h
    left = np.subtract(n_left, left, out=left)
    right = cs[hi] - cs[mid]  # right = n_right − ((c_hi − c_mid) − n_right·grid)/h
    right -= n_right * grid
    right /= h
    right = np.subtract(n_right, right, out=right)
    left += right
    left = np.maximum(left, 0.0, out=left)
    left /= xs.shape[-1] * h
    return left


def _edges(sigma, inv_sq):  # noqa: ANN001, ANN202 - a σ or an array of them
    """The bulk edges (b, a) = (σ(1 ± 1/√Q))² of the MP law of σ, ``inv_sq`` = √(1/Q)."""
    return (sigma * (1 + inv_sq)) ** 2, (sigma * (1 - inv_sq)) ** 2


def _fast_from_sums(c, y2, t1_sum, t2_sum):  # noqa: ANN001, ANN202
    """Fast residual Σy² + c²·Σ d/x² − 2c·Σ √d·y/x (scalars or arrays) and its scale (the sum of the
    magnitudes of the three terms), from the sums over the law's support."""
    t1, t2 = c * c * t1_sum, 2.0 * c * t2_sum
    return y2 + t1 - t2, y2 + t1 + t2


def _bounds_from_sums(c, y2, sy_all, count, d1, d2, dy, s1_hi, s2_hi, b, a):  # noqa: ANN001, ANN202
    """:meth:`_MPResidual._lower_bounds` from the prefix-sum differences over each σ's support
    (count of points, Σ1/x, Σ1/x², Σy²) and the prefix sums Σ1/x, Σ1/x² up to its end."""
    sum1, sum2 = (a + b) * d1, (a * b) * d2
    law2 = c * c * np.maximum(sum1 - count - sum2, 0.0)
    y2s = np.maximum(dy, 0.0)
    bound = y2 - y2s + (np.sqrt(law2) - np.sqrt(y2s)) ** 2
    # Prefix sums are rounded relative to the whole prefix (s1[i1], s2[i1], sy[-1]).
    magnitude = y2 + sy_all + c * c * (count + (a + b) * s1_hi + a * b * s2_hi) + 2.0 * np.sqrt(law2 * y2s)
    return bound, 1e-9 * magnitude + 1e-300


class _MPResidual:
    """Sum of squared residuals between the KDE of ``to_fit`` and the MP (or quarter-circle) law. :meth:`exact` is
    WeightWatcher's residual operation for operation (so Nelder–Mead and ``brute`` pick its σ)."""

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

    def off(self, b: float, a: float) -> bool:
        """WeightWatcher's rejection of a bulk edge outside the data (its residual is then 1000·L)."""
        return self.Q != 1 and (b < self.x_peak or b > self.x_last or a > self.x_peak)

    def exact(self, sigma: float) -> float:
        b, a = _edges(sigma, self.inv_sq)
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


class _NearTie(Exception):
    """Two fast residuals too close to compare: the exact ones decide."""


def _nelder_mead_1d(func: Callable[[float], float], x0: float) -> float:
    """``scipy.optimize.fmin(func, x0)`` of a function of one variable, step for step on floats."""
    steps = _nelder_mead_steps(x0, 0.0)
    x = next(steps)
    try:
        while True:
            x = steps.send((func(x), 0.0))
    except StopIteration as done:
        return float(done.value)


_Steps = Generator[float, tuple[float, float], float]


def _nelder_mead_steps(x0: float, rel_err: float) -> _Steps:
    """:func:`_nelder_mead_1d` as a coroutine (yields points, is sent their values; :func:`mp_fit_many` runs many).
    scipy's ``_minimize_neldermead`` with fmin's defaults (initial step 5 %, xatol = fatol = 1e-4, 200 iterations and
    evaluations; sorting keeps the older vertex first on ties), in one dimension. The values sent are ``(value,
    scale)``: when ``rel_err`` > 0 a comparison of values closer than ``rel_err``·scale raises :class:`_NearTie` (the
    values are approximations)."""
    xatol = fatol = 1e-4

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
    f0 = yield x0
    f1 = yield x1
    calls = 2
    x0, f0, x1, f1 = ordered(x0, f0, x1, f1)
    iterations = 1
    while calls < _NM_MAXFUN and iterations < _NM_MAXFUN:
        # An evaluation past the budget is scipy's _MaxFuncCallError: the iteration stops there.
        if abs(x1 - x0) <= xatol:
            gap = abs(f0[0] - f1[0])
            if abs(gap - fatol) <= 2.0 * rel_err * max(f0[1], f1[1]) and (f0[1] > 0.0 or f1[1] > 0.0):
                raise _NearTie
            if gap <= fatol:
                break
        xbar = x0
        xr = 2 * xbar - x1
        fxr = yield xr
        calls += 1
        if less(fxr, f0):
            if calls < _NM_MAXFUN:
                xe = 3 * xbar - 2 * x1
                fxe = yield xe
                calls += 1
                x1, f1 = (xe, fxe) if less(fxe, fxr) else (xr, fxr)
                iterations += 1
        else:  # with one variable the second-worst vertex is the best one: contract
            outside = less(fxr, f1)
            if calls < _NM_MAXFUN:
                xc = 1.5 * xbar - 0.5 * x1 if outside else 0.5 * xbar + 0.5 * x1  # outside or inside contraction
                fxc = yield xc
                calls += 1
                if less(fxc, fxr, or_equal=True) if outside else less(fxc, f1):
                    x1, f1 = xc, fxc
                    iterations += 1
                else:  # shrink
                    x1 = x0 + 0.5 * (x1 - x0)
                    if calls < _NM_MAXFUN:
                        f1 = yield x1
                        calls += 1
                        iterations += 1
        x0, f0, x1, f1 = ordered(x0, f0, x1, f1)
    return x0


def mp_fit(eigs: np.ndarray, N: int, M: int) -> MPFit:  # noqa: N803 - WeightWatcher names
    """Marchenko–Pastur bulk fit exactly as WeightWatcher 0.7.7's ``mp_fit`` (docs/math.md §4).

    ``eigs`` keeps its zeros, as WeightWatcher does. N, M are WeightWatcher's sides of one matrix (for some Conv2d
    layers it reports N < M: :func:`wbfe.metrics.ww_compat.ww_conv2d_dims`). NaN + reason for an empty, all-zero or
    non-finite spectrum, a negative eigenvalue where N = M (that fit takes square roots), or one that float64 cannot
    rescale to mean 1. InvalidOptionError for N or M not positive."""
    _check_sides(N, M)
    e = np.asarray(eigs, dtype=np.float64)
    if not np.all(np.isfinite(e)):
        return _failed("non-finite eigenvalue")
    with np.errstate(over="ignore"):  # a sum past float64's range (inf) is refused below: its scale is 0
        total = np.sum(e)
    if e.size == 0 or not float(total) > 0.0:
        return _failed("empty or all-zero spectrum")
    Q = N / M
    if Q == 1 and float(np.min(e)) < 0.0:
        return _failed("negative eigenvalue: the fit of a square matrix takes square roots")
    # the scale of tiny (subnormal) eigenvalues overflows, to inf (inf · 0 = NaN for a zero one): refused below
    with np.errstate(over="ignore", invalid="ignore"):
        w_scale = np.sqrt(e.size) / np.sqrt(total)
        to_plot = (w_scale * w_scale) * e
    lambda_max = float(np.max(to_plot))
    if not 0.0 < lambda_max < math.inf:
        return _failed("eigenvalues too small or too large to rescale to mean 1 in float64")
    s = np.sqrt(lambda_max / np.square(1.0 + 1.0 / np.sqrt(Q)))
    residual = _MPResidual(np.sqrt(to_plot) if Q == 1 else to_plot, Q)
    # scipy.optimize.brute(residual, (slice,)): the grid's argmin, then fmin from there.
    sigmas = np.mgrid[slice(0.05 * s, 2.0 * s, 0.01 * s)]
    start = float(sigmas[int(np.argmin([residual.exact(sigma) for sigma in sigmas.tolist()]))])  # the first minimum
    return _fit_of(_nelder_mead_1d(residual.exact, start), to_plot, w_scale, lambda_max, Q, M)


def _failed(reason: str) -> MPFit:
    return MPFit(math.nan, math.nan, math.nan, math.nan, math.nan, reason)


def _check_sides(N: float, M: float) -> None:  # noqa: N803
    if not (0.0 < N < math.inf and 0.0 < M < math.inf):
        raise InvalidOptionError(f"the MP fit needs positive sides N and M, not N={N!r}, M={M!r}")


def _fit_of(sigma: float, to_plot: np.ndarray, w_scale: float, lambda_max: float, Q: float, M: int) -> MPFit:  # noqa: N803
    """The :class:`MPFit` of the fitted σ of the rescaled spectrum ``to_plot`` (= w_scale² · eigs)."""
    inv_sq = 1 / np.sqrt(Q)
    bulk_max, bulk_min = _edges(sigma, inv_sq)
    tw = inv_sq * np.power(bulk_max, 2 / 3) * np.power(M, -2 / 3)
    num_spikes = int(np.count_nonzero(to_plot > bulk_max + np.sqrt(tw)))
    return MPFit(
        sigma_mp=sigma, bulk_max=float(bulk_max / (w_scale * w_scale)), bulk_min=float(bulk_min / (w_scale * w_scale)),
        num_spikes=num_spikes, mp_softrank=float(bulk_max / lambda_max),
    )


_BATCH_MIN = 16  # fewer spectra: mp_fit one by one (below it the batch costs more)
_BATCH_MAX = 64  # more: in groups of about this many (larger stacks fall out of cache)
_LOCKSTEP_MIN = 2  # fewer Nelder–Mead runs left: the last finishes alone
_CHUNK = 1 << 14  # support-sum elements per vectorised step (cache-sized)


def mp_fit_many(spectra: Sequence[ArrayLike], N: int, M: int) -> list[MPFit]:  # noqa: N803
    """:func:`mp_fit` of many spectra of one matrix shape, equal to it field for field, vectorised.

    The KDEs and σ grids run on the whole stack and the Nelder–Mead polishes in lockstep; every decision too close for
    the fast residuals' bound, and any spectrum off the common path, is taken by :func:`mp_fit` on that spectrum alone.
    Spectra of different lengths, or fewer than _BATCH_MIN, are fitted one by one."""
    _check_sides(N, M)
    arrays = [np.asarray(e, dtype=np.float64) for e in spectra]
    if len(arrays) < _BATCH_MIN or len({e.shape for e in arrays}) != 1 or arrays[0].ndim != 1:
        return [mp_fit(e, N, M) for e in arrays]
    n_groups = -(-len(arrays) // _BATCH_MAX)  # in groups that keep the stacks in cache
    return [fit for group in np.array_split(np.arange(len(arrays)), n_groups)
            for fit in _fit_batch([arrays[i] for i in group], N, M)]  # fmt: skip


def _fit_batch(arrays: list[np.ndarray], N: int, M: int) -> list[MPFit]:  # noqa: N803
    stack = np.stack(arrays)
    # The rows fitted together; alone: empty or all-zero (mp_fit's failure), non-finite or negative
    # values (whatever mp_fit makes of them, error included), a mean float64 cannot rescale to 1 (the
    # sum or n / sum overflows: that inf is what sends the row to mp_fit).
    with np.errstate(divide="ignore", over="ignore"):
        sums = np.sum(stack, axis=1)  # per row numpy's pairwise sum, as np.sum of the row
        rows = np.flatnonzero((sums > 0.0) & np.isfinite(sums) & np.isfinite(stack.shape[1] / sums)
                              & (np.min(stack, axis=1) >= 0.0))
    if rows.size < _BATCH_MIN:
        return [mp_fit(e, N, M) for e in arrays]
    Q = N / M
    e = stack[rows]
    w_scale = np.sqrt(e.shape[1]) / np.sqrt(sums[rows])
    to_plot = (w_scale * w_scale)[:, None] * e
    lambda_max = np.max(to_plot, axis=1)
    s = np.sqrt(lambda_max / np.square(1.0 + 1.0 / np.sqrt(Q)))
    batch = _ResidualBatch(np.sqrt(to_plot) if Q == 1 else to_plot, Q)
    sigmas = _polish_many(batch, *batch.grid_starts(s))
    fits = {k: _fit_of(sigma, to_plot[i], w_scale[i], float(lambda_max[i]), Q, M)
            for i, (k, sigma) in enumerate(zip(rows.tolist(), sigmas)) if sigma is not None}
    return [fits[k] if k in fits else mp_fit(e, N, M) for k, e in enumerate(arrays)]


def _row_dots(u: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Σ_j u[i, j]·v[i, j] of every row (np.vecdot where numpy has it, from 2.0: SIMD, one call)."""
    return _vecdot(u, v) if _vecdot is not None else np.einsum("ij,ij->i", u, v)


_vecdot = getattr(np, "vecdot", None)  # numpy >= 2.0


_WINDOW_SLACK = np.array([[-1.0], [2.0]])  # grid points beyond ⌊a/step⌋, ⌊b/step⌋ that may be inside


class _ResidualBatch:
    """The :class:`_MPResidual` of every row of a stack of spectra (rescaled as ``to_fit``), fast form
    only, on each row's whole KDE grid: the points not fitted weigh 0, so every support is a window
    [lo, lo + width) of a row (the arrays run on past the last row, where x = +inf)."""

    def __init__(self, to_fit: np.ndarray, Q: float) -> None:  # noqa: N803
        self.Q = Q
        n_rows = to_fit.shape[0]
        stop = np.max(to_fit, axis=1) + 0.5
        self.x = np.full(n_rows * _KDE_GRID + _KDE_GRID, np.inf)
        xde = self.x[: n_rows * _KDE_GRID].reshape(n_rows, _KDE_GRID)
        self.step = stop / (_KDE_GRID - 1)
        xde[...] = np.linspace(0.0, stop, _KDE_GRID, axis=1)  # each row's np.linspace(0, stop, 1000)
        yde = np.stack([_linear_kde(t, x, _KDE_BANDWIDTH) for t, x in zip(to_fit, xde)])
        good = yde > _KDE_FLOOR
        self.n_good = np.count_nonzero(good, axis=1)
        self.usable = self.n_good > 0  # no point to fit: mp_fit's own error
        self.off_grid = self.n_good * 1e6
        row_at = np.arange(n_rows) * _KDE_GRID
        # np.argmax: the first maximum, a fitted point, as on the fitted points alone.
        self.x_peak = xde.ravel().take(np.argmax(yde, axis=1) + row_at)
        self.x_last = xde.ravel().take(_KDE_GRID - 1 - np.argmax(good[:, ::-1], axis=1) + row_at)
        self.inv_sq = float(np.sqrt(1.0 / Q))
        y = np.where(good, yde, 0.0)
        self.y2 = _row_dots(y, y)
        if Q == 1:
            with np.errstate(invalid="ignore"):
                r = np.sqrt(4 - xde**2)
            r[~(np.isfinite(r) & good)] = 0.0
            self.rr, self.ry = _row_dots(r, r), _row_dots(r, y)
            return
        with np.errstate(divide="ignore"):
            inv = np.divide(1.0, xde, out=np.zeros_like(xde), where=good & (xde > 0.0))  # x = 0: never in a support
        self.h, self.g = np.zeros_like(self.x), np.zeros_like(self.x)
        h = np.multiply(inv, inv, out=self.h[: n_rows * _KDE_GRID].reshape(n_rows, _KDE_GRID))
        np.multiply(y, inv, out=self.g[: n_rows * _KDE_GRID].reshape(n_rows, _KDE_GRID))
        # Prefix sums of the fitted points (count, Σ 1/x, Σ 1/x², Σ y²) for the grid's lower bounds.
        self.prefix = np.zeros((4, n_rows, _KDE_GRID + 1))
        for out, v in zip(self.prefix, (good, inv, h, y * y)):
            np.cumsum(v, axis=1, out=out[:, 1:])
        # Every run of _KDE_GRID consecutive values, a read-only view: indexing it copies whole runs.
        self.windows = tuple(np.lib.stride_tricks.sliding_window_view(v, _KDE_GRID) for v in (self.x, self.h, self.g))

    def off(self, rows, b, a):  # noqa: ANN001, ANN201 - arrays, or one row's scalars
        """:meth:`_MPResidual.off` of each (row, edges)."""
        x_peak = self.x_peak[rows]
        return (b < x_peak) | (b > self.x_last[rows]) | (a > x_peak)

    def support_sums(self, rows: np.ndarray, sigmas: np.ndarray, b, a, lo, hi):  # noqa: ANN001, ANN201
        """Fast values and scales of σ of rows whose supports lie in the windows [lo, hi) of them."""
        widths = hi - lo
        starts = rows * _KDE_GRID + lo
        width = int(np.max(widths)) if rows.size else 0
        if rows.size * width <= 4 * _CHUNK:  # one step (most Nelder–Mead steps)
            t1, t2 = self._window_sums(starts, width, b[:, None], a[:, None])
        else:
            t1, t2 = np.empty(rows.size), np.empty(rows.size)
            order = np.argsort(widths)[::-1]  # widest first: each chunk pads to about its own width
            widths_desc, starts, b, a = widths[order].tolist(), starts[order], b[order, None], a[order, None]
            start = 0
            while start < rows.size:
                stop = min(rows.size, start + max(1, _CHUNK // max(widths_desc[start], 1)))
                at = order[start:stop]
                t1[at], t2[at] = self._window_sums(starts[start:stop], widths_desc[start], b[start:stop], a[start:stop])
                start = stop
        return _fast_from_sums(self.Q / (2 * np.pi * sigmas * sigmas), self.y2[rows], t1, t2)

    def _window_sums(self, starts: np.ndarray, width: int, b: np.ndarray, a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Σ d/x² and Σ √d·y/x, d = (b − x)(x − a) where > 0, over the ``width`` points from each start."""
        # Each row's points copied as one slice from the strided views (not gathered one by one).
        x, h, g = (v[starts, :width] for v in self.windows)
        d = np.subtract(b, x)
        d *= np.subtract(x, a, out=x)
        np.fmax(d, 0.0, out=d)  # 0 off the support (and on the +inf padding)
        t1 = _row_dots(d, h)
        return t1, _row_dots(np.sqrt(d, out=d), g)

    def fast(self, rows: np.ndarray, sigmas: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The fast residual of σ of each row: values, scales (``|value − exact| <= _FAST_REL_ERR · scale``)
        and the rows it cannot give (a lower edge at 0, a non-finite value: refitted alone)."""
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):  # flagged, not used
            if self.Q == 1:
                values, scales = _fast_from_sums(1 / (np.pi * sigmas * sigmas), self.y2[rows], self.rr[rows],
                                                 self.ry[rows])
                return values, scales, ~np.isfinite(values)
            b, a = _edges(sigmas, self.inv_sq)
            off = self.off(rows, b, a)
            values, scales = self.off_grid[rows].astype(np.float64), np.zeros(rows.size)
            inside = ~off & (a > 0.0)
            on = np.flatnonzero(inside)
            if on.size:
                if on.size < rows.size:
                    rows, sigmas, b, a = rows[on], sigmas[on], b[on], a[on]
                # Windows holding each support (a, b) ⊂ (0, x_last]: np.linspace's points i·step.
                window = np.floor(np.stack((a, b)) / self.step[rows]) + _WINDOW_SLACK
                lo, hi = np.clip(window, 0, _KDE_GRID, out=window).astype(np.intp)
                values[on], scales[on] = self.support_sums(rows, sigmas, b, a, lo, hi)
            return values, scales, ~(off | inside) | ~np.isfinite(values)

    def fast_one(self, k: int, sigma: float) -> Optional[tuple[float, float]]:
        """:meth:`fast` of one row and σ, in scalars (the lockstep's last few runs); None where it
        flags the row."""
        if self.Q == 1:
            if sigma * sigma == 0.0:  # the single fit's 1/σ² fails: refit alone, as it does
                return None
            value, scale = _fast_from_sums(1 / (np.pi * sigma * sigma), self.y2[k], self.rr[k], self.ry[k])
            return (float(value), float(scale)) if math.isfinite(value) else None
        b, a = _edges(sigma, self.inv_sq)
        if self.off(k, b, a):
            return float(self.off_grid[k]), 0.0
        if not a > 0.0:
            return None
        step, at = float(self.step[k]), k * _KDE_GRID
        lo = at + max(math.floor(a / step) + int(_WINDOW_SLACK[0, 0]), 0)
        hi = at + min(math.floor(b / step) + int(_WINDOW_SLACK[1, 0]), _KDE_GRID)
        xs = self.x[lo:hi]
        d = (b - xs) * (xs - a)
        np.fmax(d, 0.0, out=d)
        t1 = float(np.dot(d, self.h[lo:hi]))
        c = self.Q / (2 * np.pi * sigma * sigma)
        value, scale = _fast_from_sums(c, float(self.y2[k]), t1, float(np.dot(np.sqrt(d, out=d), self.g[lo:hi])))
        return (value, scale) if math.isfinite(value) else None

    def grid_starts(self, s: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``brute``'s start of every row: the first minimum of the exact residuals on its σ grid (np.mgrid), from the
        fast ones, with its fast value and scale; NaN σ where the row must be fitted on its own."""
        n_rows = s.size
        grids = [np.arange(0.05 * si, 2.0 * si, 0.01 * si) for si in s.tolist()]  # np.mgrid[slice]
        sigmas = np.full((n_rows, max(g.size for g in grids)), np.nan)
        for k, g in enumerate(grids):
            sigmas[k, : g.size] = g
        in_grid = ~np.isnan(sigmas)
        values = np.full(sigmas.shape, np.inf)
        scales = np.zeros(sigmas.shape)
        fallback = ~self.usable
        if self.Q == 1:
            with np.errstate(invalid="ignore", divide="ignore"):
                v, sc = _fast_from_sums(1 / (np.pi * sigmas * sigmas), self.y2[:, None], self.rr[:, None], self.ry[:, None])
            values[in_grid], scales[in_grid] = v[in_grid], sc[in_grid]
            computed = in_grid
        else:
            b, a = _edges(sigmas, self.inv_sq)
            with np.errstate(invalid="ignore"):
                valid = in_grid & ~self.off(np.arange(n_rows)[:, None], b, a)
            values[in_grid & ~valid] = np.broadcast_to(self.off_grid[:, None], sigmas.shape)[in_grid & ~valid]
            # The grid points in (a, b) of each row.
            a, b = np.where(valid, a, 0.0), np.where(valid, b, 0.0)
            xde = self.x[: n_rows * _KDE_GRID].reshape(n_rows, _KDE_GRID)
            i0 = np.stack([np.searchsorted(x, v, side="right") for x, v in zip(xde, a)])
            i1 = np.stack([np.searchsorted(x, v, side="left") for x, v in zip(xde, b)])
            row_at = (np.arange(n_rows) * (_KDE_GRID + 1))[:, None]
            prefix = self.prefix.reshape(4, -1)
            (n_lo, s1_lo, s2_lo, sy_lo), (n_hi, s1_hi, s2_hi, sy_hi) = prefix.take(i0 + row_at, 1), prefix.take(i1 + row_at, 1)
            with np.errstate(invalid="ignore", divide="ignore"):
                c = self.Q / (2 * np.pi * sigmas * sigmas)
                bound, margin = _bounds_from_sums(
                    c, self.y2[:, None], self.prefix[3, :, -1:], n_hi - n_lo,
                    s1_hi - s1_lo, s2_hi - s2_lo, sy_hi - sy_lo, s1_hi, s2_hi, b, a,
                )  # fmt: skip
            prune = np.count_nonzero(valid, axis=1) > 4
            first = np.zeros(sigmas.shape, dtype=bool)
            if np.any(prune):
                order = np.argpartition(np.where(valid, bound, np.inf), 4, axis=1)[:, :4]
                np.put_along_axis(first, order, True, 1)
            first = (first & prune[:, None] | ~prune[:, None]) & valid

            def evaluate(mask: np.ndarray) -> None:
                r, k = np.nonzero(mask)
                values[r, k], scales[r, k] = self.support_sums(r, sigmas[r, k], b[r, k], a[r, k], i0[r, k], i1[r, k])

            evaluate(first)
            best = np.min(np.where(first, values + _FAST_REL_ERR * scales, np.inf), axis=1)
            keep = valid & (~prune[:, None] | (bound - margin <= best[:, None]))
            evaluate(keep & ~first)
            pruned = valid & ~keep
            values[pruned], scales[pruned] = np.inf, 0.0
            computed = keep
        fallback |= np.any(computed & ~np.isfinite(values), axis=1)
        tol = _FAST_REL_ERR * scales
        with np.errstate(invalid="ignore"):
            candidates = values - tol <= np.min(values + tol, axis=1)[:, None]
        tied = np.count_nonzero(candidates, axis=1) > 1
        # Candidates all exact (rejected σ, at 1000·L): argmin of the values, the first on ties.
        fallback |= tied & np.any(candidates & (scales > 0.0), axis=1)
        best_at = np.where(tied, np.argmin(np.where(candidates, values, np.inf), axis=1), np.argmax(candidates, axis=1))
        best_at += np.arange(n_rows) * sigmas.shape[1]
        start, start_value, start_scale = (v.ravel().take(best_at) for v in (sigmas, values, scales))
        start[fallback] = np.nan
        return start, start_value, start_scale


def _polish_many(
    batch: _ResidualBatch, starts: np.ndarray, start_values: np.ndarray, start_scales: np.ndarray
) -> list[Optional[float]]:
    """:func:`mp_fit`'s polish of every row from its start σ, the Nelder–Mead runs in lockstep; None where
    the row must be fitted on its own (a near tie, an exact residual, no start)."""
    sigmas: list[Optional[float]] = [None] * starts.size
    running: list[tuple[int, _Steps]] = []
    points: list[float] = []
    for k, (x0, value, scale) in enumerate(zip(starts.tolist(), start_values.tolist(), start_scales.tolist())):
        if math.isnan(x0):
            continue
        steps = _nelder_mead_steps(x0, _FAST_REL_ERR)
        next(steps)  # x0, whose fast residual the grid has
        running.append((k, steps))
        points.append(steps.send((value, scale)))
    while len(running) >= _LOCKSTEP_MIN:
        values, scales, exact = batch.fast(np.array([k for k, _ in running]), np.array(points))
        still, points = [], []
        for (k, steps), value, scale, off_path in zip(running, values.tolist(), scales.tolist(), exact.tolist()):
            if off_path:
                continue
            try:
                points.append(steps.send((value, scale)))
                still.append((k, steps))
            except StopIteration as done:
                sigmas[k] = float(done.value)
            except _NearTie:
                pass
        running = still
    for (k, steps), x in zip(running, points):  # the last few: one by one
        try:
            while (fx := batch.fast_one(k, x)) is not None:
                x = steps.send(fx)
        except StopIteration as done:
            sigmas[k] = float(done.value)
        except _NearTie:
            pass
    return sigmas
