"""``wbfe theory solve|curve|hmc|student|scaling`` through the typer app."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from wbfe.theory.teacher_student import readout, scaling_table, solve
from wbfe_cli.main import app

runner = CliRunner()


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _invoke(*args: str):
    result = runner.invoke(app, ["theory", *args])
    return result


def test_solve_json_equals_library():
    res = _invoke("solve", "--beta", "0.3", "--delta", "0.04", "--d", "200", "--k", "100", "--r", "1.0",
                  "--format", "json")
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    sol = solve(readout("power", 100, beta=0.3), delta=0.04, d=200, r=1.0)
    for key in ("eps", "eps_all", "k_c", "q", "snr", "lambda_sigma", "q_sigma", "g1"):
        assert key in data
    assert data["eps"] == sol.eps and data["eps_all"] == list(sol.eps_all) and data["k_c"] == sol.k_c
    assert data["q"] == sol.q.tolist() and data["n"] == 20000.0


def test_solve_table_and_other_readouts():
    res = _invoke("solve", "--readout", "sparse", "--nonzeros", "2", "--n", "40000", "--k", "10", "--d", "20")
    assert res.exit_code == 0, res.output
    lines = dict(line.split(None, 1) for line in res.stdout.strip().splitlines())
    sol = solve(readout("sparse", 10, nonzeros=2), delta=0.04, d=20, n=40000)
    assert lines["k_c"] == str(sol.k_c) == "2"
    assert float(lines["eps"]) == pytest.approx(sol.eps, rel=1e-5)


def test_solve_errors_exit_2_with_one_line():
    res = _invoke("solve", "--activation", "softsign")
    assert res.exit_code == 2
    assert res.stderr.strip().splitlines() == [
        "wbfe: error: unknown activation 'softsign' (known: erf, relu, tanh, tanh2)"]
    res = _invoke("solve", "--r", "1", "--n", "100")
    assert res.exit_code == 2 and "give exactly one of n and r" in res.stderr


def test_curve_writes_plots_and_json(tmp_path):
    res = _invoke("curve", "--beta", "1.0", "--k", "200", "--d", "100", "--r-min", "0.01", "--r-max", "1e6",
                  "--points", "40", "--output", str(tmp_path), "--format", "json")
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    for name in ("staircase.png", "eps.png", "kc.png", "curve.json"):
        path = tmp_path / name
        assert path.is_file() and path.stat().st_size > 1000
        assert str(path) in out["files"]
    saved = json.loads((tmp_path / "curve.json").read_text())
    assert len(saved["sweep"]["eps"]) == 40 and saved["fit"]["refinement"] == pytest.approx(-1.0, abs=0.02)
    assert (tmp_path / "eps.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_curve_rejects_bad_range(tmp_path):
    res = _invoke("curve", "--r-min", "5", "--r-max", "1", "--output", str(tmp_path))
    assert res.exit_code == 2 and "need 0 < --r-min < --r-max and --points >= 2 (got 5.0, 1.0, 80)" in res.stderr
    res = _invoke("hmc", "--r-values", "0.5,0", "--output", str(tmp_path))  # a field named as its flag
    assert res.exit_code == 2 and res.stderr.strip() == "wbfe: error: --r-values must be positive and finite, got 0.0"


def test_scaling_json_equals_library():
    res = _invoke("scaling", "--d-values", "100,200,400", "--format", "json")
    assert res.exit_code == 0, res.output
    rows = json.loads(res.stdout)
    lib = scaling_table([100, 200, 400], r=4.0)
    assert [r["family"] for r in rows] == [r.family for r in lib]
    assert [r["eps"] for r in rows] == [list(r.eps) for r in lib]
    table = _invoke("scaling", "--d-values", "100,200,400")
    assert table.exit_code == 0 and "power beta=1.0" in table.stdout


def test_scaling_rejects_bad_list():
    res = _invoke("scaling", "--d-values", "100,abc")
    assert res.exit_code == 2 and "--d-values must be comma-separated numbers" in res.stderr


def test_hmc_command_writes_plot(tmp_path):
    res = _invoke("hmc", "--r-values", "0.5", "--d", "16", "--k", "4", "--seeds", "0,1", "--warmup", "40",
                  "--samples", "40", "--output", str(tmp_path), "--format", "json")
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    (point,) = data["points"]
    assert point["k_c"] == 0 and point["n"] == 32 and len(point["per_seed"]) == 2
    assert (tmp_path / "hmc.png").is_file() and json.loads((tmp_path / "hmc.json").read_text()) == data


def test_student_command_table(tmp_path):
    res = _invoke("student", "--widths", "1,4", "--n", "300", "--d", "10", "--k", "10", "--epochs", "20",
                  "--output", str(tmp_path))
    assert res.exit_code == 0, res.output
    assert "k_c (theory) =" in res.stdout and (tmp_path / "student.png").is_file()
    saved = json.loads((tmp_path / "student.json").read_text())
    assert saved["widths"] == [1, 4] and len(saved["test_error"]) == 2


@pytest.mark.parametrize("option", ["--widths", "--seeds"])
@pytest.mark.parametrize("value", ["inf", "nan", "4,-inf"])
def test_non_finite_integer_lists_are_refused_in_one_line(option, value):
    # int(inf) raised OverflowError and int(nan) ValueError: a traceback and exit 1.
    res = _invoke("student", option, value)
    assert res.exit_code == 2, res.output
    assert res.output == f"wbfe: error: {option} must be comma-separated integers, got {value!r}\n"


@pytest.mark.parametrize(("command", "option"), [("student", "--widths"), ("student", "--seeds"), ("hmc", "--seeds"),
                                                 ("scaling", "--d-values")])
@pytest.mark.parametrize("value", ["3.0", "2,3.0", "1e3"])
def test_whole_floats_in_integer_lists_are_refused_in_one_line(command, option, value):
    # "3.0" was read as 3 and "1e3" as 1000, where the settings and the library refuse a float seed or width
    res = _invoke(command, option, value)
    assert res.exit_code == 2, res.output
    assert res.output == f"wbfe: error: {option} must be comma-separated integers, got {value!r}\n"


def test_hmc_with_one_seed_says_why_its_error_bar_is_missing():
    # One seed has no spread to take: s.e. and z were printed as "nan" with no word
    res = _invoke("hmc", "--r-values", "0.5", "--d", "6", "--k", "2", "--seeds", "3", "--warmup", "10",
                  "--samples", "10")
    assert res.exit_code == 0, res.output
    lines = res.stdout.splitlines()
    assert lines[1].split()[5:7] == ["nan", "nan"]
    assert lines[2:] == ["s.e. and z are over seeds: one seed has none (give two or more, e.g. --seeds 0,1,2)"]
