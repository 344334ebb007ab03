"""BFE-W against an independent computation, closed forms and its symmetries (docs/math.md §2)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from wbfe.errors import InvalidOptionError
from wbfe.metrics.bfe import bfe, bfe_from_moments, bfe_marchenko_pastur_limit, lambda_star


def _independent(w: np.ndarray, lam: float | None) -> float:
    """Primal formula straight from docs/math.md with slogdet of the smaller Gram matrix (no shared code)."""
    w = np.asarray(w, dtype=np.float64)
    g = w @ w.T if w.shape[0] <= w.shape[1] else w.T @ w
    m = g.shape[0]
    tr = np.trace(g)
    lam = m / tr if lam is None else lam
    sign, logdet = np.linalg.slogdet(g)
    assert sign > 0
    return lam / (2 * m) * tr - logdet / (2 * m) + 0.5 * math.log(2 * math.pi / lam)


def _eigs(w: np.ndarray) -> np.ndarray:
    return np.linalg.svd(np.asarray(w, dtype=np.float64), compute_uv=False) ** 2


@pytest.mark.parametrize("shape", [(30, 50), (50, 30), (64, 64), (10, 400)])
@pytest.mark.parametrize("lam", [None, 0.37, 5.0])
def test_matches_independent_numpy(shape: tuple[int, int], lam: float | None) -> None:
    rng = np.random.default_rng(1)
    w = rng.standard_t(df=4, size=shape) * 0.1
    value, used = bfe(_eigs(w), "opt" if lam is None else lam)
    assert value == pytest.approx(_independent(w, lam), rel=1e-10)
    if lam is None:
        assert used == pytest.approx(min(shape) / np.sum(w**2), rel=1e-12)


def test_marchenko_pastur_limit() -> None:
    rng = np.random.default_rng(2)
    gamma = 0.25
    p = 1000
    w = rng.standard_normal((p, int(p / gamma)))
    value, _ = bfe(_eigs(w))
    # finite-size corrections are O(1/p)
    assert value == pytest.approx(bfe_marchenko_pastur_limit(gamma), abs=5e-3)
    assert bfe_marchenko_pastur_limit(gamma) == pytest.approx(
        0.5 * math.log(2 * math.pi * math.e) + 0.5 * (1 + 3 * math.log(0.75)), rel=1e-15
    )


def test_transposition_invariant() -> None:
    rng = np.random.default_rng(3)
    w = rng.standard_normal((40, 90))
    assert bfe(_eigs(w))[0] == pytest.approx(bfe(_eigs(w.T))[0], rel=1e-13)
    assert bfe(_eigs(w), 2.0)[0] == pytest.approx(bfe(_eigs(w.T), 2.0)[0], rel=1e-13)


def test_scale_invariant_at_lambda_star_and_not_at_fixed_lambda() -> None:
    rng = np.random.default_rng(4)
    e = _eigs(rng.standard_normal((30, 60)))
    c = 7.5
    assert bfe(e * c**2)[0] == pytest.approx(bfe(e)[0], rel=1e-13)
    lam = 0.8
    # F^λ(cW) − F^λ(W) = λ/2·(c²−1)·mean(e) − log c
    expected = lam / 2 * (c**2 - 1) * e.mean() - math.log(c)
    assert bfe(e * c**2, lam)[0] - bfe(e, lam)[0] == pytest.approx(expected, rel=1e-12)


def test_optimum_is_minimum_over_lambda() -> None:
    e = np.random.default_rng(5).gamma(2.0, size=50)
    f_star, lam_star = bfe(e)
    assert lam_star == pytest.approx(lambda_star(e))
    for lam in (lam_star * 0.5, lam_star * 0.9, lam_star * 1.1, lam_star * 3):
        assert bfe(e, lam)[0] > f_star
    assert bfe(e, lam_star)[0] == pytest.approx(f_star, rel=1e-13)


def test_zero_eigenvalue_gives_plus_infinity() -> None:
    assert bfe(np.array([0.0, 1.0, 2.0]))[0] == math.inf
    assert bfe(np.array([0.0, 1.0, 2.0]), 1.0)[0] == math.inf


@pytest.mark.parametrize("lam", [0.0, -1.0, math.nan, "x"])
def test_bad_lambda(lam: object) -> None:
    with pytest.raises(InvalidOptionError, match="lambda must be 'opt' or a positive number"):
        bfe(np.ones(3), lam)  # type: ignore[arg-type]


def test_no_eigenvalue_is_an_error() -> None:
    with pytest.raises(InvalidOptionError, match="^BFE-W needs at least one eigenvalue$"):
        bfe(np.array([]))


def test_all_zero_is_an_error() -> None:
    with pytest.raises(InvalidOptionError, match="all-zero"):
        bfe(np.zeros(4))


@pytest.mark.parametrize("eigs", [[1.0, math.nan, 2.0], [1.0, math.inf], [-1.0, 2.0, 3.0]])
def test_eigenvalues_no_gram_matrix_has_are_refused(eigs: list) -> None:
    # NaN said "undefined for an all-zero matrix", inf gave (nan, 0.0), a negative one +inf as if it were zero
    with pytest.raises(InvalidOptionError, match="finite, non-negative eigenvalues"):
        bfe(np.array(eigs))


@pytest.mark.parametrize(("mean_e", "mean_log_e"), [(math.nan, 0.0), (math.inf, 0.0), (1.0, math.nan)])
def test_moments_that_are_not_numbers_are_refused(mean_e: float, mean_log_e: float) -> None:
    # (inf, 0.0) and (nan, 1.0) came back with no reason; NaN mean(e) was called all-zero
    with pytest.raises(InvalidOptionError, match="finite mean"):
        bfe_from_moments(mean_e, mean_log_e)
    assert bfe_from_moments(2.0, -math.inf)[0] == math.inf  # a zero eigenvalue: +inf, as documented


@pytest.mark.parametrize("eigs", [[0.0, 0.0], [], [1e-320, 1e-320]])
def test_lambda_star_of_no_positive_mean_is_refused(eigs: list) -> None:
    # ZeroDivisionError, nan with a RuntimeWarning, inf
    with pytest.raises(InvalidOptionError, match="positive, finite mean eigenvalue"):
        lambda_star(np.array(eigs))
    assert lambda_star(np.array([1.0, 3.0])) == 0.5


def test_group_row_of_an_all_zero_spectrum_says_why() -> None:
    # an all-zero intra product: InvalidOptionError from bfe_from_moments aborted the whole score
    from wbfe.metrics._group import MetricOptions, Spectrum
    from wbfe.metrics.bfe import GROUP

    row = GROUP.compute(Spectrum(eigs=np.zeros(4), rows=4, cols=6), MetricOptions())
    assert math.isnan(row.values["bfe"]) and row.reasons["bfe"] == "all-zero spectrum: BFE-W is undefined"


def test_fixed_lambda_on_rescaled_eigenvalues_is_the_true_spectrums_bfe() -> None:
    # λ = 1e-300 on eigenvalues stored e^-1390 times the true ones is λ·e^1390 ~ 4e303 in stored units, past the range a
    # caller's λ is held to: it aborted the whole score ("lambda must lie in [1e-300, 1e+300], not 4e+303")
    from wbfe.metrics._group import MetricOptions, Spectrum
    from wbfe.metrics.bfe import GROUP

    e = np.array([0.5, 1.0, 2.0, 4.0])
    row = GROUP.compute(Spectrum(eigs=None, rows=4, cols=6, moments=(float(np.mean(e)), float(np.mean(np.log(e))), 4, 0),
                                 log_scale=1390.0), MetricOptions(lam=1e-300))
    # F(λ) = λ/2·mean(e_true) − ½·mean(log e_true) + ½·log(2π/λ), e_true = e·e^1390
    expected = (0.5 * math.exp(math.log(1e-300) + 1390.0) * np.mean(e) - 0.5 * (np.mean(np.log(e)) + 1390.0)
                + 0.5 * math.log(2 * math.pi / 1e-300))
    assert row.values["bfe"] == pytest.approx(expected, rel=1e-12) and row.values["lambda"] == 1e-300
