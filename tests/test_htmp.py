"""The HTMP law, its fit, F∞, h* and the ``htmp`` metric group (docs/math.md §3)."""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np
import pytest
from scipy import integrate, optimize, stats

from wbfe.errors import InvalidOptionError
from wbfe.metrics import bfe as bfe_module
from wbfe.metrics import htmp
from wbfe.metrics._group import MetricOptions, Spectrum

# (κ, γ, β, τ): small and large γ, a δ < 1 case (density infinite at the edge), a gap.
LAWS = [
    (2.0, 0.5, 1.0, 0.0),
    (0.3, 0.2, 3.0, 0.0),
    (20.0, 0.1, 0.5, 0.0),
    (1.0, 0.9, 2.0, 0.0),
    (6.0, 0.25, 1.5, 0.4),
]


def _expect(fn, kappa: float, gamma: float, beta: float, tau: float, upper: float = math.inf) -> float:
    """∫ fn(x) ρ(x) dx over (τ, upper) by quadrature in t = log(x − τ) (smooths the edge)."""
    c = kappa / (2.0 * gamma)
    sd = math.sqrt(c * (kappa / 2.0 + 1.0))
    delta = c - kappa / 2.0
    # below y = (1e-15)^(1/δ) the mass (≈ const·y^δ) is negligible
    lo = max(math.log(1e-15) / delta, -650.0) - math.log(beta)
    hi = math.log((c + 40.0 * sd + 60.0) / beta)
    if upper < math.inf:
        hi = min(hi, math.log(upper - tau))
    bulk = [math.log(max(c + k * sd, 1e-3 * c) / beta) for k in (-3, -1, 0, 1, 3)]
    points = sorted(p for p in bulk if lo < p < hi)

    def integrand(t: float) -> float:
        x = tau + math.exp(t)
        return fn(x) * float(htmp.pdf(x, kappa, gamma, beta, tau)) * math.exp(t)

    # epsabs stops quad chasing relative accuracy in tails that hold < 1e-13 of the mass
    value, _ = integrate.quad(integrand, lo, hi, points=points, limit=400, epsabs=1e-13, epsrel=1e-10)
    return value


@pytest.mark.parametrize("law", LAWS)
def test_density_integrates_to_one(law) -> None:
    assert _expect(lambda x: 1.0, *law) == pytest.approx(1.0, abs=2e-9)


@pytest.mark.parametrize("law", LAWS)
def test_closed_form_moments_equal_integrals_of_the_density(law) -> None:
    kappa, gamma, beta, tau = law
    mean = htmp.mean(*law)
    assert mean == pytest.approx(tau + kappa / (2 * gamma * beta))
    assert _expect(lambda x: x, *law) == pytest.approx(mean, rel=1e-8)
    assert _expect(lambda x: (x - mean) ** 2, *law) == pytest.approx(htmp.variance(*law), rel=1e-7)
    assert _expect(math.log, *law) == pytest.approx(htmp.log_moment(*law), rel=1e-8, abs=1e-8)


@pytest.mark.parametrize("law", LAWS)
def test_cdf_matches_the_integrated_density(law) -> None:
    kappa, gamma, beta, tau = law
    mean, sd = htmp.mean(*law), math.sqrt(htmp.variance(*law))
    xs = [x for x in (mean - 1.5 * sd, mean - 0.5 * sd, mean, mean + sd, mean + 3 * sd) if x > tau]
    cdf = htmp.cdf(np.array(xs), *law)
    assert np.all(np.diff(cdf) > 0)
    for x, value in zip(xs, cdf):
        assert value == pytest.approx(_expect(lambda v: 1.0, *law, upper=x), abs=1e-8)
    assert htmp.cdf(tau, *law) == 0.0
    assert htmp.cdf(tau + 1e4 * mean + 1e3, *law) == pytest.approx(1.0, abs=1e-12)


def _mp_cdf(x: np.ndarray, gamma: float) -> np.ndarray:
    """Marchenko–Pastur CDF for mean 1 and ratio γ, by quadrature of its density."""
    lo, hi = (1 - math.sqrt(gamma)) ** 2, (1 + math.sqrt(gamma)) ** 2

    def density(v: float) -> float:
        return math.sqrt(max((hi - v) * (v - lo), 0.0)) / (2 * math.pi * gamma * v)

    return np.array([integrate.quad(density, lo, min(max(v, lo), hi))[0] for v in x])


def test_large_kappa_approaches_marchenko_pastur() -> None:
    gamma = 0.25
    x = np.linspace(0.1, 2.4, 40)
    reference = _mp_cdf(x, gamma)
    gaps = []
    for kappa in (10.0, 60.0, 300.0):
        beta = kappa / (2 * gamma)  # mean 1, variance γ(κ+2)/κ -> γ, the MP values
        gaps.append(np.max(np.abs(htmp.cdf(x, kappa, gamma, beta) - reference)))
    assert gaps[0] > gaps[1] > gaps[2]
    assert gaps[2] < 0.03


def test_small_kappa_at_fixed_c_approaches_gamma() -> None:
    c, beta = 2.0, 1.5
    x = np.linspace(0.05, 6.0, 30)
    reference = stats.gamma.cdf(x, c, scale=1.0 / beta)
    gaps = []
    for kappa in (1.0, 0.1, 0.01):
        gamma = kappa / (2 * c)
        gaps.append(np.max(np.abs(htmp.cdf(x, kappa, gamma, beta) - reference)))
    assert gaps[0] > gaps[1] > gaps[2]
    assert gaps[2] < 5e-3


@pytest.mark.parametrize("law", [LAWS[0], LAWS[4]])
def test_f_inf_is_the_expected_bfe_formula(law) -> None:
    kappa, gamma, beta, tau = law
    lam = 0.7
    expected = _expect(lambda x: lam / 2 * x - 0.5 * math.log(x) + 0.5 * math.log(2 * math.pi / lam), *law)
    assert htmp.f_inf(lam, *law) == pytest.approx(expected, rel=1e-9)
    # and the BFE-W module on a large sample agrees to sampling accuracy
    draws = htmp.sample(200_000, *law, seed=5)
    value, _ = bfe_module.bfe(draws, lam)
    assert value == pytest.approx(expected, abs=0.01)


def test_f_inf_at_lambda_star_has_the_closed_form() -> None:
    kappa, gamma, beta, tau = LAWS[4]
    lam = 1.0 / htmp.mean(kappa, gamma, beta, tau)
    c_g = beta * tau
    from wbfe.metrics.special import log_hyperu

    closed = 0.5 * math.log(2 * math.pi * math.e) + 0.5 * math.log(c_g + kappa / (2 * gamma))
    closed += float(log_hyperu(kappa / 2, 1 - kappa * (1 - gamma) / (2 * gamma), c_g)) / kappa
    assert htmp.f_inf(lam, kappa, gamma, beta, tau) == pytest.approx(closed, rel=1e-12)


@pytest.mark.parametrize("kappa,gamma,lam", [(2.0, 0.5, 1.3), (0.4, 0.1, 0.2), (30.0, 0.8, 5.0)])
def test_h_star_minimises_f_inf_without_a_gap(kappa: float, gamma: float, lam: float) -> None:
    res = optimize.minimize_scalar(
        lambda lb: htmp.f_inf(lam, kappa, gamma, math.exp(lb)), bounds=(-15, 15), method="bounded",
        options={"xatol": 1e-10},
    )
    assert kappa / math.exp(res.x) == pytest.approx(htmp.h_star(lam, gamma), rel=1e-6)
    assert htmp.h_star(lam, gamma) == pytest.approx(2 * gamma / lam)
    assert htmp.h_star(lam, gamma, kappa, 0.0) == htmp.h_star(lam, gamma)


@pytest.mark.parametrize("kappa,gamma,lam,c_g", [(2.0, 0.5, 1.3, 0.7), (8.0, 0.2, 0.5, 3.0)])
def test_h_star_minimises_f_inf_with_a_gap(kappa: float, gamma: float, lam: float, c_g: float) -> None:
    # the gap constant c_g = βτ is held fixed while β (hence h = κ/β and τ = c_g/β) moves
    res = optimize.minimize_scalar(
        lambda lb: htmp.f_inf(lam, kappa, gamma, math.exp(lb), c_g / math.exp(lb)),
        bounds=(-15, 15),
        method="bounded",
        options={"xatol": 1e-10},
    )
    h_opt = htmp.h_star(lam, gamma, kappa=kappa, c=c_g)
    assert kappa / math.exp(res.x) == pytest.approx(h_opt, rel=1e-6)
    assert h_opt == pytest.approx(2 * gamma * kappa / (lam * (kappa + 2 * gamma * c_g)))


def test_sample_is_seeded_and_follows_the_law() -> None:
    law = LAWS[0]
    first = htmp.sample(2000, *law, seed=11)
    assert np.array_equal(first, htmp.sample(2000, *law, seed=11))
    assert not np.array_equal(first, htmp.sample(2000, *law, seed=12))
    ks = stats.kstest(first, lambda x: htmp.cdf(x, *law))
    assert ks.pvalue > 0.01
    assert np.all(first > law[3])


@lru_cache(maxsize=None)
def _draws(law: tuple[float, float, float, float], n: int = 20_000) -> np.ndarray:
    return htmp.sample(n, *law, seed=2026)


@pytest.mark.parametrize("law", [LAWS[0], LAWS[1], LAWS[2], LAWS[3]])
def test_fit_recovers_kappa_and_beta(law) -> None:
    kappa, gamma, beta, tau = law
    result = htmp.fit(_draws(law), gamma, tau=0.0)
    assert result.converged
    assert result.kappa == pytest.approx(kappa, rel=0.05)
    assert result.beta == pytest.approx(beta, rel=0.05)
    assert result.ks < 0.02
    assert result.h == pytest.approx(result.kappa / result.beta)


def test_fit_with_the_default_tau_sits_just_below_the_smallest_eigenvalue() -> None:
    law = LAWS[4]
    draws = _draws(law, 2000)
    result = htmp.fit(draws, law[1])
    e = np.sort(draws)
    assert result.tau == pytest.approx(max(0.0, e[0] - (e[1] - e[0])))
    assert 0.0 <= result.tau < e[0]
    assert result.converged and result.n == 2000
    loglik = float(np.sum(htmp.logpdf(draws, result.kappa, law[1], result.beta, result.tau)))
    assert result.loglik == pytest.approx(loglik, rel=1e-6)
    # the fit is a maximum: nudging κ or β lowers the likelihood
    for dk, db in ((1.02, 1.0), (0.98, 1.0), (1.0, 1.02), (1.0, 0.98)):
        other = np.sum(htmp.logpdf(draws, result.kappa * dk, law[1], result.beta * db, result.tau))
        assert other < loglik


def _spectrum(eigs: np.ndarray, gamma_inv: int = 4) -> Spectrum:
    return Spectrum(eigs=np.sort(eigs), rows=eigs.size, cols=gamma_inv * eigs.size)


def test_group_gives_finite_columns_and_the_right_diagnosis() -> None:
    law = (4.0, 0.25, 2.0, 0.0)
    spec = _spectrum(htmp.sample(1000, *law, seed=3))
    lam_star = 1.0 / float(np.mean(spec.eigs))
    base = htmp.GROUP.compute(spec, MetricOptions(lam="opt"))
    numeric = [col for col in htmp.GROUP.columns if col != "diagnosis"]
    assert all(math.isfinite(base.values[col]) for col in numeric)
    assert base.values["h"] == pytest.approx(base.values["htmp_kappa"] / base.values["htmp_beta"])
    assert base.values["h_star"] == pytest.approx(
        htmp.h_star(lam_star, 0.25, base.values["htmp_kappa"], base.values["htmp_beta"] * base.values["htmp_tau"])
    )
    assert base.values["f_inf"] == pytest.approx(
        htmp.f_inf(lam_star, base.values["htmp_kappa"], 0.25, base.values["htmp_beta"], base.values["htmp_tau"])
    )
    h = base.values["h"]
    # h* = 2γκ/[λ(κ + 2γ c_g)] ∝ 1/λ: a large λ puts h above h*, a small one below.
    under = htmp.GROUP.compute(spec, MetricOptions(lam=100.0 * lam_star)).values
    over = htmp.GROUP.compute(spec, MetricOptions(lam=0.01 * lam_star)).values
    assert under["h"] > under["h_star"] and under["diagnosis"] == "under-fit side"
    assert over["h"] < over["h_star"] and over["diagnosis"] == "over-fit side"
    lam_eq = lam_star * base.values["h_star"] / h  # makes h* = h
    assert htmp.GROUP.compute(spec, MetricOptions(lam=lam_eq)).values["diagnosis"] == "near optimum"


def test_diagnose_tolerance() -> None:
    assert htmp.diagnose(1.04, 1.0) == "near optimum"
    assert htmp.diagnose(1.06, 1.0) == "under-fit side"
    assert htmp.diagnose(1.0 / 1.06, 1.0) == "over-fit side"


def test_group_drops_zero_eigenvalues_with_a_reason() -> None:
    eigs = np.concatenate([np.zeros(7), htmp.sample(500, 4.0, 0.25, 2.0, seed=4)])
    result = htmp.GROUP.compute(_spectrum(eigs), MetricOptions())
    assert math.isfinite(result.values["htmp_kappa"])
    assert result.reasons["htmp_kappa"].startswith("7 exact zero eigenvalue(s)")


@pytest.mark.parametrize(
    "spec,reason",
    [
        (Spectrum(eigs=np.linspace(1.0, 2.0, 50), rows=50, cols=50), "square matrix"),
        (Spectrum(eigs=np.array([0.0, 0.0, 1.0, 2.0]), rows=4, cols=16), "only 2 nonzero"),
        (Spectrum(eigs=np.ones(40), rows=40, cols=160), "degenerate spectrum"),
    ],
)
def test_group_failures_are_nan_with_a_reason(spec: Spectrum, reason: str) -> None:
    result = htmp.GROUP.compute(spec, MetricOptions())
    for col in htmp.GROUP.columns:
        if col != "diagnosis":
            assert math.isnan(result.values[col])
            assert result.reasons[col].startswith(reason)
    assert result.values["diagnosis"].startswith("no fit: " + reason)


def test_group_metadata_and_public_alias() -> None:
    import wbfe
    from wbfe import htmp as alias

    # one module object, whichever way it is reached
    assert alias is htmp and wbfe.htmp is htmp
    assert htmp.GROUP.name == "htmp"
    assert htmp.GROUP.columns == ("htmp_kappa", "htmp_beta", "htmp_tau", "htmp_ks", "h", "h_star", "f_inf", "diagnosis")
    assert htmp.GROUP.summary_columns == ("htmp_kappa", "h", "f_inf")


@pytest.mark.parametrize(
    "call",
    [
        lambda: htmp.pdf(1.0, -1.0, 0.5, 1.0),
        lambda: htmp.pdf(1.0, 1.0, 1.0, 1.0),
        lambda: htmp.cdf(1.0, 1.0, 0.5, 0.0),
        lambda: htmp.mean(1.0, 0.5, 1.0, -0.1),
        lambda: htmp.f_inf(0.0, 1.0, 0.5, 1.0),
        lambda: htmp.h_star(1.0, 0.5, None, 2.0),
        lambda: htmp.sample(-1, 1.0, 0.5, 1.0),
        lambda: htmp.fit(np.array([1.0, 2.0, -1.0]), 0.5),
        lambda: htmp.fit(np.array([1.0, 2.0, 3.0]), 0.5, tau=1.5),
    ],
)
def test_invalid_arguments_raise(call) -> None:
    with pytest.raises(InvalidOptionError):
        call()


@pytest.mark.parametrize("gamma", [0.0, 1.0, 1.5, math.nan])
@pytest.mark.parametrize(
    "call",
    [
        lambda g: htmp.pdf(1.0, 1.0, g, 1.0),
        lambda g: htmp.h_star(1.0, g),
        lambda g: htmp.fit(np.arange(1.0, 20.0), g),
        lambda g: htmp.fit_many([np.arange(1.0, 20.0)], g),
        bfe_module.bfe_marchenko_pastur_limit,
    ],
)
def test_an_aspect_ratio_outside_0_1_is_refused_in_the_same_words(call, gamma: float) -> None:
    with pytest.raises(InvalidOptionError, match=rf"^gamma must lie in \(0, 1\), not {gamma!r}$"):
        call(gamma)


@pytest.mark.parametrize("c", [-1.0, math.inf, math.nan])
def test_h_star_refuses_a_gap_constant_that_is_not_a_positive_number(c: float) -> None:
    with pytest.raises(InvalidOptionError, match=rf"^gap constant c must be >= 0, not {c!r}$"):
        htmp.h_star(1.0, 0.5, 2.0, c)


@pytest.mark.parametrize("law", [(2.0, 0.5, 1.0), (1.0, 0.9, 2.0), (60.0, 0.5, 4.0), (0.3, 0.2, 3.0)])
def test_fit_ks_is_the_kolmogorov_smirnov_distance_of_the_fitted_law(law: tuple) -> None:
    stats = pytest.importorskip("scipy.stats")
    kappa, gamma, beta = law
    draws = htmp.sample(1000, kappa, gamma, beta, seed=7)
    result = htmp.fit(draws, gamma, tau=0.0)
    # The fit integrates its density spline; the reference is the exact CDF (arg U) per point.
    # Measured differences: at most 1.1e-6.
    reference = stats.kstest(draws, lambda x: htmp.cdf(x, result.kappa, gamma, result.beta, 0.0)).statistic
    assert result.ks == pytest.approx(reference, abs=1e-5)


def test_a_repeated_smallest_eigenvalue_puts_tau_one_distinct_spacing_below() -> None:
    # it was refused: "tau must lie in [0, min(eigs)), not 5.0", about a τ the caller never gave
    e = np.r_[5.0, 5.0, 5.0 + htmp.sample(60, 20.0, 0.5, 1.0, seed=4)]
    spacing = float(np.min(e[e > 5.0])) - 5.0
    got = htmp.fit(e, 0.5)
    assert got.tau == 5.0 - spacing
    assert got == htmp.fit(e, 0.5, tau=5.0 - spacing)
