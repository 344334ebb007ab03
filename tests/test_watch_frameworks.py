"""The checkpoint folders frameworks write: Keras ModelCheckpoint names, Hugging Face Trainer output, common names.

Each case is a folder as the framework names it (the file contents are a tiny safetensors tensor: the
step and metric discovery never reads the weights) and the steps it must be read as.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.test_watch import touch_weights
from wbfe.errors import InvalidOptionError
from wbfe.watch.runs import STEP_ROUTES, discover_run, parse_step
from wbfe_cli.main import app


def _folder(root: Path, names: list[str]) -> Path:
    for name in names:
        touch_weights(root / name)
    return root


@pytest.mark.parametrize("names, steps", [
    # Keras ModelCheckpoint("saved-model-{epoch:02d}-{val_acc:.2f}.hdf5"): the epoch, never the accuracy after it;
    # two epochs with one accuracy (0.96) used to be refused as "two checkpoints have step 96".
    (["saved-model-01-0.91.hdf5", "saved-model-02-0.96.hdf5", "saved-model-03-0.96.hdf5", "saved-model-10-0.93.hdf5"],
     [1, 2, 3, 10]),
    # "weights.{epoch:02d}-{val_loss:.2f}.hdf5": distinct losses used to order the run by loss.
    (["weights.01-0.85.hdf5", "weights.02-0.52.hdf5", "weights.03-0.61.hdf5"], [1, 2, 3]),
    (["checkpoint_epoch_1.pt", "checkpoint_epoch_2.pt", "checkpoint_epoch_12.pt"], [1, 2, 12]),
    (["model_step_500.safetensors", "model_step_1000.safetensors"], [500, 1000]),
    (["epoch=0-step=50.ckpt", "epoch=1-step=100.ckpt"], [50, 100]),  # Lightning: the step
    # Whole numbers only: the one position that changes between names is the step.
    (["run2-10.pt", "run2-11.pt", "run2-9.pt"], [9, 10, 11]),
])
def test_framework_names(tmp_path: Path, names: list[str], steps: list[int]) -> None:
    run = discover_run(_folder(tmp_path, names))
    assert [c.step for c in run.checkpoints] == steps


def test_keras_name_parses_the_epoch() -> None:
    assert parse_step("saved-model-07-0.85.hdf5") == 7
    assert parse_step("weights.12-1.05.hdf5") == 12


def test_ambiguous_names_are_refused_with_the_routes(tmp_path: Path) -> None:
    # Two whole numbers change between names (e.g. a Keras metric formatted with no decimals):
    # no rule can tell the step from the metric.
    _folder(tmp_path, ["model-1-85.h5", "model-2-91.h5", "model-3-88.h5"])
    with pytest.raises(InvalidOptionError) as info:
        discover_run(tmp_path)
    assert str(info.value) == (f"{tmp_path}: ambiguous checkpoint names (model-1-85.h5, model-2-91.h5: more than one "
                               f"number changes between names); {STEP_ROUTES}")
    assert "--step-pattern REGEX" in STEP_ROUTES and "run CSV" in STEP_ROUTES
    run = discover_run(tmp_path, step_pattern=r"model-(\d+)-")
    assert [(c.step, Path(str(c.ref)).name) for c in run.checkpoints] == [
        (1, "model-1-85.h5"), (2, "model-2-91.h5"), (3, "model-3-88.h5")]


def test_cli_refuses_ambiguous_names_in_one_line_and_takes_a_step_pattern(tmp_path: Path) -> None:
    _folder(tmp_path, ["model-1-85.h5", "model-2-91.h5"])
    out = CliRunner().invoke(app, ["watch", str(tmp_path)])
    assert out.exit_code == 2
    assert out.stderr.strip().splitlines() == [
        f"wbfe: error: {tmp_path}: ambiguous checkpoint names (model-1-85.h5, model-2-91.h5: more than one number "
        f"changes between names); {STEP_ROUTES}"]
    bad = CliRunner().invoke(app, ["watch", str(tmp_path), "--step-pattern", "(a+)+$"])
    assert bad.exit_code == 2 and len(bad.stderr.strip().splitlines()) == 1 and "--step-pattern" in bad.stderr
    none = CliRunner().invoke(app, ["watch", str(tmp_path), "--step-pattern", r"epoch(\d+)"])
    assert none.exit_code == 2
    assert "cannot parse a step from model-1-85.h5, model-2-91.h5 with --step-pattern 'epoch(\\\\d+)'" in none.stderr


def _trainer_folder(root: Path) -> Path:
    """A Trainer output_dir: checkpoint-N/ folders, each with its trainer_state.json, and the final model beside."""
    history = [{"loss": 2.1, "step": 5, "epoch": 0.5},
               {"eval_loss": 1.50, "eval_accuracy": 0.40, "step": 10, "epoch": 1.0},
               {"eval_loss": 1.20, "eval_accuracy": 0.55, "step": 20, "epoch": 2.0},
               {"eval_loss": 1.35, "eval_accuracy": 0.52, "step": 30, "epoch": 3.0}]
    for step in (10, 20, 30):
        folder = root / f"checkpoint-{step}"
        touch_weights(folder / "model.safetensors")
        (folder / "config.json").write_text("{}")
        upto = [h for h in history if h["step"] <= step]
        (folder / "trainer_state.json").write_text(json.dumps({"global_step": step, "log_history": upto}))
    touch_weights(root / "model.safetensors")  # trainer.save_model(): the final weights, not a checkpoint
    return root


def test_hugging_face_trainer_folder(tmp_path: Path) -> None:
    run = discover_run(_trainer_folder(tmp_path))
    assert [(c.step, Path(str(c.ref)).name, c.test_loss, c.test_accuracy) for c in run.checkpoints] == [
        (10, "checkpoint-10", 1.50, 0.40), (20, "checkpoint-20", 1.20, 0.55), (30, "checkpoint-30", 1.35, 0.52)]


def test_trainer_state_without_log_history_is_refused(tmp_path: Path) -> None:
    touch_weights(tmp_path / "checkpoint-10" / "model.safetensors")
    (tmp_path / "checkpoint-10" / "trainer_state.json").write_text('{"global_step": 10}')
    with pytest.raises(InvalidOptionError, match="no log_history list"):
        discover_run(tmp_path)


def test_a_metrics_csv_wins_over_the_trainer_state(tmp_path: Path) -> None:
    _trainer_folder(tmp_path)
    (tmp_path / "metrics.csv").write_text("step,test_loss\n10,0.9\n20,0.8\n30,0.7\n")
    assert [c.test_loss for c in discover_run(tmp_path).checkpoints] == [0.9, 0.8, 0.7]
