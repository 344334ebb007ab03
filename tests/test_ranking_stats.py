"""Correlation statistics against scipy.stats, brute-force enumeration and known answers."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from scipy import stats as sps

from wbfe.errors import InvalidOptionError
from wbfe.ranking import stats


def _samples(seed: int, n: int, ties: bool = False) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=n)
    y = 0.6 * x + rng.normal(size=n)
    if ties:
        x = np.round(x, 0)
        y = np.round(y, 0)
    return x, y


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("n", [3, 5, 12, 40])
@pytest.mark.parametrize("ties", [False, True])
def test_coefficients_match_scipy(seed: int, n: int, ties: bool) -> None:
    x, y = _samples(seed, n, ties)
    if np.ptp(x) == 0 or np.ptp(y) == 0:  # a rounded tiny sample can be constant: undefined, as in scipy
        assert math.isnan(stats.spearman(x, y)) and math.isnan(sps.spearmanr(x, y).statistic)
        return
    assert stats.spearman(x, y) == pytest.approx(sps.spearmanr(x, y).statistic, abs=1e-12)
    assert stats.kendall_tau(x, y) == pytest.approx(sps.kendalltau(x, y).statistic, abs=1e-12)
    assert stats.pearson(x, y) == pytest.approx(sps.pearsonr(x, y).statistic, abs=1e-12)


def test_constant_input_gives_nan() -> None:
    x = np.array([1.0, 1.0, 1.0, 1.0])
    y = np.array([1.0, 2.0, 3.0, 4.0])
    assert math.isnan(stats.spearman(x, y))
    assert math.isnan(stats.kendall_tau(x, y))
    assert math.isnan(stats.pearson(x, y))
    result = stats.correlate(x, y)
    assert math.isnan(result.rho) and result.reason == "metric is constant across models"
    swapped = stats.correlate(y, x)
    assert math.isnan(swapped.rho) and swapped.reason == "quality is constant across models"


def test_length_mismatch_raises() -> None:
    with pytest.raises(InvalidOptionError, match=r"x and y differ in length \(3 vs 2\)"):
        stats.spearman([1, 2, 3], [1, 2])


@pytest.mark.parametrize("x", [[[1.0, 2.0], [3.0, 4.0]], [[1.0, 2.0, 3.0, 4.0]], [[1.0], [2.0], [3.0], [4.0]], 2.0])
def test_input_that_is_not_1d_is_refused(x: object) -> None:
    """A 2-D table was flattened: [[1, 2], [3, 4]] against four qualities paired values of different models."""
    y = [4.0, 3.0, 1.0, 2.0]
    shape = np.shape(x)
    for fn in (stats.correlate, stats.bootstrap_ci, stats.permutation_p_value, stats.spearman, stats.kendall_tau,
               stats.pearson):
        with pytest.raises(InvalidOptionError) as info:
            fn(x, y)
        assert str(info.value) == f"x and y must be 1-D, one value per model; x has shape {shape}"
        with pytest.raises(InvalidOptionError, match=r"y has shape \(4, 1\)"):
            fn(y, np.reshape(y, (4, 1)))


def _brute_force_p(x: np.ndarray, y: np.ndarray) -> float:
    observed = abs(sps.spearmanr(x, y).statistic)
    hits = total = 0
    for perm in itertools.permutations(range(len(y))):
        rho = sps.spearmanr(x, y[list(perm)]).statistic
        hits += abs(rho) >= observed - 1e-12
        total += 1
    return hits / total


@pytest.mark.parametrize("n,seed", [(3, 0), (4, 1), (5, 2), (6, 3), (6, 4)])
def test_exact_permutation_p_matches_enumeration(n: int, seed: int) -> None:
    x, y = _samples(seed, n)
    p, method = stats.permutation_p_value(x, y)
    assert method == "exact"
    assert p == pytest.approx(_brute_force_p(x, y), abs=1e-15)


def test_exact_permutation_p_with_ties_matches_enumeration() -> None:
    x = np.array([1.0, 2.0, 2.0, 3.0, 5.0, 4.0])
    y = np.array([0.1, 0.3, 0.2, 0.3, 0.9, 0.4])
    p, method = stats.permutation_p_value(x, y)
    assert method == "exact"
    assert p == pytest.approx(_brute_force_p(x, y), abs=1e-15)


def test_known_exact_p_for_perfect_order() -> None:
    # Only the identity and the reversal reach |rho| = 1 among the 5! orderings.
    p, _ = stats.permutation_p_value(np.arange(5.0), np.arange(5.0) ** 2)
    assert p == pytest.approx(2 / 120, abs=1e-15)


def test_monte_carlo_p_close_to_exact() -> None:
    x, y = _samples(7, 8)
    exact, method = stats.permutation_p_value(x, y)
    assert method == "exact"
    mc, method = stats.permutation_p_value(x, y, exact_max_n=4, n_perm=20_000, seed=3)
    assert method == "monte-carlo"
    # Binomial standard error at 20,000 draws is at most 0.0036.
    assert mc == pytest.approx(exact, abs=0.015)
    assert mc > 0.0


def test_bootstrap_known_answer_perfect_monotone() -> None:
    # Every resample with two distinct models is perfectly ordered: rho* = 1 always.
    x = np.arange(10.0)
    low, high = stats.bootstrap_ci(x, np.exp(x), n_boot=500, seed=1)
    assert (low, high) == (1.0, 1.0)


def test_bootstrap_matches_exact_bootstrap_distribution() -> None:
    # For n = 5 the bootstrap distribution is known exactly: all 5^5 index tuples are equally
    # likely; the seeded Monte-Carlo interval must sit at its 2.5 % and 97.5 % points.
    x = np.array([0.3, 1.1, 0.7, 2.0, 1.6])
    y = np.array([0.2, 0.5, 0.9, 1.3, 1.0])
    exact = []
    for idx in itertools.product(range(5), repeat=5):
        xi, yi = x[list(idx)], y[list(idx)]
        if np.ptp(xi) > 0 and np.ptp(yi) > 0:
            exact.append(sps.spearmanr(xi, yi).statistic)
    exact_arr = np.sort(np.array(exact))
    low, high = stats.bootstrap_ci(x, y, n_boot=40_000, seed=11)

    def cdf_below(v: float) -> float:
        return float(np.mean(exact_arr < v - 1e-12))

    def cdf_at(v: float) -> float:
        return float(np.mean(exact_arr <= v + 1e-12))

    assert cdf_below(low) <= 0.025 + 0.005 and cdf_at(low) >= 0.025 - 0.005
    assert cdf_below(high) <= 0.975 + 0.005 and cdf_at(high) >= 0.975 - 0.005


def test_bootstrap_close_to_scipy_percentile_interval() -> None:
    x, y = _samples(5, 30)
    ours = stats.bootstrap_ci(x, y, n_boot=4000, seed=2)
    ref = sps.bootstrap(
        (x, y),
        lambda a, b: sps.spearmanr(a, b).statistic,
        paired=True,
        vectorized=False,
        n_resamples=4000,
        method="percentile",
        random_state=np.random.default_rng(2),
    ).confidence_interval
    assert ours[0] == pytest.approx(ref.low, abs=0.04)
    assert ours[1] == pytest.approx(ref.high, abs=0.04)


def test_seeded_results_are_reproducible() -> None:
    x, y = _samples(9, 25)
    a = stats.correlate(x, y, seed=4)
    b = stats.correlate(x, y, seed=4)
    assert a == b
    assert a.p_method == "monte-carlo"
    c = stats.correlate(x, y, seed=5)
    assert (c.ci_low, c.ci_high) != (a.ci_low, a.ci_high)


def test_correlate_drops_non_finite_and_reports_n() -> None:
    metric = np.array([1.0, 2.0, np.nan, 4.0, np.inf, 6.0])
    quality = np.array([6.0, 5.0, 4.0, 3.0, 2.0, np.nan])
    result = stats.correlate(metric, quality)
    assert result.n == 3
    assert result.rho == pytest.approx(-1.0)
    assert result.kendall_tau == pytest.approx(-1.0)
    assert result.p_value == pytest.approx(2 / 6)
    assert result.reason is None


def test_correlate_too_few_models() -> None:
    result = stats.correlate([1.0, 2.0], [2.0, 1.0])
    assert math.isnan(result.rho) and result.n == 2
    assert result.reason == "needs at least 3 models with a finite value, has 2"


@pytest.mark.parametrize("kwargs,message", [
    ({"n_boot": 0}, "n_boot must be a positive integer of at most 10,000,000 (each draw's ρ is kept), not 0"),
    ({"level": 1.0}, "level must be in (0, 1), not 1.0"),
])
def test_bootstrap_rejects_bad_options(kwargs: dict, message: str) -> None:
    with pytest.raises(InvalidOptionError) as info:
        stats.bootstrap_ci([1, 2, 3], [3, 1, 2], **kwargs)
    assert str(info.value) == message


def test_nan_or_text_input_is_refused() -> None:
    """The bootstrap of a NaN pair ranked around it: bootstrap_ci([1, nan, 3], [2, 1, 3]) gave (1.0, 1.0); text
    raised ValueError from numpy."""
    for fn in (stats.bootstrap_ci, stats.permutation_p_value, stats.spearman, stats.kendall_tau, stats.pearson):
        with pytest.raises(InvalidOptionError, match="x and y must be finite numbers; correlate"):
            fn([1.0, math.nan, 3.0], [2.0, 1.0, 3.0])
        with pytest.raises(InvalidOptionError, match="x and y must be sequences of numbers"):
            fn(["a", "b", "c"], [2.0, 1.0, 3.0])
    assert stats.correlate([1.0, math.nan, 3.0, 4.0, 2.0], [2.0, 1.0, 3.0, 5.0, 1.5]).n == 4  # drops the pair


def test_values_near_the_float_range_correlate_without_overflow() -> None:
    """np.ptp(±1e308) overflowed to inf with a RuntimeWarning on stderr; Pearson r is scale-free."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        huge = stats.correlate([1e308, -1e308, 1e300, 5.0], [1.0, 2.0, 4.0, 3.0])
    assert huge.rho == pytest.approx(sps.spearmanr([4, 1, 3, 2], [1, 2, 4, 3]).statistic, abs=1e-12)
    assert huge.pearson_r == pytest.approx(stats.pearson([1.0, -1.0, 1e-8, 5e-308], [1.0, 2.0, 4.0, 3.0]), abs=1e-12)


def test_resample_counts_past_the_bound_are_refused() -> None:
    """n_boot=10**12 ran for days before a MemoryError: scipy keeps every resample's ρ."""
    from wbfe.options import MAX_RESAMPLES

    for key in ("n_boot", "n_perm"):
        with pytest.raises(InvalidOptionError, match=f"^{key} must be a positive integer of at most {MAX_RESAMPLES:,} "
                                                     r"\(each draw's ρ is kept\), not 1000000000000$"):
            stats.correlate([1, 2, 3], [3, 1, 2], **{key: 10**12})


def test_an_integer_past_float64_is_refused_not_an_overflow_error():
    # np.asarray(10**400, float64) raises OverflowError: it escaped untyped.
    with pytest.raises(InvalidOptionError, match="^x and y must be sequences of numbers$"):
        stats.spearman([10**400, 1, 2], [1, 2, 3])


@pytest.mark.parametrize("function", [stats.bootstrap_ci, stats.permutation_p_value, stats.correlate])
def test_keyword_defaults_are_the_stats_options_defaults(function) -> None:  # noqa: ANN001
    """The keywords' defaults were written a second time in each signature; they are StatsOptions' own."""
    import inspect
    from dataclasses import fields

    from wbfe.options import StatsOptions

    own = {f.name: f.default for f in fields(StatsOptions)}
    shared = {name: p.default for name, p in inspect.signature(function).parameters.items() if name in own}
    assert shared and shared == {name: own[name] for name in shared}
    assert stats.EXACT_MAX_N == own["exact_max_n"] == 8  # the docstring's 8! = 40,320 orderings
