"""The two-stage eigenvalue solver (LAPACK dsyevd_2stage via wbfe.linalg.blas) against the solver it
replaces for large matrices (scipy's eigvalsh, dsyevr): every eigenvalue within 1e-12·λ_max, on
many spectra (Gaussian, heavy-tailed, rank-deficient, clustered, spiked, tiny and huge scales)."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.linalg
import torch

from wbfe.linalg import blas, spectra

pytestmark = pytest.mark.skipif(not blas.has_two_stage(), reason="no LAPACKE dsyevd_2stage in this LAPACK")


def _spectra_cases() -> list[tuple[str, np.ndarray]]:
    rng = np.random.default_rng(19)
    cases = []
    for p, n in ((1, 3), (2, 2), (17, 40), (64, 64), (100, 300), (257, 300), (400, 1600)):
        cases.append((f"gauss{p}x{n}", rng.standard_normal((p, n))))
        cases.append((f"student{p}x{n}", rng.standard_t(2.5, size=(p, n))))
    low = rng.standard_normal((150, 20)) @ rng.standard_normal((20, 400))  # rank 20 of 150
    cases.append(("rank-deficient", low))
    spiked = rng.standard_normal((200, 500))
    spiked[:3] *= 40.0
    cases.append(("spiked", spiked))
    q, _ = np.linalg.qr(rng.standard_normal((120, 120)))
    cases.append(("clustered", q @ np.diag(np.repeat([1.0, 1.0 + 1e-9, 3.0], 40)) @ q.T))
    cases.append(("tiny", rng.standard_normal((90, 200)) * 1e-150))
    cases.append(("huge", rng.standard_normal((90, 200)) * 1e140))
    return cases


@pytest.mark.parametrize(("name", "w"), _spectra_cases(), ids=lambda v: v if isinstance(v, str) else "")
def test_two_stage_equals_dsyevr(name: str, w: np.ndarray) -> None:
    g = np.asfortranarray(w @ w.T)
    today = scipy.linalg.eigvalsh(g.copy(order="F"), lower=True, check_finite=False)
    lower_only = np.asfortranarray(np.tril(g))  # LAPACK reads the lower triangle only
    two_stage = blas.eigvalsh_two_stage(lower_only)
    assert np.all(np.diff(two_stage) >= 0.0)
    np.testing.assert_allclose(two_stage, today, rtol=0.0, atol=1e-12 * today[-1])


def test_spectrum_uses_it_for_large_matrices(monkeypatch: pytest.MonkeyPatch) -> None:
    w = torch.randn(150, 420, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    today = spectra.eigenvalues([w], torch.device("cpu"))
    calls = []
    real = blas.eigvalsh_two_stage
    monkeypatch.setattr(blas, "eigvalsh_two_stage", lambda g: calls.append(g.shape) or real(g))
    monkeypatch.setattr(spectra, "TWO_STAGE_P", 100)
    got = spectra.eigenvalues([w], torch.device("cpu"))
    assert calls == [(150, 150)]
    np.testing.assert_allclose(got, today, rtol=0.0, atol=1e-12 * today[-1])


def test_bad_input_is_refused() -> None:
    with pytest.raises(ValueError):
        blas.eigvalsh_two_stage(np.ones((3, 3)))  # C-ordered
    with pytest.raises(ValueError):
        blas.eigvalsh_two_stage(np.ones((3, 4), order="F"))
