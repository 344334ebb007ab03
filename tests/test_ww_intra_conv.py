"""``--intra --ww-compatible`` on a conv net: WeightWatcher 0.7.7's ``analyze(intra=True)`` chains
its Conv2d layers too (by their first kernel slice) and scales a product whose second layer is a
Conv2d; wbfe's rows against its own, at rtol 1e-6, from the library, the engine and the CLI."""

from __future__ import annotations

import contextlib
import io
import json
import logging
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from safetensors.torch import save_file
from typer.testing import CliRunner

import wbfe
from wbfe.engine import score_intra

ww = pytest.importorskip("weightwatcher")

COLUMNS = ("alpha", "xmin", "num_pl_spikes", "log_norm", "log_spectral_norm", "stable_rank", "matrix_rank", "entropy",
           "lambda_max", "sv_min", "rank_loss", "num_spikes", "bulk_max", "mp_softrank")
NAMES = ["0.weight X 2.weight", "2.weight X 3.weight", "3.weight X 6.weight", "6.weight X 7.weight"]


def _model() -> torch.nn.Module:
    """Three Conv2d (out > in; out < in with an even kernel, where WW's M is the larger side) and
    two Linear layers, every consecutive pair sharing a side, Student-t weights."""
    torch.manual_seed(0)
    m = torch.nn.Sequential(
        torch.nn.Conv2d(16, 40, 3), torch.nn.ReLU(), torch.nn.Conv2d(40, 64, 3), torch.nn.Conv2d(64, 48, 2),
        torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(48, 30), torch.nn.Linear(30, 10))
    with torch.no_grad():
        for k, layer in enumerate([m[0], m[2], m[3], m[6], m[7]]):
            shape = tuple(layer.weight.shape)
            layer.weight.copy_(torch.from_numpy(np.random.default_rng(k).standard_t(3.0, size=shape).astype(np.float32)))
    return m


def _analyze(model: torch.nn.Module, *, seed: int, sparsify: bool) -> Any:
    np.random.seed(seed)  # WeightWatcher's sparsify masks come from NumPy's global generator
    logging.disable(logging.WARNING)
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")
            return ww.WeightWatcher(model=model).analyze(randomize=False, plot=False, mp_fit=True, intra=True,
                                                         sparsify=sparsify)
    finally:
        logging.disable(logging.NOTSET)


def _assert_equal(rows: list[dict[str, Any]], details: Any) -> None:
    assert [r["name"] for r in rows] == NAMES and len(details) == len(NAMES)
    for row, (_, ref) in zip(rows, details.iterrows()):
        assert (max(row["rows"], row["cols"]), min(row["rows"], row["cols"])) == (ref["N"], ref["M"]), row["name"]
        assert row["n_eigs"] == ref["num_evals"], row["name"]
        for column in COLUMNS:
            want = float(ref[column])
            assert row[column] == pytest.approx(want, rel=1e-6, abs=1e-12), (row["name"], column, want)


@pytest.mark.parametrize("sparsify", [False, True])
def test_conv_net_equals_weightwatchers_intra(sparsify: bool) -> None:
    model = _model()
    details = _analyze(model, seed=5, sparsify=sparsify)
    _assert_equal(score_intra(model, metrics="htsr", ww_compatible=True, sparsify=sparsify, seed=5), details)


def test_score_and_cli_on_a_safetensors_conv_net(tmp_path: Path) -> None:
    from wbfe_cli.main import app

    model = _model()
    details = _analyze(model, seed=7, sparsify=True)
    path = tmp_path / "cnn.safetensors"
    save_file({k: v.detach().contiguous() for k, v in model.state_dict().items()}, str(path))
    result = wbfe.score(model, metrics="htsr", ww_compatible=True, intra=True, seed=7)
    _assert_equal([r for r in result.layers if r["role"] == "intra"], details)
    # the stored names' order is the modules' order here: the file chains as the model does
    out = CliRunner().invoke(app, ["score", str(path), "--intra", "--ww-compatible", "--metrics", "htsr",
                                   "--seed", "7", "--format", "json"])
    assert out.exit_code == 0, out.stderr
    _assert_equal([r for r in json.loads(out.stdout)["layers"] if r["role"] == "intra"], details)


def test_default_mode_keeps_convolutions_out_of_the_chain() -> None:
    # wbfe's own default: a product of one kernel position's slice with the next layer is not the
    # composition of the two layers, so a convolution ends the chain (docs/metrics.md)
    rows = score_intra(_model(), metrics="htsr", sparsify=False)
    assert [r["name"] for r in rows] == ["6.weight X 7.weight"]
