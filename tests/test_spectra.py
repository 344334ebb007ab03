"""Eigenvalues: the smaller Gram matrix in float64, blocked accumulation, degenerate inputs."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from wbfe.errors import InvalidOptionError
from wbfe.linalg import spectra
from wbfe.linalg.spectra import DegenerateMatrixError, eigenvalues, resolve_device, spectrum

CPU = torch.device("cpu")


@pytest.mark.parametrize("shape", [(20, 70), (70, 20), (33, 33)])
def test_equal_squared_singular_values(shape: tuple[int, int]) -> None:
    w = torch.randn(*shape, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    expected = np.sort(np.linalg.svd(w.numpy(), compute_uv=False) ** 2)
    got = eigenvalues([w], CPU)
    assert got.shape == (min(shape),)
    np.testing.assert_allclose(got, expected, rtol=1e-10)


def test_blocked_gram_equals_one_block(monkeypatch: pytest.MonkeyPatch) -> None:
    w = torch.randn(15, 200, generator=torch.Generator().manual_seed(1))
    whole = eigenvalues([w], CPU)
    monkeypatch.setattr(spectra, "_BLOCK_BYTES", 8 * 15 * 7)  # 7 columns per block
    blocked = eigenvalues([w], CPU)
    np.testing.assert_allclose(blocked, whole, rtol=1e-12)
    np.testing.assert_allclose(eigenvalues([w.T.contiguous()], CPU), whole, rtol=1e-12)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_low_precision_inputs_are_exact_in_float64(dtype: torch.dtype) -> None:
    w = torch.randn(12, 40, generator=torch.Generator().manual_seed(2)).to(dtype)
    expected = np.sort(np.linalg.svd(w.to(torch.float64).numpy(), compute_uv=False) ** 2)
    np.testing.assert_allclose(eigenvalues([w], CPU), expected, rtol=1e-10)


def test_rank_deficient_gives_exact_zeros() -> None:
    g = torch.Generator().manual_seed(3)
    w = torch.randn(10, 3, generator=g, dtype=torch.float64) @ torch.randn(3, 30, generator=g, dtype=torch.float64)
    e = eigenvalues([w], CPU)
    assert np.count_nonzero(e == 0.0) == 7
    assert np.all(e[-3:] > 0)


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_non_finite_is_degenerate(bad: float) -> None:
    w = torch.randn(10, 20)
    w[3, 4] = bad
    with pytest.raises(DegenerateMatrixError, match="non-finite"):
        eigenvalues([w], CPU)


def test_all_zero_is_degenerate() -> None:
    with pytest.raises(DegenerateMatrixError, match="all-zero"):
        eigenvalues([torch.zeros(10, 20)], CPU)


def test_pooled_slices() -> None:
    g = torch.Generator().manual_seed(4)
    slices = [torch.randn(8, 12, generator=g, dtype=torch.float64) for _ in range(3)]
    spec = spectrum(slices, CPU)
    expected = np.sort(np.concatenate([np.linalg.svd(s.numpy(), compute_uv=False) ** 2 for s in slices]))
    np.testing.assert_allclose(spec.eigs, expected, rtol=1e-10)
    assert (spec.rows, spec.cols, spec.n_slices, spec.p, spec.gamma, spec.form) == (8, 12, 3, 8, 8 / 12, "primal")
    assert spectrum([torch.randn(12, 8)], CPU).form == "dual"


def test_devices() -> None:
    assert resolve_device("cpu").type == "cpu"
    assert resolve_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")
    with pytest.raises(InvalidOptionError, match="device must be auto, cpu or cuda"):
        resolve_device("tpu")
    if not torch.cuda.is_available():
        with pytest.raises(InvalidOptionError, match="no CUDA device"):
            resolve_device("cuda")


@pytest.mark.parametrize("name", ["cuda:x", "cuda:", "cuda:-1", "cudafoo", "CPU", "tpu", None])
def test_device_names_are_refused_by_their_form(monkeypatch: pytest.MonkeyPatch, name: object) -> None:
    # As if on a GPU machine, where "cuda:x" and "cudafoo" passed and failed in torch at the first tensor
    # moved there (RuntimeError), and None was an AttributeError.
    monkeypatch.setattr(spectra, "_cuda_available", lambda: True)
    with pytest.raises(InvalidOptionError, match=r"^device must be auto, cpu or cuda \(cuda:N for the N-th GPU\), not"):
        resolve_device(name)  # type: ignore[arg-type]


def test_cuda_index_past_the_last_gpu_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(spectra, "_cuda_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert resolve_device("cuda:1") == "cuda:1" and resolve_device("cuda") == "cuda"
    with pytest.raises(InvalidOptionError, match=r"^--device cuda:2: this machine has 2 CUDA device\(s\), cuda:0 to "):
        resolve_device("cuda:2")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(300, 700), (700, 300), (512, 512)])
def test_cuda_equals_cpu(dtype: torch.dtype, shape: tuple[int, int]) -> None:
    """On a GPU: the eigenvalues, and BFE-W from the Cholesky path, as on the CPU (where a large
    square matrix takes the LU path instead)."""
    from wbfe.linalg.spectra import log_moments
    from wbfe.metrics.bfe import bfe_from_moments

    cuda = torch.device("cuda")
    w = (torch.randn(*shape, generator=torch.Generator().manual_seed(5)) * 0.05).to(dtype)
    cpu_eigs = eigenvalues([w], CPU)
    np.testing.assert_allclose(eigenvalues([w], cuda), cpu_eigs, rtol=1e-9, atol=1e-12 * cpu_eigs[-1])
    on_gpu, on_cpu = log_moments([w], cuda), log_moments([w], CPU)
    assert on_gpu[2:] == on_cpu[2:]
    assert bfe_from_moments(*on_gpu[:2])[0] == pytest.approx(bfe_from_moments(*on_cpu[:2])[0], rel=1e-8)


@pytest.mark.parametrize("shape", [(20, 70), (70, 20), (40, 40)])
def test_cholesky_moments_equal_eigenvalue_moments(shape: tuple[int, int]) -> None:
    from wbfe.linalg.spectra import log_moments

    w = torch.randn(*shape, generator=torch.Generator().manual_seed(6)) * 3.0
    e = eigenvalues([w], CPU)
    mean, mean_log, n, n_zero = log_moments([w], CPU)
    assert (n, n_zero) == (min(shape), 0)
    assert mean == pytest.approx(e.mean(), rel=1e-12)
    assert mean_log == pytest.approx(np.mean(np.log(e)), rel=1e-10)


def test_cholesky_moments_of_pooled_slices_and_rank_deficient() -> None:
    from wbfe.linalg.spectra import log_moments

    g = torch.Generator().manual_seed(7)
    slices = [torch.randn(8, 12, generator=g, dtype=torch.float64) for _ in range(3)]
    e = eigenvalues(slices, CPU)
    mean, mean_log, n, _ = log_moments(slices, CPU)
    assert n == 24 and mean == pytest.approx(e.mean(), rel=1e-12)
    assert mean_log == pytest.approx(np.mean(np.log(e)), rel=1e-10)
    low = torch.randn(10, 3, generator=g, dtype=torch.float64) @ torch.randn(3, 30, generator=g, dtype=torch.float64)
    mean, mean_log, n, n_zero = log_moments([low], CPU)
    assert mean_log == -np.inf and n_zero == 7
    with pytest.raises(DegenerateMatrixError, match="all-zero"):
        log_moments([torch.zeros(5, 12)], CPU)
    with pytest.raises(DegenerateMatrixError, match="non-finite"):
        log_moments([torch.full((5, 12), float("nan"))], CPU)


def test_bfe_only_path_equals_full_path() -> None:
    import wbfe

    g = torch.Generator().manual_seed(8)
    state = {"a.weight": torch.randn(30, 80, generator=g), "b.weight": torch.randn(64, 16, 3, 3, generator=g)}
    only = wbfe.score(state, metrics="bfe", conv="slices")
    full = wbfe.score(state, metrics="bfe,htsr", conv="slices")
    for x, y in zip(only.layers, full.layers):
        assert x["bfe"] == pytest.approx(y["bfe"], rel=1e-10) and x["n_eigs"] == y["n_eigs"]


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
def test_lu_moments_of_large_square_equal_eigenvalue_moments(dtype: torch.dtype) -> None:
    from wbfe.linalg.spectra import log_moments

    w = (torch.randn(300, 300, generator=torch.Generator().manual_seed(9), dtype=torch.float64) * 0.1).to(dtype)
    before = w.clone()
    e = np.linalg.svd(w.to(torch.float64).numpy(), compute_uv=False) ** 2  # independent of the Gram path
    mean, mean_log, n, n_zero = log_moments([w], CPU)
    assert (n, n_zero) == (300, 0)
    assert mean == pytest.approx(e.mean(), rel=1e-12)
    assert mean_log == pytest.approx(np.mean(np.log(e)), rel=1e-10)
    assert torch.equal(w, before)  # factorised a copy, never the caller's tensor


def test_lu_moments_of_singular_and_bad_square_matrices() -> None:
    from wbfe.linalg.spectra import log_moments

    g = torch.Generator().manual_seed(10)
    low = torch.randn(300, 290, generator=g, dtype=torch.float64) @ torch.randn(290, 300, generator=g, dtype=torch.float64)
    mean, mean_log, n, n_zero = log_moments([low], CPU)
    assert (mean_log, n, n_zero) == (-np.inf, 300, 10)
    assert mean == pytest.approx(eigenvalues([low], CPU).mean(), rel=1e-12)
    bad = torch.randn(300, 300, generator=g)
    bad[7, 9] = float("nan")
    with pytest.raises(DegenerateMatrixError, match="non-finite"):
        log_moments([bad], CPU)
    with pytest.raises(DegenerateMatrixError, match="all-zero"):
        log_moments([torch.zeros(300, 300)], CPU)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(40, 90), (90, 40), (300, 300)])
def test_gpu_code_path_run_on_the_cpu_equals_the_cpu_path(monkeypatch: pytest.MonkeyPatch, dtype: torch.dtype,
                                                          shape: tuple[int, int]) -> None:
    """The torch code path that runs on CUDA (Gram by addmm, torch eigvalsh and Cholesky), run on the
    CPU, against the numpy/LAPACK path: BFE-W within 1e-8 relative, as the GPU must be."""
    from wbfe.linalg.spectra import log_moments
    from wbfe.metrics.bfe import bfe_from_moments

    w = (torch.randn(*shape, generator=torch.Generator().manual_seed(13)) * 0.05).to(dtype)
    cpu_eigs, cpu_moments = eigenvalues([w], CPU), log_moments([w], CPU)
    monkeypatch.setattr(spectra, "_TORCH_ON_CPU", True)
    monkeypatch.setattr(spectra, "_DEVICE_BLOCK_BYTES", 8 * min(shape) * 16)  # several blocks
    torch_eigs, torch_moments = eigenvalues([w], CPU), log_moments([w], CPU)
    np.testing.assert_allclose(torch_eigs, cpu_eigs, rtol=1e-9, atol=1e-12 * cpu_eigs[-1])
    assert torch_moments[2:] == cpu_moments[2:]
    assert bfe_from_moments(*torch_moments[:2])[0] == pytest.approx(bfe_from_moments(*cpu_moments[:2])[0], rel=1e-8)


@pytest.mark.parametrize("matrices", [[], [np.ones((2, 3, 4))], [np.ones((3, 4)), np.ones((4, 3))]])
def test_spectrum_of_no_matrix_or_mixed_shapes_is_refused(matrices: list) -> None:
    # ValueError from numpy ("too many values to unpack", "inhomogeneous shape"); [] said "all-zero matrix"
    for need_eigs in (True, False):
        with pytest.raises(InvalidOptionError, match="2-D matrices of one shape"):
            spectrum(matrices, resolve_device("cpu"), need_eigs=need_eigs)


@pytest.mark.parametrize("name", ["cuda", "cuda:1"])
def test_cuda_without_a_gpu_is_refused_naming_what_was_asked(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    monkeypatch.setattr(spectra, "_cuda_available", lambda: False)
    with pytest.raises(InvalidOptionError, match=f"^--device {name} was asked for but no CUDA device is available$"):
        resolve_device(name)
