"""Batched power-law fits: each result equals the single fit of its sample, bit for bit."""

from __future__ import annotations

import dataclasses
import math
from typing import Optional

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.test_powerlaw import pareto, tpl_samples
from wbfe.errors import InvalidOptionError
from wbfe.metrics import powerlaw as module
from wbfe.metrics.powerlaw import (
    fit_power_law,
    fit_power_law_many,
    fit_truncated_power_law,
    fit_truncated_power_law_many,
)


def exact(fit: object) -> str:
    """Every field, floats by repr (round-trip exact; NaN equals NaN, −0.0 differs from 0.0)."""
    return repr(dataclasses.astuple(fit))  # type: ignore[call-overload]


def gram_eigs(rng: np.random.Generator, n: int, heavy: bool) -> np.ndarray:
    w = rng.standard_t(2.5, size=(2 * n, n)) if heavy else rng.standard_normal((2 * n, n))
    e = np.linalg.eigvalsh(w.T @ w / (2 * n))
    return e[e > 0.0]


def tpl_cases(seed: int, count: int) -> list[tuple[str, np.ndarray, Optional[float]]]:
    """(kind, sample, xmin) of every kind the scoring loop and the fit's branches meet, mixed."""
    rng = np.random.default_rng(seed)
    cases: list[tuple[str, np.ndarray, Optional[float]]] = []
    for k in range(count):
        kind = k % 9
        s = int(rng.integers(1 << 30))
        if kind == 0:  # Pareto: Λ at or near 0
            cases.append(("pareto", pareto(float(rng.uniform(1.5, 4.0)), int(rng.integers(20, 400)), s), 1.0))
        elif kind == 1:  # truncated, α from below 0 to above 2
            alpha, lam = float(rng.uniform(-2.0, 2.5)), float(10.0 ** rng.uniform(-2, 0.5))
            cases.append(("tpl", tpl_samples(alpha, lam, 1.0, int(rng.integers(10, 300)), s), 1.0))
        elif kind in (2, 3):  # MP bulks and heavy tails above the power-law fit's xmin
            e = gram_eigs(rng, int(rng.choice([16, 32, 64, 144])), heavy=kind == 3)
            fit = fit_power_law(e)
            cases.append(("mp" if kind == 2 else "heavy", e, fit.xmin if fit.ok else None))
        elif kind == 4:  # the same spectra with the default xmin (the smallest value)
            cases.append(("whole", gram_eigs(rng, 16, heavy=True), None))
        elif kind == 5:  # Λ = 0 boundary: data with a mean above the power law's
            cases.append(("boundary", 1.0 + np.concatenate([rng.uniform(0, 0.5, 4), [40.0 + rng.uniform()]]), 1.0))
        elif kind == 6:  # tiny tails: fewer than 3 values >= xmin
            x = rng.uniform(0.5, 2.0, int(rng.integers(1, 6)))
            cases.append(("tiny", x, float(np.sort(x)[-min(2, x.size)])))
        elif kind == 7:  # degenerate: every value of the tail equals xmin, or nothing positive
            cases.append(("degenerate", np.full(int(rng.integers(3, 30)), 2.5), None) if k % 2 else ("empty", np.zeros(4), None))
        else:  # a narrow, nearly Gaussian tail: α ≈ −60, a nearly singular Hessian
            x = rng.gamma(60.0, 1 / 2.0, 400)
            cases.append(("narrow", x, float(np.quantile(x, 0.9))))
    return cases


def test_cases_cover_every_branch() -> None:
    fits = [fit_truncated_power_law(x, xmin=m) for _, x, m in tpl_cases(1, 90)]
    reasons = {f.reason for f in fits}
    assert "no positive values" in reasons
    assert "degenerate tail: all values equal xmin" in reasons
    assert any(r is not None and r.startswith("only ") for r in reasons)
    assert any(f.ok and f.lam == 0.0 for f in fits)  # the boundary
    assert sum(f.ok and f.lam > 0.0 for f in fits) > 40
    assert any(f.ok and f.alpha < -20.0 for f in fits)  # the narrow tails


@pytest.mark.parametrize("size,seed", [(1, 2), (2, 3), (7, 4), (64, 5), (300, 6)])
def test_tpl_batch_equals_single_fits(size: int, seed: int) -> None:
    cases = tpl_cases(seed, size)
    batch = fit_truncated_power_law_many([x for _, x, _ in cases], [m for _, _, m in cases])
    assert len(batch) == size
    for (kind, x, m), fit in zip(cases, batch):
        assert exact(fit) == exact(fit_truncated_power_law(x, xmin=m)), kind


def test_tpl_batch_result_does_not_depend_on_the_rest_of_the_batch() -> None:
    cases = tpl_cases(7, 40)
    samples, xmins = [x for _, x, _ in cases], [m for _, _, m in cases]
    first = fit_truncated_power_law_many(samples, xmins)
    order = np.random.default_rng(8).permutation(len(cases))
    shuffled = fit_truncated_power_law_many([samples[i] for i in order], [xmins[i] for i in order])
    assert [exact(first[i]) for i in order] == [exact(f) for f in shuffled]
    # Equal-length samples (the scoring loop's many matrices of one shape) likewise.
    rng = np.random.default_rng(9)
    same = [gram_eigs(rng, 32, heavy=bool(k % 2)) for k in range(24)]
    mins = [fit_power_law(e).xmin for e in same]
    assert [exact(f) for f in fit_truncated_power_law_many(same, mins)] == [
        exact(fit_truncated_power_law(e, xmin=m)) for e, m in zip(same, mins)
    ]


def test_tpl_batch_runs_the_log_phase_in_lockstep(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fits that stall against Λ = 0 finish in (α, log Λ) while others still iterate in (α, Λ),
    all evaluated together, and each ends where it ends alone."""
    rng = np.random.default_rng(10)
    log_phases: list[float] = []
    calls: list[int] = []
    real_newton, real_objective = module._damped_newton, module._tpl_objective_many

    def newton(x0, x1, log_lam):  # noqa: ANN001, ANN202
        if log_lam:
            log_phases.append(x0)
        return real_newton(x0, x1, log_lam)

    def objective(alpha, lam, mean_u, mean_y):  # noqa: ANN001, ANN202
        calls.append(alpha.size)
        return real_objective(alpha, lam, mean_u, mean_y)

    monkeypatch.setattr(module, "_damped_newton", newton)
    monkeypatch.setattr(module, "_tpl_objective_many", objective)
    # Samples whose mean falls just short of the power law's: the MLE has Λ ~ 1e-20 (found by a
    # search over seeds: about 1 in 300 such samples reaches the log phase).
    samples = [pareto(2.5, 3000, 660764732), pareto(2.5, 3000, 375391194), tpl_samples(2.5, 1e-3, 1.0, 2000, 923461893)]
    samples += [tpl_samples(1.5, 0.3, 1.0, 500, int(s)) for s in rng.integers(1 << 30, size=20)]
    fits = fit_truncated_power_law_many(samples, [1.0] * len(samples))
    assert len(log_phases) == 3
    assert calls[0] == len(samples) and sum(calls) > 3 * len(calls)  # lockstep rounds, not one by one
    assert all(f.ok for f in fits) and all(0.0 < f.lam < 1e-18 for f in fits[:3])
    monkeypatch.setattr(module, "_damped_newton", real_newton)
    monkeypatch.setattr(module, "_tpl_objective_many", real_objective)
    assert [exact(f) for f in fits] == [exact(fit_truncated_power_law(x, xmin=1.0)) for x in samples]


@settings(max_examples=60, deadline=None, derandomize=True)
@given(
    st.lists(
        st.tuples(
            st.lists(st.floats(1e-3, 1e3), min_size=0, max_size=40),
            st.one_of(st.none(), st.floats(1e-3, 1e2)),
        ),
        min_size=3,
        max_size=12,
    )
)
def test_tpl_batch_equals_single_fits_property(cases: list[tuple[list[float], Optional[float]]]) -> None:
    samples = [np.array(x) for x, _ in cases]
    xmins = [m for _, m in cases]
    batch = fit_truncated_power_law_many(samples, xmins)
    assert [exact(f) for f in batch] == [exact(fit_truncated_power_law(x, xmin=m)) for x, m in zip(samples, xmins)]


def test_batched_objective_is_the_single_one_bit_for_bit() -> None:
    """The objective of a fit evaluated among others equals its evaluation alone (every number)."""
    rng = np.random.default_rng(13)
    for size in (1, 3, 40):
        alpha = np.concatenate([rng.uniform(-80.0, 40.0, size), [37.1, -15.0, 0.9999251378006888]])
        lam = np.concatenate([10.0 ** rng.uniform(-18.0, 7.0, size), [5e-18, 1e7, 3.4345278851413745e-05]])
        mean_u, mean_y = rng.uniform(0.01, 2.0, alpha.size), 1.0 + rng.uniform(0.01, 5.0, alpha.size)
        many = [v.tolist() for v in module._tpl_objective_many(alpha, lam, mean_u, mean_y)]
        for k in range(alpha.size):
            one = module._tpl_objective(float(alpha[k]), float(lam[k]), float(mean_u[k]), float(mean_y[k]))
            assert repr(one) == repr(tuple(v[k] for v in many))


def test_tpl_batch_rejects_mismatched_lengths() -> None:
    with pytest.raises(InvalidOptionError, match="3 samples but 2 xmins"):
        fit_truncated_power_law_many([np.ones(5)] * 3, [1.0, 1.0])
    assert fit_truncated_power_law_many([], []) == []


def pl_samples(seed: int) -> list[np.ndarray]:
    """Spectra of one shape (batched together) and of several (alone), with every failure."""
    rng = np.random.default_rng(seed)
    samples = [gram_eigs(rng, int(rng.choice([16, 32])), heavy=bool(k % 2)) for k in range(40)]
    samples += [gram_eigs(rng, int(n), heavy=True) for n in (8, 19, 24, 48, 49, 64, 200)]
    samples += [rng.uniform(1.0, 1.2, 16) for _ in range(3)]  # flat: candidates with α near 1
    samples += [np.round(rng.gamma(1.5, size=32), 1) + 0.1 for _ in range(4)]  # ties
    samples += [np.full(16, 3.0), np.full(32, 2.0), np.full(16, 1.0)]  # constant: degenerate
    samples += [np.concatenate([[0.0], rng.uniform(1, 2, 15)]), np.concatenate([[np.nan], rng.uniform(1, 2, 15)])]
    samples += [np.array([1.0, 2.0]), np.array([]), pareto(2.0, 500, 3), pareto(1.2, 16, 4), pareto(6.0, 32, 5)]
    order = rng.permutation(len(samples))
    return [samples[i] for i in order]


@pytest.mark.parametrize("ww,min_tail", [(False, 10), (False, 3), (False, 40), (True, 2)])
def test_power_law_batch_equals_single_fits(ww: bool, min_tail: int, monkeypatch: pytest.MonkeyPatch) -> None:
    batched: list[int] = []
    real = module._fit_scan_many

    def spy(x, **kwargs):  # noqa: ANN001, ANN003, ANN202
        batched.append(x.shape[0])
        return real(x, **kwargs)

    monkeypatch.setattr(module, "_fit_scan_many", spy)
    samples = pl_samples(11)
    batch = fit_power_law_many(samples, min_tail=min_tail, ww_compatible=ww)
    single = [fit_power_law(x, min_tail=min_tail, ww_compatible=ww) for x in samples]
    assert [exact(f) for f in batch] == [exact(f) for f in single]
    # The 32-value spectra (and the 16-value ones outside the WW small-N mode) were scanned together.
    assert sum(batched) >= 30 or min_tail > 32
    assert any(f.ok for f in batch) and len({f.reason for f in batch if not f.ok}) >= 3
    if ww:
        assert {f.method for f in batch} == {"ww", "ww-small-n"}


@settings(max_examples=60, deadline=None, derandomize=True)
@given(
    st.integers(2, 48).flatmap(
        lambda n: st.lists(st.lists(st.floats(1e-3, 1e3), min_size=n, max_size=n), min_size=3, max_size=8)
    ),
    st.booleans(),
)
def test_power_law_batch_equals_single_fits_property(samples: list[list[float]], ww: bool) -> None:
    arrays = [np.array(x) for x in samples]
    batch = fit_power_law_many(arrays, min_tail=3, ww_compatible=ww)
    assert [exact(f) for f in batch] == [exact(fit_power_law(x, min_tail=3, ww_compatible=ww)) for x in arrays]


def test_power_law_batch_options_are_checked() -> None:
    with pytest.raises(InvalidOptionError):
        fit_power_law_many([np.ones(5)], min_tail=1)
    assert fit_power_law_many([]) == []


def test_the_narrow_tail_reaches_the_optimum() -> None:
    """A tail with α ≈ −60 has a nearly singular Hessian (log y and y nearly proportional): the
    fit still ends at the likelihood's stationary point, the data's mean statistics matched."""
    mpmath = pytest.importorskip("mpmath")
    mpmath.mp.dps = 30
    x = np.random.default_rng(3).gamma(60.0, 1 / 2.0, 400)
    xmin = float(np.quantile(x, 0.9))
    fit = fit_truncated_power_law(x, xmin=xmin)
    assert fit.ok and fit.alpha < -20.0
    a, lam = mpmath.mpf(fit.alpha), mpmath.mpf(fit.lam)
    tail = x[x >= xmin]
    cut = [xmin, xmin * 1.2, xmin * 2, mpmath.inf]
    z = mpmath.quad(lambda t: t ** (-a) * mpmath.exp(-lam * t), cut)
    e_log = mpmath.quad(lambda t: mpmath.log(t) * t ** (-a) * mpmath.exp(-lam * t), cut) / z
    e_x = mpmath.quad(lambda t: t ** (1 - a) * mpmath.exp(-lam * t), cut) / z
    assert float(e_log) == pytest.approx(float(np.mean(np.log(tail))), rel=1e-12)
    assert float(e_x) == pytest.approx(float(np.mean(tail)), rel=1e-12)
    assert math.isfinite(fit.loglik)
