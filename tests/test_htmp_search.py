"""The κ search of the HTMP fit (:func:`wbfe.metrics.htmp._maximise`) on functions whose maximum is
known in closed form, and the fit against a brute-force scan of its own profile likelihood."""

from __future__ import annotations

import math

import numpy as np
import pytest

from wbfe.metrics import htmp


@pytest.mark.parametrize(("peak", "start"), [(0.3, 0.0), (-1.7, 0.5), (2.9, -3.0), (0.0, 0.0)])
def test_finds_the_maximum_of_a_smooth_unimodal_function(peak: float, start: float) -> None:
    calls = []

    def f(x: float) -> float:
        calls.append(x)
        return -((x - peak) ** 2) - 0.3 * (x - peak) ** 4 + 0.1 * (x - peak) ** 3

    x, ok = htmp._maximise(f, -5.0, 5.0, start, 0.2, 1e-2)
    assert ok
    assert x == pytest.approx(peak, abs=1e-2)
    assert x in calls  # a point that was evaluated, whose side results the caller holds
    assert len(calls) <= 25


@pytest.mark.parametrize(("end", "sign"), [(-2.0, -1.0), (3.0, 1.0)])
def test_stops_at_the_end_where_the_function_still_rises(end: float, sign: float) -> None:
    x, ok = htmp._maximise(lambda v: sign * v, -2.0, 3.0, 0.5, 0.2, 1e-2)
    assert ok and x == end


def test_on_a_grid_it_evaluates_only_grid_points_and_the_ends() -> None:
    calls: list[float] = []

    def f(x: float) -> float:
        calls.append(x)
        return -((x - 0.537) ** 2)

    x, ok = htmp._maximise(f, -5.0, 5.0, 0.1, 0.2, 1e-2, grid=1e-2)
    assert ok and x == pytest.approx(0.537, abs=1e-2)
    assert all(abs(c / 1e-2 - round(c / 1e-2)) < 1e-9 for c in calls)
    calls.clear()
    # rising towards an end that is not a grid point: it ends exactly there
    x, ok = htmp._maximise(f, -5.0, 0.3337, 0.1, 0.2, 1e-2, grid=1e-2)
    assert ok and x == 0.3337


@pytest.mark.parametrize("sigma", [0.02, 0.5, 1.0])
def test_with_sd_fraction_it_stops_at_a_quarter_of_the_statistical_error(sigma: float) -> None:
    # A skewed log-likelihood in x, largest at 0.537 with −f'' = 1/sigma² there.
    calls: list[float] = []

    def f(x: float) -> float:
        calls.append(x)
        z = (x - 0.537) / sigma
        return -0.5 * z * z - 0.3 * z**4 + 0.1 * z**3

    x, ok = htmp._maximise(f, -5.0, 5.0, 0.0, 0.2, 1e-2, grid=1e-2, sd_fraction=0.25)
    assert ok and abs(x - 0.537) <= max(1e-2, 0.25 * sigma)
    with_sd = len(calls)
    calls.clear()
    htmp._maximise(f, -5.0, 5.0, 0.0, 0.2, 1e-2, grid=1e-2)
    # a sharp peak is searched to xtol either way; a flat one stops sooner with sd_fraction
    assert (with_sd < len(calls)) if sigma > 0.1 else (with_sd == len(calls))


def test_the_start_matches_the_jensen_gap_of_the_law() -> None:
    for kappa, gamma in ((0.3, 0.2), (2.0, 0.5), (20.0, 0.1), (150.0, 0.3)):
        beta = 1.7
        # E[log x] − log E[x] from the closed forms of log_moment and mean
        gap = htmp.log_moment(kappa, gamma, beta) - math.log(htmp.mean(kappa, gamma, beta))
        assert htmp._jensen_gap(math.log(kappa), gamma) == pytest.approx(gap, abs=1e-12)
        assert htmp._log_kappa_start(gap, gamma) == pytest.approx(math.log(kappa), abs=1e-5)
        if kappa > 100.0:
            continue  # nearly Marchenko–Pastur: log κ is barely determined by any draw
        # and from a large draw, within a statistical error of log κ
        x = htmp.sample(20_000, kappa, gamma, beta, seed=3)
        start = htmp._prepare(x, gamma, 0.0).log_k0
        assert start == pytest.approx(math.log(kappa), abs=0.1)


def test_a_marchenko_pastur_like_spectrum_ends_at_the_kappa_bound() -> None:
    eigs = htmp.sample(1000, 150.0, 0.3, 1.0, seed=7)
    fitted = htmp.fit(eigs, 0.3, tau=0.0)
    assert fitted.kappa == pytest.approx(htmp.KAPPA_RANGE[1], rel=1e-12)
    assert fitted.at_bound and fitted.converged and "end of its range" in fitted.message


def test_fit_kappa_is_the_maximum_of_its_profile() -> None:
    # Brute force on the fit's own objective: the profile likelihood (β maximised by Brent on a
    # spline of the log-density spanning every β tried) at κ·e^±0.05, e^±0.1 is not higher.
    eigs = np.sort(htmp.sample(1000, 2.0, 0.5, 1.0, seed=7))
    fitted = htmp.fit(eigs, 0.5, tau=0.0)
    profile = {step: _profile(eigs, fitted.kappa * math.exp(step), 0.5) for step in (-0.1, -0.05, 0.0, 0.05, 0.1)}
    assert max(profile, key=profile.__getitem__) == 0.0
    assert fitted.loglik == pytest.approx(profile[0.0], abs=0.05)


def _profile(eigs: np.ndarray, kappa: float, gamma: float) -> float:
    from scipy.optimize import minimize_scalar

    log_x = np.log(eigs)
    log_b0 = math.log(kappa / (2.0 * gamma) / float(np.mean(eigs)))
    model = htmp._ProfileModel(kappa, gamma, log_b0 - 3.0 + log_x[0], log_b0 + 3.0 + log_x[-1])
    res = minimize_scalar(lambda lb: -model.loglik(lb, log_x), bounds=(log_b0 - 2.5, log_b0 + 2.5),
                          method="bounded", options={"xatol": 1e-7})
    return -float(res.fun)
