"""The theory commands' ``--output`` folder (issue 35): ``-o`` as in score, compare, rank, report and
watch, and the same folder rules (wbfe.render.files.check_output_dir), checked before any simulation."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner
from wbfe_cli.main import app

from wbfe.errors import OutputError
from wbfe.render.files import check_output_dir

runner = CliRunner()
CURVE = ["theory", "curve", "--beta", "1.0", "--k", "50", "--d", "40", "--points", "12"]
HIER = ["theory", "hierarchical", "--d", "10", "--p", "4", "--alpha-min", "1.6", "--alpha-max", "2.6",
        "--points", "3", "--seeds", "1", "--features", "gaussian", "--kernel-max-n", "0", "--n-test", "200"]
COMMANDS = {
    "curve": (CURVE, "wbfe.theory.reports.write_curve"),
    "hmc": (["theory", "hmc", "--r-values", "0.5", "--d", "16", "--k", "4", "--seeds", "0", "--warmup", "10",
             "--samples", "10"], "wbfe.theory.reports.write_hmc"),
    "student": (["theory", "student", "--widths", "1", "--n", "100", "--d", "10", "--k", "10", "--epochs", "5"],
                "wbfe.theory.reports.write_student"),
    "hierarchical": (HIER, "wbfe.theory.hierarchical.simulate_hierarchical"),
}

pytestmark = pytest.mark.usefixtures("one_blas_thread")


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_a_file_is_refused_before_any_work(command: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    args, work = COMMANDS[command]

    def started(*_: object, **__: object) -> None:
        raise AssertionError(f"{command} started its work before checking --output")

    monkeypatch.setattr(work, started)
    target = tmp_path / "results.json"
    target.write_text("keep")
    with pytest.raises(OutputError) as expected:
        check_output_dir(target)
    for flag in ("-o", "--output"):
        result = runner.invoke(app, [*args, flag, str(target)])
        assert result.exit_code == 2, result.output
        assert result.stderr == f"wbfe: error: {expected.value}\n"
    assert target.read_text() == "keep"


@pytest.mark.parametrize("args", [CURVE, HIER], ids=["curve", "hierarchical"])
def test_short_and_long_write_the_same(args: list[str], tmp_path: Path) -> None:
    written = {}
    for flag in ("-o", "--output"):
        folder = tmp_path / flag.strip("-") / "new"  # an absent folder is created, as for compare
        result = runner.invoke(app, [*args, flag, str(folder)])
        assert result.exit_code == 0, result.output
        (saved,) = folder.glob("*.json")
        data = json.loads(saved.read_text())
        data.pop("files", None)  # the paths differ by the folder's name
        written[flag] = (sorted(p.name for p in folder.iterdir()), data)
    assert written["-o"] == written["--output"]
    assert len(written["-o"][0]) >= 3  # the JSON and its figures
