"""``wbfe score --ww-compatible`` with ``fix_fingers`` and ``fit`` through the public score API and the CLI,
on one model, against WeightWatcher 0.7.7's ``analyze(fix_fingers=..., fit=...)``.

Which reference each column is checked against:

* ``clip_xmax``: WeightWatcher itself (its default ``pl_package`` runs the clipped fit).
* ``xmin_peak`` and ``tpl``/``e_tpl``: WeightWatcher runs these only through the ``powerlaw`` package, and
  with the installed powerlaw 2.0 every such row is -1 (asserted below), so the reference is the package's
  own ``Fit`` given exactly WeightWatcher's arguments on WeightWatcher's own eigenvalues (``get_ESD``).
"""

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
from wbfe_cli.main import app

from tests.test_ww_compatible_scoring import _model

EVALS_THRESH = 1e-5  # weightwatcher.constants.EVALS_THRESH: the eigenvalues it fits
PL_RANGE = {"alpha": [1, None]}  # the Clauset-Shalizi-Newman bounds WeightWatcher was written for (see test_fingers)
runner = CliRunner()


@contextlib.contextmanager
def _quiet():
    logging.disable(logging.CRITICAL)
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")
            yield
    finally:
        logging.disable(logging.NOTSET)


def _analyze(model: torch.nn.Module, **options: Any) -> dict[str, dict]:
    ww = pytest.importorskip("weightwatcher")
    with _quiet():
        details = ww.WeightWatcher(model=model).analyze(randomize=False, plot=False, **options)
    return {row["name"]: row.to_dict() for _, row in details.iterrows()}


def _ww_evals(model: torch.nn.Module) -> dict[str, np.ndarray]:
    """WeightWatcher's eigenvalues per layer, as analyze fits them: get_ESD's, with conv layers halved
    (analyze's conv2d_norm, which get_ESD does not apply), above its threshold."""
    ww = pytest.importorskip("weightwatcher")
    watcher = ww.WeightWatcher(model=model)
    out = {}
    with _quiet():
        for layer_id, name in enumerate((n for n, _ in model.named_children()), start=1):
            e = np.sort(np.asarray(watcher.get_ESD(layer=layer_id), dtype=np.float64))
            if isinstance(getattr(model, name), torch.nn.Conv2d):
                e = 0.5 * e
            out[name] = e[e > EVALS_THRESH]
    return out


def _package_fit(x: np.ndarray, **kwargs: Any) -> Any:
    powerlaw = pytest.importorskip("powerlaw")
    with _quiet():
        return powerlaw.Fit(x, verbose=False, **kwargs)


def _ours(model: torch.nn.Module, **options: Any) -> dict[str, dict]:
    layers = wbfe.score(model, ww_compatible=True, metrics="htsr", **options).layers
    return {layer["name"].removesuffix(".weight"): layer for layer in layers}


def test_clip_xmax_equals_weightwatcher() -> None:
    model = _model()
    ref = _analyze(model, fix_fingers="clip_xmax")
    ours = _ours(model, fix_fingers="clip_xmax")
    assert sorted(ours) == sorted(ref)
    for name, row in ref.items():
        assert row["alpha"] > 0, name  # a real fit, not WeightWatcher's -1
        for column in ("alpha", "alpha_weighted", "xmin", "num_pl_spikes", "log_norm", "stable_rank"):
            assert ours[name][column] == pytest.approx(float(row[column]), rel=1e-6), (name, column)


def test_xmin_peak_equals_the_powerlaw_package() -> None:
    model = _model()
    ww_rows = _analyze(model, fix_fingers="xmin_peak", pl_package="powerlaw")
    assert all(row["alpha"] == -1 for row in ww_rows.values())  # why the package is the reference here
    ours = _ours(model, fix_fingers="xmin_peak")
    for name, x in _ww_evals(model).items():
        counts, edges = np.histogram(np.log10(x), bins=100)
        peak = 10 ** edges[np.argmax(counts)]
        ref = _package_fit(x, xmin=(np.log10(0.95 * peak), 1.5 * peak), parameter_ranges=PL_RANGE)
        assert ours[name]["xmin"] == pytest.approx(ref.xmin, rel=1e-6), name
        assert ours[name]["alpha"] == pytest.approx(ref.alpha, rel=1e-6), name
        assert ours[name]["num_pl_spikes"] == np.count_nonzero(x >= ref.xmin), name


@pytest.fixture(scope="module")
def tpl_reference() -> dict[str, tuple[np.ndarray, float]]:
    """Per layer, WeightWatcher's eigenvalues and the xmin of the package's truncated-power-law KS scan
    over the full range: the reference of both ``tpl`` and ``e_tpl`` (the same scan, see below), made once,
    since it is this test file's cost (a numerical TPL fit per candidate xmin, ~50 s for the four layers)."""
    out = {}
    for name, x in _ww_evals(_model()).items():
        ref = _package_fit(x, xmin_distribution="truncated_power_law",
                           parameter_ranges={"alpha": [-20, 20], "Lambda": [0, None]})
        out[name] = (x, float(ref.xmin))
    return out


@pytest.mark.parametrize("fit", ["tpl", "e_tpl"])
def test_tpl_xmin_equals_the_powerlaw_package(fit: str, tpl_reference: dict[str, tuple[np.ndarray, float]]) -> None:
    """The tail WeightWatcher's TPL fit chooses: the package's truncated-power-law KS scan over the full range
    (E_TPL's range starts at WeightWatcher's log10(0.95·peak), below every eigenvalue here: the same scan)."""
    model = _model()
    ww_rows = _analyze(model, fit=fit.upper(), pl_package="powerlaw")
    assert all(row["alpha"] == -1 for row in ww_rows.values())
    ours = _ours(model, fit=fit)
    assert sorted(ours) == sorted(tpl_reference)
    for name, (x, xmin) in tpl_reference.items():
        assert ours[name]["xmin"] == pytest.approx(xmin, rel=1e-6), name
        assert ours[name]["num_pl_spikes"] == np.count_nonzero(x >= xmin), name


def test_cli_matches_the_library(tmp_path: Path) -> None:
    model = _model()
    path = tmp_path / "m.safetensors"
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(path))
    ref = _analyze(model, fix_fingers="clip_xmax")
    out = tmp_path / "out.json"
    result = runner.invoke(app, ["score", str(path), "--ww-compatible", "--fix-fingers", "clip_xmax", "--metrics",
                                 "htsr", "--format", "json", "--output", str(out)])
    assert result.exit_code == 0, result.output
    layers = {x["name"].removesuffix(".weight"): x for x in json.loads(out.read_text())["layers"]}
    for name, row in ref.items():
        for column in ("alpha", "xmin", "num_pl_spikes"):
            assert layers[name][column] == pytest.approx(float(row[column]), rel=1e-6), (name, column)
