"""wbfe.metrics.special against mpmath: log U on [0, ∞) and log|U|, arg U on the cut (docs/math.md §3)."""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np
import pytest
from scipy.special import exp1, gammaln

from wbfe.errors import InvalidOptionError
from wbfe.metrics.special import arg_hyperu_neg, log_abs_hyperu_neg, log_hyperu, log_hyperu_neg

mp = pytest.importorskip("mpmath")

RTOL = 1e-10
# On the cut, log|U| is within 2e-11 everywhere except a few points with κ = 300, γ = 0.999 and
# y <= 1e-6 (δ = 0.15, heavy cancellation along every path), where it is within 1.5e-10.
RTOL_CUT = 2e-10

# κ and γ spanning the HTMP range; with them δ = κ(1−γ)/(2γ) takes integer values
# (κ=2, γ=1/2 → 1; κ=2, γ=1/3 → 2; κ=6, γ=1/3 → 6; κ=100, γ=1/3 → 100; κ=2, γ=0.001 → 999)
# and values far above 100 (γ <= 0.01).
KAPPAS = (0.01, 0.1, 1.0, 2.0, 6.0, 30.0, 100.0, 300.0)
GAMMAS = (0.001, 0.01, 0.1, 1.0 / 3.0, 0.5, 0.9, 0.999)
# On the cut the whole κ range is checked as well.
KAPPA_CUT = 300.0


def _ab(kappa: float, gamma: float) -> tuple[float, float, float]:
    a = kappa / 2.0
    delta = kappa * (1.0 - gamma) / (2.0 * gamma)
    return a, 1.0 - delta, a + delta


def _mp_log_u_quad(a: float, b: float, z: float, dps: int = 20) -> float:
    """log U by mpmath quadrature of U = Γ(a)⁻¹ ∫ e^(−zt) t^(a−1) (1+t)^(b−a−1) dt in s = log t."""
    with mp.workdps(dps):
        a_, b_, z_ = mp.mpf(a), mp.mpf(b), mp.mpf(z)

        def g(s):
            return -z_ * mp.exp(s) + a_ * s + (b_ - a_ - 1) * mp.log1p(mp.exp(s))

        def dg(s):
            return -z_ * mp.exp(s) + a_ + (b_ - a_ - 1) / (1 + mp.exp(-s))

        lo, hi = mp.mpf(-10), mp.mpf(10)
        while dg(lo) <= 0:
            lo -= 20
        while dg(hi) >= 0:
            hi += 20
        for _ in range(100):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if dg(mid) > 0 else (lo, mid)
        s_m = (lo + hi) / 2
        g_m = g(s_m)

        def edge(sign: int):
            d = mp.mpf(1)
            while g(s_m + sign * d) > g_m - 60:
                d *= 2
            left, right = mp.mpf(0), d
            for _ in range(60):
                mid = (left + right) / 2
                left, right = (mid, right) if g(s_m + sign * mid) > g_m - 60 else (left, mid)
            return s_m + sign * right

        s_lo, s_hi = edge(-1), edge(1)
        points = [s_lo + (s_hi - s_lo) * k / 16 for k in range(17)]
        integral = mp.quad(lambda s: mp.exp(g(s) - g_m), points)
        return float(g_m + mp.log(integral) - mp.loggamma(a_))


@lru_cache(maxsize=None)
def _mp_log_u(a: float, b: float, z: float) -> float:
    """mpmath oracle for log U(a, b, z), z >= 0.

    ``mpmath.hyperu`` is used where its series are reliable; with |b| > 200 and z within a decade
    of |b| it can be silently wrong (it gives log U(0.5, −498.5, 250) = 400 although U decreases
    from U(0.5, −498.5, 0) = e^−3.1), and there the oracle is mpmath quadrature of the integral.
    """
    if z == 0.0:
        return float(mp.loggamma(1 - b) - mp.loggamma(a - b + 1))
    if abs(b) > 200.0 and 0.01 * abs(b) <= z <= 10.0 * abs(b):
        return _mp_log_u_quad(a, b, z)
    with mp.workdps(20):
        return float(mp.log(mp.hyperu(a, b, z)))


def _mp_cut_quad(a: float, b: float, y: float, dps: int = 30) -> tuple[float, float]:
    """(log|U|, arg U mod 2π) at −y − i0 by mpmath quadrature of the Kummer-transformed integral

    U(a, b, z) = z^(−a)/Γ(c) ∫ e^(−u) u^(c−1) (1 + u/z)^(−a) du along the ray through the complex
    saddle of the integrand (used only in the bulk, where ``mpmath.hyperu`` gives up for |b| >~ 1e3).
    """
    with mp.workdps(dps):
        a_, b_, y_ = mp.mpf(a), mp.mpf(b), mp.mpf(y)
        c = a_ - b_ + 1
        big_b = y_ + c - a_
        disc = big_b**2 - 4 * y_ * c
        assert disc < 0, "the ray oracle is for points inside the bulk"
        saddle = (big_b - 1j * mp.sqrt(-disc)) / 2
        ray = saddle / abs(saddle)
        r_s = abs(saddle)

        def f(r):
            u = r * ray
            return mp.exp(-u + (c - 1) * mp.log(u) - a_ * mp.log(1 - u / y_)) * ray

        width = r_s / mp.sqrt(c)
        points = [0] + [max(r_s + k * width, r_s * (1 + k) / 40) for k in range(-30, 31, 3)] + [mp.inf]
        points = sorted(set(p for p in points if p >= 0))
        integral = mp.quad(f, points)
        log_u = -a_ * mp.log(y_) + 1j * mp.pi * a_ - mp.loggamma(c) + mp.log(integral)
        return float(mp.re(log_u)), float(mp.im(log_u))


@lru_cache(maxsize=None)
def _mp_cut(a: float, b: float, y: float) -> tuple[float, float]:
    """(log|U|, arg U) at −y − i0 from mpmath (which returns the value at −y + i0, the conjugate).

    """
    with mp.workdps(20):
        value = mp.hyperu(a, b, -mp.mpf(y))
        return float(mp.log(abs(value))), -float(mp.arg(value))


def _mp_cut_or_none(a: float, b: float, y: float):
    """:func:`_mp_cut`, or None where ``mpmath.hyperu`` gives up (large |b| near the bulk)."""
    try:
        return _mp_cut(a, b, y)
    except (ValueError, mp.libmp.NoConvergence):  # "failed to converge" / "converges too slowly"
        return None


def _positive_grid() -> list[tuple[float, float, float]]:
    points = []
    for kappa in KAPPAS:
        for gamma in GAMMAS:
            a, b, c = _ab(kappa, gamma)
            for z in (0.0, 1e-8, 1e-3, 0.5 * c, 2.0 * c, 1e6):
                points.append((a, b, z))
    return points


def _cut_grid(full: bool = False) -> list[tuple[float, float, float]]:
    """The cut grid; for κ >= 100 mpmath.hyperu is slow, so the fast test takes 3 of the 6 y."""
    points = []
    for kappa in KAPPAS:
        for gamma in GAMMAS:
            a, b, c = _ab(kappa, gamma)
            ys = (1e-6, 0.05 * c, 0.5 * c, c, 3.0 * c, 1e4)
            if kappa >= 100.0 and not full:
                ys = (1e-6, 0.5 * c, 3.0 * c)
            points.extend((a, b, y) for y in ys)
    return points


def test_grids_cover_the_required_range() -> None:
    pos, cut = _positive_grid(), _cut_grid()
    assert len(pos) + len(cut) >= 500
    deltas = {round(1.0 - b, 9) for a, b, _ in pos + cut}
    assert {1.0, 2.0, 6.0, 100.0, 999.0} <= deltas
    assert max(deltas) > 1e5
    assert max(z for *_, z in pos) == 1e6 and min(z for *_, z in pos) == 0.0


@pytest.mark.slow
def test_log_hyperu_matches_mpmath_on_the_grid() -> None:
    _check_positive(_positive_grid())


def test_log_hyperu_matches_mpmath_on_a_sample_of_the_grid() -> None:
    """Every 10th point of the grid (the whole grid, ~26 s of mpmath, is the slow test above)."""
    _check_positive(_positive_grid()[::10])


def _check_positive(points: list[tuple[float, float, float]]) -> None:
    for a, b, z in points:
        mine = log_hyperu(a, b, z)
        ref = _mp_log_u(a, b, z)
        assert math.isfinite(mine), (a, b, z)
        assert abs(mine - ref) <= RTOL * max(1.0, abs(ref)), (a, b, z, mine, ref)


def test_log_hyperu_is_vectorised_over_z() -> None:
    a, b, _ = _ab(6.0, 0.1)
    z = np.array([[0.0, 1e-3], [5.0, 1e6]])
    values = log_hyperu(a, b, z)
    assert values.shape == (2, 2)
    np.testing.assert_allclose(values.ravel(), [log_hyperu(a, b, float(v)) for v in z.ravel()], rtol=1e-13)


def test_log_hyperu_closed_forms() -> None:
    z = np.array([1e-4, 0.3, 2.0, 40.0, 700.0])
    # U(1, 1, z) = e^z E1(z)
    np.testing.assert_allclose(log_hyperu(1.0, 1.0, z), z + np.log(exp1(z)), rtol=1e-13)
    # U(a, b, 0) = Γ(1−b)/Γ(a−b+1) for b < 1
    assert log_hyperu(3.5, -20.0, 0.0) == pytest.approx(gammaln(21.0) - gammaln(24.5), rel=1e-14)


def _check_cut(a: float, b: float, y: float, ref_abs: float, ref_arg: float) -> float:
    value = log_hyperu_neg(a, b, y)
    assert np.isfinite(value), (a, b, y)
    assert abs(value.real - ref_abs) <= RTOL_CUT * max(1.0, abs(ref_abs)), (a, b, y, value, ref_abs)
    # mpmath's argument is principal; ours is continuous: equal modulo 2π. The scale of arg U is
    # πa (arg U / πa is the HTMP CDF): the CDF it gives must be right to 1e-8.
    wrapped = (value.imag - ref_arg + math.pi) % (2.0 * math.pi) - math.pi
    assert abs(wrapped) <= 1e-8 * math.pi * max(a, 1.0), (a, b, y, value.imag, ref_arg)
    return abs(value.real - ref_abs) / max(1.0, abs(ref_abs))


@pytest.mark.slow
def test_log_abs_and_arg_on_the_cut_match_mpmath() -> None:
    """Every grid point where mpmath.hyperu converges (the rest: the slow test, by quadrature)."""
    assert _check_cut_points(_cut_grid()) >= 230


def test_log_abs_and_arg_on_the_cut_match_mpmath_on_a_sample() -> None:
    """Every 10th point of the cut grid (the whole grid, ~44 s of mpmath, is the slow test above)."""
    assert _check_cut_points(_cut_grid()[::10]) >= 20


def _check_cut_points(points: list[tuple[float, float, float]]) -> int:
    checked = 0
    for a, b, y in points:
        ref = _mp_cut_or_none(a, b, y)
        if ref is None:
            continue
        _check_cut(a, b, y, *ref)
        checked += 1
    return checked


@pytest.mark.slow
def test_cut_full_grid_against_mpmath() -> None:
    checked = 0
    for a, b, y in _cut_grid(full=True):
        ref = _mp_cut_or_none(a, b, y)
        if ref is not None:
            _check_cut(a, b, y, *ref)
            checked += 1
    assert checked >= 300


@pytest.mark.slow
def test_cut_where_mpmath_hyperu_gives_up() -> None:
    """Bulk points with large |b|: mpmath quadrature along the saddle ray as the oracle."""
    checked = 0
    for a, b, y in _cut_grid(full=True):
        c = a - b + 1.0
        if _mp_cut_or_none(a, b, y) is not None or (y + c - a) ** 2 - 4.0 * y * c >= 0.0:
            continue
        _check_cut(a, b, y, *_mp_cut_quad(a, b, y))
        checked += 1
    assert checked >= 5


def test_scalar_helpers_agree_with_the_complex_log() -> None:
    a, b, _ = _ab(2.0, 0.5)
    value = log_hyperu_neg(a, b, 3.0)
    assert log_abs_hyperu_neg(a, b, 3.0) == value.real
    assert arg_hyperu_neg(a, b, 3.0) == value.imag


@pytest.mark.parametrize("kappa,gamma", [(0.3, 0.2), (2.0, 0.5), (6.0, 1.0 / 3.0), (40.0, 0.1), (100.0, 0.01)])
def test_arg_is_continuous_and_runs_from_zero_to_pi_a(kappa: float, gamma: float) -> None:
    a, b, c = _ab(kappa, gamma)
    y = np.exp(np.linspace(math.log(1e-9 * c), math.log(c + 60.0 * math.sqrt(c * (a + 1.0)) + 200.0), 1500))
    arg = arg_hyperu_neg(a, b, y)
    assert arg_hyperu_neg(a, b, 0.0) == 0.0
    # arg U / (πa) is the HTMP CDF: non-decreasing from 0 to 1, with no 2π jumps (a jump down
    # shows as a decrease; a jump up is caught against the integrated density in test_htmp.py).
    assert np.all(np.diff(arg) >= -1e-9)
    assert arg[0] == pytest.approx(0.0, abs=1e-4)
    assert arg[-1] == pytest.approx(math.pi * a, rel=1e-9)


def test_cut_at_zero_is_the_positive_axis_value() -> None:
    a, b, _ = _ab(6.0, 1.0 / 3.0)
    assert log_hyperu_neg(a, b, 0.0) == pytest.approx(log_hyperu(a, b, 0.0), rel=1e-14)
    assert log_abs_hyperu_neg(a, b, 1e-12) == pytest.approx(log_hyperu(a, b, 0.0), rel=1e-9)


@pytest.mark.parametrize(
    "call",
    [
        lambda: log_hyperu(0.0, 0.5, 1.0),
        lambda: log_hyperu(1.0, 3.0, 1.0),
        lambda: log_hyperu(1.0, 0.5, -1.0),
        lambda: log_hyperu(1.0, 0.5, math.nan),
        lambda: log_hyperu_neg(1.0, 1.0, 1.0),
        lambda: log_hyperu_neg(1.0, 0.5, -2.0),
    ],
)
def test_invalid_arguments_raise(call) -> None:
    with pytest.raises(InvalidOptionError):
        call()


@pytest.mark.slow
def test_random_sweep_against_mpmath() -> None:
    """600 random points on the positive axis (quadrature oracle) and 300 on the cut."""
    rng = np.random.default_rng(20261130)
    for _ in range(600):
        kappa = 10 ** rng.uniform(-2, math.log10(300.0))
        gamma = 10 ** rng.uniform(-3, math.log10(0.999))
        a, b, _ = _ab(kappa, gamma)
        z = 10 ** rng.uniform(-10, 6)
        ref = _mp_log_u_quad(a, b, z, dps=25)
        assert abs(log_hyperu(a, b, z) - ref) <= RTOL * max(1.0, abs(ref)), (a, b, z)
    for _ in range(300):
        kappa = 10 ** rng.uniform(-2, math.log10(KAPPA_CUT))
        gamma = 10 ** rng.uniform(-3, math.log10(0.999))
        a, b, c = _ab(kappa, gamma)
        y = c * 10 ** rng.uniform(-4, 2)
        ref = _mp_cut_or_none(a, b, y)
        if ref is not None:
            _check_cut(a, b, y, *ref)


@pytest.mark.parametrize("kappa,gamma", [(100.0, 0.5), (100.0, 0.01), (1.0, 0.9), (20.0, 0.1), (300.0, 0.999)])
def test_modulus_only_path_agrees_with_the_full_value_at_the_bulk_edges(kappa: float, gamma: float) -> None:
    # log_abs_hyperu_neg tries other paths before finer steps (no phase to keep): where the
    # default path struggles, at the bulk edges, both orders must give the same |U|.
    a, b, c = _ab(kappa, gamma)
    edges = np.sort(np.roots([1.0, -2.0 * (c + a), (c - a) ** 2]).real)
    y = np.concatenate([edge * np.exp(np.linspace(-0.4, 0.4, 25)) for edge in edges if edge > 0.0])
    full = log_hyperu_neg(a, b, y).real
    modulus = log_abs_hyperu_neg(a, b, y)
    np.testing.assert_allclose(modulus, full, rtol=1e-11, atol=1e-11)
    loose = log_abs_hyperu_neg(a, b, y, rtol=1e-8)
    np.testing.assert_allclose(loose, full, rtol=1e-9, atol=1e-9)
