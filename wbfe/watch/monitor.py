"""Record the watch quantities inside a training loop (plain PyTorch, or Lightning when installed)."""

from __future__ import annotations

import math
from typing import Any, Optional

from wbfe._deps import require, require_torch
from wbfe.errors import InvalidOptionError
from wbfe.options import WatchOptions
from wbfe.watch.trajectories import (METRICS, CheckpointPoint, Trajectory, WatchResult, checkpoint_point, result_at,
                                     scan_checkpoint)
from wbfe.watch.runs import CheckpointRef

__all__ = ["Monitor", "lightning_callback"]


class Monitor:
    """Record the watch quantities inside a training loop, without saving checkpoints.

    Example:
        >>> monitor = Monitor(model, every=1, layers="all")          # doctest: +SKIP
        >>> for epoch in range(epochs):                              # doctest: +SKIP
        ...     train_one_epoch(model)
        ...     monitor(epoch, test_loss=evaluate(model))            # test_loss is optional
        >>> monitor.result(lam=0.5).recommendation                   # doctest: +SKIP
    """

    def __init__(self, model: Any, *, every: int = 1, layers: str = "head", head: Optional[str] = None,
                 device: str = "cpu", name: str = "monitor", metrics: str = METRICS) -> None:
        """Watch ``model`` (an ``nn.Module`` or state dict trained in place), recording when ``step % every == 0``;
        ``layers``, ``head``, ``device``, ``metrics`` as :func:`~wbfe.watch.scan_checkpoint` (InvalidOptionError for
        a bad one, or an ``every`` that is not a positive integer); ``name``: the run's."""
        if not isinstance(every, int) or isinstance(every, bool) or every < 1:
            raise InvalidOptionError(f"every must be a positive integer, not {every!r}")
        WatchOptions(layers=layers, head=head, device=device)  # now, not at the first record an epoch later
        self.model, self.every, self.layers, self.head, self.device = model, every, layers, head, device
        self.metrics = metrics
        self.trajectory = Trajectory(run=name)

    def __call__(self, step: int, *, test_loss: float = math.nan,
                 test_accuracy: float = math.nan) -> Optional[CheckpointPoint]:
        """Record at ``step`` if it is a multiple of ``every``; return the new point or None."""
        return None if step % self.every else self.record(step, test_loss=test_loss, test_accuracy=test_accuracy)

    def record(self, step: int, *, test_loss: float = math.nan, test_accuracy: float = math.nan) -> CheckpointPoint:
        """Score the model's current weights now and append them at ``step`` (after the last recorded one)."""
        if self.trajectory.points and step <= self.trajectory.points[-1].step:
            raise InvalidOptionError(f"step {step} is not after the last recorded step {self.trajectory.points[-1].step}")
        torch = require_torch("the training monitor")  # present wherever an nn.Module is trained

        with torch.no_grad():
            scanned = scan_checkpoint(self.model, layers=self.layers, head=self.head, device=self.device,
                                      metrics=self.metrics)
        point = checkpoint_point(CheckpointRef(step, self.model, test_loss, test_accuracy), scanned)
        self.trajectory.points.append(point)
        return point

    def result(self, lam: Optional[float] = None) -> WatchResult:
        """The recorded trajectory at ``lam`` with the rule's recommendation."""
        return result_at(self.trajectory, lam, layers=self.layers)


def lightning_callback(monitor: Monitor) -> Any:
    """A Lightning ``Callback`` that calls ``monitor(trainer.current_epoch)`` after every training epoch
    (MissingDependencyError without ``lightning`` or ``pytorch_lightning``)."""
    try:
        from lightning.pytorch import Callback as base
    except ImportError:  # the package's name before Lightning 2.0
        base = require("pytorch_lightning", "the Lightning callback needs lightning (pip install lightning)").Callback

    class WatchCallback(base):
        def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
            monitor(int(trainer.current_epoch))

    return WatchCallback()
