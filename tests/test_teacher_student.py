"""The teacher–student fixed point, its sweeps and scaling exponents (wbfe.theory.teacher_student)."""

from __future__ import annotations

import math
import re
import warnings

import numpy as np
import pytest
from scipy.optimize import brentq

from wbfe.errors import InvalidOptionError, UnknownNameError
from wbfe.theory.hermite import kernel
from wbfe.theory.teacher_student import (
    fit_slope,
    fit_regimes,
    fixed_point_map,
    readout,
    scaling_table,
    solve,
    sweep,
)

KERN = kernel("tanh2")


def _reference_eps(v: np.ndarray, n_over_d: float, delta: float) -> float:
    """An independent solver: m by brentq on the stationarity condition, ε by a scan + brentq."""
    lam_s, q_s = KERN.lambda_sigma, KERN.q_sigma

    def m(lam: float) -> float:
        if lam < lam_s:
            return 0.0
        return brentq(lambda q: lam * float(KERN.g_prime(q)) * (1 - q) - q, q_s * (1 - 1e-12), 1 - 1e-15,
                      xtol=1e-15, rtol=1e-15)

    def h(eps: float) -> float:
        return sum(vi**2 * (KERN.g1 - float(KERN.g(m(n_over_d * vi**2 / (delta + eps))))) for vi in v) - eps

    grid = np.geomspace(1e-9, KERN.g1, 60)
    vals = [h(e) for e in grid]
    # At ε = g1 with nothing learnt h is 0 up to the rounding of Σv² = 1 (a few 1e-17, either sign).
    j = next(i for i in range(len(grid) - 1) if vals[i] > 1e-15 and vals[i + 1] <= 1e-15)
    return brentq(h, grid[j], grid[j + 1], xtol=1e-14) if vals[j + 1] < 0 else float(grid[j + 1])


@pytest.mark.parametrize("kind,opts", [("power", {"beta": 0.7}), ("dense", {}), ("exp", {"rate": 0.5}),
                                       ("sparse", {"nonzeros": 2})])
def test_readouts_have_unit_norm_and_their_shape(kind, opts):
    v = readout(kind, 12, **opts)
    assert v.shape == (12,) and np.linalg.norm(v) == pytest.approx(1.0, abs=1e-15)
    assert np.all(np.diff(v) <= 1e-15)
    if kind == "power":
        assert v[0] / v[3] == pytest.approx(4**0.7, rel=1e-12)
    if kind == "exp":
        assert v[1] / v[0] == pytest.approx(math.exp(-0.5), rel=1e-12)
    if kind == "sparse":
        assert np.count_nonzero(v) == 2
    if kind == "dense":
        assert np.allclose(v, 1 / math.sqrt(12))


def test_readout_errors():
    with pytest.raises(UnknownNameError, match="unknown readout 'powr'"):
        readout("powr", 5)
    with pytest.raises(InvalidOptionError, match=r"nonzeros must be in \[1, k=5\], got 6"):
        readout("sparse", 5, nonzeros=6)
    with pytest.raises(InvalidOptionError, match="give exactly one of n and r"):
        solve(readout("power", 5), delta=0.04, d=10, n=100, r=1.0)
    with pytest.raises(InvalidOptionError, match="delta must be positive"):
        solve(readout("power", 5), delta=0.0, d=10, r=1.0)


@pytest.mark.parametrize("k", [math.inf, math.nan, None, 2.5, "3"])
def test_readout_refuses_a_width_that_is_not_a_whole_number(k):
    # inf raised ValueError from np.arange, nan ValueError, None and "3" TypeError
    with pytest.raises(InvalidOptionError, match=r"k must be an integer >= 1, got "):
        readout("power", k)


def test_readout_refuses_a_width_past_its_memory_limit():
    # a MemoryError (7.28 TiB) before; `wbfe theory solve --k 10**12` printed a traceback
    with pytest.raises(InvalidOptionError, match=r"k must be at most 100,000,000 \(the readout is held in memory\)"):
        readout("power", 10**12)


def test_readout_refuses_an_infinite_rate():
    # exp(-inf * 0) is NaN: the solver then said "the readout v must be a non-empty finite vector"
    with pytest.raises(InvalidOptionError, match="rate must be > 0 and finite, got inf"):
        readout("exp", 5, rate=math.inf)
    assert readout("power", 4.0).shape == (4,)  # a float that is a whole number is the number


def test_solve_refuses_an_all_zero_readout_and_a_grid_without_points():
    # all zero: ValueError from np.geomspace; grid_points=1 blamed "the kernel or readout", -5 a ValueError
    with pytest.raises(InvalidOptionError, match="the readout v must be a non-empty finite vector, not all zero"):
        solve(np.zeros(5), delta=0.04, d=10, r=1.0)
    for grid in (1, -5, 2.5):
        with pytest.raises(InvalidOptionError, match=f"need grid_points >= 2 and max_jumps >= 0, got {grid}"):
            solve(readout("power", 5), delta=0.04, d=10, r=1.0, grid_points=grid)
    # max_jumps=-1 sliced off the last jump silently
    with pytest.raises(InvalidOptionError, match="and -1$"):
        solve(readout("power", 5), delta=0.04, d=10, r=1.0, max_jumps=-1)


def test_sweep_and_slopes_refuse_what_has_no_answer():
    with pytest.raises(InvalidOptionError, match="r_values must not be empty"):
        sweep(readout("power", 5), delta=0.04, d=10, r_values=[])
    with pytest.raises(InvalidOptionError, match=r"x and y must have the same shape, got \(3,\) and \(2,\)"):
        fit_slope([1.0, 2.0, 3.0], [1.0, 2.0])
    assert math.isnan(fit_slope([2.0, 2.0, 2.0], [1.0, 2.0, 3.0]))  # one x: no slope (LinAlgError before)
    assert fit_slope([1.0, 2.0, 4.0], [3.0, 12.0, 48.0]) == pytest.approx(2.0, abs=1e-12)


@pytest.mark.parametrize("d_values", [[100, 100, 100], [math.inf, 100, 200], [math.nan, 100, 200], [100.5, 200, 400]])
def test_scaling_table_refuses_d_values_without_three_different_integers(d_values):
    # [100, 100, 100] printed slopes fitted on one x; inf/nan raised OverflowError/ValueError; 100.5 became 100
    with pytest.raises(InvalidOptionError, match="need at least 3 different integers d >= 1, got "):
        scaling_table(d_values)
    with pytest.raises(InvalidOptionError, match="r, gamma and delta must be positive and finite"):
        scaling_table([100, 200, 400], gamma=math.inf)  # OverflowError before


@pytest.mark.parametrize("bad", [None, "3", [1]])
def test_library_calls_refuse_a_non_number_naming_the_parameter(bad):
    # each raised Python's TypeError ("'<' not supported between ...", "must be real number") before
    v, got = readout("power", 5), re.escape(repr(bad))
    cases = [
        (lambda: solve(v, delta=bad, d=10, r=1.0), f"^delta must be positive and finite, got {got}$"),
        (lambda: solve(v, delta=0.04, d=bad, r=1.0), f"^d must be an integer >= 1, got {got}$"),
        (lambda: sweep(v, delta=0.04, d=bad, r_values=[1.0]), f"^d must be an integer >= 1, got {got}$"),
        (lambda: readout("power", 5, beta=bad), f"^beta must be a number >= 0, got {got}$"),
        (lambda: readout("exp", 5, rate=bad), f"^rate must be > 0 and finite, got {got}$"),
        (lambda: readout("sparse", 5, nonzeros=bad), rf"^nonzeros must be in \[1, k=5\], got {got}$"),
        (lambda: fit_slope([1.0, 2.0], [1.0, 2.0], min_points=bad), f"^min_points must be an integer >= 0, got {got}$"),
        (lambda: scaling_table([10, 20, 40], gamma=bad),
         f"^r, gamma and delta must be positive and finite, got r=4.0, gamma={got}, delta=0.04$"),
        (lambda: kernel("tanh2", degree=bad), f"^degree must be >= 2 and <= .* \\(an integer\\), got {got}$"),
    ]
    if bad is not None:  # r=None (n=None) is the one not given: "give exactly one of n and r"
        cases += [(lambda: solve(v, delta=0.04, d=10, r=bad), f"^r must be a positive finite number, got {got}$"),
                  (lambda: solve(v, delta=0.04, d=10, n=bad), f"^n must be a positive finite number, got {got}$")]
    for call, message in cases:
        with pytest.raises(InvalidOptionError, match=message):
            call()


def test_scaling_table_names_the_teacher_width_a_small_gamma_d_gives():
    # "nonzeros must be in [1, k=1], got 3" before: an option of the sparse family the caller never gave
    for d_values, k in (([2, 3, 4], 1), ([4, 8, 16], 2)):
        with pytest.raises(InvalidOptionError, match=rf"^d = {d_values[0]} and gamma = 0.5 give k = round\(gamma\*d\) = "
                           rf"{k} teacher unit\(s\); the scaling table needs k >= 3: raise the smallest d or gamma$"):
            scaling_table(d_values, gamma=0.5)
    # k = 3 at the smallest d is enough: the sparse teacher's 3 units are all learned at r = 4
    assert scaling_table([6, 7, 8], gamma=0.5)[-1].k_c == (3, 3, 3)


def test_fixed_point_map_equals_the_direct_sum():
    # The map sums the features that are off in closed form; check it against the plain sum, v unsorted.
    rng = np.random.default_rng(0)
    v = readout("power", 300, beta=0.8)[rng.permutation(300)]
    eps = np.concatenate([[0.0], np.geomspace(1e-12, 0.1, 200)])
    fast = fixed_point_map(eps, v, n_over_d=1e3, delta=0.04, kern=KERN)
    direct = np.array([KERN.deficit_at(1e3 * v**2 / (0.04 + e)) @ v**2 for e in eps])
    np.testing.assert_allclose(fast, direct, rtol=1e-13)


@pytest.mark.parametrize("r", [0.3, 1.2, 2.0, 5.0, 50.0])
def test_solution_is_a_fixed_point_and_matches_an_independent_solver(r):
    v = readout("power", 8, beta=0.6)
    d = 40
    sol = solve(v, delta=0.04, d=d, r=r, kern=KERN)
    n_over_d = r * len(v)
    for root in sol.eps_all:
        assert float(fixed_point_map(root, v, n_over_d=n_over_d, delta=0.04, kern=KERN)[0]) == pytest.approx(
            root, rel=1e-9, abs=1e-13)
    assert sol.eps == min(sol.eps_all) and sol.kinds[0] == "stable"
    assert sol.eps == pytest.approx(_reference_eps(v, n_over_d, 0.04), rel=1e-7, abs=1e-12)
    assert sol.k_c == int(np.count_nonzero(sol.q > 0))
    np.testing.assert_allclose(sol.snr, n_over_d * v**2 / (0.04 + sol.eps))
    assert sol.eps == pytest.approx(float(np.sum(v**2 * (KERN.g1 - KERN.g(sol.q)))), rel=1e-7)


def test_below_first_transition_nothing_is_learned():
    sol = solve(readout("power", 20, beta=0.3), delta=0.04, d=40, r=0.2, kern=KERN)
    assert sol.k_c == 0 and sol.eps == pytest.approx(KERN.g1, rel=1e-12)
    assert np.all(sol.q == 0)


def test_closely_spaced_crossings_are_all_reported():
    # Near the first transitions the map crosses the diagonal twice with a jump between the crossings.
    sol = solve(readout("power", 100, beta=0.3), delta=0.04, d=200, r=1.0, kern=KERN)
    assert len(sol.eps_all) == 2 and sol.kinds == ("stable", "stable") and len(sol.jumps) == 1
    lo, hi = sol.eps_all
    assert lo < sol.jumps[0] < hi and (hi - lo) / lo < 0.05
    assert sol.eps == lo and sol.k_c == 6
    # a jump is a discontinuity of F over the diagonal, not a root
    jump = sol.jumps[0]
    f_minus, f_plus = fixed_point_map(np.array([jump * (1 - 1e-9), jump * (1 + 1e-9)]), readout("power", 100, beta=0.3),
                                      n_over_d=100.0, delta=0.04, kern=KERN)
    assert f_minus < jump < f_plus


def test_refinement_limit_is_delta_over_r():
    # All features learned: g(1) − g(qᵢ) → 1/snrᵢ, so ε = Σ (Δ + ε)·d/n = kd(Δ + ε)/n → Δ/r.
    v = readout("power", 10, beta=0.3)
    for r in (1e5, 1e7):
        sol = solve(v, delta=0.04, d=50, r=r, kern=KERN)
        assert sol.k_c == 10
        assert sol.eps * r / 0.04 == pytest.approx(1.0, rel=2e-3)


def test_eps_non_increasing_and_kc_non_decreasing_in_n():
    for kind, opts in (("power", {"beta": 0.3}), ("power", {"beta": 1.0}), ("exp", {}), ("dense", {})):
        sw = sweep(readout(kind, 100, **opts), delta=0.04, d=200, r_values=np.geomspace(1e-2, 1e4, 70), kern=KERN)
        assert np.all(np.diff(sw.eps) <= 1e-15 * sw.eps[:-1])
        assert np.all(np.diff(sw.k_c) >= 0)
        assert sw.k_c[0] == 0 and sw.k_c[-1] >= 30


@pytest.mark.parametrize("beta,tol", [(1.0, 0.04), (1.5, 0.04)])
def test_feature_learning_exponent(beta, tol):
    # k = 2000 features, n over about three decades: ε ∝ n^(1/(2β) − 1).
    sw = sweep(readout("power", 2000, beta=beta), delta=0.04, d=1000,
               r_values=np.geomspace(0.05, 20.0 if beta == 1.0 else 1000.0, 40), kern=KERN)
    fit = fit_regimes(sw, beta=beta)
    assert fit.feature_learning_window[1] / fit.feature_learning_window[0] > 100
    assert fit.feature_learning == pytest.approx(1 / (2 * beta) - 1, abs=tol)


def test_refinement_exponent():
    sw = sweep(readout("power", 50, beta=1.0), delta=0.04, d=100, r_values=np.geomspace(1.0, 1e7, 50), kern=KERN)
    fit = fit_regimes(sw, beta=1.0)
    assert fit.refinement_window[1] / fit.refinement_window[0] > 1e3
    assert fit.refinement == pytest.approx(-1.0, abs=0.01)


def test_regime_without_points_is_nan_with_reason():
    sw = sweep(readout("power", 20, beta=1.0), delta=0.04, d=40, r_values=[0.01, 0.02, 0.05], kern=KERN)
    fit = fit_regimes(sw, beta=1.0)
    assert math.isnan(fit.refinement) and "no point has all k=20 features learned" in fit.reasons["refinement"]


def test_scaling_table_exponents():
    rows = {row.family: row for row in scaling_table([200, 400, 800, 1600, 3200, 6400], r=4.0)}
    assert set(rows) == {"dense", "power beta=0.3", "power beta=0.5", "power beta=1.0", "exp rate=0.2",
                         "sparse p=3"}
    assert rows["dense"].kc_slope == pytest.approx(1.0, abs=1e-12)
    assert rows["dense"].eps_slope == pytest.approx(0.0, abs=1e-9)
    assert rows["power beta=0.3"].kc_slope == pytest.approx(1.0, abs=0.05)
    assert abs(rows["power beta=0.3"].eps_slope) < 0.05
    assert 0.7 < rows["power beta=0.5"].kc_slope < 1.0  # d/log d
    assert rows["power beta=1.0"].kc_slope == pytest.approx(0.5, abs=0.06)
    assert rows["power beta=1.0"].eps_slope == pytest.approx(-0.5, abs=0.05)
    assert rows["exp rate=0.2"].kc_slope == pytest.approx(2.5, abs=0.5)  # k_c against ln d
    assert rows["exp rate=0.2"].eps_slope == pytest.approx(-1.0, abs=0.15)  # 1/d up to a log
    assert rows["sparse p=3"].k_c == (3,) * 6
    assert rows["sparse p=3"].eps_slope == pytest.approx(-1.0, abs=0.02)


def test_solve_refuses_an_r_whose_n_is_past_a_float():
    # r itself is finite; n = r·k·d is not
    with pytest.raises(InvalidOptionError, match=r"^n \(or r\) must be positive and finite, got n=inf$"):
        solve(readout("power", 10), delta=0.04, d=10, r=1e308)


@pytest.mark.parametrize("activation", ["tanh2", "relu"])
def test_solve_refuses_when_f_underflows_to_zero_at_an_extreme_n_over_delta(activation: str):
    # n/Δ = 1e600: every snr overflows, F(0) rounds to 0 and no sign change is left to bracket; the overflow (to inf,
    # whose deficit is its limit 0) is no RuntimeWarning printed before the refusal, which names the cause (it said
    # "the kernel or readout is degenerate", neither of which is)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(InvalidOptionError, match=r"^n/\(d·delta\) = 1e\+300/1e-300 is past a float's range: raise "
                                                     r"delta or lower n \(or r\)$"):
            solve(readout("dense", 1), delta=1e-300, d=1, n=1e300, activation=activation)


def test_fixed_point_map_over_two_million_features_equals_the_closed_form():
    # A dense readout of k > 2,000,000 features, all on: one ε row holds more than one flattened chunk, and F is
    # g(1) − g(m(snr)) at the one snr every feature has.
    k = 2_000_001
    v = readout("dense", k)
    eps = np.array([0.0, 0.01, 0.1])
    n_over_d = 1e3 * k
    fast = fixed_point_map(eps, v, n_over_d=n_over_d, delta=0.04, kern=KERN)
    assert np.all(n_over_d * v[0] ** 2 / (0.04 + eps) > KERN.lambda_sigma)  # every feature on
    np.testing.assert_allclose(fast, KERN.deficit_at(n_over_d * v[0] ** 2 / (0.04 + eps)) * float(v @ v), rtol=1e-10)


@pytest.mark.parametrize("r", [1e100, 1e200, 1e300])
def test_a_root_far_below_the_grid_is_bisected_to_the_last_bit(r: float):
    # ε = Δ/(r − 1) (test_refinement_limit_is_delta_over_r's closed form) lies far below the scan's first point
    # (1e-16 of ε_max) when the climb from 0 stops at once: 200 halvings from there stopped at ~3e-77 and gave that
    # as ε^BO (wbfe theory solve --r 1e300, the defaults otherwise)
    sol = solve(readout("power", 100, beta=0.3), delta=0.04, d=200, r=r, kern=KERN)
    assert sol.k_c == 100 and sol.eps == pytest.approx(0.04 / (r - 1.0), rel=1e-9, abs=0.0)


def test_solve_refuses_an_snr_past_a_float_instead_of_a_false_crossing():
    # delta 1e-320: n/(d·delta) overflows, F rounds to 0 below ε ~ 1e-309 and that crossing was given as ε^BO
    # (kind "unstable", with a RuntimeWarning); the true F = (delta + ε)/r > ε there
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(InvalidOptionError, match=r"^n/\(d·delta\) = 50/1e-320 is past a float's range"):
            solve(readout("power", 100, beta=0.3), delta=1e-320, d=200, r=0.5, kern=KERN)
