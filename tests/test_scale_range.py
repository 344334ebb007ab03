"""Matrices of extreme but finite scale: tiny weights (randn·1e-30) and float64 matrices scaled by
1e-200 or 1e200, whose Gram matrix would underflow or overflow float64, are scored, not skipped.

Scale-invariant columns (BFE-W at λ*, α, κ, ranks, entropy) equal those of the unscaled matrix;
the others are checked against mpmath on the scaled matrix itself, or are NaN with the reason."""

from __future__ import annotations

import math

import mpmath
import numpy as np
import pytest
import torch

import wbfe
from wbfe.linalg.spectra import near_one, spectrum

CPU = torch.device("cpu")
INVARIANT = ("bfe", "stable_rank", "matrix_rank", "entropy", "alpha", "num_pl_spikes", "tpl_alpha",
             "num_spikes", "mp_softrank", "htmp_kappa", "htmp_ks", "f_inf", "diagnosis")


def _weights(dtype: torch.dtype = torch.float64) -> torch.Tensor:
    return torch.randn(64, 128, generator=torch.Generator().manual_seed(3), dtype=torch.float64).to(dtype)


def _score(w: torch.Tensor) -> dict:
    result = wbfe.score({"a.weight": w}, metrics=("bfe", "htsr", "htmp"))
    assert not result.skipped
    return result.layers[0]


def _mp_log10_norm(w: np.ndarray) -> float:
    mpmath.mp.dps = 30
    return float(mpmath.log10(mpmath.fsum(mpmath.mpf(float(x)) ** 2 for x in w.ravel())))


@pytest.fixture(scope="module")
def reference() -> dict:
    return _score(_weights())


@pytest.mark.parametrize(("dtype", "scale"), [(torch.float32, 1e-30), (torch.float64, 1e-30), (torch.float64, 1e-60)])
def test_tiny_weights_score_every_column(reference: dict, dtype: torch.dtype, scale: float) -> None:
    # randn(64,128)·1e-30 once gave "math domain error" in htsr (Σ e^α underflowed to 0 for α > 5.3)
    # and aborted the whole score; at 1e-60 (e ~ 1e-118, α ~ 4.6) it underflows for every α.
    w = (_weights() * scale).to(dtype)
    row = _score(w)
    assert row["reasons"] == {}
    base = _score(w.to(torch.float64) / scale) if dtype == torch.float32 else reference
    for column in INVARIANT:
        if isinstance(base[column], str):
            assert row[column] == base[column], column
        else:
            # the HTMP fit stops at 1 % in κ: eigenvalues that differ by rounding move it slightly
            assert row[column] == pytest.approx(base[column], rel=1e-4 if column.startswith(("htmp", "f_")) else 1e-9), column
    assert row["log_norm"] == pytest.approx(_mp_log10_norm(w.to(torch.float64).numpy()), abs=1e-10)
    # log10 Σ e^α = log10 Σ (e/s²)^α + α·log10 s²
    assert row["log_alpha_norm"] == pytest.approx(base["log_alpha_norm"] + 2 * math.log10(scale) * row["alpha"], abs=1e-6)


@pytest.mark.parametrize("scale", [1e-200, 1e200])
def test_float64_beyond_the_gram_range_is_scored(reference: dict, scale: float) -> None:
    w = _weights() * scale
    row = _score(w)
    for column in INVARIANT:
        if isinstance(reference[column], str):
            assert row[column] == reference[column], column
        else:
            assert row[column] == pytest.approx(reference[column], rel=1e-9), column
    digits = 2.0 * math.log10(scale)
    assert row["log_norm"] == pytest.approx(_mp_log10_norm(w.numpy()), abs=1e-10)
    assert row["log_norm"] == pytest.approx(reference["log_norm"] + digits, abs=1e-10)
    assert row["log_spectral_norm"] == pytest.approx(reference["log_spectral_norm"] + digits, abs=1e-10)
    assert row["alpha_weighted"] == pytest.approx(reference["alpha_weighted"] + row["alpha"] * digits, rel=1e-9)
    # Eigenvalues of order 1e±400 are not float64 numbers: those columns say so instead.
    for column in ("norm", "spectral_norm", "lambda", "bulk_max", "htmp_tau", "h", "h_star"):
        assert math.isnan(row[column]), column
        assert "outside float64's range" in row["reasons"][column], column


@pytest.mark.parametrize("shift", [-700, 700])
def test_spectrum_of_rescaled_matrix(shift: int) -> None:
    w = _weights()
    plain = spectrum([w], CPU)
    scaled = spectrum([w * math.ldexp(1.0, shift)], CPU)
    assert plain.log_scale == 0.0
    assert scaled.log_scale != 0.0
    # stored·exp(log_scale) = true eigenvalues = 4^shift · plain, in log space
    np.testing.assert_allclose(np.log(scaled.eigs) + scaled.log_scale, np.log(plain.eigs) + 2 * shift * math.log(2.0),
                               rtol=0, atol=1e-12)
    moments = spectrum([w * math.ldexp(1.0, shift)], CPU, need_eigs=False)
    assert moments.log_scale == scaled.log_scale
    assert moments.log_moments()[1] == pytest.approx(scaled.log_moments()[1], abs=1e-12)


def test_extreme_matrices_still_refused_for_their_true_reason() -> None:
    w = _weights()
    w[3, 4] = math.inf
    result = wbfe.score({"a.weight": w * 1e-200, "b.weight": _weights()})
    assert result.skipped[0]["reason"] == "non-finite values (NaN or Inf)"
    result = wbfe.score({"a.weight": torch.zeros(64, 128, dtype=torch.float64), "b.weight": _weights()})
    assert result.skipped[0]["reason"] == "all-zero matrix"


def test_subnormal_float64_weights_are_scored() -> None:
    # Largest entry ~1e-315 (subnormal): 2^range_shift alone is past float64's range, and the score once
    # raised OverflowError from math.ldexp instead of scoring the matrix.
    w = _weights() * 2.0**-1050  # rounded to the subnormals' fewer bits; scaling back up is exact
    row, base = _score(w), _score(w * 2.0**525 * 2.0**525)
    for column in ("bfe", "alpha", "stable_rank", "matrix_rank", "entropy", "num_spikes"):
        assert row[column] == pytest.approx(base[column], rel=1e-9), column
    assert row["log_norm"] == pytest.approx(base["log_norm"] - 2100 * math.log10(2.0), abs=1e-10)
    scaled, f = near_one(w.numpy())
    assert f == 2.0**1023 and np.array_equal(scaled, w.numpy() * 2.0**1023)
