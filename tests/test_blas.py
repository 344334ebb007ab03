"""The GIL-free BLAS/LAPACK calls (wbfe.linalg.blas) against numpy and scipy."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.linalg.lapack import dpotrf

from wbfe.linalg import blas


def test_scipy_exports_the_routines() -> None:
    # Otherwise every call silently falls back to scipy's wrappers, which hold the GIL.
    assert blas.releases_gil()


@pytest.mark.parametrize("trans", [False, True])
def test_syrk_lower_accumulates_the_lower_triangle(trans: bool) -> None:
    rng = np.random.default_rng(0)
    n, k = 37, 90
    a = np.asfortranarray(rng.standard_normal((k, n) if trans else (n, k)))
    start = np.asfortranarray(rng.standard_normal((n, n)))
    c = start.copy(order="F")
    blas.syrk_lower(c, a, trans=trans)
    product = a.T @ a if trans else a @ a.T
    lower = np.tril_indices(n)
    np.testing.assert_allclose(c[lower], (start + product)[lower], rtol=1e-13, atol=1e-12)
    upper = np.triu_indices(n, 1)
    np.testing.assert_array_equal(c[upper], start[upper])  # never written


def test_syrk_lower_refuses_what_blas_would_misread() -> None:
    c = np.zeros((4, 4), order="F")
    with pytest.raises(ValueError, match="Fortran-ordered float64"):
        blas.syrk_lower(c, np.ones((4, 6)), trans=False)  # C-ordered
    with pytest.raises(ValueError, match="do not match"):
        blas.syrk_lower(c, np.ones((5, 6), order="F"), trans=False)


def test_getrf_equals_scipys_lu_and_reports_a_zero_pivot() -> None:
    from scipy.linalg import lu_factor

    a = np.random.default_rng(3).standard_normal((6, 4))
    lu = np.asfortranarray(a)
    assert blas.getrf(lu) == 0
    assert np.array_equal(lu, lu_factor(a)[0])  # the same dgetrf: bit for bit
    assert blas.getrf(np.ones((3, 3), order="F")) == 2  # u_22 is exactly zero
    with pytest.raises(ValueError, match="^getrf needs a Fortran-ordered float64 matrix$"):
        blas.getrf(np.ones((3, 3)))


def test_empty_products_and_spectra_are_empty() -> None:
    c = np.zeros((4, 4), order="F")
    blas.syrk_lower(c, np.ones((4, 0), order="F"), trans=False)  # k = 0: nothing to add
    assert not c.any()
    assert blas.eigvalsh_lower(np.zeros((0, 0), order="F")).shape == (0,)


def test_potrf_lower_equals_lapack_and_reports_failure() -> None:
    rng = np.random.default_rng(1)
    w = rng.standard_normal((30, 80))
    g = np.asfortranarray(w @ w.T)
    expected, info = dpotrf(g, lower=1, clean=1)
    assert info == 0
    mine = g.copy(order="F")
    assert blas.potrf_lower(mine) == 0
    np.testing.assert_allclose(np.tril(mine), expected, rtol=1e-13, atol=1e-13)
    singular = np.asfortranarray(np.diag([4.0, 1.0, -1.0, 2.0]))
    assert blas.potrf_lower(singular) == 3  # the leading minor of order 3 is not positive definite
    with pytest.raises(ValueError, match="square Fortran-ordered"):
        blas.potrf_lower(np.ones((3, 4), order="F"))


@pytest.mark.parametrize("p", [1, 2, 7, 64, 300])
def test_eigvalsh_lower_is_scipys_eigvalsh_bit_for_bit(p: int) -> None:
    from scipy.linalg import eigvalsh

    rng = np.random.default_rng(p)
    w = rng.standard_normal((p, 2 * p + 3)) * np.exp(rng.uniform(-3, 3, size=(p, 1)))  # a spread spectrum
    g = np.asfortranarray(w @ w.T)
    expected = eigvalsh(g.copy(order="F"), lower=True, check_finite=False)
    lower_only = np.asfortranarray(np.tril(g)) + np.triu(np.full((p, p), np.nan), 1)  # upper never read
    np.testing.assert_array_equal(blas.eigvalsh_lower(np.asfortranarray(lower_only)), expected)
    with pytest.raises(ValueError, match="square Fortran-ordered"):
        blas.eigvalsh_lower(np.ones((3, 3)))  # C-ordered


def test_eigvalsh_lower_lets_other_threads_run() -> None:
    # A solve on a second thread while this one counts in pure Python: with the GIL held for the
    # solve (scipy's wrapper), the count stops until it ends; released, it goes on at its own rate.
    import sys
    import threading
    import time

    from threadpoolctl import threadpool_limits

    rng = np.random.default_rng(3)
    w = rng.standard_normal((900, 1200))
    g = np.asfortranarray(w @ w.T)
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-4)  # a thread waiting for the GIL gets it within 0.1 ms of its release
    try:
        # One BLAS thread: a second one would spin against the counting loop for the other core.
        with threadpool_limits(1):
            def count_while(worker: threading.Thread) -> tuple[int, float]:
                ticks, start = 0, time.perf_counter()
                worker.start()
                while worker.is_alive():
                    ticks += 1
                return ticks, time.perf_counter() - start

            calibration, span = count_while(threading.Thread(target=time.sleep, args=(0.05,)))  # sleeps GIL-free
            rate = calibration / span
            ticks, elapsed = count_while(threading.Thread(target=blas.eigvalsh_lower, args=(g,)))
    finally:
        sys.setswitchinterval(interval)
    assert elapsed > 0.02, elapsed  # long enough to tell (p = 900: ~50 ms on one core)
    # Released: ~100 % of the rate on two cores (a busy machine leaves well over a third);
    # held: only the instants before the solve starts and after it ends.
    assert ticks / (rate * elapsed) > 0.3, (ticks, rate, elapsed)


def test_the_openblas_files_found_beside_the_wheels_are_the_ones_loaded() -> None:
    # Loading a file that is not already mapped would give a second OpenBLAS whose thread count
    # governs nothing; /proc/self/maps is the reference (where it exists).
    import os

    import scipy.linalg  # noqa: F401 - loads scipy's OpenBLAS

    wheel = set(blas._wheel_openblas())
    if os.path.exists("/proc/self/maps"):
        mapped = {os.path.realpath(p) for p in blas._mapped_openblas()}
        assert {os.path.realpath(p) for p in wheel} <= mapped
        assert mapped, "numpy and scipy load an OpenBLAS"
    assert blas.controls_threads()
