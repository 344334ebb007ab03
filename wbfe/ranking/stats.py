"""Rank correlations between a metric and a quality oriented so that higher is better, with their uncertainty
(docs/math.md §5). All resampling is seeded. Every function takes 1-D inputs, one value per model, and refuses
anything else (InvalidOptionError)."""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Any, Optional

import numpy as np

from wbfe.errors import InvalidOptionError
from wbfe.options import StatsOptions, field_defaults

__all__ = ["Correlation", "spearman", "kendall_tau", "pearson", "bootstrap_ci", "permutation_p_value",
           "correlate", "MIN_MODELS", "EXACT_MAX_N"]

MIN_MODELS = 3
"""Fewest models a correlation is reported for; with two, every rank correlation is ±1."""

_DEFAULTS = field_defaults(StatsOptions)  # the keywords' defaults are the options' own

EXACT_MAX_N: int = _DEFAULTS["exact_max_n"]
"""Largest n for which the permutation p-value enumerates all n! orderings (8! = 40,320)."""


@dataclass(frozen=True, kw_only=True)
class Correlation:
    """How one metric ranks a zoo against its quality numbers (the rank JSON's ``metrics`` item): Spearman ρ (NaN
    when undefined, with the ``reason``), its bootstrap interval and permutation p-value (``"exact"`` or
    ``"monte-carlo"``), Kendall τ-b, Pearson r of the raw values, and n, the models with a finite metric value and a
    quality value. A ranking names the ``metric``, its ``expected_sign`` and ``applicable``: the same ρ on the
    models where BFE-W's conditions hold (summary.bfe_applicability), {"n", "rho", "ci_low", "ci_high"}."""

    metric: str = ""
    rho: float
    ci_low: float
    ci_high: float
    p_value: float
    kendall_tau: float
    pearson_r: float
    n: int
    expected_sign: Optional[int] = None
    p_method: Optional[str] = None
    reason: Optional[str] = None
    applicable: Optional[dict[str, Any]] = None


def _pair(x: "np.typing.ArrayLike", y: "np.typing.ArrayLike", finite: bool = True) -> tuple[np.ndarray, np.ndarray]:
    try:
        a = np.asarray(x, dtype=np.float64)
        b = np.asarray(y, dtype=np.float64)
    except (TypeError, ValueError, OverflowError):  # OverflowError: an int past float64 (10**400)
        raise InvalidOptionError("x and y must be sequences of numbers") from None
    # Flattening a table would pair values of different models; a single row or column is refused too, so that
    # one rule holds (the caller ravels it knowingly).
    for name, v in (("x", a), ("y", b)):
        if v.ndim != 1:
            raise InvalidOptionError(f"x and y must be 1-D, one value per model; {name} has shape {v.shape}")
    if a.shape != b.shape:
        raise InvalidOptionError(f"x and y differ in length ({a.size} vs {b.size})")
    if finite and not (np.isfinite(a).all() and np.isfinite(b).all()):  # NaN ranks gave a bootstrap of garbage
        raise InvalidOptionError("x and y must be finite numbers; correlate() drops the pairs that are not")
    return a, b


def _rowwise_spearman(a: np.ndarray, b: np.ndarray, axis: int = -1) -> np.ndarray:
    """Spearman ρ of each row pair (the Pearson r of the average ranks): the statistic scipy's resampling calls."""
    from scipy.stats import rankdata

    return _rowwise_pearson(rankdata(a, axis=axis), rankdata(b, axis=axis), axis)


def _rowwise_pearson(ra: np.ndarray, rb: np.ndarray, axis: int = -1) -> np.ndarray:
    da = ra - ra.mean(axis=axis, keepdims=True)
    db = rb - rb.mean(axis=axis, keepdims=True)
    num = np.sum(da * db, axis=axis)
    den = np.sqrt(np.sum(da * da, axis=axis) * np.sum(db * db, axis=axis))
    with np.errstate(invalid="ignore", divide="ignore"):
        r = num / den
    # Rounding can push |ρ| a hair past 1 for perfectly monotone data.
    return np.clip(np.where(den > 0.0, r, np.nan), -1.0, 1.0)


def _defined(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether a correlation of ``a`` and ``b`` is defined: two or more pairs, neither side constant."""
    return bool(a.size >= 2 and a.min() < a.max() and b.min() < b.max())  # np.ptp overflows past ±9e307


def _statistic(test: str, x: "np.typing.ArrayLike", y: "np.typing.ArrayLike") -> float:
    from scipy import stats

    a, b = _pair(x, y)
    return float(getattr(stats, test)(a, b).statistic) if _defined(a, b) else math.nan


def pearson(x: "np.typing.ArrayLike", y: "np.typing.ArrayLike") -> float:
    """Pearson correlation coefficient (:func:`scipy.stats.pearsonr`); NaN when either input is constant or n < 2."""
    return float(np.clip(_statistic("pearsonr", x, y), -1.0, 1.0))


def spearman(x: "np.typing.ArrayLike", y: "np.typing.ArrayLike") -> float:
    """Spearman ρ (:func:`scipy.stats.spearmanr`); NaN when either input is constant or n < 2."""
    return _statistic("spearmanr", x, y)


def kendall_tau(x: "np.typing.ArrayLike", y: "np.typing.ArrayLike") -> float:
    """Kendall τ-b, tie-corrected (:func:`scipy.stats.kendalltau`); NaN when either input is constant or n < 2."""
    return _statistic("kendalltau", x, y)


def _batch(n: int, total: int) -> int:
    # Resamples per batch: memory stays at ~2 million floats whatever the count.
    return max(1, min(total, 2_000_000 // max(n, 1)))


def bootstrap_ci(x: "np.typing.ArrayLike", y: "np.typing.ArrayLike", *, n_boot: int = _DEFAULTS["n_boot"],
                 level: float = _DEFAULTS["level"], seed: int = _DEFAULTS["seed"]) -> tuple[float, float]:
    """Percentile bootstrap interval ``(low, high)`` of Spearman ρ at coverage ``level``, resampling pairs with
    replacement (:func:`scipy.stats.bootstrap`), over the resamples with a defined ρ (docs/math.md §5); NaN when
    none has one.

    Raises:
        InvalidOptionError: ``n_boot`` outside [1, :data:`~wbfe.options.MAX_RESAMPLES`], ``level`` outside (0, 1),
            or a value that is not a finite number (as for every function here but :func:`correlate`).
    """
    from scipy.stats import bootstrap

    options = StatsOptions(n_boot=n_boot, level=level, seed=seed)
    a, b = _pair(x, y)
    n = a.size
    if n < 2:
        return math.nan, math.nan
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # DegenerateDataWarning: handled below
        result = bootstrap((a, b), _rowwise_spearman, paired=True, vectorized=True, n_resamples=options.n_boot,
                           batch=_batch(n, options.n_boot), confidence_level=options.level, method="percentile",
                           rng=np.random.default_rng(options.seed))
        low, high = float(result.confidence_interval.low), float(result.confidence_interval.high)
        if not (math.isfinite(low) and math.isfinite(high)):  # all-NaN: NaN (its warning ignored above)
            alpha = (1.0 - options.level) / 2.0
            low, high = np.nanquantile(result.bootstrap_distribution, [alpha, 1.0 - alpha])
    return float(low), float(high)


def permutation_p_value(x: "np.typing.ArrayLike", y: "np.typing.ArrayLike", *, exact_max_n: int = EXACT_MAX_N,
                        n_perm: int = _DEFAULTS["n_perm"], seed: int = _DEFAULTS["seed"]) -> tuple[float, str]:
    """Two-sided permutation p-value of Spearman ρ, P(|ρ_perm| ≥ |ρ_obs|), and its method: ``"exact"`` (all n!
    orderings, n ≤ ``exact_max_n``) or ``"monte-carlo"`` (``n_perm`` seeded orderings); p is NaN when ρ is
    undefined (docs/math.md §5).

    Raises:
        InvalidOptionError: ``n_perm`` outside [1, :data:`~wbfe.options.MAX_RESAMPLES`], a value not finite.
    """
    from scipy.stats import permutation_test, rankdata

    options = StatsOptions(n_perm=n_perm, exact_max_n=exact_max_n, seed=seed)
    a, b = _pair(x, y)
    n = a.size
    method = "exact" if n <= options.exact_max_n else "monte-carlo"
    if not _defined(a, b):
        return math.nan, method
    # Only y's ranks are reordered (one sample: n! orderings, not n!²); a reordering of y reorders
    # its ranks, so each ordering's ρ is the Pearson r of fixed ranks, with no ranking per ordering.
    # The statistic is |ρ|, one-sided: scipy's own two-sided p doubles the smaller tail instead.
    ra, rb = rankdata(a), rankdata(b)
    resamples = math.factorial(n) if method == "exact" else options.n_perm
    result = permutation_test((rb,), lambda yy, axis=-1: np.abs(_rowwise_pearson(np.broadcast_to(ra, yy.shape), yy)),
                              permutation_type="pairings", vectorized=True, n_resamples=resamples,
                              batch=_batch(n, resamples), alternative="greater",
                              rng=np.random.default_rng(options.seed))
    return float(result.pvalue), method


def correlate(metric: "np.typing.ArrayLike", quality: "np.typing.ArrayLike", *, n_boot: int = _DEFAULTS["n_boot"],
              n_perm: int = _DEFAULTS["n_perm"], level: float = _DEFAULTS["level"], seed: int = _DEFAULTS["seed"],
              exact_max_n: int = EXACT_MAX_N, options: "Optional[StatsOptions]" = None) -> Correlation:
    """Every statistic of a metric against a quality (oriented so that higher is better), on the pairs where both
    are finite; the settings as keywords or one :class:`~wbfe.options.StatsOptions` (which replaces them).

    Returns:
        A :class:`Correlation`; its numbers are NaN with a ``reason`` when fewer than
        :data:`MIN_MODELS` pairs remain or a side is constant.
    """
    o = options if options is not None else StatsOptions(n_boot=n_boot, n_perm=n_perm, level=level, seed=seed,
                                                         exact_max_n=exact_max_n)
    a, b = _pair(metric, quality, finite=False)
    keep = np.isfinite(a) & np.isfinite(b)
    a, b = a[keep], b[keep]
    n = int(a.size)
    reason = (f"needs at least {MIN_MODELS} models with a finite value, has {n}" if n < MIN_MODELS
              else "metric is constant across models" if np.all(a == a[0])
              else "quality is constant across models" if np.all(b == b[0]) else None)
    if reason is not None:
        nan = math.nan
        return Correlation(rho=nan, ci_low=nan, ci_high=nan, p_value=nan, kendall_tau=nan, pearson_r=nan, n=n,
                           reason=reason)
    low, high = bootstrap_ci(a, b, n_boot=o.n_boot, level=o.level, seed=o.seed)
    p, method = permutation_p_value(a, b, exact_max_n=o.exact_max_n, n_perm=o.n_perm, seed=o.seed)
    return Correlation(rho=spearman(a, b), ci_low=low, ci_high=high, p_value=p, kendall_tau=kendall_tau(a, b),
                       pearson_r=pearson(a, b), n=n, p_method=method)
