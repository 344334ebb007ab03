"""Tests of wbfe.metrics.htsr (HT-SR columns, MP fit) and wbfe.metrics.ww_compat, against WeightWatcher 0.7.7."""

from __future__ import annotations

import contextlib
import io
import math
import warnings

import numpy as np
import pytest

from wbfe.metrics import get_group
from wbfe.metrics._group import MetricOptions, Spectrum
from wbfe.options.conventions import WEIGHTWATCHER
from wbfe.metrics.htsr import COLUMNS, GROUP, WW_EVALS_THRESH, matrix_entropy, matrix_rank
from wbfe.metrics.mp import _KDE_GRID, _bounds_from_sums, _linear_kde, _MPResidual, _nelder_mead_1d, _ResidualBatch, mp_fit
from wbfe.metrics.powerlaw import fit_power_law, fit_truncated_power_law
from wbfe.metrics.ww_compat import WW_CONV2D_EIG_SCALE, ww_conv2d_dims, ww_conv2d_matrices, ww_linear_matrix

WW = MetricOptions(conventions=WEIGHTWATCHER)
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


def test_entropy_of_no_spectrum_or_rank_one_says_why() -> None:
    assert matrix_entropy(np.zeros(4), 4)[1] == "all-zero spectrum"
    result = GROUP.compute(Spectrum(np.array([0.0] * 19 + [5.0]), 20, 30), PLAIN)
    assert math.isnan(result.values["entropy"])
    assert result.reasons["entropy"] == "matrix rank 1: entropy normalised by ln(rank) is undefined"
    assert result.values["matrix_rank"] == 1 and result.values["rank_loss"] == 19


def test_power_law_of_an_unusable_spectrum_says_why() -> None:
    from wbfe.metrics.htsr import fit_spectrum_power_law

    for eigs, reason in ((None, "empty spectrum"), (np.array([1.0, np.nan]), "non-finite eigenvalue")):
        fit = fit_spectrum_power_law(Spectrum(eigs, 20, 30), PLAIN)
        assert fit.reason == reason and math.isnan(fit.alpha)


def test_an_mp_fit_that_fails_on_a_usable_spectrum_says_why() -> None:
    with warnings.catch_warnings():  # subnormal eigenvalues: rescaled to mean 1 they overflow, refused with no warning
        warnings.simplefilter("error")
        result = GROUP.compute(Spectrum(np.linspace(1.0, 2.0, 20) * 1e-320, 20, 30), PLAIN)
    for column in ("bulk_max", "num_spikes", "mp_softrank"):
        assert math.isnan(result.values[column])
        assert result.reasons[column] == "MP fit: eigenvalues too small or too large to rescale to mean 1 in float64"
    assert result.values["stable_rank"] == pytest.approx(30.0 / 2.0, rel=1e-2)  # Σe / max e: computed all the same


def test_ww_views_refuse_a_weight_of_the_wrong_shape() -> None:
    from wbfe.metrics.ww_compat import ww_truncated_smooth

    with pytest.raises(ValueError, match=r"^expected a 2-D weight, got shape \(2, 3, 4\)$"):
        ww_linear_matrix(np.ones((2, 3, 4)))
    with pytest.raises(ValueError, match=r"^expected a 4-D conv weight \(out, in, kh, kw\), got shape \(2, 3\)$"):
        ww_conv2d_matrices(np.ones((2, 3)))
    with pytest.raises(ValueError, match=r"^n_components 4 outside \[1, 3\]$"):  # scikit-learn refuses it too
        ww_truncated_smooth(np.ones((5, 3)), 4)


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
    expected = fit_power_law(tiny.eigs[-15:], method="ww")  # WW's small-N fit of the 15 kept
    assert expected.method == "ww-small-n"
    assert ww_tiny["alpha"] == pytest.approx(expected.alpha, rel=1e-14)
    assert ww_tiny["alpha"] != pytest.approx(plain["alpha"], rel=1e-3)


# ---------------------------------------------------------------- failures

#: Spectra no group can use, and the reason every group gives (tests/test_detx.py too).
UNUSABLE_SPECTRA = [
    (np.array([]), "empty spectrum"),
    (np.zeros(20), "all-zero spectrum"),
    (np.array([-1.0, 1.0, 2.0]), "negative eigenvalue -1.0 (the spectrum stage should clip noise to 0)"),
    (np.array([1.0, np.inf]), "non-finite eigenvalue"),
]


@pytest.mark.parametrize("eigs,reason", UNUSABLE_SPECTRA)
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


# ---------------------------------------------------------------- MP fit: the fast path is today's fit

def _reference_mp_fit(eigs: np.ndarray, N: int, M: int) -> tuple[float, float, float, int]:  # noqa: N803
    """The MP fit as wbfe computed it before its fast path (frozen copy): every σ of the grid
    evaluated on the full KDE grid, then scipy's own ``fmin``. Returns (σ, bulk_max, softrank, spikes)."""
    from scipy import optimize

    e = np.asarray(eigs, dtype=np.float64)
    Q = N / M
    w_scale = np.sqrt(e.size) / np.sqrt(np.sum(e))
    to_plot = (w_scale * w_scale) * e
    lambda_max = float(np.max(to_plot))
    s = np.sqrt(lambda_max / np.square(1.0 + 1.0 / np.sqrt(Q)))
    to_fit = np.sqrt(to_plot) if Q == 1 else to_plot
    xde = np.linspace(0.0, float(np.max(to_fit)) + 0.5, 1000)
    yde = _linear_kde(to_fit, xde, 0.1)
    good = yde > 0.01
    n_dropped = int(np.count_nonzero(yde < 0.01))
    xde, yde = xde[good], yde[good]
    x_peak = xde[int(np.argmax(yde))]
    inv_sq = np.sqrt(1.0 / Q)

    def sum_squares(resid: np.ndarray) -> float:
        return float(np.sum(np.concatenate((resid, np.zeros(n_dropped))) ** 2))

    off_grid = sum_squares(np.full(xde.size, 1000.0))

    def law(sigma, b, a):  # noqa: ANN001, ANN202
        with np.errstate(divide="ignore", invalid="ignore"):
            if Q == 1:
                return np.nan_to_num((1 / (np.pi * sigma * sigma)) * np.sqrt(4 - xde**2))
            prefactor = 1 / (2 * np.pi * sigma * sigma * xde * (1 / Q))
            return np.nan_to_num(prefactor * np.sqrt((b - xde) * (xde - a)))

    def residual(p: np.ndarray) -> float:
        sigma = np.ravel(p)[0]
        b, a = np.power(sigma * (1 + inv_sq), 2), np.power(sigma * (1 - inv_sq), 2)
        if Q != 1 and ((b < x_peak) or (b > xde[-1]) or (a > x_peak)):
            return off_grid
        return sum_squares(law(sigma, b, a) - yde)

    sigmas = np.mgrid[slice(0.05 * s, 2.0 * s, 0.01 * s)]
    start = sigmas[int(np.argmin([residual(np.array([x])) for x in sigmas]))]  # brute, point by point
    sigma = float(np.ravel(optimize.fmin(residual, start, disp=False))[0])
    bulk_max = (sigma * (1 + 1 / np.sqrt(Q))) ** 2
    tw = 1 / np.sqrt(Q) * np.power(bulk_max, 2 / 3) * np.power(M, -2 / 3)
    spikes = int(np.count_nonzero(to_plot > bulk_max + np.sqrt(tw)))
    return sigma, float(bulk_max / (w_scale * w_scale)), float(bulk_max / lambda_max), spikes


def _mp_cases() -> list[tuple[str, np.ndarray, int, int]]:
    rng = np.random.default_rng(2026)
    cases = []
    for n in (2, 3, 5, 8, 10, 16, 40, 64, 200):
        for ratio in (1, 2, 4):
            P = n * ratio
            w = rng.standard_normal((P, n))
            cases.append((f"gauss n={n} Q={ratio}", spectrum_of([w]).eigs, P, n))
            t = rng.standard_t(2.5, size=(P, n))
            cases.append((f"t2.5 n={n} Q={ratio}", spectrum_of([t]).eigs, P, n))
    for n in (20, 64, 150):
        w = rng.standard_t(3.0, size=(2 * n, n))
        w[:, n // 3 :] = 0.0  # exact zero eigenvalues
        cases.append((f"rank-deficient n={n}", spectrum_of([w]).eigs, 2 * n, n))
        e = np.sort(rng.gamma(2.0, size=n).round(1))  # many ties
        cases.append((f"ties n={n}", e, 3 * n, n))
        cases.append((f"WW N<M n={n}", spectrum_of([rng.standard_normal((n, 2 * n))]).eigs, n, 2 * n))
        spikes = spectrum_of([rng.standard_normal((2 * n, n))]).eigs
        spikes[-3:] *= [20.0, 40.0, 80.0]
        cases.append((f"spiked n={n}", np.sort(spikes), 2 * n, n))
    cases.append(("constant", np.full(30, 2.0), 60, 30))
    cases.append(("one non-zero", np.array([0.0] * 9 + [1.0]), 20, 10))
    cases.append(("single", np.array([3.0]), 1, 1))
    return cases


@pytest.mark.parametrize("case", _mp_cases(), ids=lambda c: c[0])
def test_mp_fit_is_bit_for_bit_the_reference_fit(case: tuple[str, np.ndarray, int, int]) -> None:
    _, e, N, M = case
    fit = mp_fit(e, N, M)
    sigma, bulk_max, softrank, spikes = _reference_mp_fit(e, N, M)
    assert (fit.sigma_mp, fit.bulk_max, fit.mp_softrank, fit.num_spikes) == (sigma, bulk_max, softrank, spikes)


def _nm_functions() -> list[tuple[str, object, float]]:
    def residual_of(e: np.ndarray, N: int, M: int):  # noqa: ANN202
        Q = N / M
        e = e * e.size / np.sum(e)
        return _MPResidual(np.sqrt(e) if Q == 1 else e, Q).exact

    rng = np.random.default_rng(8)
    funcs: list[tuple[str, object, float]] = [
        ("quadratic", lambda x: (x - 1.234) ** 2, 0.3),
        ("quartic", lambda x: (x - 0.7) ** 4 + 1.0, 5.0),
        ("abs", lambda x: abs(x + 2.0), 0.0),
        ("staircase", lambda x: float(np.floor(4 * x)) ** 2, 3.3),  # ties everywhere
        ("flat", lambda x: 7.0, 1.0),
        ("unbounded", lambda x: -x, 1.0),  # runs out of evaluations
        ("nan beyond", lambda x: math.nan if x > 2 else (x - 3) ** 2, 1.9),
        ("inf beyond", lambda x: math.inf if x < 0.5 else (x - 0.2) ** 2, 0.6),
    ]
    for i in range(12):
        n = int(rng.integers(5, 120))
        ratio = int(rng.integers(1, 4))
        e = spectrum_of([rng.standard_t(3.0, size=(ratio * n, n))]).eigs
        funcs.append((f"mp residual {i}", residual_of(e, ratio * n, n), float(rng.uniform(0.2, 2.0))))
    return funcs


@pytest.mark.parametrize("func", _nm_functions(), ids=lambda f: f[0])
def test_nelder_mead_1d_is_scipy_fmin(func: tuple[str, object, float]) -> None:
    from scipy import optimize

    _, f, x0 = func
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref = float(optimize.fmin(lambda p: f(float(np.ravel(p)[0])), x0, disp=False)[0])
    assert _nelder_mead_1d(f, x0) == ref


def _batch_lower_bounds(batch: _ResidualBatch, sigmas: np.ndarray, b: np.ndarray, a: np.ndarray) -> tuple:
    """The lower bounds (and margins) that mp_fit_many's grid prunes with, of σ of a one-row batch, from its prefix
    sums: by Cauchy–Schwarz Σ law·y ≤ √(Σ law² · Σ_support y²), so the residual is at least Σ_off-support y² +
    (√Σ law² − √Σ_support y²)²."""
    x = batch.x[:_KDE_GRID]
    i0, i1 = np.searchsorted(x, a, side="right"), np.searchsorted(x, b, side="left")
    (n_lo, s1_lo, s2_lo, sy_lo), (n_hi, s1_hi, s2_hi, sy_hi) = batch.prefix[:, 0, i0], batch.prefix[:, 0, i1]
    c = batch.Q / (2 * np.pi * sigmas * sigmas)
    return _bounds_from_sums(c, float(batch.y2[0]), float(batch.prefix[3, 0, -1]), n_hi - n_lo, s1_hi - s1_lo,
                             s2_hi - s2_lo, sy_hi - sy_lo, s1_hi, s2_hi, b, a)


def test_mp_residual_lower_bounds_hold() -> None:
    rng = np.random.default_rng(10)
    for n, ratio, df in ((8, 2, 2.5), (16, 2, 100.0), (16, 4, 3.0), (64, 2, 2.5), (300, 3, 4.0), (50, 1.5, 3.0)):
        w = rng.standard_t(df, size=(int(ratio * n), n))
        e = spectrum_of([w]).eigs
        e = e * e.size / np.sum(e)
        residual = _MPResidual(e, float(ratio))
        sigmas = np.linspace(0.05, 2.5, 400)
        b, a = (sigmas * (1 + residual.inv_sq)) ** 2, (sigmas * (1 - residual.inv_sq)) ** 2
        valid = np.array([not residual.off(float(bb), float(aa)) for bb, aa in zip(b, a)])
        bound, margin = _batch_lower_bounds(_ResidualBatch(e[None, :], float(ratio)), sigmas[valid], b[valid], a[valid])
        exact = np.array([residual.exact(float(sigma)) for sigma in sigmas[valid]])
        assert np.all(bound - margin <= exact)
        if n >= 64:  # and useful: most σ are pruned (the KDE of a few eigenvalues is too bumpy for that)
            assert np.count_nonzero(bound - margin > np.min(exact)) > 0.5 * exact.size


# ---------------------------------------------------------------- batches (compute_many)

def _batch_specs() -> list[Spectrum]:
    """Spectra of a few shapes, interleaved, with the failures and corner cases a model has."""
    specs = []
    for seed in range(12):
        specs.append(spectrum_of([heavy_tailed((32, 96), 2.5 + 0.2 * seed, seed)]))
        if seed % 3 == 0:
            specs.append(spectrum_of([heavy_tailed((64, 64), 3.0, 100 + seed)]))  # Q = 1
    low_rank = heavy_tailed((32, 4), 3.0, 7) @ heavy_tailed((4, 96), 3.0, 8)
    specs.append(spectrum_of([low_rank]))  # 28 zero eigenvalues: a power law on too few values
    specs.append(Spectrum(np.zeros(32), 32, 96))  # all zero
    specs.append(Spectrum(np.array([0.5, 1.0, 2.0, 3.0, 7.0]), 5, 9))  # too few for a tail
    shifted = spectrum_of([heavy_tailed((32, 96), 2.2, 99)])
    specs.append(Spectrum(shifted.eigs, 32, 96, log_scale=-400.0))  # rescaled: NaN where out of range
    return specs


@pytest.mark.parametrize("options", [PLAIN, WW], ids=["plain", "ww"])
def test_compute_many_is_compute_of_each(options: MetricOptions) -> None:
    import json

    specs = _batch_specs()
    many = GROUP.compute_many(specs, options)
    assert len(many) == len(specs)
    for spec, got in zip(specs, many):
        one = GROUP.compute(spec, options)
        # json writes NaN as NaN: equal dumps are equal values, NaN columns included, and equal reasons.
        assert json.dumps(got.values) == json.dumps(one.values)
        assert got.reasons == one.reasons
        if spec.eigs.size < 20 or not spec.eigs[-1] > 0:
            continue
        # ... and the fit columns are the per-spectrum fits' (independently of compute_many).
        e = np.sort(spec.eigs)
        fit = mp_fit(e, spec.P, spec.p)
        assert (got.values["num_spikes"], got.values["mp_softrank"]) == (fit.num_spikes, fit.mp_softrank)
        tail = e[e > (WW_EVALS_THRESH * math.exp(-spec.log_scale) if options.conventions is WEIGHTWATCHER else 0.0)]
        pl = fit_power_law(tail, min_tail=options.min_tail, method="ww" if options.conventions is WEIGHTWATCHER else "csn")
        if pl.ok:
            assert got.values["alpha"] == pl.alpha
            tpl = fit_truncated_power_law(tail, xmin=pl.xmin)
            assert got.values["tpl_alpha"] == pytest.approx(tpl.alpha, rel=1e-12)
        else:
            assert math.isnan(got.values["alpha"])


def test_log_alpha_norm_past_float64_under_a_negative_truncated_alpha_says_why() -> None:
    # An orthogonal float32 matrix: eigenvalues 1 ± rounding, whose truncated fit gives α ~ -7e14; Σ (e/max e)^α
    # overflowed to inf, written as null with no reason.
    import torch

    import wbfe

    q, _ = np.linalg.qr(np.random.default_rng(0).standard_normal((64, 64)))
    row = wbfe.score({"a.weight": torch.tensor(q, dtype=torch.float32)}, metrics=("htsr",), fit="tpl").layers[0]
    assert row["alpha"] < -1e10
    assert math.isnan(row["log_alpha_norm"]) and "overflows float64" in row["reasons"]["log_alpha_norm"]
