"""fit_regimes says why a regime slope is NaN, with the numbers that decide it and what to change (issue 35
item 10: ``wbfe theory curve --points 60`` printed ``refinement slope nan`` with no reason)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from wbfe.theory.teacher_student import Sweep, fit_regimes

K, D = 100, 200


def staircase(r_max: float, points: int, *, r_on: float = 3.0) -> Sweep:
    """A sweep with k_c = 9 below ``r_on`` and k above, and ε = 0.05/r exactly (closed-form slope −1)."""
    r = np.geomspace(0.01, r_max, points)
    k_c = np.where(r >= r_on, K, 9)
    return Sweep(r=r, n=r * K * D, eps=0.05 / r, k_c=k_c, q=np.zeros((points, K)), n_roots=np.ones(points),
                 d=D, k=K, delta=0.04, lambda_sigma=1.0, q_sigma=1.0)


def test_refinement_reason_has_the_numbers_and_the_fix_works() -> None:
    sw = staircase(100.0, 60)
    fit = fit_regimes(sw, beta=1.0)
    r_on = float(sw.r[np.argmax(sw.k_c == K)])
    inside = int(np.count_nonzero(sw.r >= 30 * r_on))
    assert math.isnan(fit.refinement) and inside < 3
    assert fit.reasons["refinement"] == (
        f"{inside} point(s) in the refinement regime r >= 30 x {r_on:.3g} (the first r with all k=100 features "
        f"learned) = {30 * r_on:.3g}, up to r_max = 100; 3 are needed: raise --r-max to about {300 * r_on:.3g}")
    fixed = fit_regimes(staircase(300 * r_on, 60), beta=1.0)
    assert fixed.refinement == pytest.approx(-1.0, abs=1e-12) and "refinement" not in fixed.reasons


def test_no_point_with_every_feature_learned() -> None:
    fit = fit_regimes(staircase(2.0, 40), beta=1.0)
    assert fit.reasons["refinement"] == "no point has all k=100 features learned (k_c reaches 9 by r = 2): raise --r-max"


def test_feature_learning_reason() -> None:
    sw = staircase(100.0, 60)
    assert np.count_nonzero(sw.r < 3.0) >= 3  # k_c = 9 there: inside 8 <= k_c <= 10
    fit = fit_regimes(sw, beta=1.0)
    assert math.isfinite(fit.feature_learning) and "feature_learning" not in fit.reasons
    sw.k_c[:] = np.where(sw.r >= 3.0, K, 30)  # never in the band
    fit = fit_regimes(sw, beta=1.0)
    assert fit.reasons["feature_learning"] == ("0 point(s) with 8 <= k_c <= 0.1*k = 10; 3 are needed: k_c never "
                                               "enters that band in this sweep (raise --k, or widen --r-min/--r-max)")


@pytest.mark.parametrize("beta", [0.5, 0.3])
def test_feature_learning_slope_at_beta_up_to_one_half_has_a_reason(beta) -> None:
    # the slope is fitted (3+ points in the band) but no power law is predicted for beta <= 1/2
    fit = fit_regimes(staircase(100.0, 60), beta=beta)
    assert fit.feature_learning == pytest.approx(-1.0, abs=1e-12)  # eps = 0.05/r exactly
    assert fit.feature_learning_predicted == pytest.approx(1 / (2 * beta) - 1)
    assert fit.reasons["feature_learning"] == "the power law n^(1/(2beta)-1) is predicted for beta > 1/2 only"


def test_cli_curve_points_60_prints_why(tmp_path: Path) -> None:
    from wbfe_cli.main import app

    out = CliRunner().invoke(app, ["theory", "curve", "--points", "60", "--output", str(tmp_path)])
    assert out.exit_code == 0, out.output
    saved = json.loads((tmp_path / "curve.json").read_text())
    r, k_c = np.array(saved["sweep"]["r"]), np.array(saved["sweep"]["k_c"])
    r_on = float(r[np.argmax(k_c == K)])  # from the solver's own sweep
    lines = out.stdout.splitlines()
    at = lines.index("refinement slope        nan")
    assert lines[at + 2] == "  why                   " + saved["fit"]["reasons"]["refinement"]
    assert f"r >= 30 x {r_on:.3g}" in lines[at + 2] and f"raise --r-max to about {300 * r_on:.3g}" in lines[at + 2]


def test_cli_curve_beta_zero_is_a_dense_readout_not_a_division_by_zero(tmp_path: Path) -> None:
    from wbfe_cli.main import app

    # beta = 0 is a valid power readout (every v_i equal); the fit's prediction 1/(2 beta) - 1 is its limit
    result = CliRunner().invoke(app, ["theory", "curve", "-o", str(tmp_path), "--beta", "0", "--points", "5",
                                      "--format", "json"])
    assert result.exit_code == 0, result.output
    fit = json.loads(result.stdout)["fit"]
    assert fit["feature_learning_predicted"] is None  # inf, written as null
    assert fit["reasons"]["feature_learning"]  # no slope there, and the line says why
