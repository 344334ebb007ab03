"""Small equal-shaped matrices eigen-solved in batches (spectra.spectra_batch) against the
per-matrix path (spectra.spectrum), and scoring a stack of experts in batches against one at a time."""

import math

import numpy as np
import pytest
import torch

import wbfe
from wbfe.engine import jobs
from wbfe.linalg import spectra
from wbfe.linalg.spectra import DegenerateMatrixError, spectra_batch, spectrum

CPU = torch.device("cpu")


def _stack(shape, n, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    rows, cols = shape
    out = []
    for k in range(n):
        w = torch.randn(rows, cols, generator=g, dtype=torch.float64) * (0.5 + k)
        if k % 4 == 1:  # rank-deficient: rank 3
            w = torch.randn(rows, 3, generator=g, dtype=torch.float64) @ torch.randn(3, cols, generator=g, dtype=torch.float64)
        if k % 4 == 2:  # a column scaled down to the noise level
            w[:, 0] *= 1e-9
        out.append(w.to(dtype))
    return out


@pytest.mark.parametrize("shape", [(7, 19), (40, 12), (64, 64), (95, 200), (256, 100)])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
def test_batched_eigenvalues_match_per_matrix(shape, dtype):
    matrices = _stack(shape, 9, dtype, seed=shape[0] * 7 + shape[1])
    batched = spectra_batch(matrices, CPU)
    assert len(batched) == len(matrices)
    for m, got in zip(matrices, batched):
        want = spectrum([m], CPU, need_eigs=True)
        assert (got.rows, got.cols, got.n_slices, got.log_scale) == (want.rows, want.cols, 1, 0.0)
        top = want.eigs[-1]
        assert got.eigs.shape == want.eigs.shape
        assert np.max(np.abs(got.eigs - want.eigs)) <= 1e-12 * top
        # the reference: numpy's eigenvalues of the float64 Gram matrix, independent of wbfe
        a = m.double().numpy()
        ref = np.linalg.eigvalsh(a @ a.T if a.shape[0] <= a.shape[1] else a.T @ a)
        assert np.max(np.abs(np.where(got.eigs == 0.0, 0.0, got.eigs - ref))) <= 1e-12 * top


def test_each_matrix_keeps_its_skip_and_scale():
    g = torch.Generator().manual_seed(1)
    good = torch.randn(20, 50, generator=g, dtype=torch.float64)
    nan = good.clone()
    nan[3, 4] = math.nan
    tiny = good * 1e-300  # its Gram matrix underflows: rescaled by a power of two, log_scale set
    out = spectra_batch([good, nan, torch.zeros(20, 50, dtype=torch.float64), tiny, good], CPU)
    assert isinstance(out[1], DegenerateMatrixError) and "non-finite" in str(out[1])
    assert isinstance(out[2], DegenerateMatrixError) and "all-zero" in str(out[2])
    want = spectrum([tiny], CPU)
    assert out[3].log_scale == want.log_scale != 0.0
    assert out[3].log_moments()[1] + out[3].log_scale == pytest.approx(want.log_moments()[1] + want.log_scale, rel=1e-12)
    assert out[3].log_moments()[0] == pytest.approx(want.log_moments()[0], rel=1e-12)
    assert out[0].log_moments() == out[4].log_moments()


def _experts(n=24, seed=0):
    g = torch.Generator().manual_seed(seed)
    sd = {"model.embed.weight": torch.randn(50, 32, generator=g)}
    for e in range(n):
        sd[f"model.layers.0.mlp.experts.{e}.gate_proj.weight"] = (torch.randn(64, 32, generator=g) * 0.1).to(torch.bfloat16)
    for e in range(n):
        sd[f"model.layers.0.mlp.experts.{e}.down_proj.weight"] = (torch.randn(32, 64, generator=g) * 0.1).to(torch.bfloat16)
    sd["model.layers.0.mlp.experts.5.gate_proj.weight"][:] = 0  # skipped in its place, with its reason
    sd["lm_head.weight"] = torch.randn(50, 32, generator=g)
    return sd


@pytest.mark.parametrize("metrics", ["bfe,htsr", "bfe,htsr,rand"])
def test_scoring_in_batches_equals_one_at_a_time(monkeypatch, metrics):
    batched = wbfe.score(_experts(), metrics=metrics, device="cpu")
    monkeypatch.setattr(jobs, "batchable", lambda *a: False)
    single = wbfe.score(_experts(), metrics=metrics, device="cpu")
    assert [r["name"] for r in batched.layers] == [r["name"] for r in single.layers]
    assert batched.skipped == single.skipped
    assert [s["reason"] for s in single.skipped] == ["all-zero matrix"]
    for a, b in zip(batched.layers, single.layers):
        assert a.keys() == b.keys() and a["reasons"] == b["reasons"]
        for k, v in a.items():
            if isinstance(v, float) and math.isfinite(v):
                assert v == pytest.approx(b[k], rel=1e-9, abs=1e-12), (a["name"], k)
            else:
                assert v == b[k] or (isinstance(v, float) and math.isnan(v) and math.isnan(b[k])), (a["name"], k)
    assert batched.summary.keys() == single.summary.keys()


def test_batches_are_used_and_bounded(monkeypatch):
    calls = []
    real = spectra.spectra_batch

    def spy(matrices, device):
        calls.append(len(matrices))
        return real(matrices, device)

    monkeypatch.setattr(jobs, "spectra_batch", spy)
    monkeypatch.setattr(spectra, "_BATCH_BYTES", 8 * 5 * (64 * 32 + 32 * 32))  # 5 experts a batch
    wbfe.score(_experts(), metrics="bfe", device="cpu")
    assert calls == []  # BFE-W alone: a Cholesky factor per matrix, not an eigen-solve
    wbfe.score(_experts(), metrics="bfe,htsr", device="cpu")
    # embed (float32) alone, 24 gate (64x32 bfloat16) in batches of 5, 24 down (32x64), head (float32) alone
    assert calls == [5, 5, 5, 5, 4, 5, 5, 5, 5, 4]  # a lone matrix (embed, head) goes its own way
