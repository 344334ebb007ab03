"""The batch HTMP fit (:func:`wbfe.metrics.htmp.fit_many`) and the group's ``compute_many``: each
spectrum's result equals its own :func:`~wbfe.metrics.htmp.fit` / ``compute``, failures stay with
their spectrum, and the batch shares its U grids (fewer profile models than the single fits)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from wbfe.errors import InvalidOptionError
from wbfe.metrics import htmp
from wbfe.metrics._group import MetricOptions, Spectrum

GAMMA = 0.5
# The search's tolerance on κ (1 %); β follows κ (log β is profiled at each κ).
TOL = htmp._LOG_KAPPA_XTOL


def _batch() -> list[np.ndarray]:
    """Ten draws of one law (an MoE layer's experts), a constant spectrum and a one-eigenvalue one."""
    draws = [htmp.sample(600, 2.0, GAMMA, 1.0 + 0.1 * i, seed=40 + i) for i in range(10)]
    return draws[:4] + [np.full(50, 2.0)] + draws[4:7] + [np.array([1.5])] + draws[7:]


def _count_models(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    built = [0]
    original = htmp._ProfileModel.__init__

    def counting(self: htmp._ProfileModel, *args: float) -> None:
        built[0] += 1
        original(self, *args)

    monkeypatch.setattr(htmp._ProfileModel, "__init__", counting)
    return built


def test_fit_many_equals_fit_per_spectrum_and_failures_stay_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    batch = _batch()
    built = _count_models(monkeypatch)
    many = htmp.fit_many(batch, GAMMA)
    shared = built[0]
    assert len(many) == len(batch)
    built[0] = 0
    for eigs, got in zip(batch, many):
        try:
            alone = htmp.fit(eigs, GAMMA)
        except InvalidOptionError as exc:
            assert isinstance(got, InvalidOptionError) and str(got) == str(exc)
            continue
        assert isinstance(got, htmp.HTMPFit)
        assert got.converged and alone.converged and got.n == alone.n
        assert got.tau == alone.tau
        assert got.kappa == pytest.approx(alone.kappa, rel=TOL)
        assert got.beta == pytest.approx(alone.beta, rel=TOL)
        assert got.ks == pytest.approx(alone.ks, abs=1e-3)
        # and it is a fit of its own spectrum: its likelihood, exactly computed, is its loglik
        exact = float(np.sum(htmp.logpdf(eigs, got.kappa, GAMMA, got.beta, got.tau)))
        assert got.loglik == pytest.approx(exact, rel=1e-6)
    assert [type(r) for r in many].count(InvalidOptionError) == 2
    # the constant spectrum leaves no room for the default τ (one spacing below min = min)
    assert "tau must lie" in str(many[4]) and "at least 2" in str(many[8])
    # One U grid per κ tried serves every spectrum that tries it.
    assert shared < built[0] / 2


def test_fit_many_keeps_tau_and_rejects_a_bad_gamma() -> None:
    batch = _batch()[:3]
    for got, eigs in zip(htmp.fit_many(batch, GAMMA, tau=0.0), batch):
        assert isinstance(got, htmp.HTMPFit) and got.tau == 0.0
        assert got.kappa == pytest.approx(htmp.fit(eigs, GAMMA, tau=0.0).kappa, rel=TOL)
    with pytest.raises(InvalidOptionError):
        htmp.fit_many(batch, 1.0)
    only_bad = htmp.fit_many([np.ones(20), np.array([2.0])], GAMMA, tau=0.0)
    assert len(only_bad) == 2 and all(isinstance(r, InvalidOptionError) for r in only_bad)
    assert "not constant" in str(only_bad[0]) and "at least 2" in str(only_bad[1])


def _spectrum(eigs: np.ndarray, cols_per_row: int = 2) -> Spectrum:
    return Spectrum(eigs=np.sort(eigs), rows=eigs.size, cols=cols_per_row * eigs.size)


def test_group_compute_many_equals_compute() -> None:
    specs = [_spectrum(e) for e in _batch() if e.size > 1]
    # other shapes and failures in the same call: another γ, a square matrix, too few eigenvalues,
    # zero eigenvalues dropped with a reason
    specs += [
        _spectrum(htmp.sample(400, 3.0, 0.25, 1.0, seed=9), cols_per_row=4),
        Spectrum(eigs=np.linspace(1.0, 2.0, 50), rows=50, cols=50),
        Spectrum(eigs=np.array([0.0, 0.0, 1.0, 2.0]), rows=4, cols=8),
        _spectrum(np.concatenate([np.zeros(5), htmp.sample(400, 2.0, GAMMA, 1.0, seed=11)])),
    ]
    options = MetricOptions()
    assert htmp.GROUP.compute_many is not None
    many = htmp.GROUP.compute_many(specs, options)
    assert len(many) == len(specs)
    for spec, got in zip(specs, many):
        want = htmp.GROUP.compute(spec, options)
        assert got.reasons == want.reasons
        assert set(got.values) == set(want.values) == set(htmp.GROUP.columns)
        assert got.values["diagnosis"] == want.values["diagnosis"]
        for column in htmp.GROUP.columns:
            if column == "diagnosis":
                continue
            a, b = got.values[column], want.values[column]
            assert (math.isnan(a) and math.isnan(b)) or a == pytest.approx(b, rel=2 * TOL, abs=1e-3)


def test_score_fits_an_moe_layers_experts_as_one_batch(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    # End to end: the experts of one layer reach compute_many together (scoring's hook), and their
    # htmp columns equal those of one compute per expert.
    import dataclasses

    import torch
    from safetensors.torch import save_file

    import wbfe

    g = torch.Generator().manual_seed(19)
    tensors = {f"model.layers.0.mlp.experts.{e}.up_proj.weight": torch.randn(48, 192, generator=g) for e in range(8)}
    tensors["model.layers.0.mlp.experts.3.up_proj.weight"] = torch.zeros(48, 192)  # skipped: all zero
    save_file(tensors, str(tmp_path / "model.safetensors"))
    calls: list[int] = []
    batch_fn = htmp.GROUP.compute_many
    assert batch_fn is not None

    def counting(specs, options):
        calls.append(len(specs))
        return batch_fn(specs, options)

    monkeypatch.setattr(htmp, "GROUP", dataclasses.replace(htmp.GROUP, compute_many=counting))
    batched = wbfe.score(tmp_path, metrics="htmp")
    assert calls == [7]  # the all-zero expert is skipped, and its neighbours on either side fitted together
    monkeypatch.setattr(htmp, "GROUP", dataclasses.replace(htmp.GROUP, compute_many=None))
    plain = wbfe.score(tmp_path, metrics="htmp")
    assert [s["name"] for s in batched.skipped] == ["model.layers.0.mlp.experts.3.up_proj.weight"]
    assert [row["name"] for row in batched.layers] == [row["name"] for row in plain.layers]
    for got, want in zip(batched.layers, plain.layers):
        assert got["reasons"] == want["reasons"] and got["diagnosis"] == want["diagnosis"]
        for column in ("htmp_kappa", "htmp_beta", "htmp_tau", "htmp_ks", "h", "h_star", "f_inf"):
            assert math.isfinite(want[column])
            assert got[column] == pytest.approx(want[column], rel=2 * TOL, abs=1e-3)
