"""λ calibration over several runs with test losses: leave one run out, report the held-out gap (rule: :mod:`.rule`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Sequence, Union

import numpy as np

from wbfe._config import user_path
from wbfe.errors import InvalidOptionError
from wbfe.options import WatchOptions, compile_layers, field_defaults
from wbfe.render.text import ToJson, json_ready, text_table
from wbfe.watch.rule import Calibration, calibrate_lambda
from wbfe.watch.runs import Run, discover_run, read_csv, run_from_rows
from wbfe.watch.trajectories import CheckpointScan, Trajectory, checkpoint_point, trajectory

__all__ = ["CalibrationReport", "calibrate", "read_runs_csv"]

_DEFAULTS = field_defaults(WatchOptions)  # the keywords' defaults are the options' own


@dataclass
class CalibrationReport(ToJson):
    """Leave-one-run-out λ calibration over several runs, with their trajectories (the scored runs, in the order
    given, for :func:`~wbfe.watch.result_at` or another :func:`calibrate` without scoring again) and the ``layers``,
    ``head`` and ``device`` they were scored with."""

    calibration: Calibration
    trajectories: list[Trajectory]
    layers: str = _DEFAULTS["layers"]
    head: Optional[str] = _DEFAULTS["head"]
    device: str = _DEFAULTS["device"]

    def scored(self, run: Run, *, layers: str, head: Optional[str], device: str) -> Optional[Trajectory]:
        """``run``'s trajectory when it is one of the calibration runs (the same checkpoints at the same steps)
        scored with this ``layers``, ``head`` and ``device``: under ``run``'s name and with its own test metrics
        (a calibration CSV may give others); None when it is not, and the run must be scored."""
        wanted = [(ck.step, _place(ck.ref)) for ck in run.checkpoints]
        if (layers, head, device) != (self.layers, self.head, self.device) or any(p is None for _, p in wanted):
            return None
        for traj in self.trajectories:
            if [(p.step, _place(p.source)) for p in traj.points] == wanted:
                scans = (CheckpointScan(p.layers, p.fittable, p.min_eigs) for p in traj.points)
                return Trajectory(run.name, [checkpoint_point(ck, scan) for ck, scan in zip(run.checkpoints, scans)])
        return None

    def to_dict(self) -> dict[str, Any]:
        cal = self.calibration
        runs = [{"run": r.name, "lambda": r.lam, "recommended_step": r.recommended_step, "best_step": r.best_step,
                 "recommended_test_loss": r.recommended_loss, "best_test_loss": r.best_loss, "test_loss_gap": r.gap}
                for r in cal.held_out]
        gaps = np.array([r.gap for r in cal.held_out])
        mean, median = float(np.nanmean(gaps)), float(np.nanmedian(gaps))
        return json_ready({"layer_selection": self.layers, "lambda_all_runs": cal.lam_all, "held_out_gap_mean": mean,
                           "held_out_gap_median": median, "runs": runs, "grid": cal.grid.tolist(),
                           "mean_gap": cal.mean_gap.tolist()})

    def table(self) -> str:
        d = self.to_dict()
        cols = ("run", "lambda", "recommended_step", "best_step", "recommended_test_loss", "best_test_loss",
                "test_loss_gap")
        return (text_table(d["runs"], cols) + "\n\n"
                f"held-out test-loss gap: mean {d['held_out_gap_mean']:.4f}, median {d['held_out_gap_median']:.4f}; "
                f"lambda chosen on all runs: {d['lambda_all_runs']:.6g}\n")


def _place(ref: object) -> Optional[str]:
    """Where a checkpoint reference reads from: a local file's real path, else the reference (a hub id); None for an
    object in memory, which is no run's (its trajectory point's source is ``<Module>``)."""
    if not isinstance(ref, str):
        return None
    return os.path.realpath(ref) if os.path.exists(ref) else ref


def read_runs_csv(path: Union[str, Path], *, step_pattern: Optional[str] = None) -> list[Run]:
    """The runs of a calibration CSV: one row per run (``run``: a folder or run CSV, relative to this file), or
    one per checkpoint (``run``, ``step``, ``test_loss``, optional ``checkpoint`` / ``test_accuracy``); checkpoint
    names are read with ``step_pattern`` as :func:`discover_run` reads them.

    Raises:
        InvalidOptionError: no ``run`` column, or a malformed row. The errors of :func:`discover_run`.
    """
    path = user_path(path)  # as the run itself and the zoo are
    rows = read_csv(path, required="run", kind="runs")
    empty = next((number for number, row in enumerate(rows, start=2) if not row["run"]), None)
    if empty is not None:  # path.parent / "" is the CSV's own folder
        raise InvalidOptionError(f"{path}: line {empty} has an empty 'run' cell")
    if "step" not in rows[0]:
        # an absolute path replaces the folder
        return [discover_run(path.parent / row["run"], step_pattern=step_pattern) for row in rows]
    grouped = {name: [row for row in rows if row["run"] == name] for name in dict.fromkeys(r["run"] for r in rows)}
    pattern = compile_layers(step_pattern, option="--step-pattern")
    return [run_from_rows(path, group, name, pattern) for name, group in grouped.items()]


def _refuse_repeated_runs(items: Sequence[Union[Run, Trajectory]]) -> None:
    """Refuse one run listed twice under two names (a link, ``../runs/a``): held out, its copy would stay in, and its
    gap would be 0 by construction."""
    seen: dict[tuple[Optional[str], ...], str] = {}
    for item in items:
        refs = [ck.ref for ck in item.checkpoints] if isinstance(item, Run) else [p.source for p in item.points]
        places = tuple(_place(ref) for ref in refs)
        if None in places:  # a model in memory is no file another run could name
            continue
        name = item.name if isinstance(item, Run) else item.run
        if places in seen:
            other = f" (as {seen[places]}: the same checkpoints)" if seen[places] != name else ""
            raise InvalidOptionError(f"run {name} is listed twice{other}: leave-one-run-out needs each run once")
        seen[places] = name


def calibrate(runs: Union[str, Path, Sequence[Union[str, Path, Run, Trajectory]]], *,
              layers: str = _DEFAULTS["layers"], head: Optional[str] = _DEFAULTS["head"],
              device: str = _DEFAULTS["device"], grid: Optional[np.ndarray] = None,
              step_pattern: Optional[str] = None) -> CalibrationReport:
    """Choose λ by leave-one-run-out over runs (a calibration CSV, runs or scored trajectories) that have a test
    loss at every checkpoint; ``layers``, ``head``, ``device`` as :func:`scan_checkpoint`, ``grid`` default a
    log grid covering every run's critical λ, ``step_pattern`` as :func:`discover_run` (for the runs named by path).

    Raises:
        InvalidOptionError: fewer than two runs, a run without test losses, or two runs of the same checkpoints.
    """
    WatchOptions(layers=layers, head=head, device=device)  # every option before the first run is read
    items = (read_runs_csv(runs, step_pattern=step_pattern) if isinstance(runs, (str, Path)) else
             [discover_run(x, step_pattern=step_pattern) if isinstance(x, (str, Path)) else x for x in runs])
    _refuse_repeated_runs(items)
    missing = next((x.name for x in items if isinstance(x, Run) and not x.has_test_loss), None)
    if missing is not None:  # refused by calibrate_lambda too, but only once every run was scored
        raise InvalidOptionError(f"run {missing}: every checkpoint needs a finite test_loss")
    trajs = [x if isinstance(x, Trajectory) else trajectory(x, layers=layers, head=head, device=device) for x in items]
    cal = calibrate_lambda([t.run for t in trajs], [t.steps for t in trajs], [t.critical_lambdas() for t in trajs],
                           [t.test_losses() for t in trajs], grid=grid)
    return CalibrationReport(cal, trajs, layers, head, device)
