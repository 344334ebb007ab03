"""Watch a training run without data: h_t = κ_t/β_t against h*(λ) per checkpoint, and where to stop.

- :mod:`wbfe.watch.runs`: a run's checkpoints and the step each was saved at;
- :mod:`wbfe.watch.trajectories`: score each checkpoint once, derive the λ-dependent columns;
- :mod:`wbfe.watch.guidance`: why a column is NaN, which layers can carry h_t, BFE-W at a fixed λ;
- :mod:`wbfe.watch.rule`: the stopping rule and λ calibration across runs;
- :mod:`wbfe.watch.calibration`: leave-one-run-out λ over several runs with test losses;
- :mod:`wbfe.watch.monitor`: the same quantities recorded inside a training loop;
- :mod:`wbfe.watch.stopping`: the data-free stopping rules and their leave-one-run-out measurement;
- :mod:`wbfe.watch.decide`: a checkpoint recommended by a measured rule (the default of ``wbfe watch``);
- :mod:`wbfe.watch.callbacks`: a Hugging Face ``TrainerCallback`` that records the signal and can stop training.

>>> import wbfe.watch as ww
>>> result = ww.watch("runs/seed0", lam=0.5)           # doctest: +SKIP
>>> result.recommendation.step, result.to_json()       # doctest: +SKIP
"""

from __future__ import annotations

from wbfe.watch.calibration import CalibrationReport, calibrate, read_runs_csv
from wbfe.watch.callbacks import trainer_callback
from wbfe.watch.decide import result_by_rule
from wbfe.watch.guidance import FixedLambdaTrend, fixed_lambda_trend
from wbfe.watch.monitor import Monitor, lightning_callback
from wbfe.watch.trajectories import (
    CheckpointPoint,
    LayerPoint,
    Trajectory,
    CheckpointScan,
    WatchResult,
    bfe_at,
    result_at,
    scan_checkpoint,
    score_checkpoint,
    trajectory,
    watch,
)

__all__ = [
    "LayerPoint",
    "CheckpointPoint",
    "Trajectory",
    "WatchResult",
    "CalibrationReport",
    "Monitor",
    "score_checkpoint",
    "trajectory",
    "watch",
    "result_at",
    "calibrate",
    "read_runs_csv",
    "bfe_at",
    "lightning_callback",
    "CheckpointScan",
    "scan_checkpoint",
    "FixedLambdaTrend",
    "fixed_lambda_trend",
    "trainer_callback",
    "result_by_rule",
]
