"""Tests of wbfe.metrics.htsr (HT-SR columns, MP fit) and wbfe._ww_compat, against WeightWatcher 0.7.7."""

from __future__ import annotations

import contextlib
import io
import math
import warnings

import numpy as np
import pytest

from wbfe._ww_compat import WW_CONV2D_EIG_SCALE, ww_conv2d_dims, ww_conv2d_matrices, ww_linear_matrix
from wbfe.metrics import get_group
from wbfe.metrics._group import MetricOptions, Spectrum
from wbfe.metrics.htsr import COLUMNS, GROUP, _linear_kde, matrix_entropy, matrix_rank, mp_fit

WW = MetricOptions(ww_compatible=True)
PLAIN = MetricOptions()


def spectrum_of(mats: list[np.ndarray]) -> Spectrum:
    """What the spectra stage does: float64 smaller Gram, eigvalsh, noise clipped to 0, pooled."""
    eigs = []
    for m in mats:
        m = np.asarray(m, dtype=np.float64)
        gram = m.T @ m if m.shape[0] >= m.shape[1] else m @ m.T
        e = np.linalg.eigvalsh(gram)
        e[e <= np.max(e) * gram.shape[0] * np.finfo(np.float64).eps * 10] = 0.0
        eigs.append(e)
    rows, cols = mats[0].shape
    return Spectrum(eigs=np.sort(np.concatenate(eigs)), rows=rows, cols=cols, n_slices=len(mats))


def heavy_tailed(shape: tuple[int, int], df: float, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_t(df, size=shape).astype(np.float32)


# ---------------------------------------------------------------- WeightWatcher 0.7.7 comparison

LINEAR_LAYERS = ("fc1", "fc2", "fc3", "low_rank", "small")
CONV_LAYERS = ("conv", "conv_even", "conv_tiny")
MP_LAYERS = ("fc1", "low_rank", "conv", "conv_even", "conv_tiny")
MP_COLUMNS = ("bulk_max", "num_spikes", "mp_softrank")


@pytest.fixture(scope="module")
def ww_run():
    """A torch model with seeded heavy-tailed Linear layers and a few Conv2d, analysed once by WW."""
    torch = pytest.importorskip("torch")
    weightwatcher = pytest.importorskip("weightwatcher")
    torch.set_num_threads(1)
    torch.manual_seed(0)

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc1 = torch.nn.Linear(300, 200)
            self.fc2 = torch.nn.Linear(200, 400)
            self.fc3 = torch.nn.Linear(500, 250)
            self.low_rank = torch.nn.Linear(200, 300)
            self.small = torch.nn.Linear(16, 12)  # 12 eigenvalues: WW's small-N power-law path
            self.conv = torch.nn.Conv2d(16, 32, 3)
            self.conv_even = torch.nn.Conv2d(40, 24, 2)  # out < in, 4 slices: WW reports N < M
            self.conv_tiny = torch.nn.Conv2d(2, 1, 9)  # out + in < kh + kw: WW's "channels first"

    net = Net()
    with torch.no_grad():
        net.fc1.weight.copy_(torch.from_numpy(heavy_tailed((200, 300), 3.0, 1)))
        net.fc3.weight.copy_(torch.from_numpy(heavy_tailed((250, 500), 2.5, 2)))
        w = heavy_tailed((300, 200), 4.0, 3)
        w[150:] = 0.0  # rank 150: 50 exact zero eigenvalues
        net.low_rank.weight.copy_(torch.from_numpy(w))
        net.small.weight.copy_(torch.from_numpy(heavy_tailed((12, 16), 3.0, 4)))
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        watcher = weightwatcher.WeightWatcher(model=net)
        details = watcher.analyze(randomize=False, mp_fit=False, plot=False)
        # WW's MP fit is slow (a sklearn KDE per grid point): run it on a subset only.
        mp_details = watcher.analyze(randomize=False, mp_fit=True, plot=False, layers=list(MP_LAYERS))
    rows = {row["name"]: row.to_dict() for _, row in details.iterrows()}
    for _, row in mp_details.iterrows():
        rows[row["name"]].update({column: row[column] for column in MP_COLUMNS})
    weights = {name: getattr(net, name).weight.detach().numpy() for name in LINEAR_LAYERS + CONV_LAYERS}
    return weights, rows


def ww_spectrum(w: np.ndarray) -> Spectrum:
    return spectrum_of(ww_conv2d_matrices(w) if w.ndim == 4 else [ww_linear_matrix(w)])


REQUIRED = ("alpha", "alpha_weighted", "log_norm", "log_spectral_norm", "stable_rank")
ALSO_EQUAL = (
    "xmin", "sigma", "num_pl_spikes", "log_alpha_norm", "norm", "spectral_norm", "matrix_rank", "entropy",
)


@pytest.mark.parametrize("name", LINEAR_LAYERS + CONV_LAYERS)
def test_ww_compatible_columns_match_weightwatcher(ww_run, name: str) -> None:
    weights, rows = ww_run
    result = GROUP.compute(ww_spectrum(weights[name]), WW)
    assert result.reasons == {}
    ref = rows[name]
    # MP columns differ only where WW's reported N < M (see test_ww_conv_dims_reproduce_its_mp_fit).
    columns = REQUIRED + ALSO_EQUAL + (MP_COLUMNS if name in ("fc1", "low_rank", "conv") else ())
    for column in columns:
        assert result.values[column] == pytest.approx(float(ref[column]), rel=1e-6, abs=1e-12), column


def test_ww_conv_dims_reproduce_its_mp_fit(ww_run) -> None:
    weights, rows = ww_run
    for name in CONV_LAYERS:
        N, M, rf = ww_conv2d_dims(weights[name].shape)
        ref = rows[name]
        assert (N, M, rf) == (ref["N"], ref["M"], ref["rf"])
        assert ww_spectrum(weights[name]).eigs.size == ref["num_evals"]
        fit = mp_fit(ww_spectrum(weights[name]).eigs, N, M)
        for column in MP_COLUMNS:
            assert getattr(fit, column) == pytest.approx(float(ref[column]), rel=1e-6), (name, column)
    assert ww_conv2d_dims(weights["conv_even"].shape) == (24, 40, 4)  # the N < M quirk
    assert ww_conv2d_dims(weights["conv_tiny"].shape) == (1, 2, 81)


def test_mp_comparison_covers_spikes(ww_run) -> None:
    _, rows = ww_run
    assert rows["fc1"]["num_spikes"] > 0  # the comparison above is not only of spike-free layers


def test_weightwatcher_sees_the_zero_eigenvalues(ww_run) -> None:
    weights, rows = ww_run
    spec = ww_spectrum(weights["low_rank"])
    assert int(np.count_nonzero(spec.eigs == 0.0)) == 50
    assert rows["low_rank"]["matrix_rank"] == 150
    assert rows["low_rank"]["num_evals"] == 200  # zeros are kept in WW's ESD


# ---------------------------------------------------------------- independent formulas

def test_columns_against_svd_formulas() -> None:
    w = np.random.default_rng(7).standard_t(3.0, size=(180, 420))
    s = np.linalg.svd(w, compute_uv=False)
    result = GROUP.compute(spectrum_of([w]), PLAIN)
    v = result.values
    assert result.reasons == {}
    assert v["norm"] == pytest.approx(np.linalg.norm(w, "fro") ** 2, rel=1e-12)
    assert v["log_norm"] == pytest.approx(math.log10(np.linalg.norm(w, "fro") ** 2), rel=1e-12)
    assert v["spectral_norm"] == pytest.approx(np.linalg.norm(w, 2) ** 2, rel=1e-12)
    assert v["log_spectral_norm"] == pytest.approx(2 * math.log10(s[0]), rel=1e-12)
    assert v["stable_rank"] == pytest.approx(np.sum(s**2) / s[0] ** 2, rel=1e-12)
    assert v["matrix_rank"] == np.linalg.matrix_rank(w) == 180
    p = s**2 / np.sum(s**2)
    assert v["entropy"] == pytest.approx(-np.sum(p * np.log(p)) / math.log(180), rel=1e-12)
    assert v["alpha_weighted"] == pytest.approx(v["alpha"] * 2 * math.log10(s[0]), rel=1e-12)
    assert v["log_alpha_norm"] == pytest.approx(math.log10(np.sum(s ** (2 * v["alpha"]))), rel=1e-10)
    assert v["num_pl_spikes"] == int(np.count_nonzero(s**2 >= v["xmin"]))
    assert v["sigma"] == pytest.approx((v["alpha"] - 1) / math.sqrt(v["num_pl_spikes"]), rel=1e-12)
    assert set(v) == set(COLUMNS)


def test_entropy_of_flat_and_spiked_spectra() -> None:
    assert matrix_entropy(np.ones(50), 80)[0] == pytest.approx(1.0, rel=1e-14)
    e = np.array([0.0] * 10 + [1.0] * 30)  # zeros do not count: rank 30, uniform on it
    assert matrix_rank(e, 50) == 30
    assert matrix_entropy(e, 50)[0] == pytest.approx(1.0, rel=1e-14)
    assert matrix_entropy(np.array([0.0, 0.0, 5.0]), 3) == (
        pytest.approx(math.nan, nan_ok=True),
        "matrix rank 1: entropy normalised by ln(rank) is undefined",
    )


def test_zero_eigenvalues_are_dropped_from_the_fit_only() -> None:
    w = np.random.default_rng(11).standard_t(3.0, size=(300, 200))
    w[120:] = 0.0  # rank 120 of 200
    spec = spectrum_of([w])
    positive = spec.eigs[spec.eigs > 0]
    assert positive.size == 120
    full = GROUP.compute(spec, PLAIN).values
    only_positive = GROUP.compute(Spectrum(positive, 300, 200), PLAIN).values
    for column in ("alpha", "xmin", "sigma", "num_pl_spikes", "norm", "spectral_norm", "log_alpha_norm"):
        assert full[column] == pytest.approx(only_positive[column], rel=1e-14), column
    assert full["matrix_rank"] == 120
    assert full["entropy"] == pytest.approx(only_positive["entropy"], rel=1e-14)


def test_plain_alpha_is_scale_invariant_but_ww_threshold_is_not() -> None:
    from wbfe.metrics.powerlaw import fit_power_law

    w = np.random.default_rng(12).standard_t(3.0, size=(150, 300))
    spec = spectrum_of([w])
    # Scale so that exactly the 15 largest eigenvalues stay above WW's absolute 1e-5 threshold.
    scale = 1e-5 / np.sqrt(spec.eigs[-16] * spec.eigs[-15])
    tiny = Spectrum(spec.eigs * scale, spec.rows, spec.cols)
    assert int(np.count_nonzero(tiny.eigs > 1e-5)) == 15
    plain, plain_tiny = GROUP.compute(spec, PLAIN).values, GROUP.compute(tiny, PLAIN).values
    assert plain_tiny["alpha"] == pytest.approx(plain["alpha"], rel=1e-9)
    assert plain_tiny["stable_rank"] == pytest.approx(plain["stable_rank"], rel=1e-12)
    ww_tiny = GROUP.compute(tiny, WW).values
    expected = fit_power_law(tiny.eigs[-15:], ww_compatible=True)  # WW's small-N fit of the 15 kept
    assert expected.method == "ww-small-n"
    assert ww_tiny["alpha"] == pytest.approx(expected.alpha, rel=1e-14)
    assert ww_tiny["alpha"] != pytest.approx(plain["alpha"], rel=1e-3)


# ---------------------------------------------------------------- failures

@pytest.mark.parametrize(
    "eigs,reason",
    [
        (np.array([]), "empty spectrum"),
        (np.zeros(20), "all-zero spectrum"),
        (np.array([-1.0, 1.0, 2.0]), "negative eigenvalue -1.0 (the spectrum stage should clip noise to 0)"),
        (np.array([1.0, np.inf]), "non-finite eigenvalue"),
    ],
)
def test_unusable_spectrum_fails_every_column(eigs: np.ndarray, reason: str) -> None:
    result = GROUP.compute(Spectrum(eigs, 20, 30), PLAIN)
    assert set(result.reasons) == set(COLUMNS)
    assert all(r == reason for r in result.reasons.values())
    assert all(math.isnan(result.values[c]) for c in COLUMNS)


def test_too_few_eigenvalues_fail_the_power_law_only() -> None:
    e = np.array([0.5, 1.0, 2.0, 3.0, 7.0])
    result = GROUP.compute(Spectrum(e, 5, 9), PLAIN)
    failed = {
        "alpha", "sigma", "xmin", "num_pl_spikes", "alpha_weighted", "log_alpha_norm", "tpl_alpha", "tpl_lambda",
    }
    assert set(result.reasons) == failed
    assert result.reasons["alpha"] == "power-law fit: only 5 positive value(s), need a tail of at least 10"
    assert all(math.isnan(result.values[c]) for c in failed)
    assert result.values["stable_rank"] == pytest.approx(13.5 / 7.0, rel=1e-15)
    assert all(result.values[c] != -1 for c in COLUMNS)


def test_constant_spectrum() -> None:
    result = GROUP.compute(Spectrum(np.full(40, 2.0), 40, 40), PLAIN)
    assert result.reasons["alpha"] == (
        "power-law fit: degenerate spectrum: no tail of at least 10 values gives a finite alpha > 1"
    )
    assert result.values["stable_rank"] == pytest.approx(40.0, rel=1e-15)
    assert result.values["entropy"] == pytest.approx(1.0, rel=1e-14)
    ww = GROUP.compute(Spectrum(np.full(40, 2.0), 40, 40), WW)
    assert math.isnan(ww.values["alpha"]) and ww.reasons["alpha"].startswith("power-law fit: degenerate tail")


# ---------------------------------------------------------------- MP fit

def test_mp_fit_on_a_gaussian_matrix_finds_the_bulk_edge() -> None:
    p, P = 400, 1000
    w = np.random.default_rng(21).standard_normal((p, P))
    e = spectrum_of([w]).eigs
    fit = mp_fit(e, P, p)
    edge = P * (1 + math.sqrt(p / P)) ** 2  # MP edge of W Wᵀ for unit-variance entries
    assert fit.bulk_max == pytest.approx(edge, rel=0.05)
    assert fit.num_spikes == 0
    assert fit.mp_softrank == pytest.approx(fit.bulk_max / e.max(), rel=1e-12)
    # A strong rank-3 signal gives 3 spikes above the edge.
    rng = np.random.default_rng(22)
    u, v = np.linalg.qr(rng.standard_normal((p, 3)))[0], np.linalg.qr(rng.standard_normal((P, 3)))[0]
    spiked = w + u @ np.diag([150.0, 120.0, 100.0]) @ v.T
    assert mp_fit(spectrum_of([spiked]).eigs, P, p).num_spikes == 3


def test_linear_kde_matches_sklearn() -> None:
    neighbors = pytest.importorskip("sklearn.neighbors")
    x = np.random.default_rng(5).gamma(2.0, size=400)
    grid = np.linspace(0.0, x.max() + 0.5, 1000)
    kde = neighbors.KernelDensity(kernel="linear", bandwidth=0.1).fit(x[:, None])
    ref = np.exp(kde.score_samples(grid[:, None]))
    assert np.max(np.abs(_linear_kde(x, grid, 0.1) - ref)) < 1e-12


def test_mp_fit_failure() -> None:
    assert mp_fit(np.zeros(10), 20, 10).reason == "empty or all-zero spectrum"


# ---------------------------------------------------------------- group and WW conversion helpers

def test_group_is_registered() -> None:
    group = get_group("htsr")
    assert group is GROUP
    assert group.columns == COLUMNS
    assert set(group.summary_columns) <= set(group.columns)


def test_ww_conv2d_matrices_slices_and_scale() -> None:
    w = np.random.default_rng(3).standard_normal((8, 12, 3, 2)).astype(np.float32)
    mats = ww_conv2d_matrices(w)
    assert len(mats) == 6 and all(m.shape == (12, 8) for m in mats)  # out < in: transposed
    raw = np.linalg.svd(w[:, :, 1, 0].astype(np.float64), compute_uv=False) ** 2
    got = np.linalg.svd(mats[2], compute_uv=False) ** 2  # row-major kernel order: (1, 0) is third
    assert got == pytest.approx(WW_CONV2D_EIG_SCALE * raw, rel=1e-12)
    unpooled = ww_conv2d_matrices(w, pool=False)
    assert np.linalg.svd(unpooled[2], compute_uv=False) ** 2 == pytest.approx(3.0 * raw, rel=1e-12)


def test_ww_helpers_reject_wrong_shapes() -> None:
    message = r"expected a 4-D conv weight \(out, in, kh, kw\), got shape \(3, 4\)"
    with pytest.raises(ValueError, match=message):
        ww_conv2d_matrices(np.zeros((3, 4)))
    with pytest.raises(ValueError, match=r"expected a 2-D weight, got shape \(3, 4, 1\)"):
        ww_linear_matrix(np.zeros((3, 4, 1)))
