"""``fix_fingers`` and ``fit`` (wbfe.metrics.fingers): against WeightWatcher 0.7.7 where it runs them
(``clip_xmax``), and against the ``powerlaw`` package's own fits on the same candidates elsewhere
(WeightWatcher runs those through the package, and with powerlaw 2.0 its calls fail)."""

from __future__ import annotations

import contextlib
import io
import logging
import math
import warnings

import numpy as np
import pytest

from wbfe.errors import InvalidOptionError
from wbfe.metrics import get_group
from wbfe.metrics._group import MetricOptions, Spectrum
from wbfe.options.conventions import WBFE, WEIGHTWATCHER
from wbfe.metrics.fingers import (
    esd_peak,
    fit_tail,
    peak_range,
    tpl_ks_distance,
)
from wbfe.metrics.powerlaw import (
    fit_power_law,
    fit_power_law_in_range,
    fit_truncated_power_law,
)
from wbfe.options import ScoreOptions, check_tail_options

# The package's 2.0 default bounds α of a power law to [0, 3] and clamps larger exponents onto 3;
# with these bounds its fits are the Clauset–Shalizi–Newman ones that WeightWatcher was written for.
PL_RANGE = {"alpha": [1, None]}
TPL_RANGE = {"alpha": [-20, 20], "Lambda": [0, None]}


def spectrum(shape: tuple[int, int], df: float, seed: int) -> np.ndarray:
    w = np.random.default_rng(seed).standard_t(df, size=shape)
    return np.sort(np.linalg.eigvalsh(w @ w.T if shape[0] <= shape[1] else w.T @ w))


def _quiet_fit(x: np.ndarray, **kwargs):
    powerlaw = pytest.importorskip("powerlaw")
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        return powerlaw.Fit(x, verbose=False, **kwargs)


# ---------------------------------------------------------------- clip_xmax: WeightWatcher itself

def _model():
    """Seeded heavy-tailed layers (the model of test_ww_parity.py): conv, transposed conv, linear,
    rank-deficient linear, and 12 eigenvalues (WeightWatcher's small-N fit)."""
    import torch

    def heavy(shape, df, seed):
        return torch.from_numpy(np.random.default_rng(seed).standard_t(df, size=shape).astype(np.float32))

    torch.manual_seed(0)
    m = torch.nn.Sequential()
    m.add_module("conv", torch.nn.Conv2d(16, 32, 3))
    m.add_module("conv_even", torch.nn.Conv2d(40, 24, 2))
    m.add_module("fc1", torch.nn.Linear(300, 200))
    m.add_module("fc2", torch.nn.Linear(200, 120))
    m.add_module("low_rank", torch.nn.Linear(200, 300))
    m.add_module("small", torch.nn.Linear(16, 12))
    with torch.no_grad():
        m.fc1.weight.copy_(heavy((200, 300), 3.0, 1))
        m.fc2.weight.copy_(heavy((120, 200), 2.5, 2))
        w = heavy((300, 200), 4.0, 3)
        w[150:] = 0.0
        m.low_rank.weight.copy_(w)
        m.conv.weight.mul_(heavy((32, 16, 3, 3), 3.0, 5))
        m.small.weight.copy_(heavy((12, 16), 3.0, 4))
    return m


@pytest.fixture(scope="module")
def ww_clipped():
    torch = pytest.importorskip("torch")
    ww = pytest.importorskip("weightwatcher")
    from wbfe.metrics.ww_compat import ww_conv2d_matrices, ww_linear_matrix

    model = _model()
    logging.disable(logging.WARNING)
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")
            details = ww.WeightWatcher(model=model).analyze(randomize=False, mp_fit=False, plot=False,
                                                            fix_fingers="clip_xmax")
    finally:
        logging.disable(logging.NOTSET)
    specs = {}
    for name, module in model.named_children():
        w = module.weight.detach().numpy()
        mats = ww_conv2d_matrices(w) if w.ndim == 4 else [ww_linear_matrix(w)]
        specs[name] = Spectrum(eigs=np.sort(np.concatenate([np.linalg.svd(m, compute_uv=False) ** 2 for m in mats])),
                               rows=mats[0].shape[0], cols=mats[0].shape[1], n_slices=len(mats))
    del torch
    return {row["name"]: row.to_dict() for _, row in details.iterrows()}, specs


@pytest.mark.parametrize("name", ["conv", "conv_even", "fc1", "fc2", "low_rank", "small"])
def test_clip_xmax_equals_weightwatcher(ww_clipped, name: str) -> None:
    rows, specs = ww_clipped
    options = MetricOptions(conventions=WEIGHTWATCHER, fix_fingers="clip_xmax")
    got = dict(get_group("htsr").compute(specs[name], options).values)
    got.update(get_group("fingers").compute(specs[name], options).values)
    for column in ("alpha", "xmin", "sigma", "num_pl_spikes", "num_fingers", "raw_alpha"):
        assert got[column] == pytest.approx(float(rows[name][column]), rel=1e-6), (name, column)


def test_clip_xmax_comparison_clips_something(ww_clipped) -> None:
    rows, _ = ww_clipped
    assert sum(int(r["num_fingers"]) > 0 for r in rows.values()) >= 3
    assert all(r["raw_alpha"] >= r["alpha"] for r in rows.values())


def test_clip_xmax_by_hand() -> None:
    """The loop written out: refit without the top idx values until α drops by more than 1."""
    x = spectrum((120, 200), 2.2, 5)
    first = fit_power_law(x)
    expected = (first.alpha, 0)
    for idx in range(2, 10):
        fit = fit_power_law(x[:-idx])
        if fit.alpha + 1.0 < first.alpha:
            expected = (fit.alpha, idx - 1)
            break
        if fit.alpha <= 2.0:
            break
    got = fit_tail(x, fix_fingers="clip_xmax")
    assert (got.alpha, got.num_fingers) == expected and got.raw_alpha == first.alpha


# ---------------------------------------------------------------- xmin_peak: the powerlaw package

@pytest.mark.parametrize("seed", range(4))
def test_xmin_peak_equals_powerlaw_package(seed: int) -> None:
    x = spectrum((150, 260), 2.5 + seed % 3, seed)
    for conventions in (WBFE, WEIGHTWATCHER):
        lo, hi = peak_range(x, log10=conventions.peak_log10)
        ref = _quiet_fit(x, xmin=(lo, hi), parameter_ranges=PL_RANGE)
        got = fit_tail(x, fix_fingers="xmin_peak", conventions=conventions, min_tail=1)
        assert got.xmin == ref.xmin
        assert got.alpha == pytest.approx(ref.alpha, rel=1e-10)
        assert got.sigma == pytest.approx(ref.sigma, rel=1e-10)
        assert got.ks == pytest.approx(ref.D, rel=1e-9)
    # the default range [0.95·peak, 1.5·peak) is what the package is given; WW's keeps a log10
    peak = esd_peak(x)
    assert peak_range(x, log10=False) == (0.95 * peak, 1.5 * peak)
    assert peak_range(x, log10=True) == (math.log10(0.95 * peak), 1.5 * peak)


def test_esd_peak_is_the_fullest_log_bin() -> None:
    x = spectrum((100, 300), 4.0, 9)
    counts, edges = np.histogram(np.log10(x), bins=100)
    peak = esd_peak(x)
    assert math.log10(peak) == pytest.approx(edges[np.argmax(counts)], abs=1e-12)
    inside = np.count_nonzero((np.log10(x) >= edges[np.argmax(counts)]) & (np.log10(x) < edges[np.argmax(counts) + 1]))
    assert inside == counts.max() > 0


def test_range_fit_candidates() -> None:
    x = np.sort(np.random.default_rng(2).pareto(2.0, 300) + 1.0)
    lo, hi = x[20], x[200]
    fit = fit_power_law_in_range(x, lo, hi, min_tail=1)
    assert lo <= fit.xmin < hi and fit.xmin != x[199]  # the last candidate in range is dropped
    ref = _quiet_fit(x, xmin=(lo, hi), parameter_ranges=PL_RANGE)
    assert (fit.xmin, fit.n_candidates) == (ref.xmin, 179)
    assert fit_power_law_in_range(x, x[5], x[6]).reason is not None  # one candidate: dropped, none left


# ---------------------------------------------------------------- truncated power law: the package

def test_tpl_ks_distance_is_the_packages() -> None:
    x = spectrum((100, 180), 3.5, 1)
    x0 = x[40]
    ref = _quiet_fit(x, xmin=x0, parameter_ranges=TPL_RANGE).truncated_power_law
    assert tpl_ks_distance(x[x >= x0], ref.alpha, ref.Lambda) == pytest.approx(ref.D, rel=1e-9)
    ours = fit_truncated_power_law(x, xmin=x0)
    assert ours.alpha == pytest.approx(ref.alpha, rel=1e-3)
    assert ours.lam == pytest.approx(ref.Lambda, rel=1e-3)
    assert ours.loglik >= float(np.sum(ref.loglikelihoods(x[x >= x0]))) - 1e-9  # the exact MLE


def test_e_tpl_scan_against_the_package() -> None:
    """E_TPL: xmin by the truncated fit's own KS distance among the ESD-peak candidates."""
    x = spectrum((70, 120), 3.5, 1)
    lo, hi = peak_range(x, log10=False)
    got = fit_tail(x, fit="e_tpl", min_tail=3)
    ref = _quiet_fit(x, xmin=(lo, hi), xmin_distribution="truncated_power_law", parameter_ranges=TPL_RANGE)
    assert got.ks <= ref.D + 1e-6  # the exact MLE never chooses a worse tail than the package's optimiser
    assert got.xmin == ref.xmin
    _same_tpl_optimum(x, got, ref)
    assert math.isnan(got.sigma)


def _same_tpl_optimum(x: np.ndarray, got, ref) -> None:
    """Both solve the same maximum-likelihood problem on the same tail. The package's optimiser stops
    early (its α, Λ move by ~1e-5 relative along a flat ridge of the likelihood), so the optima are
    compared by likelihood: ours is never lower and the two agree to 1e-10 relative."""
    tpl = ref.truncated_power_law
    tail = x[x >= got.xmin]
    ours = fit_truncated_power_law(x, xmin=got.xmin)
    assert (ours.alpha, ours.lam) == (got.alpha, got.lam)
    theirs = float(np.sum(tpl.loglikelihoods(tail)))
    assert ours.loglik >= theirs - 1e-12 * abs(theirs)
    assert ours.loglik == pytest.approx(theirs, rel=1e-10)
    assert got.alpha == pytest.approx(tpl.alpha, rel=1e-4) and got.lam == pytest.approx(tpl.Lambda, rel=1e-4)


def test_tpl_over_the_full_range_against_the_package() -> None:
    """fit=tpl with no range: xmin over every candidate the package scans (min..max), by the truncated
    fit's KS distance, as WeightWatcher's TPL asks the package for."""
    x = spectrum((70, 120), 3.5, 1)
    got = fit_tail(x, fit="tpl", min_tail=1)
    ref = _quiet_fit(x, xmin_distribution="truncated_power_law", parameter_ranges=TPL_RANGE)
    assert got.xmin == ref.xmin
    _same_tpl_optimum(x, got, ref)


def test_htsr_columns_follow_the_fit_option() -> None:
    e = spectrum((90, 150), 3.0, 4)
    spec = Spectrum(eigs=e, rows=90, cols=150)
    options = MetricOptions(fit="tpl")
    result = get_group("htsr").compute(spec, options)
    fit = fit_tail(e, fit="tpl")
    assert result.values["alpha"] == fit.alpha and result.values["xmin"] == fit.xmin
    assert "sigma" in result.reasons
    assert get_group("fingers").compute(spec, options).values["Lambda"] == fit.lam
    plain = get_group("htsr").compute(spec, MetricOptions())
    assert plain.values["alpha"] == fit_power_law(e).alpha != result.values["alpha"]


# ---------------------------------------------------------------- options

def test_option_errors() -> None:
    with pytest.raises(InvalidOptionError, match="^fix_fingers must be 'xmin_peak' or 'clip_xmax', not 'peak'$"):
        MetricOptions(fix_fingers="peak")  # type: ignore[arg-type]
    with pytest.raises(InvalidOptionError, match="^fit must be one of 'pl', 'tpl', 'e_tpl', not 'TPL'$"):
        ScoreOptions(fit="TPL")
    with pytest.raises(InvalidOptionError, match="cannot be combined with fix_fingers=clip_xmax"):
        check_tail_options("clip_xmax", "e_tpl")
    with pytest.raises(InvalidOptionError, match="^fit must be one of 'pl', 'tpl', 'e_tpl', not 'TPL'$"):
        fit_tail(np.arange(1.0, 30.0), fit="TPL")  # type: ignore[arg-type]  # no options class checked it
    options = ScoreOptions(fix_fingers="xmin_peak", fit="tpl")
    assert options.to_dict()["fix_fingers"] == "xmin_peak" and options.to_dict()["fit"] == "tpl"
    assert "fit" not in ScoreOptions().to_dict()  # plain runs keep their provenance and cache keys
    assert MetricOptions.from_score_options(options) == MetricOptions(fix_fingers="xmin_peak", fit="tpl")


def test_fingers_thresholds_a_rescaled_spectrum_as_htsr_does() -> None:
    # The true eigenvalues are eigs·exp(log_scale): here all far below WeightWatcher's 1e-5. fingers scaled that
    # threshold with its own math.exp, which raised OverflowError (untyped) once exp(-log_scale) left float64 (a
    # matrix of 1e-160 entries under --ww-compatible --metrics fingers). One rule now serves both groups
    # (metrics._group.stored_threshold): both drop every eigenvalue and say so.
    e = np.sort(np.random.default_rng(7).pareto(2.5, 120) + 0.5)
    spec = Spectrum(eigs=e, rows=120, cols=300, log_scale=-800.0)
    fingers = get_group("fingers").compute(spec, MetricOptions(conventions=WEIGHTWATCHER, fix_fingers="xmin_peak"))
    htsr = get_group("htsr").compute(spec, MetricOptions(conventions=WEIGHTWATCHER))
    assert math.isnan(fingers.values["num_fingers"])
    assert fingers.reasons["num_fingers"] == "tail fit: need at least 3 positive finite values, got 0"
    assert math.isnan(htsr.values["alpha"]) and "(120 eigenvalue(s) <= 1e-05 dropped)" in htsr.reasons["alpha"]


@pytest.mark.parametrize("x", [[], [1.0, math.nan, 2.0], [0.0, 1.0, 2.0], [-1.0, 1.0, 2.0], [math.inf, 1.0, 2.0]],
                         ids=["empty", "nan", "zero", "negative", "inf"])
def test_esd_peak_refuses_what_has_no_log_peak(x: list[float]) -> None:
    # An empty x gave a peak of 1.0 (a number from nothing), the others numpy's ValueError from the histogram.
    with pytest.raises(InvalidOptionError, match=r"^esd_peak needs at least one value, all finite and positive"):
        esd_peak(np.array(x))
    assert esd_peak(np.array([2.0])) == 2.0  # one value v: numpy bins [log v - 0.5, log v + 0.5], v on the 51st's edge


@pytest.mark.parametrize(("x", "kwargs", "reason"), [
    (np.array([1.0, 2.0]), {}, "need at least 3 positive finite values, got 2"),
    (np.arange(1.0, 40.0), {"fit": "tpl", "min_tail": 50}, "no candidate xmin in [1, 39)"),
])
def test_failed_tail_fit_is_all_nan_with_reason(x: np.ndarray, kwargs: dict, reason: str) -> None:
    fit = fit_tail(x, **kwargs)
    assert fit.reason == reason and fit.num_fingers == 0
    assert all(math.isnan(v) for v in (fit.alpha, fit.sigma, fit.xmin, fit.ks, fit.lam, fit.raw_alpha))
