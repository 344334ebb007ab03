"""WeightWatcher parity II: htsr's rank columns, the ``vectors`` and ``detx`` groups.

``ww_compatible`` values are compared with WeightWatcher 0.7.7's ``analyze(vectors=True,
detX=True)`` on the same seeded torch model; default-mode values with independent computations
(numpy eigen-solves and WeightWatcher's own per-vector functions, its detX scan).
"""

from __future__ import annotations

import contextlib
import io
import logging
import math
import warnings

import numpy as np
import pytest

import wbfe
from wbfe.metrics import get_group
from wbfe.metrics._group import MetricOptions, Spectrum
from wbfe.options.conventions import WEIGHTWATCHER
from wbfe.metrics.detx import detx_tail
from wbfe.metrics.htsr import fit_spectrum_power_law
from wbfe.metrics.vectors import COLUMNS as VECTOR_COLUMNS
from wbfe.metrics.vectors import eigenvector_data

torch = pytest.importorskip("torch")

RANK_COLUMNS = ("rank_loss", "weak_rank_loss", "sv_min", "lambda_max")
DETX_COLUMNS = ("detX_num", "detX_val", "detX_val_unrescaled", "num_ERG_spikes", "ERG_gap")


def heavy(shape: tuple[int, ...], df: float, seed: int) -> "torch.Tensor":
    return torch.from_numpy(np.random.default_rng(seed).standard_t(df, size=shape).astype(np.float32))


def _model() -> "torch.nn.Module":
    torch.manual_seed(0)
    m = torch.nn.Sequential()
    m.add_module("conv", torch.nn.Conv2d(16, 32, 3))
    m.add_module("conv_even", torch.nn.Conv2d(40, 24, 2))  # out < in: transposed slices
    m.add_module("fc1", torch.nn.Linear(300, 200))
    m.add_module("fc2", torch.nn.Linear(200, 120))
    m.add_module("low_rank", torch.nn.Linear(200, 300))
    m.add_module("small", torch.nn.Linear(16, 12))  # WW's small-N power-law path
    with torch.no_grad():
        m.fc1.weight.copy_(heavy((200, 300), 3.0, 1))
        m.fc2.weight.copy_(heavy((120, 200), 2.5, 2))
        w = heavy((300, 200), 4.0, 3)
        w[150:] = 0.0  # rank 150: a 50-dimensional null space (complex eigenvectors in WW's eig)
        m.low_rank.weight.copy_(w)
        m.conv.weight.mul_(heavy((32, 16, 3, 3), 3.0, 5))
        m.conv.weight[:, :, 1, 1] *= 1e-3  # one slice much smaller: per-slice sv_min matters
        m.small.weight.copy_(heavy((12, 16), 3.0, 4))
    return m


@pytest.fixture(scope="module")
def parity():
    ww = pytest.importorskip("weightwatcher")
    model = _model()
    logging.disable(logging.WARNING)
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")
            details = ww.WeightWatcher(model=model).analyze(randomize=False, mp_fit=False, plot=False,
                                                            vectors=True, detX=True)
    finally:
        logging.disable(logging.NOTSET)
    ours = wbfe.score(model, ww_compatible=True, metrics="htsr,vectors,detx")
    return {row["name"]: row.to_dict() for _, row in details.iterrows()}, \
        {layer["name"].removesuffix(".weight"): layer for layer in ours.layers}


@pytest.mark.parametrize("name", ["conv", "conv_even", "fc1", "fc2", "low_rank", "small"])
def test_ww_compatible_columns_equal_weightwatcher(parity, name: str) -> None:
    ww_rows, ours = parity
    ref, got = ww_rows[name], ours[name]
    for column in RANK_COLUMNS + VECTOR_COLUMNS + DETX_COLUMNS:
        assert column in ref, column  # WW's own name
        assert got[column] == pytest.approx(float(ref[column]), rel=1e-6, abs=1e-12), (name, column)


def test_comparison_covers_the_quirks(parity) -> None:
    ww_rows, _ = parity
    assert ww_rows["low_rank"]["rank_loss"] == 50 and ww_rows["low_rank"]["weak_rank_loss"] == 50
    # conv: WW's sv_min is the largest of the slices' smallest singular values, far above the
    # smallest singular value of all (in the slice scaled by 1e-3)
    from wbfe.metrics.ww_compat import ww_conv2d_matrices

    slices = ww_conv2d_matrices(_model().conv.weight.detach().numpy())
    smallest = [np.linalg.svd(s, compute_uv=False).min() for s in slices]
    assert ww_rows["conv"]["sv_min"] == pytest.approx(max(smallest), rel=1e-9)
    assert max(smallest) > 100 * min(smallest)
    assert ww_rows["fc1"]["ERG_gap"] != 0  # a gap that is not trivially 0


# ---------------------------------------------------------------- default mode, independent paths

def _numpy_vector_columns(w: np.ndarray, n_tail: int) -> dict[str, float]:
    """The 12 columns from numpy's symmetric eigen-solve and WeightWatcher's per-vector functions."""
    from weightwatcher import RMT_Util as R

    x = w @ w.T if w.shape[0] <= w.shape[1] else w.T @ w
    _, v = np.linalg.eigh(x)  # ascending eigenvalues
    numbers = {"vec_entropy": [R.discrete_entropy(v[:, j]) for j in range(v.shape[1])],
               "loc_ratio": [R.localization_ratio(v[:, j]) for j in range(v.shape[1])],
               "part_ratio": [R.participation_ratio(v[:, j]) for j in range(v.shape[1])]}
    out = {}
    for metric, values in numbers.items():
        values = np.asarray(values)
        for part, chosen in (("bulk", values[: values.size - n_tail]), ("tail", values[values.size - n_tail:])):
            out[f"{part}_mean_{metric}"] = float(np.mean(chosen))
            out[f"{part}_var_{metric}"] = float(np.var(chosen))
    return out


@pytest.mark.parametrize("shape", [(120, 80), (60, 150)])
def test_default_vectors_against_numpy_and_ww_functions(shape: tuple[int, int]) -> None:
    pytest.importorskip("weightwatcher")
    w = heavy(shape, 3.0, 11).double()
    got = wbfe.score({"layer.weight": w}, metrics="htsr,vectors").layers[0]
    ref = _numpy_vector_columns(w.numpy(), got["num_pl_spikes"])
    assert set(ref) == set(VECTOR_COLUMNS)
    for column in VECTOR_COLUMNS:
        assert got[column] == pytest.approx(ref[column], rel=1e-9), column


@pytest.mark.parametrize("exponent", [-1000, 1000])
def test_vectors_of_a_matrix_whose_gram_leaves_float64(exponent: int) -> None:
    # Entries of 2^±1000: the Gram matrix overflows (an untyped ValueError from the histogram) or underflows (the
    # eigenvectors of zeros, silently). A common power of two brings it back: the same columns as the matrix's own.
    w = heavy((60, 150), 3.0, 11).double()
    plain = wbfe.score({"layer.weight": w}, metrics="htsr,vectors").layers[0]
    far = wbfe.score({"layer.weight": w * 2.0**exponent}, metrics="htsr,vectors").layers[0]
    for column in VECTOR_COLUMNS:
        assert far[column] == pytest.approx(plain[column], rel=1e-9), column
    # WeightWatcher's arithmetic has no answer there: every column NaN, and why.
    ww = wbfe.score({"layer.weight": w * 2.0**exponent}, metrics="vectors", ww_compatible=True).layers[0]
    assert all(math.isnan(ww[c]) for c in VECTOR_COLUMNS)
    assert "the Gram matrix leaves float64's range" in ww["reasons"][VECTOR_COLUMNS[0]]


def test_vectors_pool_slices_and_need_the_matrices() -> None:
    group = get_group("vectors")
    slices = [heavy((40, 30), 3.0, s).double() for s in range(3)]
    data = eigenvector_data(slices, torch.device("cpu"), MetricOptions(), "conv")
    assert data.eigs.size == data.loc_ratio.size == 90
    # a unit-norm vector has 1 <= ‖v‖₁/‖v‖∞ <= p and 1 <= ‖v‖₂/‖v‖₄ <= p^¼
    assert np.all((data.loc_ratio >= 1 - 1e-12) & (data.loc_ratio <= 30 + 1e-9))
    assert np.all((data.part_ratio >= 1 - 1e-12) & (data.part_ratio <= 30**0.25 + 1e-9))
    result = group.compute(Spectrum(eigs=np.sort(data.eigs), rows=40, cols=30, n_slices=3), MetricOptions())
    assert set(result.reasons) == set(VECTOR_COLUMNS)  # no hook output: every column NaN with why
    assert all("needs the matrix" in r for r in result.reasons.values())


def test_vectors_fail_with_reason_without_a_fit() -> None:
    w = torch.eye(12, dtype=torch.float64)  # constant spectrum: no power-law fit
    layer = wbfe.score({"eye.weight": w}, metrics="vectors").layers[0]
    assert all(math.isnan(layer[c]) for c in VECTOR_COLUMNS)


def _ww_detx(e: np.ndarray) -> tuple[int, int]:
    from weightwatcher.RMT_Util import detX_constraint

    return detX_constraint(np.sort(e), rescale=True)


@pytest.mark.parametrize("seed", range(8))
def test_detx_tail_equals_weightwatchers_scan(seed: int) -> None:
    pytest.importorskip("weightwatcher")
    rng = np.random.default_rng(seed)
    e = np.sort(rng.standard_t(2.5 + seed % 3, size=(60 + 10 * seed, 40 + 5 * seed)) ** 2 @ np.ones(40 + 5 * seed))
    num, idx, scaled = detx_tail(e)
    assert (num, idx) == _ww_detx(e)
    assert np.sum(scaled) == pytest.approx(e.size, rel=1e-12)


def test_detx_edge_cases_match_weightwatcher() -> None:
    pytest.importorskip("weightwatcher")
    for e in (np.full(10, 3.0), np.array([1.0, 1.0, 1.0, 1.0001]), np.array([0.0, 0.0, 1.0, 5.0]),
              np.array([0.5, 1.5])):
        assert detx_tail(e)[:2] == _ww_detx(e), e


def test_detx_group_columns() -> None:
    e = np.sort(np.random.default_rng(3).pareto(2.0, 400) + 0.1)
    spec = Spectrum(eigs=e, rows=400, cols=900)
    v = get_group("detx").compute(spec, MetricOptions()).values
    num, idx, scaled = detx_tail(e)
    assert v["detX_num"] == v["num_ERG_spikes"] == num
    assert v["detX_val"] == e[idx] and v["detX_val_unrescaled"] == pytest.approx(e[idx] * e.size / e.sum(), rel=1e-12)
    fit = fit_spectrum_power_law(spec, MetricOptions())
    assert v["ERG_gap"] == num - int(np.count_nonzero(e >= fit.xmin))
    # the tail product is below 1 and one more eigenvalue would bring it to at least 1
    assert np.prod(scaled[idx:]) < 1.0 <= np.prod(scaled[idx + 1:])


# ---------------------------------------------------------------- htsr's new columns, default mode

def test_rank_columns_against_svd() -> None:
    w = heavy((90, 140), 3.0, 21).double()
    w[:, :10] = 0.0
    u = torch.linalg.svdvals(w).numpy()
    layer = wbfe.score({"m.weight": w}, metrics="htsr").layers[0]
    assert layer["lambda_max"] == pytest.approx(u[0] ** 2, rel=1e-12)
    assert layer["rank_loss"] == 90 - np.linalg.matrix_rank(w.numpy()) == 0
    w[:30] = 0.0  # rank 60 of 90: 30 dead rows
    # The default mode scores the live 60×130 part (full rank); WeightWatcher's view counts the
    # dead rows' zeros (docs/math.md §1).
    layer = wbfe.score({"m.weight": w}, metrics="htsr").layers[0]
    live = torch.linalg.svdvals(w[30:, 10:]).numpy()
    assert (layer["dead_rows"], layer["dead_cols"], layer["rows"], layer["cols"]) == (30, 10, 60, 130)
    assert layer["rank_loss"] == 0 and layer["sv_min"] == pytest.approx(live.min(), rel=1e-10)
    layer = wbfe.score({"m.weight": w}, metrics="htsr", ww_compatible=True).layers[0]
    assert layer["rank_loss"] == 30 and layer["weak_rank_loss"] == 30 and layer["sv_min"] == 0.0
    small = heavy((50, 70), 3.0, 22).double() * 1e-4  # eigenvalues ~1e-6: some under WW's tolerance
    e = torch.linalg.svdvals(small).numpy() ** 2
    layer = wbfe.score({"s.weight": small}, metrics="htsr").layers[0]
    assert layer["weak_rank_loss"] == int(np.count_nonzero(e < 1e-6)) and 0 < layer["weak_rank_loss"] < 50
    assert layer["sv_min"] == pytest.approx(math.sqrt(e.min()), rel=1e-8)


# ---------------------------------------------------------------- conv2d_fft

def test_conv2d_fft_equals_weightwatcher() -> None:
    ww = pytest.importorskip("weightwatcher")
    from wbfe.linalg.conv_fft import conv2d_fft_eigenvalues as ww_conv2d_fft_eigenvalues

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(16, 32, 3), torch.nn.Conv2d(32, 24, 3), torch.nn.Conv2d(12, 8, 5),
                                torch.nn.Conv2d(2, 1, 9))  # the last: out + in < kh + kw, FFT over the channels
    logging.disable(logging.WARNING)
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")
            details = ww.WeightWatcher(model=model).analyze(randomize=False, plot=False, conv2d_fft=True, mp_fit=True)
    finally:
        logging.disable(logging.NOTSET)
    assert len(details) == 4
    htsr = get_group("htsr")
    for (_, ref), layer in zip(details.iterrows(), model):
        e, n, m = ww_conv2d_fft_eigenvalues(layer.weight.detach().numpy())
        assert (n, m, e.size) == (ref["N"], ref["M"], ref["num_evals"])
        got = htsr.compute(Spectrum(eigs=e, rows=n, cols=m), MetricOptions(conventions=WEIGHTWATCHER)).values
        for column in ("alpha", "xmin", "num_pl_spikes", "log_norm", "log_spectral_norm", "stable_rank", "matrix_rank",
                       "entropy", "lambda_max", "num_spikes", "bulk_max"):
            assert got[column] == pytest.approx(float(ref[column]), rel=1e-6), (ref["name"], column)


def test_conv2d_fft_is_not_the_operator_spectrum() -> None:
    """What WW's conv2d_fft computes, written out: real part of the 32 × 32 FFT grid of each kernel,
    halved eigenvalues, the top rf·N·M — not the SVD of the frequency-domain operator."""
    from wbfe.linalg.conv_fft import conv2d_fft_eigenvalues as ww_conv2d_fft_eigenvalues

    w = heavy((6, 4, 3, 3), 3.0, 8).numpy()
    e, n, m = ww_conv2d_fft_eigenvalues(w)
    grids = np.fft.fft2(w, [32, 32], axes=[2, 3]).real.astype(np.float64)
    sv = np.sort(np.concatenate([np.linalg.svd(grids[i, j], compute_uv=False) for i in range(6) for j in range(4)]))
    assert (n, m) == (6, 4)
    assert e == pytest.approx(np.sort(sv[-3 * 6 * 4:] ** 2) / 2, rel=1e-10)
    operator = np.fft.fft2(w, [32, 32], axes=[2, 3])
    op_sv = np.concatenate([np.linalg.svd(operator[:, :, u, v], compute_uv=False) for u in range(32) for v in range(32)])
    assert op_sv.size == 4 * 32 * 32 != e.size


@pytest.mark.parametrize("group", ["htsr", "vectors", "detx", "fingers"])
def test_every_column_is_documented(group: str) -> None:
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "docs" / "metrics.md").read_text(encoding="utf-8")
    documented = set(re.findall(r"`([A-Za-z_0-9]+)`", text))
    assert set(get_group(group).columns) <= documented
