"""Tests of wbfe.metrics.powerlaw: CSN power-law fit, WeightWatcher-compatible mode, truncated PL."""

from __future__ import annotations

import math
import warnings
from typing import Optional

import numpy as np
import pytest

from wbfe.errors import InvalidOptionError
from wbfe.metrics.powerlaw import (
    WW_SMALL_N,
    fit_power_law,
    fit_power_law_in_range,
    fit_truncated_power_law,
    tpl_log_normaliser,
)


def pareto(alpha: float, n: int, seed: int, xmin: float = 1.0) -> np.ndarray:
    """Samples of p(x) ∝ x^(−alpha) on x ≥ xmin by inversion."""
    u = np.random.default_rng(seed).random(n)
    return xmin * (1.0 - u) ** (-1.0 / (alpha - 1.0))


def with_body(alpha: float, seed: int, n_tail: int = 1500, n_body: int = 500) -> np.ndarray:
    """A Pareto tail on [1, ∞) above a uniform body on [0.2, 1): the xmin search has work to do."""
    rng = np.random.default_rng(seed + 1000)
    return np.concatenate([rng.uniform(0.2, 1.0, n_body), pareto(alpha, n_tail, seed)])


def tpl_samples(alpha: float, lam: float, xmin: float, n: int, seed: int) -> np.ndarray:
    """Samples of p(x) ∝ x^(−alpha)·exp(−lam·x) on x ≥ xmin (exact rejection samplers)."""
    rng = np.random.default_rng(seed)
    chunks: list[np.ndarray] = []
    total = 0
    while total < n:
        if alpha > 1.0:
            # Pareto proposal, accepted with probability exp(−lam (x − xmin)).
            x = xmin * (1.0 - rng.random(4 * n)) ** (-1.0 / (alpha - 1.0))
            x = x[rng.random(x.size) < np.exp(-lam * (x - xmin))]
        else:
            # Gamma(1 − alpha, rate lam) has density ∝ x^(−alpha) e^(−lam x); condition on x ≥ xmin.
            x = rng.gamma(1.0 - alpha, 1.0 / lam, 4 * n)
            x = x[x >= xmin]
        chunks.append(x)
        total += x.size
    return np.concatenate(chunks)[:n]


def brute_force_fit(x: np.ndarray, *, min_tail: int, ww: bool) -> tuple[float, float, float]:
    """Independent, loop-per-candidate CSN scan (the obvious O(n²) code): (alpha, xmin, ks)."""
    x = np.sort(x)
    n = x.size
    best = (math.inf, math.nan, math.nan)
    for i in range(n - 1):
        tail = x[i:]
        nt = tail.size
        alpha = 1.0 + nt / float(np.sum(np.log(tail / tail[0])))
        if not ww and (nt < min_tail or not alpha > 1.0):
            continue
        if alpha > 1.0:
            ks = float(np.max(np.abs(1.0 - (tail / tail[0]) ** (1.0 - alpha) - np.arange(nt) / nt)))
        else:
            ks = 1.0
        if ks < best[0]:
            best = (ks, alpha, float(tail[0]))
    return best[1], best[2], best[0]


@pytest.mark.parametrize("alpha", [1.8, 2.5, 4.0])
@pytest.mark.parametrize("ww", [False, True])
def test_recovers_pareto_exponent(alpha: float, ww: bool) -> None:
    x = pareto(alpha, 4000, seed=int(alpha * 10))
    fit = fit_power_law(x, method="ww" if ww else "csn")
    assert fit.ok, fit.reason
    # CSN picks an xmin inside the pure tail; the estimate is within ~4 standard errors.
    assert abs(fit.alpha - alpha) < 4.0 * fit.sigma + 0.02
    assert fit.sigma == pytest.approx((fit.alpha - 1.0) / math.sqrt(fit.n_tail), rel=1e-15)
    assert fit.n_tail == int(np.count_nonzero(x >= fit.xmin))
    assert fit.xmax == pytest.approx(float(x.max()), rel=0)


def test_finds_the_start_of_the_tail() -> None:
    x = with_body(2.5, seed=3)
    fit = fit_power_law(x)
    assert 0.95 <= fit.xmin <= 1.3
    assert fit.alpha == pytest.approx(2.5, abs=0.1)


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("ww,min_tail", [(False, 10), (False, 50), (True, 2)])
def test_vectorised_scan_equals_brute_force(seed: int, ww: bool, min_tail: int) -> None:
    rng = np.random.default_rng(seed)
    x = np.concatenate([rng.gamma(2.0, 1.0, 300), pareto(3.0, 100, seed) * 5.0])
    fit = fit_power_law(x, min_tail=min_tail, method="ww" if ww else "csn")
    alpha, xmin, ks = brute_force_fit(x, min_tail=min_tail, ww=ww)
    assert fit.xmin == xmin
    assert fit.alpha == pytest.approx(alpha, rel=1e-12)
    assert fit.ks == pytest.approx(ks, rel=1e-10)


def test_min_tail_is_respected() -> None:
    # Top values placed so that the best unconstrained KS sits on a tiny tail.
    x = np.concatenate([np.linspace(1.0, 2.0, 200), [50.0, 51.0, 52.0, 60.0, 70.0]])
    for min_tail in (10, 30, 100):
        fit = fit_power_law(x, min_tail=min_tail)
        assert fit.n_tail >= min_tail


@pytest.mark.parametrize("n", [12, 19, 20, 60, 400])
def test_ww_mode_matches_weightwatcher_wwfit(n: int) -> None:
    ww_powerlaw = pytest.importorskip("weightwatcher.WW_powerlaw")
    rng = np.random.default_rng(n)
    x = np.sort(rng.standard_t(3, size=(n, 2 * n)).std(axis=1) ** 2 * pareto(3.0, n, n))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import contextlib
        import io

        with contextlib.redirect_stdout(io.StringIO()):  # WWFit prints "SMALL N PL FIT"
            ref = ww_powerlaw.WWFit(x)
    ours = fit_power_law(x, method="ww")
    assert ours.method == ("ww-small-n" if n < WW_SMALL_N else "ww")
    assert ours.xmin == float(ref.xmin)
    assert ours.alpha == pytest.approx(float(ref.alpha), rel=1e-12)
    assert ours.sigma == pytest.approx(float(ref.sigma), rel=1e-12)
    assert ours.ks == pytest.approx(float(ref.D), rel=1e-10)
    assert ours.n_tail == int(np.count_nonzero(x >= ref.xmin))


@pytest.mark.parametrize("alpha,seed", [(2.2, 1), (2.8, 3)])
def test_matches_powerlaw_package(alpha: float, seed: int) -> None:
    powerlaw = pytest.importorskip("powerlaw")
    x = with_body(alpha, seed, n_tail=800, n_body=250)
    ours = fit_power_law(x)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref = powerlaw.Fit(x, verbose=False)
    # powerlaw 2.0 uses the same one-sided KS and every unique value as a candidate; its default
    # alpha range (0, 3) does not bind for these exponents.
    assert ours.xmin == ref.xmin
    assert ours.alpha == pytest.approx(ref.alpha, rel=1e-12)
    assert ours.ks == pytest.approx(ref.D, rel=1e-10)


def test_scale_invariance() -> None:
    x = with_body(2.5, seed=5)
    a, b = fit_power_law(x), fit_power_law(x * 1e-7)
    assert b.alpha == pytest.approx(a.alpha, rel=1e-9)
    assert b.xmin == pytest.approx(a.xmin * 1e-7, rel=1e-12)


@pytest.mark.parametrize(
    "values,kwargs,reason",
    [
        (np.arange(1.0, 6.0), {}, "only 5 positive value(s), need a tail of at least 10"),
        (np.full(50, 3.0), {}, "degenerate spectrum: no tail of at least 10 values gives a finite alpha > 1"),
        (np.array([0.0, 1.0, 2.0] * 10), {}, "non-positive values (drop zero eigenvalues first)"),
        (np.array([1.0, np.nan] * 10), {}, "non-finite values"),
        (np.array([1.0]), {"method": "ww"}, "only 1 value(s), need at least 2"),
        (np.full(50, 3.0), {"method": "ww"}, "degenerate tail: alpha = inf at the best xmin"),
        (np.full(10, 3.0), {"method": "ww"}, "degenerate spectrum: all values equal"),
    ],
)
def test_failures_are_nan_with_reason(values: np.ndarray, kwargs: dict, reason: str) -> None:
    fit = fit_power_law(values, **kwargs)
    assert not fit.ok
    assert fit.reason == reason
    assert math.isnan(fit.alpha) and math.isnan(fit.sigma) and math.isnan(fit.xmin) and math.isnan(fit.ks)


@pytest.mark.parametrize(
    "values,lo,hi,reason",
    [
        (np.array([1.0, np.nan, 3.0] * 10), 1.0, 3.0, "non-finite or non-positive values"),
        (np.array([0.0, 1.0, 3.0] * 10), 1.0, 3.0, "non-finite or non-positive values"),
        (np.arange(1.0, 30.0), 40.0, 50.0, "no candidate xmin in [40, 50)"),
        # candidates 21 … 24 (25, the largest in the range, is dropped): tails of 9 values or fewer
        (np.arange(1.0, 30.0), 21.0, 26.0, "no candidate xmin in [21, 26) gives alpha > 1 with a tail of 10"),
    ],
)
def test_range_fit_failures_are_nan_with_reason(values: np.ndarray, lo: float, hi: float, reason: str) -> None:
    fit = fit_power_law_in_range(values, lo, hi)
    assert fit.reason == reason and fit.method == "range"
    assert math.isnan(fit.alpha) and math.isnan(fit.xmin)


def test_min_tail_below_two_is_rejected() -> None:
    with pytest.raises(InvalidOptionError, match="^min_tail must be at least 2, not 1$"):
        fit_power_law(np.arange(1.0, 20.0), min_tail=1)
    with pytest.raises(ValueError):  # also the built-in
        fit_power_law(np.arange(1.0, 20.0), min_tail=0)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"min_tail": None}, "min_tail must be at least 2, not None"),  # TypeError from the comparison
    ({"min_tail": math.nan}, "min_tail must be at least 2, not nan"),  # accepted: "no tail of at least nan values"
    ({"min_tail": True}, "min_tail must be at least 2, not True"),
    ({"method": "WW"}, "method must be 'csn' or 'ww', not 'WW'"),  # silently the csn fit
])
def test_fit_options_that_are_not_options_are_refused(kwargs: dict, message: str) -> None:
    with pytest.raises(InvalidOptionError, match=f"^{message}$"):
        fit_power_law(np.arange(1.0, 30.0), **kwargs)
    assert fit_power_law(np.arange(1.0, 30.0), min_tail=np.int64(5)).ok  # numpy integers are integers


def test_truncated_fit_of_values_it_cannot_fit_says_why() -> None:
    sample = pareto(2.5, 200, seed=3)
    # NaN and inf were dropped and the rest fitted as if it were the sample
    for bad in (math.nan, math.inf):
        fit = fit_truncated_power_law(np.r_[sample, bad])
        assert fit.reason == "non-finite values" and math.isnan(fit.alpha) and math.isnan(fit.lam)
    # Λ = Λ'/xmin past float64's range was reported as inf with no reason
    fit = fit_truncated_power_law(np.linspace(1.0, 2.0, 30) * 1e-310)
    assert math.isnan(fit.lam) and fit.reason is not None and "overflows" in fit.reason
    for xmin in (-1.0, 0.0, math.nan, math.inf):  # -1 raised "math domain error"
        with pytest.raises(InvalidOptionError, match="xmin must be a positive number"):
            fit_truncated_power_law(sample, xmin=xmin)


@pytest.mark.parametrize(("alpha", "lam", "xmin"), [(2.0, math.inf, 1.0), (math.nan, 1.0, 1.0), (2.0, 1.0, math.inf),
                                                    (2.0, 0.0, 1.0), (2.0, 1.0, -1.0)])
def test_normaliser_outside_its_domain_is_refused(alpha: float, lam: float, xmin: float) -> None:
    # Λ = inf looped forever (panels of width 0)
    with pytest.raises(InvalidOptionError, match="need a finite alpha"):
        tpl_log_normaliser(alpha, lam, xmin)


@pytest.mark.parametrize(
    "alpha,lam,xmin",
    [
        (2.5, 0.3, 1.0),
        (0.5, 2.0, 0.7),
        (-1.0, 5.0, 2.0),
        (1.0, 1e-3, 1.0),
        (3.0, 1e-8, 0.01),
        (1.5, 100.0, 3.0),
        (0.2, 1e-5, 1.0),
        (37.1, 5e-18, 1.0),
        (-15.0, 1e7, 1.0),
        # A flat peak (curvature 1 − α ≈ 7e-5): its first panel once spanned 57 e-folds.
        (0.9999251378006888, 3.4345278851413745e-05, 1.0),
    ],
)
def test_tpl_normaliser_against_mpmath(alpha: float, lam: float, xmin: float) -> None:
    mpmath = pytest.importorskip("mpmath")
    mpmath.mp.dps = 30
    ref = mpmath.log(mpmath.power(lam, alpha - 1) * mpmath.gammainc(1 - alpha, lam * xmin))
    assert tpl_log_normaliser(alpha, lam, xmin) == pytest.approx(float(ref), rel=1e-12, abs=1e-13)


@pytest.mark.parametrize("alpha,lam,xmin", [(2.0, 0.5, 1.0), (0.5, 1.0, 1.0), (1.5, 0.02, 2.0)])
def test_tpl_recovers_alpha_and_lambda(alpha: float, lam: float, xmin: float) -> None:
    x = tpl_samples(alpha, lam, xmin, 100_000, seed=int(10 * alpha))
    fit = fit_truncated_power_law(x, xmin=xmin)
    assert fit.ok, fit.reason
    assert fit.n_tail == 100_000
    # Measured spread over seeds at this n: sd(α) ≈ 0.015–0.025, sd(Λ)/Λ ≈ 1.5 %; bounds ≈ 4 sd.
    assert fit.alpha == pytest.approx(alpha, abs=0.08)
    assert fit.lam == pytest.approx(lam, rel=0.06)


def test_tpl_recovers_a_gamma_tail_far_below_alpha_zero() -> None:
    # A Gamma(k, r) law restricted to x >= xmin is exactly a TPL with α = 1 − k, Λ = r.
    rng = np.random.default_rng(3)
    x = rng.gamma(60.0, 1 / 2.0, 40_000)
    fit = fit_truncated_power_law(x[x >= 25.0], xmin=25.0)
    assert fit.ok, fit.reason
    # Measured over 20 seeds: mean α = −59.14, sd 0.70; mean Λ = 2.005, sd 0.022.
    assert fit.alpha == pytest.approx(-59.0, abs=3.0)
    assert fit.lam == pytest.approx(2.0, abs=0.09)


def test_tpl_maximum_has_zero_score() -> None:
    # The TPL is an exponential family: at the MLE the model's E[log x] and E[x] equal the data's.
    mpmath = pytest.importorskip("mpmath")
    mpmath.mp.dps = 30
    x = tpl_samples(1.5, 0.3, 1.0, 2000, seed=4)
    fit = fit_truncated_power_law(x, xmin=1.0)
    a, lam = mpmath.mpf(fit.alpha), mpmath.mpf(fit.lam)
    z = mpmath.quad(lambda t: t ** (-a) * mpmath.exp(-lam * t), [1, 10, mpmath.inf])
    e_log = mpmath.quad(lambda t: mpmath.log(t) * t ** (-a) * mpmath.exp(-lam * t), [1, 10, mpmath.inf]) / z
    e_x = mpmath.quad(lambda t: t ** (1 - a) * mpmath.exp(-lam * t), [1, 10, mpmath.inf]) / z
    assert float(e_log) == pytest.approx(float(np.mean(np.log(x))), rel=1e-9)
    assert float(e_x) == pytest.approx(float(np.mean(x)), rel=1e-9)


def test_tpl_at_the_boundary_is_the_power_law() -> None:
    # Truncating cannot raise the likelihood when the data's mean is at least the power law's:
    # the MLE is Λ = 0 with the plain power-law exponent.
    x = 1.0 + np.array([0.0, 0.1, 0.2, 0.5, 40.0])
    mean_log = float(np.mean(np.log(x)))
    alpha_pl = 1.0 + 1.0 / mean_log
    assert alpha_pl > 2.0 and np.mean(x) >= (alpha_pl - 1.0) / (alpha_pl - 2.0)
    fit = fit_truncated_power_law(x, xmin=1.0)
    assert fit.lam == 0.0
    assert fit.alpha == pytest.approx(alpha_pl, rel=1e-15)
    assert fit.loglik == pytest.approx(x.size * (math.log(alpha_pl - 1.0) - alpha_pl * mean_log), rel=1e-12)


def test_tpl_is_a_maximum_of_the_likelihood() -> None:
    x = tpl_samples(2.0, 0.5, 1.0, 3000, seed=9)
    fit = fit_truncated_power_law(x, xmin=1.0)

    def loglik(a: float, lam: float) -> float:
        return float(-a * np.sum(np.log(x)) - lam * np.sum(x) - x.size * tpl_log_normaliser(a, lam, 1.0))

    assert fit.loglik == pytest.approx(loglik(fit.alpha, fit.lam), rel=1e-10)
    for da, dl in [(0.01, 0), (-0.01, 0), (0, 0.01), (0, -0.01)]:
        assert loglik(fit.alpha + da, fit.lam * (1 + dl)) < fit.loglik


def test_tpl_on_a_pure_power_law_has_no_truncation() -> None:
    x = pareto(2.5, 5000, seed=11)
    fit = fit_truncated_power_law(x, xmin=1.0)
    alpha_pl = 1.0 + x.size / float(np.sum(np.log(x)))
    loglik_pl = x.size * math.log(alpha_pl - 1.0) - alpha_pl * float(np.sum(np.log(x)))
    # Nested models: the truncation must not improve the fit significantly (χ²₁, 1 %: 6.63) ...
    assert 0.0 <= 2.0 * (fit.loglik - loglik_pl) < 6.63
    # ... and the exponent stays that of the power law.
    assert fit.alpha == pytest.approx(alpha_pl, abs=0.05)


def test_tpl_failures() -> None:
    assert fit_truncated_power_law(np.array([1.0, 2.0]), xmin=1.0).reason == "only 2 value(s) >= xmin, need 3"
    assert fit_truncated_power_law(np.full(10, 2.0)).reason == "degenerate tail: all values equal xmin"
    assert fit_truncated_power_law(np.zeros(5)).reason == "no positive values"
    assert math.isnan(fit_truncated_power_law(np.zeros(5)).alpha)


@pytest.mark.parametrize(("values", "xmin", "n_tail", "reason"), [
    (np.r_[1.0, math.nan], math.nan, 0, "non-finite values"),
    (np.zeros(5), math.nan, 0, "no positive values"),
    (np.array([1.0, 2.0]), 1.0, 2, "only 2 value(s) >= xmin, need 3"),
    (np.full(10, 2.0), 2.0, 10, "degenerate tail: all values equal xmin"),
    (np.linspace(1.0, 2.0, 30) * 1e-310, 1e-310, 30, None),  # "lambda = .../xmin overflows"
])
def test_tpl_failure_is_nan_with_the_tail_it_tried(values: np.ndarray, xmin: float, n_tail: int,
                                                   reason: Optional[str]) -> None:
    # Every failure, whichever step refused, is the same: NaN alpha, lambda and log-likelihood, the xmin and tail tried.
    fit = fit_truncated_power_law(values)
    assert not fit.ok and (fit.reason == reason if reason else str(fit.reason).endswith("/xmin overflows"))
    assert math.isnan(fit.alpha) and math.isnan(fit.lam) and math.isnan(fit.loglik) and fit.n_tail == n_tail
    assert fit.xmin == xmin or (math.isnan(fit.xmin) and math.isnan(xmin))


def test_newton_step_solves_the_damped_system() -> None:
    """The TPL Newton step (LDLᵀ in closed form) against LAPACK's solve, on covariances as in the fit."""
    from wbfe.metrics.powerlaw import _newton_step

    rng = np.random.default_rng(12)
    for _ in range(500):
        sd, r = 10.0 ** rng.uniform(-6, 6, 2), rng.uniform(-0.999, 0.999)
        a = np.array([[sd[0] ** 2, r * sd[0] * sd[1]], [r * sd[0] * sd[1], sd[1] ** 2]])
        g = rng.standard_normal(2) * 10.0 ** rng.uniform(-10, 5)
        step = np.array(_newton_step(g[0], g[1], a[0, 0], a[0, 1], a[1, 1]))
        ref = -np.linalg.solve(a, g)
        # Both backward stable: the same solution to within the condition number times rounding.
        assert np.allclose(step, ref, rtol=1e-9 * np.linalg.cond(a), atol=0.0)
    # Not positive definite: the diagonal is raised by the first of 1e-3, 1e-2, … times itself
    # that makes it so (Levenberg–Marquardt): here 1 + d > 2, i.e. d = 10.
    g = np.array([1.0, -2.0])
    step = np.array(_newton_step(g[0], g[1], 1.0, 2.0, 1.0))
    d = 1e-3 * 10.0 * 10.0 * 10.0 * 10.0
    assert np.allclose(step, -np.linalg.solve(np.array([[1.0 + d, 2.0], [2.0, 1.0 + d]]), g), rtol=1e-14)
    assert float(g @ step) < 0.0
    # Not finite: the identity, a gradient step.
    assert _newton_step(1.0, -2.0, math.nan, 0.0, 1.0) == (-1.0, 2.0)


def test_the_narrow_tail_reaches_the_optimum() -> None:
    """A tail with α ≈ −60 has a nearly singular Hessian (log y and y nearly proportional): the
    fit still ends at the likelihood's stationary point, the data's mean statistics matched."""
    mpmath = pytest.importorskip("mpmath")
    mpmath.mp.dps = 30
    x = np.random.default_rng(3).gamma(60.0, 1 / 2.0, 400)
    xmin = float(np.quantile(x, 0.9))
    fit = fit_truncated_power_law(x, xmin=xmin)
    assert fit.ok and fit.alpha < -20.0
    a, lam = mpmath.mpf(fit.alpha), mpmath.mpf(fit.lam)
    tail = x[x >= xmin]
    cut = [xmin, xmin * 1.2, xmin * 2, mpmath.inf]
    z = mpmath.quad(lambda t: t ** (-a) * mpmath.exp(-lam * t), cut)
    e_log = mpmath.quad(lambda t: mpmath.log(t) * t ** (-a) * mpmath.exp(-lam * t), cut) / z
    e_x = mpmath.quad(lambda t: t ** (1 - a) * mpmath.exp(-lam * t), cut) / z
    assert float(e_log) == pytest.approx(float(np.mean(np.log(tail))), rel=1e-12)
    assert float(e_x) == pytest.approx(float(np.mean(tail)), rel=1e-12)
    assert math.isfinite(fit.loglik)
