"""``wbfe watch`` through CliRunner: synthetic HTMP runs, calibration, files, and bad input (exit 2, one line)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.test_watch import K_CROSS, RATE, _crossing_lambda, touch_weights, write_synthetic_run
from wbfe_cli.main import app


def invoke(*args: str):  # noqa: ANN201
    return CliRunner().invoke(app, [str(a) for a in args])


def error_line(result) -> str:  # noqa: ANN001
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


@pytest.fixture(scope="module")
def synthetic_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("run")
    # 7 checkpoints: the lowest test loss (one after the crossing) is not the last one.
    write_synthetic_run(folder, steps=7, name="ckpt_{step:05d}.safetensors")
    (folder / "metrics.csv").write_text("step,test_loss,test_accuracy\n" + "".join(
        f"{t * 100},{0.4 + 0.1 * abs(t - K_CROSS - 1)},{80 - abs(t - K_CROSS - 1)}\n" for t in range(7)))
    return folder


def test_empty_folder(tmp_path: Path) -> None:
    assert error_line(invoke("watch", tmp_path, "--lambda", "1")) == f"wbfe: error: {tmp_path}: no checkpoints found"


def test_unparseable_steps(tmp_path: Path) -> None:
    touch_weights(tmp_path / "best.safetensors")
    assert error_line(invoke("watch", tmp_path)) == (
        f"wbfe: error: {tmp_path}: cannot parse a step from best.safetensors (put the step in the name, "
        "e.g. epoch_3.pt, or list the checkpoints in a CSV with a step column)")


@pytest.mark.parametrize("args, message", [
    ((), "give a RUN to watch, or --calibrate RUNS.csv"),
    (("x", "--lambda", "calibrated"), "--lambda calibrated needs --calibrate RUNS.csv"),
    (("x", "--lambda", "-3"), "--lambda must be a positive number or 'calibrated', not '-3'"),
    (("no/such@main",), "cannot parse a step from the revision of 'no/such@main'"),
    (("./missing-run",), "no such file or folder: ./missing-run"),
    (("a" * 5000,), f"no such file or folder: {'a' * 5000}"),  # was an OSError traceback: File name too long
    # without a RUN the calibration printed its own λ and the given one was ignored
    (("--calibrate", "runs.csv", "--lambda", "0.5"), "give either --lambda FLOAT or --calibrate RUNS.csv (which "
                                                     "chooses λ), not both"),
    (("x", "--calibrate", "runs.csv", "--lambda", "0.5"), "give either --lambda FLOAT or --calibrate RUNS.csv (which "
                                                          "chooses λ), not both"),
])
def test_bad_options(args: tuple[str, ...], message: str) -> None:
    assert error_line(invoke("watch", *args)) == f"wbfe: error: {message}"


def test_a_metrics_csv_without_a_metric_column_is_one_line(tmp_path: Path) -> None:
    for step in (1, 2):
        touch_weights(tmp_path / f"epoch_{step}.safetensors")
    (tmp_path / "metrics.csv").write_text("step,val_loss\n1,0.5\n2,0.4\n")
    assert error_line(invoke("watch", tmp_path, "--lambda", "1")) == (
        f"wbfe: error: {tmp_path / 'metrics.csv'}: a run's metrics.csv needs a 'test_loss' or 'test_accuracy' column "
        "(found: step, val_loss)")


def test_the_step_pattern_reaches_the_calibration_runs(tmp_path: Path) -> None:
    """``--calibrate RUNS.csv --step-pattern RE`` read the calibration runs' names with the default rule: refused
    here as ambiguous (two numbers change), and quietly wrong where the default rule picks another number."""
    for name, seed in (("a", 5), ("b", 6)):
        write_synthetic_run(tmp_path / name, steps=4, seed=seed, name="m{step}-{step}.safetensors")
        (tmp_path / name / "metrics.csv").write_text("step,test_loss\n" + "".join(
            f"{t * 100},{1.0 + abs(t - 2)}\n" for t in range(4)))
    (tmp_path / "runs.csv").write_text("run\na\nb\n")
    out = invoke("watch", "--calibrate", tmp_path / "runs.csv", "--step-pattern", r"m(\d+)-", "--format", "json")
    assert out.exit_code == 0, out.output
    assert [(r["run"], r["best_step"]) for r in json.loads(out.stdout)["runs"]] == [
        (str(tmp_path / "a"), 200), (str(tmp_path / "b"), 200)]


def test_a_bad_run_is_refused_before_the_calibration_runs_are_scored(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """``wbfe watch MISSING --calibrate RUNS.csv`` scored every calibration run, then said MISSING does not exist."""
    import wbfe.watch

    monkeypatch.setattr(wbfe.watch, "calibrate", lambda *a, **k: pytest.fail("the calibration runs were scored"))
    (tmp_path / "runs.csv").write_text("run\na\nb\n")
    assert error_line(invoke("watch", tmp_path / "missing", "--calibrate", tmp_path / "runs.csv")) == (
        f"wbfe: error: no such file or folder: {tmp_path / 'missing'}")


def test_table_json_and_files(synthetic_run: Path, tmp_path: Path) -> None:
    from wbfe.watch import watch

    lam = _crossing_lambda()
    table = invoke("watch", synthetic_run, "--lambda", repr(lam), "--output", tmp_path / "o")
    assert table.exit_code == 0, table.output
    assert f"recommended step: {K_CROSS * 100} — first checkpoint with h ≤ h*" in table.stdout
    assert f"best test loss at step {(K_CROSS + 1) * 100} (0.4000); recommended: 0.5000 (gap +0.1000)" in table.stdout
    assert table.stderr.splitlines() == [f"wrote {tmp_path / 'o' / 'watch.json'}", f"wrote {tmp_path / 'o' / 'watch.png'}"]
    data = json.loads((tmp_path / "o" / "watch.json").read_text())
    assert data == json.loads(watch(synthetic_run, lam=lam).to_json())  # the CLI and the library agree
    assert data["recommended"]["step"] == K_CROSS * 100
    assert data["comparison"]["test_loss_gap"] == pytest.approx(0.1)
    assert set(data["checkpoints"][0]["layers"][0]) >= {"htmp_kappa", "htmp_beta", "htmp_tau", "h", "h_star",
                                                       "f_inf", "bfe", "alpha"}
    assert (tmp_path / "o" / "watch.png").read_bytes()[:4] == b"\x89PNG"


def test_calibrate_then_watch(synthetic_run: Path, tmp_path: Path) -> None:
    # A second run crossing one checkpoint earlier, whose test loss is, like synthetic_run's,
    # lowest one checkpoint after the crossing: leave-one-run-out must find a λ with no gap.
    folder = tmp_path / "r0"
    write_synthetic_run(folder, steps=6, beta0=RATE, seed=5)
    (folder / "metrics.csv").write_text("step,test_loss\n" + "".join(
        f"{t * 100},{0.4 + 0.1 * abs(t - K_CROSS)}\n" for t in range(6)))
    (tmp_path / "runs.csv").write_text(f"run\nr0\n{synthetic_run}\n")
    out = invoke("watch", synthetic_run, "--calibrate", tmp_path / "runs.csv", "--lambda", "calibrated",
                 "--format", "json", "--output", tmp_path / "c")
    assert out.exit_code == 0, out.output
    cal = json.loads((tmp_path / "c" / "calibration.json").read_text())
    assert [(r["recommended_step"], r["best_step"], r["test_loss_gap"]) for r in cal["runs"]] == [
        (K_CROSS * 100, K_CROSS * 100, 0.0), ((K_CROSS + 1) * 100, (K_CROSS + 1) * 100, 0.0)]
    assert (tmp_path / "c" / "calibration.png").is_file()
    result = json.loads(out.stdout)
    assert result["lambda"] == pytest.approx(cal["lambda_all_runs"]) and result["lambda_source"] == "calibrated"
    assert result["recommended"]["step"] == (K_CROSS + 1) * 100
    assert result["comparison"]["test_loss_gap"] == 0.0


def test_the_bar_counts_the_runs_checkpoints(synthetic_run: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """On a terminal, ``wbfe watch`` draws the score's bar over the run's checkpoints (the total first)."""
    import functools
    import io
    import re

    from rich.console import Console

    import wbfe_cli.watch
    from wbfe_cli._progress import progress_bar

    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=160, color_system=None)
    monkeypatch.setattr(wbfe_cli.watch, "progress_bar", functools.partial(progress_bar, console=console))
    assert invoke("watch", synthetic_run, "--lambda", "1").exit_code == 0
    frames = [line for line in re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "\n", out.getvalue()).replace("\r", "\n").split("\n")
              if line.strip()]
    start = next(k for k, f in enumerate(frames) if "0/7" in f)
    assert "watching" in frames[start]
    assert any("7/7" in f and "step 600" in f and "checkpoints/s" in f for f in frames[start:])


def test_a_run_among_the_calibration_runs_is_scored_once(synthetic_run: Path, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """``wbfe watch RUN --calibrate RUNS.csv`` scored RUN a second time when it is a calibration run; its output is
    the same as scoring it again, with RUN's own name and test losses (the CSV's differ)."""
    import wbfe.watch.trajectories
    from wbfe.watch import calibrate, result_at, trajectory

    folder = tmp_path / "r0"
    write_synthetic_run(folder, steps=6, beta0=RATE, seed=5)
    rows = [f"r0,{t * 100},{0.4 + 0.1 * abs(t - K_CROSS)},{folder / f'step_{t * 100}.safetensors'}" for t in range(6)]
    # synthetic_run's checkpoints, named otherwise and with other test losses (same order, so the same calibration)
    rows += [f"other,{t * 100},{1.4 + 0.1 * abs(t - K_CROSS - 1)},{synthetic_run / f'ckpt_{t * 100:05d}.safetensors'}"
             for t in range(7)]
    (tmp_path / "runs.csv").write_text("run,step,test_loss,checkpoint\n" + "\n".join(rows) + "\n")
    report = calibrate(tmp_path / "runs.csv")
    expected = result_at(trajectory(synthetic_run), report.calibration.lam_all, lam_source="calibrated").to_json()

    scans: list[object] = []
    scan = wbfe.watch.trajectories.scan_checkpoint
    monkeypatch.setattr(wbfe.watch.trajectories, "scan_checkpoint",
                        lambda ref, **kw: scans.append(ref) or scan(ref, **kw))
    out = invoke("watch", synthetic_run, "--calibrate", tmp_path / "runs.csv", "--lambda", "calibrated", "--format",
                 "json")
    assert out.exit_code == 0, out.output
    assert len(scans) == 6 + 7  # each checkpoint once: 6 + 7 + 7 before
    assert out.stdout == expected + "\n"
    result = json.loads(out.stdout)
    assert result["run"] == str(synthetic_run) and result["comparison"]["test_loss_gap"] == 0.0
    assert [c["test_loss"] for c in result["checkpoints"]] == pytest.approx(
        [0.4 + 0.1 * abs(t - K_CROSS - 1) for t in range(7)])  # metrics.csv's, not the calibration CSV's

    # a run that is not one of them (other steps: its first checkpoint left out) is scored
    scans.clear()
    subset = tmp_path / "subset.csv"
    subset.write_text("step,checkpoint\n" + "".join(f"{t * 100},{synthetic_run / f'ckpt_{t * 100:05d}.safetensors'}\n"
                                                     for t in range(1, 7)))
    out = invoke("watch", subset, "--calibrate", tmp_path / "runs.csv", "--format", "json")
    assert out.exit_code == 0, out.output
    assert len(scans) == 6 + 7 + 6


def test_calibration_report_scored_needs_the_same_options_and_checkpoints(tmp_path: Path) -> None:
    from wbfe.watch import calibrate
    from wbfe.watch.runs import CheckpointRef, Run, discover_run

    for name, seed in (("a", 5), ("b", 6)):
        write_synthetic_run(tmp_path / name, steps=4, seed=seed)
        (tmp_path / name / "metrics.csv").write_text("step,test_loss\n" + "".join(
            f"{t * 100},{1.0 + abs(t - 2)}\n" for t in range(4)))
    report = calibrate([tmp_path / "a", tmp_path / "b"], layers="all")
    run = discover_run(tmp_path / "b")
    traj = report.scored(run, layers="all", head=None, device="auto")
    assert traj == report.trajectories[1]
    assert report.scored(run, layers="head", head=None, device="auto") is None
    assert report.scored(run, layers="all", head="x", device="auto") is None
    assert report.scored(run, layers="all", head=None, device="cpu") is None
    in_memory = Run("b", tuple(CheckpointRef(c.step, object()) for c in run.checkpoints))
    assert report.scored(in_memory, layers="all", head=None, device="auto") is None
