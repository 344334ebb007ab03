"""Stop a training run from inside the trainer: a Hugging Face ``TrainerCallback`` on the watch quantities."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any, Optional, Union

from wbfe._deps import require
from wbfe.errors import InvalidOptionError
from wbfe.watch.monitor import Monitor
from wbfe.watch.trajectories import METRICS, WatchResult, result_at

__all__ = ["StopState", "trainer_callback"]


@dataclasses.dataclass
class StopState:
    """What the rule said at the last record, and the step it fired at."""

    result: Optional[WatchResult] = None
    fired_at: Optional[int] = None


def trainer_callback(output: Union[str, Path, None] = None, *, rule: Optional[str] = None,
                     lam: Optional[float] = None, stop: bool = False, patience: int = 2,
                     layers: str = "fittable", head: Optional[str] = None, device: str = "cpu") -> Any:
    """A Hugging Face ``TrainerCallback`` that records the watch signal at each evaluation and save (docs/watch.md).

    Args:
        output: a folder for ``watch.json`` (rewritten after each record); None writes nothing.
        rule, lam: a stopping rule (None: the measured default), or the h* rule at this λ.
        stop: set ``control.should_training_stop`` when the rule fires.
        patience: records the recommended checkpoint must stay unchanged for the rule to fire (≥ 1).

    Returns:
        A ``TrainerCallback``; its ``state`` is a :class:`StopState`, its ``monitor`` the :class:`~wbfe.watch.Monitor`.

    Raises:
        MissingDependencyError: transformers is not installed.
        InvalidOptionError: both ``rule`` and ``lam``, an unknown rule, a bad ``patience`` or output folder.
    """
    needs = "the Trainer callback needs transformers (pip install transformers)"
    base: Any = require("transformers", needs).TrainerCallback
    from wbfe.options import WatchOptions, refuse_keywords
    from wbfe.render.files import check_output_dir, write_atomic
    from wbfe.watch.decide import result_by_rule, rule_metrics

    if rule is not None:
        refuse_keywords(WatchOptions, {"lam": lam}, why="give either rule or lam (the h* rule at a λ), not both")
    if not isinstance(patience, int) or isinstance(patience, bool) or patience < 1:
        raise InvalidOptionError(f"patience must be a positive integer, not {patience!r}", option="patience")
    WatchOptions(layers=layers, lam=lam, head=head, device=device)
    groups = METRICS if lam is not None else rule_metrics(rule)  # an unknown rule is refused before training starts
    folder = check_output_dir(output) if output is not None else None

    class WatchTrainerCallback(base):
        def __init__(self) -> None:
            self.monitor: Optional[Monitor] = None
            self.state = StopState()

        def _record(self, args: Any, state: Any, control: Any, model: Any, metrics: Optional[dict[str, Any]]) -> None:
            if model is None:
                return
            if self.monitor is None:
                self.monitor = Monitor(model, layers=layers, head=head, device=device, name=str(args.output_dir),
                                       metrics=groups)
            step = int(state.global_step)
            loss = float((metrics or {}).get("eval_loss", math.nan))
            acc = float((metrics or {}).get("eval_accuracy", math.nan))
            points = self.monitor.trajectory.points
            if points and points[-1].step == step:
                # A save and an evaluation at one step: one record, with the evaluation's metrics.
                last = points[-1]
                points[-1] = dataclasses.replace(last, test_loss=loss if math.isfinite(loss) else last.test_loss,
                                                 test_accuracy=acc if math.isfinite(acc) else last.test_accuracy)
            else:
                self.monitor.record(step, test_loss=loss, test_accuracy=acc)
            traj = self.monitor.trajectory
            self.state.result = result = (result_at(traj, lam, layers=layers) if lam is not None else
                                          result_by_rule(traj, rule, layers=layers))
            rec = result.recommendation
            if (rec is not None and rec.index is not None and len(traj.points) - 1 - rec.index >= patience
                    and self.state.fired_at is None):
                self.state.fired_at = step
            if folder is not None:
                write_atomic(folder / "watch.json", result.to_json() + "\n")
            if stop and self.state.fired_at is not None:
                control.should_training_stop = True

        def on_evaluate(self, args: Any, state: Any, control: Any, metrics: Optional[dict[str, Any]] = None,
                        **kwargs: Any) -> Any:
            self._record(args, state, control, kwargs.get("model"), metrics)
            return control

        def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
            self._record(args, state, control, kwargs.get("model"), None)
            return control

    return WatchTrainerCallback()
