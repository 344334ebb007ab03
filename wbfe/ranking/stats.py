"""Rank correlations between a metric and a quality number, with their uncertainty (MATH.md §5).

Sign convention: every function reports the correlation *as computed* between the metric and the
quality, where the quality is already oriented so that higher means better (a lower-is-better column
such as perplexity is negated before it gets here). A metric for which lower predicts better — BFE-W,
the power-law α — therefore agrees with the data when ρ is *negative*.

All resampling is seeded: the same input and seed give the same interval and p-value.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import asdict, dataclass
from typing import Optional

import numpy as np

from wbfe.errors import InvalidOptionError
from wbfe.options import StatsOptions

__all__ = [
    "Correlation",
    "rankdata",
    "spearman",
    "kendall_tau",
    "pearson",
    "bootstrap_ci",
    "permutation_p_value",
    "correlate",
    "MIN_MODELS",
    "EXACT_MAX_N",
]

MIN_MODELS = 3
"""Fewest models a correlation is reported for; with two, every rank correlation is ±1."""

EXACT_MAX_N = 8
"""Largest n for which the permutation p-value enumerates all n! orderings (8! = 40,320)."""


@dataclass(frozen=True)
class Correlation:
    """How one metric ranks a zoo against its quality numbers.

    Attributes:
        rho: Spearman ρ (metric vs. oriented quality), NaN when undefined.
        ci_low, ci_high: percentile bootstrap interval of ρ over models.
        p_value: two-sided permutation p-value of ρ (H0: no association).
        p_method: ``"exact"`` (all n! orderings) or ``"monte-carlo"``; None when ρ is undefined.
        kendall_tau: Kendall τ-b.
        pearson_r: Pearson r of the raw values.
        n: models with a finite metric value and a quality value.
        reason: why ρ is NaN, else None.
    """

    rho: float
    ci_low: float
    ci_high: float
    p_value: float
    kendall_tau: float
    pearson_r: float
    n: int
    p_method: Optional[str] = None
    reason: Optional[str] = None

    def to_dict(self) -> dict[str, object]:
        """Plain dict of the fields."""
        return asdict(self)


def _pair(x: "np.typing.ArrayLike", y: "np.typing.ArrayLike") -> tuple[np.ndarray, np.ndarray]:
    a = np.asarray(x, dtype=np.float64).ravel()
    b = np.asarray(y, dtype=np.float64).ravel()
    if a.shape != b.shape:
        raise InvalidOptionError(f"x and y differ in length ({a.size} vs {b.size})")
    return a, b


def rankdata(values: "np.typing.ArrayLike", axis: int = -1) -> np.ndarray:
    """Ranks 1..n along ``axis``, ties given their average rank."""
    from scipy.stats import rankdata as _rankdata

    return np.asarray(_rankdata(values, method="average", axis=axis), dtype=np.float64)


def _rowwise_pearson(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Pearson r of each row pair of two (m, n) arrays; NaN where a row is constant."""
    da = a - a.mean(axis=-1, keepdims=True)
    db = b - b.mean(axis=-1, keepdims=True)
    num = np.sum(da * db, axis=-1)
    den = np.sqrt(np.sum(da * da, axis=-1) * np.sum(db * db, axis=-1))
    with np.errstate(invalid="ignore", divide="ignore"):
        r = num / den
    r = np.where(den > 0.0, r, np.nan)
    # Rounding can push |r| a hair past 1 for perfectly monotone data.
    return np.clip(r, -1.0, 1.0)


def pearson(x: "np.typing.ArrayLike", y: "np.typing.ArrayLike") -> float:
    """Pearson correlation coefficient; NaN when either input is constant or n < 2.

    Args:
        x, y: equal-length finite samples.

    Returns:
        r in [-1, 1], or NaN.
    """
    a, b = _pair(x, y)
    if a.size < 2:
        return math.nan
    return float(_rowwise_pearson(a[None, :], b[None, :])[0])


def spearman(x: "np.typing.ArrayLike", y: "np.typing.ArrayLike") -> float:
    """Spearman ρ: Pearson r of the average ranks; NaN when either input is constant or n < 2."""
    a, b = _pair(x, y)
    if a.size < 2:
        return math.nan
    return pearson(rankdata(a), rankdata(b))


def kendall_tau(x: "np.typing.ArrayLike", y: "np.typing.ArrayLike") -> float:
    """Kendall τ-b (tie-corrected), by counting all n(n−1)/2 pairs.

    Args:
        x, y: equal-length finite samples (zoos are small: O(n²) memory is fine below ~5,000).

    Returns:
        τ-b in [-1, 1]; NaN when either input is constant or n < 2.
    """
    a, b = _pair(x, y)
    n = a.size
    if n < 2:
        return math.nan
    i, j = np.triu_indices(n, k=1)
    sa = np.sign(a[i] - a[j])
    sb = np.sign(b[i] - b[j])
    concordance = float(np.sum(sa * sb))
    untied_a = float(np.count_nonzero(sa))
    untied_b = float(np.count_nonzero(sb))
    if untied_a == 0.0 or untied_b == 0.0:
        return math.nan
    return float(np.clip(concordance / math.sqrt(untied_a * untied_b), -1.0, 1.0))


def bootstrap_ci(
    x: "np.typing.ArrayLike",
    y: "np.typing.ArrayLike",
    *,
    n_boot: int = 2000,
    level: float = 0.95,
    seed: int = 0,
) -> tuple[float, float]:
    """Percentile bootstrap interval of Spearman ρ, resampling models (pairs) with replacement.

    Resamples in which either side is constant have no ρ and are dropped (for n ≥ 5 they are rare).

    Args:
        x, y: paired samples.
        n_boot: number of resamples.
        level: coverage of the interval, in (0, 1).
        seed: seed of the NumPy generator.

    Returns:
        ``(low, high)``; ``(nan, nan)`` when no resample has a defined ρ.

    Raises:
        InvalidOptionError: ``n_boot`` < 1 or ``level`` outside (0, 1).
    """
    if n_boot < 1:
        raise InvalidOptionError(f"n_boot must be at least 1, not {n_boot}")
    if not 0.0 < level < 1.0:
        raise InvalidOptionError(f"level must be in (0, 1), not {level}")
    a, b = _pair(x, y)
    n = a.size
    if n < 2:
        return math.nan, math.nan
    rng = np.random.default_rng(seed)
    rhos = []
    # Chunks bound memory at ~chunk·n floats whatever n_boot is.
    chunk = max(1, min(n_boot, 2_000_000 // max(n, 1)))
    done = 0
    while done < n_boot:
        m = min(chunk, n_boot - done)
        idx = rng.integers(0, n, size=(m, n))
        rhos.append(_rowwise_pearson(rankdata(a[idx], axis=1), rankdata(b[idx], axis=1)))
        done += m
    values = np.concatenate(rhos)
    values = values[np.isfinite(values)]
    if values.size == 0:
        return math.nan, math.nan
    alpha = (1.0 - level) / 2.0
    low, high = np.quantile(values, [alpha, 1.0 - alpha])
    return float(low), float(high)


def permutation_p_value(
    x: "np.typing.ArrayLike",
    y: "np.typing.ArrayLike",
    *,
    exact_max_n: int = EXACT_MAX_N,
    n_perm: int = 10_000,
    seed: int = 0,
) -> tuple[float, str]:
    """Two-sided permutation p-value of Spearman ρ: P(|ρ_perm| ≥ |ρ_obs|) under random pairing.

    For n ≤ ``exact_max_n`` every one of the n! orderings of ``y`` is enumerated (the observed one
    included), so the value is exact. Above, ``n_perm`` seeded random orderings give the Monte-Carlo
    estimate (1 + #{|ρ_perm| ≥ |ρ_obs|}) / (1 + n_perm), which is never 0.

    Args:
        x, y: paired samples.
        exact_max_n: largest n enumerated exactly.
        n_perm: random orderings for larger n.
        seed: seed of the NumPy generator (Monte-Carlo only).

    Returns:
        ``(p, method)`` with method ``"exact"`` or ``"monte-carlo"``; p is NaN when ρ is undefined.

    Raises:
        InvalidOptionError: ``n_perm`` < 1.
    """
    if n_perm < 1:
        raise InvalidOptionError(f"n_perm must be at least 1, not {n_perm}")
    a, b = _pair(x, y)
    n = a.size
    method = "exact" if n <= exact_max_n else "monte-carlo"
    ra, rb = rankdata(a), rankdata(b)
    observed = pearson(ra, rb)
    if not math.isfinite(observed):
        return math.nan, method
    # Ties in floating point: count values equal to the observed one up to rounding.
    threshold = abs(observed) - 1e-12
    if method == "exact":
        perms = np.array(list(itertools.permutations(range(n))), dtype=np.intp)
        hits = 0
        for start in range(0, len(perms), 50_000):
            block = perms[start : start + 50_000]
            r = _rowwise_pearson(np.broadcast_to(ra, block.shape), rb[block])
            hits += int(np.count_nonzero(np.abs(r) >= threshold))
        return hits / len(perms), method
    rng = np.random.default_rng(seed)
    hits = 0
    chunk = max(1, min(n_perm, 2_000_000 // max(n, 1)))
    done = 0
    while done < n_perm:
        m = min(chunk, n_perm - done)
        shuffled = rng.permuted(np.broadcast_to(rb, (m, n)), axis=1)
        r = _rowwise_pearson(np.broadcast_to(ra, (m, n)), shuffled)
        hits += int(np.count_nonzero(np.abs(r) >= threshold))
        done += m
    return (1 + hits) / (1 + n_perm), method


def correlate(
    metric: "np.typing.ArrayLike",
    quality: "np.typing.ArrayLike",
    *,
    n_boot: int = 2000,
    n_perm: int = 10_000,
    level: float = 0.95,
    seed: int = 0,
    exact_max_n: int = EXACT_MAX_N,
    options: "Optional[StatsOptions]" = None,
) -> Correlation:
    """Every statistic of a metric against a quality, on the pairs where both are finite.

    Args:
        metric: one value per model (NaN/inf = not available; such models are left out).
        quality: the quality per model, oriented so that higher is better.
        n_boot, level: bootstrap resamples and interval coverage.
        n_perm, exact_max_n: permutation settings (see :func:`permutation_p_value`).
        seed: seed shared by the bootstrap and the Monte-Carlo permutations.
        options: all of the above as one :class:`~wbfe.options.StatsOptions` (replaces them).

    Returns:
        A :class:`Correlation`; its numbers are NaN with a ``reason`` when fewer than
        :data:`MIN_MODELS` pairs remain or a side is constant.
    """
    if options is None:
        options = StatsOptions(n_boot=n_boot, n_perm=n_perm, level=level, seed=seed, exact_max_n=exact_max_n)
    n_boot, n_perm, level, seed, exact_max_n = (options.n_boot, options.n_perm, options.level, options.seed,
                                                options.exact_max_n)
    a, b = _pair(metric, quality)
    keep = np.isfinite(a) & np.isfinite(b)
    a, b = a[keep], b[keep]
    n = int(a.size)
    nan = math.nan
    if n < MIN_MODELS:
        return Correlation(nan, nan, nan, nan, nan, nan, n,
                           reason=f"needs at least {MIN_MODELS} models with a finite value, has {n}")
    if np.all(a == a[0]):
        return Correlation(nan, nan, nan, nan, nan, nan, n, reason="metric is constant across models")
    if np.all(b == b[0]):
        return Correlation(nan, nan, nan, nan, nan, nan, n, reason="quality is constant across models")
    rho = spearman(a, b)
    low, high = bootstrap_ci(a, b, n_boot=n_boot, level=level, seed=seed)
    p, method = permutation_p_value(a, b, exact_max_n=exact_max_n, n_perm=n_perm, seed=seed)
    return Correlation(
        rho=rho,
        ci_low=low,
        ci_high=high,
        p_value=p,
        kendall_tau=kendall_tau(a, b),
        pearson_r=pearson(a, b),
        n=n,
        p_method=method,
    )
