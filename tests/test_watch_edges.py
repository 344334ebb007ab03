"""wbfe.watch refusals and edge cases reachable from public input that no other test reached (found by coverage):
each asserts its one-line message or its value."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from wbfe.errors import InvalidOptionError, MissingDependencyError, SourceNotFoundError
from wbfe.watch import read_runs_csv, result_at
from wbfe.watch.decide import resolve_rule, result_by_rule, rule_metrics
from wbfe.watch.rule import calibrate_lambda, layer_statistic, recommend
from wbfe.watch.runs import discover_run, trainer_state_metrics
from wbfe.watch.trajectories import METRICS, CheckpointPoint, LayerPoint, Trajectory, scan_checkpoint

from tests.test_watch import touch_weights


def _refused(call, message: str, error: type = InvalidOptionError) -> None:  # noqa: ANN001
    with pytest.raises(error) as info:
        call()
    assert str(info.value) == message


# --- runs -------------------------------------------------------------------------------------------------------

def test_run_csv_refusals(tmp_path: Path) -> None:
    for step in (1, 2):
        touch_weights(tmp_path / f"epoch_{step}.safetensors")
    table = tmp_path / "run.csv"
    table.write_text("step,test_loss\n1,abc\n")
    _refused(lambda: discover_run(table), "not a number in a run CSV: 'abc'")
    table.write_text("step,checkpoint\n1,epoch_1.safetensors\n1,epoch_2.safetensors\n")
    _refused(lambda: discover_run(table), f"{table}: two checkpoints have step 1 ({tmp_path / 'epoch_1.safetensors'} "
                                          f"and {tmp_path / 'epoch_2.safetensors'})")
    table.write_text("step,test_loss\n")
    _refused(lambda: discover_run(table), f"{table}: the CSV has no rows")
    table.write_text("step,test_loss\n5,0.1\n")
    _refused(lambda: discover_run(table), f"{table}:2: no checkpoint for step 5 next to the CSV (and no 'checkpoint' "
                                          "column)", SourceNotFoundError)
    other = tmp_path / "notes.txt"
    other.write_text("x")
    _refused(lambda: discover_run(other),
             f"{other}: a run is a folder of checkpoints, a CSV or a list of hub revisions")
    _refused(lambda: discover_run("org/m@step1,org/m"), "not a hub revision org/name@REV: 'org/m'")


def test_a_run_named_too_long_for_the_file_system_is_no_such_file(tmp_path: Path) -> None:
    """Path.is_dir raised OSError (File name too long): a traceback and exit 1 from wbfe watch."""
    name = "a" * 5000
    _refused(lambda: discover_run(name), f"no such file or folder: {name}", SourceNotFoundError)
    (tmp_path / "runs.csv").write_text(f"run\n{name}\n{name}b\n")
    _refused(lambda: read_runs_csv(tmp_path / "runs.csv"), f"no such file or folder: {tmp_path / name}",
             SourceNotFoundError)


def test_an_infinite_test_metric_is_refused_or_unknown(tmp_path: Path) -> None:
    """A metrics.csv test loss of -inf was the run's best checkpoint (gap +inf; null in the JSON)."""
    for step in (1, 2):
        touch_weights(tmp_path / f"epoch_{step}.safetensors")
    (tmp_path / "metrics.csv").write_text("step,test_loss\n1,0.5\n2,-inf\n")
    _refused(lambda: discover_run(tmp_path),
             "not a finite number in a run CSV: '-inf' (leave the cell empty when unknown)")
    table = tmp_path / "run.csv"
    table.write_text("step,checkpoint,test_accuracy\n1,epoch_1.safetensors,inf\n")
    _refused(lambda: discover_run(table), "not a finite number in a run CSV: 'inf' (leave the cell empty when unknown)")
    # A Trainer's log of a diverged evaluation (json writes Infinity): unknown, as an empty cell.
    trainer = tmp_path / "trainer"
    for step in (10, 20):
        touch_weights(trainer / f"checkpoint-{step}" / "model.safetensors")
    (trainer / "trainer_state.json").write_text('{"log_history": [{"step": 10, "eval_loss": Infinity}, '
                                                '{"step": 20, "eval_loss": 0.5}]}')
    losses = [c.test_loss for c in discover_run(trainer).checkpoints]
    assert math.isnan(losses[0]) and losses[1] == 0.5


def test_trainer_state_steps_written_as_whole_floats_and_junk_entries(tmp_path: Path) -> None:
    """A JSON step of 10.0 is step 10; a log entry that is no mapping, or has no step, is not a metric row."""
    touch_weights(tmp_path / "checkpoint-10" / "model.safetensors")
    history = [{"step": 10.0, "eval_loss": 0.25}, "note", {"loss": 1.0}]
    (tmp_path / "trainer_state.json").write_text(json.dumps({"log_history": history}))
    run = discover_run(tmp_path)
    assert [(c.step, c.test_loss) for c in run.checkpoints] == [(10, 0.25)]
    assert trainer_state_metrics(tmp_path / "checkpoint-10", {}) == {}  # no state file: no metrics


def test_a_calibration_csv_with_one_row_per_checkpoint_groups_its_runs(tmp_path: Path) -> None:
    for step in (1, 2):
        touch_weights(tmp_path / f"epoch_{step}.safetensors")
    table = tmp_path / "runs.csv"
    table.write_text("run,step,checkpoint,test_loss\na,1,epoch_1.safetensors,0.5\nb,1,epoch_1.safetensors,0.6\n"
                     "a,2,epoch_2.safetensors,0.4\n")
    runs = read_runs_csv(table)
    assert [(r.name, [(c.step, c.test_loss) for c in r.checkpoints]) for r in runs] == [
        ("a", [(1, 0.5), (2, 0.4)]), ("b", [(1, 0.6)])]


def test_a_calibration_csv_under_home_is_found_by_tilde(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``~/runs.csv`` is the file in the home folder, as a run's own ``~`` path and the zoo's are."""
    touch_weights(tmp_path / "epoch_1.safetensors")
    (tmp_path / "runs.csv").write_text("run,step,checkpoint,test_loss\na,1,epoch_1.safetensors,0.5\n")
    monkeypatch.setenv("HOME", str(tmp_path))
    runs = read_runs_csv("~/runs.csv")
    assert [(r.name, [(c.step, c.test_loss) for c in r.checkpoints]) for r in runs] == [("a", [(1, 0.5)])]


# --- the rule and the calibration -------------------------------------------------------------------------------

def test_rule_refusals() -> None:
    _refused(lambda: layer_statistic(np.ones((2, 3)), np.ones((2, 2))), "h and h* shapes differ: (2, 3) vs (2, 2)")
    _refused(lambda: recommend([0, 10], np.array([1.0]), 1.0), "2 steps but 1 statistics")
    steps, crits, losses = [[0, 1], [0, 1]], [np.array([1.0, 2.0])] * 2, [np.array([0.5, 0.4])] * 2
    _refused(lambda: calibrate_lambda(["a", "b"], steps[:1], crits, losses),
             "names, steps, critical lambdas and losses must have one entry per run")
    _refused(lambda: calibrate_lambda(["a", "b"], steps, crits, [losses[0], np.array([0.5, math.nan])]),
             "run b: every checkpoint needs a finite test_loss")
    _refused(lambda: calibrate_lambda(["a", "b"], steps, [np.full(2, math.nan)] * 2, losses),
             "no finite h/h* in any run: cannot build a lambda grid")


def _point(step: int, n_eigs: int, fittable: tuple[tuple[str, int], ...] = ()) -> CheckpointPoint:
    layer = LayerPoint("fc", "head", 0.5, math.nan, math.nan, math.nan, math.nan, 1.0, 1.0, math.nan, n_eigs=n_eigs)
    return CheckpointPoint(step, f"s{step}", (layer,), 0.5, math.nan, fittable, min_eigs=10)


def test_the_hint_when_no_matrix_has_enough_eigenvalues_and_an_empty_run() -> None:
    result = result_at(Trajectory("r", [_point(0, 5)]), None)
    assert result.notes()[1] == ("too few eigenvalues for an HTMP fit (fc has 5; the fit needs min_eigs=10); no matrix "
                                 "of this checkpoint has enough: h_t cannot be followed, only BFE-W")
    assert result_at(Trajectory("empty"), None).notes() == ([], None)
    _refused(lambda: result_by_rule(Trajectory("empty"), "last"), "empty: no checkpoints to choose from")


def test_a_rule_reading_the_randomised_control_refuses_a_run_scored_without_it() -> None:
    """result_by_rule(trajectory(run), "rand_distance_min") kept the last checkpoint because "rand_distance is not
    finite at every checkpoint": the run was scored without the rand group (rule_metrics says which to score)."""
    from dataclasses import replace

    points = [_point(step, 20) for step in (0, 1, 2)]
    _refused(lambda: result_by_rule(Trajectory("r", points), "rand_distance_min"),
             "r: rule rand_distance_min reads rand_distance, and the run was scored without it; score it with "
             "metrics=rule_metrics(rule)")
    scored = [replace(p, layers=tuple(replace(x, extra={"rand_distance": 5.0 - p.step}) for x in p.layers))
              for p in points]
    assert result_by_rule(Trajectory("r", scored), "rand_distance_min").recommendation.step == 2


def test_a_rule_the_table_has_not_measured_is_refused() -> None:
    _refused(lambda: resolve_rule("last", {"default": "last", "rules": {}}),
             "rule last has no measurement in the shipped table: rerun benchmarks/bench_early_stopping.py")


@pytest.mark.parametrize("rule, param", [
    ("gated", {"shrinking": ["rand_distance_min", None], "growing": ["last", None]}),
    ("vote", {"rand_distance_frac": 0.5, "last": None}),
])
def test_a_composite_rule_scores_the_randomised_control_when_a_part_reads_it(monkeypatch: pytest.MonkeyPatch,
                                                                             rule: str, param: dict) -> None:
    from wbfe.watch import decide

    table = {"default": "last", "rules": {rule: {"param": param}}}
    monkeypatch.setattr(decide, "shipped_table", lambda: table)
    assert rule_metrics(rule) == METRICS + ",rand"
    table["rules"][rule]["param"] = {"shrinking": ["last", None], "growing": ["last", None]}
    assert rule_metrics(rule) == METRICS


# --- scanning one checkpoint ------------------------------------------------------------------------------------

def test_scan_checkpoint_refusals(tmp_path: Path) -> None:
    import torch
    from safetensors.torch import save_file

    path = tmp_path / "plain.safetensors"
    save_file({f"encoder.layer.{k}.attn.weight": torch.eye(12) for k in range(2)}, str(path))  # no head by name
    _refused(lambda: scan_checkpoint(path, layers=""),
             "layers must be 'head', 'all', 'fittable' or a regular expression, not ''")
    _refused(lambda: scan_checkpoint(path, device="cpu"), f"{path}: no classifier head found by name; pass --head NAME "
                                                          "or --layers all|fittable|REGEX")


# --- the Trainer callback ---------------------------------------------------------------------------------------

def test_the_trainer_callback_needs_transformers(monkeypatch: pytest.MonkeyPatch) -> None:
    from wbfe.watch import trainer_callback

    monkeypatch.setitem(sys.modules, "transformers", None)
    _refused(lambda: trainer_callback(lam=1.0), "the Trainer callback needs transformers (pip install transformers)",
             MissingDependencyError)


def test_the_trainer_callback_records_nothing_without_a_model() -> None:
    pytest.importorskip("transformers", reason="transformers (a test dependency) not installed")
    from wbfe.watch import trainer_callback

    callback = trainer_callback(lam=1.0)
    control = SimpleNamespace(should_training_stop=False)
    args, state = SimpleNamespace(output_dir="out"), SimpleNamespace(global_step=3)
    assert callback.on_save(args, state, control) is control
    assert callback.on_evaluate(args, state, control, metrics={"eval_loss": 0.1}) is control
    assert callback.monitor is None and callback.state.result is None and not control.should_training_stop


def test_the_calibration_table_closes_with_the_held_out_gap_and_the_lambda() -> None:
    from wbfe.watch import calibrate

    hs = {"a": [8.0, 5.0, 2.9, 2.0], "b": [6.0, 2.5, 1.5, 1.0]}  # h*(1) = 1: both cross 3.5 where their loss is lowest
    trajs = [Trajectory(name, [CheckpointPoint(10 * t, f"{name}/{t}", (LayerPoint(
        "fc", "head", 0.5, kappa, 1.0, 0.0, 0.01, math.nan, math.nan, math.nan),), 0.3 + 0.05 * abs(t - best))
        for t, kappa in enumerate(h)]) for (name, h), best in zip(hs.items(), (2, 1))]
    table = calibrate(trajs, grid=np.array([0.1, 1 / 3.5, 1.5])).table()
    assert table.splitlines()[-1] == ("held-out test-loss gap: mean 0.0000, median 0.0000; lambda chosen on all runs: "
                                      "0.285714")
    assert [line.split()[:3] for line in table.splitlines()[2:4]] == [["a", "0.2857", "20"], ["b", "0.2857", "10"]]
