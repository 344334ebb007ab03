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


def _dense_onset(delta: float) -> float:
    """The smallest r at which the dense teacher learns (every snr_i = r/(Delta + eps)): a root with snr s >= lambda_sigma
    needs r = s*(Delta + g(1) - g(m(s))), so the onset is the minimum of that over s, from the kernel alone."""
    from scipy.optimize import minimize_scalar

    from wbfe.theory.hermite import kernel

    kern = kernel("tanh2")

    def r_of(x: float) -> float:
        return math.exp(x) * (delta + float(kern.deficit_at(np.array([math.exp(x)]))[0]))

    xs = np.linspace(math.log(kern.lambda_sigma), math.log(kern.lambda_sigma) + 8, 2000)
    i = int(np.argmin([r_of(x) for x in xs]))
    return float(minimize_scalar(r_of, bounds=(xs[max(i - 1, 0)], xs[i + 1]), method="bounded",
                                 options={"xatol": 1e-12}).fun)


def test_scaling_rows_say_when_nothing_is_learned_at_the_onset_edge() -> None:
    """Below the dense teacher's onset (closed form above) its k_c is 0 at every d: the row now says so; just above
    it every feature is learned, as its prediction has it, and the row says nothing."""
    from wbfe.theory.teacher_student import scaling_table

    edge = _dense_onset(0.04)
    below, above = (next(row for row in scaling_table([20, 40, 80], r=edge * f) if row.family == "dense")
                    for f in (1 - 1e-6, 1 + 1e-6))
    assert below.k_c == (0, 0, 0) and above.k_c == (10, 20, 40)
    assert below.off == ("k_c = 0 at d = 20, 40, 80: no feature is learned (every snr_i stays below lambda_sigma = "
                         "19.27); the predictions are for learned features: raise r or lower delta")
    assert above.off == ""


def test_scaling_rows_say_when_every_feature_is_learned() -> None:
    """At r = 1e300 every feature is learned at every d: k_c = k and eps = Delta/r, flat in d. The power beta=1 and
    exp rows printed slopes 1 and 447 against 0.5 and 2.5 with no note; their predictions need k_c < k."""
    from wbfe.theory.teacher_student import scaling_table

    rows = {row.family: row for row in scaling_table([20, 40, 80], r=1e300)}
    for family in ("power beta=1.0", "exp rate=0.2"):
        assert rows[family].k_c == (10, 20, 40)
        assert rows[family].off == ("k_c = k at d = 20, 40, 80: every feature is learned (the refinement regime, "
                                    "k_c growing like d); the predicted slopes are for k_c < k: lower r or raise delta")
    for family in ("dense", "power beta=0.3", "power beta=0.5", "sparse p=3"):  # k_c = k (or p) is their prediction
        assert rows[family].off == ""
    assert all(row.off == "" for row in scaling_table([100, 200, 400], r=4.0))


def test_cli_scaling_prints_why_a_row_is_off() -> None:
    from wbfe_cli.main import app

    out = CliRunner().invoke(app, ["theory", "scaling", "--d-values", "20,40,80", "--r", "1e300"])
    assert out.exit_code == 0, out.output
    lines = out.stdout.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("power beta=1.0"))
    assert lines[at + 1] == "  off: k_c = k at d = 20, 40, 80: every feature is learned (the refinement regime, " \
                            "k_c growing like d); the predicted slopes are for k_c < k: lower r or raise delta"
    assert sum(line.startswith("  off: ") for line in lines) == 2
