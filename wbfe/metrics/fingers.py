"""WeightWatcher 0.7.7's alternative tail fits, ``fix_fingers`` (``xmin_peak``, ``clip_xmax``) and
``fit='TPL'``/``'E_TPL'``, as its source has them: the rules, and where ``--ww-compatible`` keeps its slips, are in
docs/metrics.md (the power-law columns)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal, Optional

import numpy as np

from wbfe.errors import InvalidOptionError
from wbfe.metrics._group import GroupResult, MetricGroup, MetricOptions, Spectrum, stored_threshold
from wbfe.options import FingerFix, TailModel, check_tail_options
from wbfe.options.conventions import WBFE, Conventions
from wbfe.metrics.powerlaw import (
    FitOutcome, PowerLawFit, fit_power_law, fit_power_law_in_range, fit_truncated_power_law, range_candidates,
    tpl_log_normaliser,
)

__all__ = ["FixFingers", "TailModel", "TailFit", "esd_peak", "peak_range", "fit_tail", "tpl_ks_distance",
           "WW_MAX_FINGERS", "WW_FINGER_THRESH", "WW_MIN_ALPHA", "COLUMNS", "GROUP"]

FixFingers = Optional[FingerFix]

#: WeightWatcher 0.7.7's defaults: refits idx = 2 … WW_MAX_FINGERS − 1 (``range(2, max_fingers)``).
WW_MAX_FINGERS = 10
WW_FINGER_THRESH = 1.0
WW_MIN_ALPHA = 2.0
_PEAK_BINS = 100
_GL_X, _GL_W = np.polynomial.legendre.leggauss(8)


@dataclass(frozen=True)
class TailFit(FitOutcome):
    """The tail fit behind the ``alpha`` columns under ``fix_fingers`` / ``fit``.

    ``lam`` is Λ of a truncated fit (sigma then NaN); ``num_fingers`` and ``raw_alpha`` (α before clipping) are for
    ``clip_xmax`` only."""

    alpha: float
    sigma: float
    xmin: float
    ks: float
    lam: float = math.nan
    num_fingers: int = 0
    raw_alpha: float = math.nan
    reason: Optional[str] = None

    @classmethod
    def failed(cls, reason: str) -> TailFit:
        """The failed fit: every number NaN."""
        return cls(math.nan, math.nan, math.nan, math.nan, reason=reason)


def esd_peak(x: np.ndarray) -> float:
    """10^(left edge of the fullest of 100 bins of log10 x): WeightWatcher's ESD peak (InvalidOptionError unless x holds
    finite, positive values: an empty x has no peak, and log10 of the others bins nothing)."""
    if not (np.size(x) and 0.0 < np.min(x) and np.max(x) < math.inf):  # NaN fails both comparisons
        raise InvalidOptionError("esd_peak needs at least one value, all finite and positive (eigenvalues)")
    counts, edges = np.histogram(np.log10(x), bins=_PEAK_BINS)
    return float(10 ** edges[int(np.argmax(counts))])


def peak_range(x: np.ndarray, *, log10: bool) -> tuple[float, float]:
    """The xmin range of ``xmin_peak`` (docs/metrics.md: WeightWatcher's log10 slip with ``log10``)."""
    peak = esd_peak(x)
    return (math.log10(0.95 * peak) if log10 else 0.95 * peak), 1.5 * peak


def _from_pl(fit: PowerLawFit, **extra: float) -> TailFit:
    return TailFit(fit.alpha, fit.sigma, fit.xmin, fit.ks, reason=fit.reason, **extra)  # type: ignore[arg-type]


def _clip_xmax(x: np.ndarray, *, min_tail: int, method: Literal["csn", "ww"]) -> TailFit:
    first = fit_power_law(x, min_tail=min_tail, method=method)
    if not first.ok:
        return _from_pl(first)
    best, fingers = first, 0
    for idx in range(2, WW_MAX_FINGERS):
        if x.size - idx < 2:
            break
        fit = fit_power_law(x[:-idx], min_tail=min_tail, method=method)
        if fit.alpha + WW_FINGER_THRESH < first.alpha:  # NaN compares False: a failed refit goes on
            best, fingers = fit, idx - 1
            break
        if fit.alpha <= WW_MIN_ALPHA:
            break
    return _from_pl(best, num_fingers=fingers, raw_alpha=first.alpha)


def tpl_ks_distance(tail: np.ndarray, alpha: float, lam: float) -> float:
    """KS distance max_k |F(x_k) − k/n| of a truncated power law on the ascending ``tail`` (xmin =
    tail[0]), F(x) = ∫_xmin^x t^(−α) e^(−Λt) dt / Z: the integrals between consecutive values by
    8-point Gauss–Legendre in log t, the rest of Z beyond the largest value in closed form."""
    x0 = float(tail[0])
    u = np.log(tail)
    a, b = u[:-1], u[1:]
    half = 0.5 * (b - a)
    nodes = 0.5 * (a + b)[:, None] + half[:, None] * _GL_X[None, :]
    log0 = (1.0 - alpha) * math.log(x0) - lam * x0  # log of t·p(t) at xmin, to keep the numbers O(1)
    g = np.exp((1.0 - alpha) * nodes - lam * np.exp(nodes) - log0)
    pieces = half * (g @ _GL_W)
    top = float(tail[-1])
    if lam > 0.0:
        beyond = math.exp(tpl_log_normaliser(alpha, lam, top) - log0)
    elif alpha > 1.0:
        beyond = math.exp((1.0 - alpha) * math.log(top) - log0) / (alpha - 1.0)
    else:
        return math.nan
    cumulative = np.concatenate(([0.0], np.cumsum(pieces)))
    cdf = cumulative / (cumulative[-1] + beyond)
    k = np.arange(tail.size) / tail.size
    return float(np.max(np.abs(cdf - k)))


def _tpl_scan(x: np.ndarray, lo: float, hi: float, *, min_tail: int) -> TailFit:
    """Truncated power law with xmin chosen by its own KS distance among the candidates in [lo, hi)."""
    candidates = range_candidates(x, lo, hi)
    candidates = candidates[x.size - candidates >= max(min_tail, 3)]
    if candidates.size == 0:
        return TailFit.failed(f"no candidate xmin in [{lo:.6g}, {hi:.6g})")
    fits = [fit_truncated_power_law(x[i:], xmin=float(x[i])) for i in candidates]
    scored = [(d, j) for j, (i, fit) in enumerate(zip(candidates, fits)) if fit.ok
              for d in (tpl_ks_distance(x[i:], fit.alpha, fit.lam),) if math.isfinite(d)]
    if not scored:
        return TailFit.failed("no candidate xmin gives a truncated power-law fit")
    d, j = min(scored)  # the first of the smallest distances
    fit = fits[j]
    return TailFit(fit.alpha, math.nan, fit.xmin, d, lam=fit.lam)


def fit_tail(x: np.ndarray, *, fix_fingers: FixFingers = None, fit: TailModel = "pl", min_tail: int = 10,
             conventions: Conventions = WBFE) -> TailFit:
    """The tail fit of the positive sample ``x`` (thresholded as the caller's power-law fit thresholds it) under
    WeightWatcher's ``fix_fingers`` and ``fit`` (``e_tpl`` is ``tpl`` with ``xmin_peak``); ``min_tail`` as in
    :func:`~wbfe.metrics.powerlaw.fit_power_law`. NaN + reason on failure.

    Raises:
        InvalidOptionError: see :func:`check_tail_options`.
    """
    check_tail_options(fix_fingers, fit)
    x = np.sort(np.asarray(x, dtype=np.float64).ravel())
    if x.size < 3 or not np.all(np.isfinite(x)) or x[0] <= 0.0:
        return TailFit.failed(f"need at least 3 positive finite values, got {x.size}")
    if fit == "e_tpl":
        fit, fix_fingers = "tpl", "xmin_peak"
    tail_min = 1 if conventions.power_law == "ww" else min_tail
    if fix_fingers == "clip_xmax":
        return _clip_xmax(x, min_tail=min_tail, method=conventions.power_law)
    # no range: the package's (min, max), whose strict upper end and dropped last candidate leave out
    # the two largest values
    lo, hi = peak_range(x, log10=conventions.peak_log10) if fix_fingers == "xmin_peak" else (float(x[0]), float(x[-1]))
    if fit == "tpl":
        return _tpl_scan(x, lo, hi, min_tail=tail_min)
    if fix_fingers == "xmin_peak":
        return _from_pl(fit_power_law_in_range(x, lo, hi, min_tail=tail_min))
    return _from_pl(fit_power_law(x, min_tail=min_tail, method=conventions.power_law))


COLUMNS = ("num_fingers", "raw_alpha", "Lambda")


def _compute(spec: Spectrum, options: MetricOptions) -> GroupResult:
    result = GroupResult()
    e = None if spec.eigs is None else np.sort(np.asarray(spec.eigs, dtype=np.float64))
    if e is None or e.size == 0 or not np.all(np.isfinite(e)) or not e[-1] > 0.0:
        result.fail_all(COLUMNS, "no usable spectrum")
        return result
    threshold = stored_threshold(options.conventions.evals_thresh, spec.log_scale)
    fit = fit_tail(e[e > threshold], fix_fingers=options.fix_fingers, fit=options.fit, min_tail=options.min_tail,
                   conventions=options.conventions)
    if not fit.ok:
        result.fail_all(COLUMNS, f"tail fit: {fit.reason}")
        return result
    result.values["num_fingers"] = fit.num_fingers
    if options.fix_fingers == "clip_xmax":
        result.values["raw_alpha"] = fit.raw_alpha
    else:
        result.fail("raw_alpha", "only with fix_fingers=clip_xmax")
    if options.fit in ("tpl", "e_tpl"):
        result.put_rescaled("Lambda", fit.lam, -1.0, spec.log_scale)
    else:
        result.fail("Lambda", "only with fit=tpl or e_tpl")
    return result


GROUP = MetricGroup(
    name="fingers",
    columns=COLUMNS,
    summary_columns=("num_fingers",),
    compute=_compute,
    description="diagnostics of the fix_fingers / fit tail fits: fingers clipped, raw alpha, TPL Lambda",
    tail_columns=COLUMNS,  # every column comes from a tail fit
)
