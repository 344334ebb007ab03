"""``wbfe theory hierarchical``: parses, calls simulate_hierarchical, prints JSON or a table, writes files."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from wbfe.theory.hierarchical import simulate_hierarchical
from wbfe_cli.main import app

ARGS = ["theory", "hierarchical", "--d", "10", "--p", "4", "--gamma", "1.0", "--alpha-min", "1.6",
        "--alpha-max", "3.6", "--points", "5", "--seeds", "2", "--features", "gaussian",
        "--kernel-max-n", "200", "--n-test", "500"]


def argv(*changed: str) -> list[str]:
    """ARGS with the options in ``changed`` (option, value, ...) set to their values: each option given once (the
    command line refuses an option given twice)."""
    options = {**dict(zip(ARGS[2::2], ARGS[3::2])), **dict(zip(changed[::2], changed[1::2]))}
    return [*ARGS[:2], *(text for pair in options.items() for text in pair)]


pytestmark = pytest.mark.usefixtures("one_blas_thread")


def test_json_output_is_the_library_result():
    result = CliRunner().invoke(app, [*ARGS, "--format", "json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert set(data) == {"settings", "points", "prediction"}
    assert [pt["n"] for pt in data["points"]] == [40, 126, 398, 1259, 3981]
    for pt in data["points"]:
        assert set(pt) >= {"alpha", "n", "nmse", "nmse_kernel", "q", "recovered"} and len(pt["q"]) == 4
    expected = simulate_hierarchical(d=10, p=4, gamma=1.0, alpha_min=1.6, alpha_max=3.6, points=5, seeds=2,
                                     features="gaussian", kernel_max_n=200, n_test=500).to_dict()
    assert data == json.loads(json.dumps(expected))
    assert data["prediction"]["alpha_thresholds"][:2] == pytest.approx([2.0, 2.60206], abs=1e-5)


def test_table_output():
    result = CliRunner().invoke(app, ARGS)
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0].startswith("gaussian features  d=10  D=55  p=4  gamma=1.0")
    assert lines[1].split() == ["alpha", "n", "nmse", "kernel", "recovered", "m(n)"]
    assert lines[2].split()[:2] == ["1.600", "40"]
    assert "thresholds (log_d n): i, predicted 2+2*gamma*log_d i, finite-d, measured" in result.stdout
    assert lines[-3].startswith("NMSE slope nan")  # the finite-d count jumps from 0 to 4 features between points
    assert lines[-2].startswith("  why: 0 point(s) with 1 to 2 feature(s) recovered by the finite-d prediction")
    assert lines[-1] == "kernel floor for d^2 << n << d^4: 1"  # Gaussian-equivalent: nothing below D²


def test_output_writes_json_and_figures(tmp_path):
    out = tmp_path / "run"
    result = CliRunner().invoke(app, argv("--seeds", "1", "--output", str(out)))
    assert result.exit_code == 0, result.output
    saved = json.loads((out / "hierarchical.json").read_text())
    assert saved["settings"]["seeds"] == 1 and len(saved["points"]) == 5
    for name in ("hierarchical_overlaps.png", "hierarchical_nmse.png"):
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert f"wrote {out / name}" in result.stderr


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--activation", "tan"], "wbfe: error: unknown activation 'tan'; did you mean 'tanh'?"),
        (["--gamma", "0.4"], "wbfe: error: the sequential-recovery predictions need gamma > 1/2, not 0.4"),
        # the library's field names are said as the flags the user typed (points, alpha_min, n_test: their flags)
        (["--points", "1"], "wbfe: error: --points must be an integer >= 2, not 1"),
        (["--alpha-min", "3", "--alpha-max", "2"], "wbfe: error: need 0 < --alpha-min < --alpha-max, not 3.0 and 2.0"),
        (["--n-test", "0"], "wbfe: error: --n-test must be an integer >= 10, not 0"),
        (["--kernel-max-n", "-1"], "wbfe: error: --kernel-max-n must be a non-negative integer, not -1"),
    ],
)
def test_bad_options_exit_2_with_one_line(extra, message):
    result = CliRunner().invoke(app, argv(*extra))
    assert result.exit_code == 2
    assert result.stderr.strip().startswith(message)
    assert len(result.stderr.strip().splitlines()) == 1


def test_a_nan_slope_says_why():
    # A sweep below every predicted recovery (d = 6, log_d n in [1, 1.5]): "NMSE slope nan" came with no word
    result = CliRunner().invoke(app, ["theory", "hierarchical", "--d", "6", "--alpha-min", "1", "--alpha-max", "1.5",
                                      "--points", "2", "--seeds", "1", "--n-test", "50", "--kernel-max-n", "0"])
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("NMSE slope nan"))
    assert lines[at + 1] == ("  why: 0 point(s) with 1 to 1 feature(s) recovered by the finite-d prediction (it has 0 "
                             "at alpha 1 and 0 at 1.5), of more than one n; 2 are needed: move or widen "
                             "--alpha-min/--alpha-max, or raise --points")
