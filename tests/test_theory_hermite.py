"""Hermite coefficients, the kernel g and the scalar channel m (wbfe.theory.hermite, docs/math.md §6)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from wbfe.errors import InvalidOptionError, UnknownNameError
from wbfe.theory.hermite import ACTIVATIONS, get_activation, hermite_coefficients, kernel

SQRT_2PI = math.sqrt(2.0 * math.pi)


def kernel_quadrature(activation, q: float, *, nodes: int = 300) -> float:
    """g(q) = E[σ̃(z₁)σ̃(z₂)], z₁ = x, z₂ = q·x + √(1−q²)·y, by 2-D Gauss–Hermite quadrature (μ₀ and μ₁
    from the same rule): an independent path to check the Hermite series. numpy builds the rule
    accurately up to about 350 ``nodes``."""
    act = get_activation(activation)
    x, w = np.polynomial.hermite_e.hermegauss(nodes)
    w = w / w.sum()
    mu0 = float(np.dot(w, act.numpy(x)))
    mu1 = float(np.dot(w, act.numpy(x) * x))

    def tilde(t: np.ndarray) -> np.ndarray:
        return act.numpy(t) - mu0 - mu1 * t

    z2 = q * x[:, None] + math.sqrt(max(1.0 - q * q, 0.0)) * x[None, :]
    return float(np.einsum("i,j,i,ij->", w, w, tilde(x), tilde(z2)))


def m_exact(kern, lam: float) -> float:
    """m(λ) by brute force, the definition itself: the global argmax of the potential λ·g(q) + q + ln(1 − q)
    on a dense grid, then refined (slow; it checks the table behind ``Kernel.m``)."""
    from scipy.optimize import minimize_scalar

    u = np.concatenate([np.geomspace(1e-8, 1.0, 2000), np.linspace(1.0, 36.0, 8000)[1:]])
    q = -np.expm1(-u)
    pot = lam * kern.g(q) + q - u  # ln(1 − q) = −u
    i = int(np.argmax(pot))
    if pot[i] <= 0.0:  # q = 0 gives potential λ·g(0) = 0
        return 0.0
    lo, hi = u[max(i - 1, 0)], u[min(i + 1, len(u) - 1)]
    res = minimize_scalar(lambda t: -float(lam * kern.g(-math.expm1(-t)) - t - math.expm1(-t)),
                          bounds=(lo, hi), method="bounded", options={"xatol": 1e-12})
    return float(-math.expm1(-res.x))


def _mp_coefficient(fn, ell: int) -> float:
    import mpmath as mp

    mp.mp.dps = 30

    def he(x, n):
        a, b = mp.mpf(1), x
        if n == 0:
            return a
        for m in range(2, n + 1):
            a, b = b, x * b - (m - 1) * a
        return b

    val = mp.quad(lambda x: fn(x) * he(x, ell) * mp.exp(-x * x / 2), [-mp.inf, -2, 0, 2, mp.inf])
    return float(val / mp.sqrt(2 * mp.pi))


def test_relu_coefficients_match_closed_form():
    # μ_ℓ = φ(0)·He_{ℓ−2}(0): (−1)^{(ℓ−2)/2}(ℓ−3)!!/√(2π) for even ℓ ≥ 2, 0 for odd ℓ ≥ 3.
    mu = hermite_coefficients("relu", degree=10)
    expected = [1 / SQRT_2PI, 0.5, 1 / SQRT_2PI, 0.0, -1 / SQRT_2PI, 0.0, 3 / SQRT_2PI, 0.0, -15 / SQRT_2PI, 0.0,
                105 / SQRT_2PI]
    np.testing.assert_allclose(mu, expected, atol=1e-12)


def test_tanh2_coefficients_match_mpmath_and_published_mu1():
    import mpmath as mp

    mu = hermite_coefficients("tanh2", degree=9)
    for ell in (1, 3, 5, 9):
        assert mu[ell] == pytest.approx(_mp_coefficient(lambda x: mp.tanh(2 * x), ell), abs=1e-11)
    assert np.max(np.abs(mu[0::2])) < 1e-14  # odd function
    # The authors' code removes the linear part as tanh(2x) − 0.72948·x.
    assert mu[1] == pytest.approx(0.72948, abs=5e-6)


def test_erf_first_coefficient_closed_form():
    # μ₁ = E[erf'(z)] = (2/√π)·E[e^{−z²}] = 2/√(3π).
    assert hermite_coefficients("erf", degree=3)[1] == pytest.approx(2 / math.sqrt(3 * math.pi), abs=1e-14)


@pytest.mark.parametrize("name", ["tanh2", "tanh", "erf"])
@pytest.mark.parametrize("q", [0.05, 0.3, 0.6, 0.9, 0.99, 1.0])
def test_series_equals_gauss_hermite_quadrature(name, q):
    assert float(kernel(name).g(q)) == pytest.approx(kernel_quadrature(name, q, nodes=300), abs=1e-8)


@pytest.mark.parametrize("q", [0.0, 0.2, 0.5, 0.8, 0.9, 1.0])
def test_relu_kernel_matches_arccos_kernel(q):
    # E[relu(z1) relu(z2)] = (√(1−q²) + (π − arccos q)·q)/(2π); remove μ₀² and μ₁²·q.
    exact = (math.sqrt(1 - q * q) + (math.pi - math.acos(q)) * q) / (2 * math.pi) - 1 / (2 * math.pi) - q / 4
    assert float(kernel("relu").g(q)) == pytest.approx(exact, abs=1e-8)


def test_g1_is_second_moment_of_centred_activation():
    import mpmath as mp

    mp.mp.dps = 30
    second = mp.quad(lambda x: mp.tanh(2 * x) ** 2 * mp.exp(-x * x / 2), [-mp.inf, 0, mp.inf]) / mp.sqrt(2 * mp.pi)
    mu1 = _mp_coefficient(lambda x: mp.tanh(2 * x), 1)
    assert kernel("tanh2").g1 == pytest.approx(float(second) - mu1**2, abs=1e-12)
    assert float(kernel("tanh2").g(0.0)) == 0.0


def test_deficit_is_stable_near_one():
    kern = kernel("tanh2")
    assert float(kern.deficit(0.3)) == pytest.approx(kern.g1 - float(kern.g(0.7)), rel=1e-12)
    assert float(kern.deficit(1e-20)) == pytest.approx(float(kern.g_prime(1.0)) * 1e-20, rel=1e-9)


@pytest.mark.parametrize("name", ["tanh2", "erf"])
def test_threshold_is_the_infimum_and_a_tangency(name):
    kern = kernel(name)
    lam, qs = kern.lambda_sigma, kern.q_sigma
    q = np.linspace(1e-3, 1 - 1e-6, 200001)
    ratio = (-np.log1p(-q) - q) / kern.g(q)
    assert ratio.min() >= lam * (1 - 1e-12)
    assert ratio.min() == pytest.approx(lam, rel=1e-8)
    # At (λ_σ, q_σ) the potential touches 0 with zero slope: a first-order jump from 0 to q_σ.
    assert lam * float(kern.g(qs)) + qs + math.log1p(-qs) == pytest.approx(0.0, abs=1e-10)
    assert lam * float(kern.g_prime(qs)) * (1 - qs) == pytest.approx(qs, rel=1e-6)
    assert qs > 0.5


@pytest.mark.parametrize("name", ["tanh2", "erf", "relu"])
def test_m_is_zero_below_and_at_least_q_sigma_above(name):
    kern = kernel(name)
    lam_s, q_s = kern.lambda_sigma, kern.q_sigma
    below = lam_s * np.array([1e-3, 0.1, 0.5, 0.9, 0.999, 1 - 1e-9])
    above = lam_s * np.array([1 + 1e-9, 1.001, 1.1, 2.0, 10.0, 1e3, 1e8, 1e30])
    assert np.all(kern.m(below) == 0.0)
    m_above = kern.m(above)
    assert np.all(m_above >= q_s) and np.all(m_above > 0) and np.all(m_above <= 1)
    assert np.all(np.diff(m_above) >= 0)
    # 1 − m is below double precision at the top end; the deficit g(1) − g(m) still resolves it.
    deficit = kern.deficit_at(above)
    assert np.all(deficit > 0) and np.all(np.diff(deficit) < 0)
    assert deficit[-1] == pytest.approx(1 / above[-1], rel=1e-6)  # g(1) − g(m(λ)) → 1/λ as λ → ∞


@pytest.mark.parametrize("name", ["tanh2", "erf", "relu"])
def test_table_m_equals_brute_force_global_argmax(name):
    kern = kernel(name)
    lams = kern.lambda_sigma * np.array([0.5, 0.99, 1.0001, 1.01, 1.3, 2.0, 5.0, 30.0, 300.0])
    fast = kern.m(lams)
    exact = np.array([m_exact(kern, float(x)) for x in lams])
    np.testing.assert_allclose(fast, exact, atol=2e-7)


def test_continuous_onset_when_mu2_nonzero():
    kern = kernel("relu")
    assert kern.mu[2] == pytest.approx(1 / SQRT_2PI, abs=1e-12)
    # λ_σ = lim_{q→0} (q²/2)/(μ₂² q²/2) = 1/μ₂² = 2π, and no jump.
    assert kern.lambda_sigma == pytest.approx(2 * math.pi, rel=1e-9)
    assert kern.q_sigma == 0.0
    m = kern.m(kern.lambda_sigma * np.array([1 + 1e-6, 1 + 1e-4, 1 + 1e-2]))
    assert np.all(m > 0) and m[0] < 1e-5 and m[1] < 1e-3 and m[2] < 0.05
    # whereas tanh(2x) (μ₂ = 0) jumps straight to q_σ ≈ 0.75
    tanh = kernel("tanh2")
    assert float(tanh.m(tanh.lambda_sigma * (1 + 1e-6))) >= tanh.q_sigma > 0.7


def test_callable_activation_equals_named_one():
    custom = kernel(lambda x: np.tanh(2.0 * x))
    named = kernel("tanh2")
    np.testing.assert_allclose(custom.c2, named.c2, atol=1e-15)
    assert custom.lambda_sigma == pytest.approx(named.lambda_sigma, rel=1e-12)
    assert custom.activation.name == "custom"


def test_unknown_and_affine_activations_raise():
    with pytest.raises(UnknownNameError, match=r"unknown activation 'tanh3'; did you mean 'tanh', 'tanh2'\? \(known: erf, relu, tanh, tanh2\)"):
        kernel("tanh3")
    with pytest.raises(InvalidOptionError, match="is affine"):
        kernel(lambda x: 3.0 * x + 1.0)
    with pytest.raises(InvalidOptionError, match="the activation must map a float64 array to finite values"):
        kernel(math.tanh)
    with pytest.raises(InvalidOptionError, match="degree must be >= 2"):
        hermite_coefficients("tanh2", degree=1)
    assert set(ACTIVATIONS) == {"tanh2", "tanh", "erf", "relu"}
    assert get_activation("erf") is ACTIVATIONS["erf"]


@pytest.mark.parametrize("degree", [math.inf, math.nan, None, 2.5, 10**7])
def test_degree_must_be_a_whole_number_in_range(degree):
    # inf: OverflowError, nan: ValueError, None/2.5: TypeError, 10**7: minutes of quadrature before
    with pytest.raises(InvalidOptionError, match=r"degree must be >= 2 and <= 5000 \(an integer\), got "):
        kernel("tanh", degree=degree)
    assert np.array_equal(hermite_coefficients("erf", degree=4.0), hermite_coefficients("erf", degree=4))


def test_an_activation_that_raises_arithmetic_errors_is_refused_in_one_line():
    with pytest.raises(InvalidOptionError, match=r"the activation must map .* \(division by zero\)"):
        kernel(lambda x: 1 / 0)  # ZeroDivisionError escaped before


def test_get_activation_takes_an_activation_and_refuses_what_is_neither_name_nor_callable():
    tanh = ACTIVATIONS["tanh"]
    assert get_activation(tanh) is tanh and kernel(tanh).lambda_sigma == kernel("tanh").lambda_sigma
    for bad, kind in ((3, "int"), (None, "NoneType"), ([np.tanh], "list")):
        with pytest.raises(InvalidOptionError, match=rf"^activation must be a name or a callable, got {kind}$"):
            get_activation(bad)


@pytest.mark.parametrize("activation", [lambda x: np.ones(3), lambda x: np.where(x > 30.0, np.inf, x * x),
                                        lambda x: np.sqrt(x)])
def test_an_activation_with_another_shape_or_non_finite_values_is_refused(activation):
    with np.errstate(invalid="ignore"):  # sqrt of the negative half: NaN, the case refused
        with pytest.raises(InvalidOptionError,
                           match="^the activation must map a float64 array to finite values of the same shape$"):
            hermite_coefficients(activation)


def test_an_activation_with_a_second_transition_is_refused():
    # σ = He₃/√3! + He₃₀/√30!: g(q) = q³ + q³⁰, so λ(q) = q/((1 − q)·g'(q)) falls between q ≈ 0.88 and 0.95
    # (the q³⁰ term switches on): the branch of m above λ_σ has a second jump, which the table cannot hold.
    from numpy.polynomial.hermite_e import hermeval

    coef = np.zeros(31)
    coef[3], coef[30] = 1 / math.sqrt(math.factorial(3)), 1 / math.sqrt(math.factorial(30))
    q = np.linspace(0.5, 0.999, 2000)
    lam = q / ((1 - q) * (3 * q**2 + 30 * q**29))
    assert np.any(np.diff(lam) < 0) and np.any(np.diff(lam) > 0)  # the closed form is not monotone
    kern = kernel(lambda x: hermeval(x, coef))
    assert kern.c2[3] == pytest.approx(1.0, abs=1e-9) and kern.c2[30] == pytest.approx(1.0, abs=1e-9)
    with pytest.raises(InvalidOptionError, match=r"^activation 'custom': the branch of m above lambda_sigma is not "
                                                 r"monotone \(a second transition\); not supported$"):
        kern.m(np.array([10.0]))
