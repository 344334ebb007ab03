"""Watch a training run without data: h_t = κ_t/β_t against h*(λ) per checkpoint, and where to stop (docs/watch.md).

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
from wbfe.watch.trajectories import (CheckpointPoint, CheckpointScan, LayerPoint, Trajectory, WatchResult, bfe_at,
                                     result_at, scan_checkpoint, trajectory, watch)

__all__ = ["LayerPoint", "CheckpointPoint", "Trajectory", "WatchResult", "CalibrationReport", "Monitor", "trajectory",
           "watch", "result_at", "calibrate", "read_runs_csv", "bfe_at", "lightning_callback", "CheckpointScan",
           "scan_checkpoint", "FixedLambdaTrend", "fixed_lambda_trend", "trainer_callback", "result_by_rule"]
