"""End to end: ``wbfe.score(..., ww_compatible=True)`` reproduces WeightWatcher 0.7.7's analyze()."""

from __future__ import annotations

import logging

import pytest
import torch

import wbfe

COLUMNS = ("alpha", "alpha_weighted", "log_norm", "log_spectral_norm", "stable_rank", "num_pl_spikes", "xmin")


def _model() -> torch.nn.Module:
    g = torch.Generator().manual_seed(0)
    model = torch.nn.Sequential()
    model.add_module("conv", torch.nn.Conv2d(16, 32, 3))
    model.add_module("conv_narrow", torch.nn.Conv2d(24, 12, 2))
    model.add_module("fc1", torch.nn.Linear(300, 200))
    model.add_module("head", torch.nn.Linear(200, 40))
    with torch.no_grad():
        for p in model.parameters():
            # heavy-tailed entries (Student-t, 3 degrees of freedom) so the power-law fits are real
            z = torch.randn(p.shape, generator=g)
            chi2 = (torch.randn((3,) + tuple(p.shape), generator=g) ** 2).sum(0)
            p.copy_(0.05 * z / torch.sqrt(chi2 / 3))
    return model


def test_matches_weightwatcher_analyze() -> None:
    ww = pytest.importorskip("weightwatcher")
    logging.disable(logging.WARNING)
    try:
        model = _model()
        details = ww.WeightWatcher(model=model).analyze(randomize=False, plot=False)
    finally:
        logging.disable(logging.NOTSET)
    ours = {layer["name"].removesuffix(".weight"): layer for layer in wbfe.score(model, ww_compatible=True, metrics="htsr").layers}
    assert sorted(ours) == sorted(details["name"])
    for _, row in details.iterrows():
        layer = ours[row["name"]]
        for column in COLUMNS:
            assert layer[column] == pytest.approx(float(row[column]), rel=1e-6), (row["name"], column)


def test_default_differs_from_ww_only_where_documented() -> None:
    """Default mode: conv kernels flattened, no ×0.5, a minimum tail; dense layers' norms are identical."""
    model = _model()
    default = {x["name"]: x for x in wbfe.score(model, metrics="htsr").layers}
    compat = {x["name"]: x for x in wbfe.score(model, ww_compatible=True, metrics="htsr").layers}
    for name in ("fc1.weight", "head.weight"):
        for column in ("log_norm", "log_spectral_norm", "stable_rank"):
            assert default[name][column] == pytest.approx(compat[name][column], rel=1e-12)
    assert default["conv.weight"]["convention"] == "flatten" and compat["conv.weight"]["convention"] == "slices"
