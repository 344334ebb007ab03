"""The GIL-free BLAS/LAPACK calls (wbfe._blas) against numpy and scipy."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.linalg.lapack import dpotrf

from wbfe import _blas


def test_scipy_exports_the_routines() -> None:
    # Otherwise every call silently falls back to scipy's wrappers, which hold the GIL.
    assert _blas.releases_gil()


@pytest.mark.parametrize("trans", [False, True])
def test_syrk_lower_accumulates_the_lower_triangle(trans: bool) -> None:
    rng = np.random.default_rng(0)
    n, k = 37, 90
    a = np.asfortranarray(rng.standard_normal((k, n) if trans else (n, k)))
    start = np.asfortranarray(rng.standard_normal((n, n)))
    c = start.copy(order="F")
    _blas.syrk_lower(c, a, trans=trans)
    product = a.T @ a if trans else a @ a.T
    lower = np.tril_indices(n)
    np.testing.assert_allclose(c[lower], (start + product)[lower], rtol=1e-13, atol=1e-12)
    upper = np.triu_indices(n, 1)
    np.testing.assert_array_equal(c[upper], start[upper])  # never written


def test_syrk_lower_refuses_what_blas_would_misread() -> None:
    c = np.zeros((4, 4), order="F")
    with pytest.raises(ValueError, match="Fortran-ordered float64"):
        _blas.syrk_lower(c, np.ones((4, 6)), trans=False)  # C-ordered
    with pytest.raises(ValueError, match="do not match"):
        _blas.syrk_lower(c, np.ones((5, 6), order="F"), trans=False)


def test_potrf_lower_equals_lapack_and_reports_failure() -> None:
    rng = np.random.default_rng(1)
    w = rng.standard_normal((30, 80))
    g = np.asfortranarray(w @ w.T)
    expected, info = dpotrf(g, lower=1, clean=1)
    assert info == 0
    mine = g.copy(order="F")
    assert _blas.potrf_lower(mine) == 0
    np.testing.assert_allclose(np.tril(mine), expected, rtol=1e-13, atol=1e-13)
    singular = np.asfortranarray(np.diag([4.0, 1.0, -1.0, 2.0]))
    assert _blas.potrf_lower(singular) == 3  # the leading minor of order 3 is not positive definite
    with pytest.raises(ValueError, match="square Fortran-ordered"):
        _blas.potrf_lower(np.ones((3, 4), order="F"))
