"""The Ray executor: one task per model of a ranking, one per shard of a checkpoint
(:mod:`wbfe.executors.ray_score`). Only the work moves: the driver keeps every decision a local run
makes, and each outcome is handed back as it arrives (a driver that dies loses nothing cached).
"""

from __future__ import annotations

from typing import Any, Callable, Iterator, Optional, Sequence

from wbfe.errors import WbfeError
from wbfe.executors import ExecutorOptions, Outcome, ScoreHere, Task, failure_reason
from wbfe.executors.ray_cluster import SYSTEM_ERRORS, Progress, connect, node_of_this_task, run_tasks
from wbfe.executors.ray_score import largest_tensor_elements, score_on_ray

__all__ = ["RayExecutor"]


def _run_task(fn: Callable[..., Any], args: tuple[Any, ...]) -> dict[str, Any]:
    """Runs on a Ray worker: the task's value, or why it failed, with the node."""
    node = node_of_this_task()
    try:
        value = fn(*args)
    except Exception as exc:  # noqa: BLE001 - as a local run: this task's failure
        if isinstance(exc, tuple(SYSTEM_ERRORS)) and not isinstance(exc, WbfeError):  # some refusals are OSErrors
            raise  # Ray reruns it (retry_exceptions)
        return {"error": failure_reason(exc), "node": node}
    return {"value": value, "node": node}


class RayExecutor:
    """Runs tasks on a Ray cluster (``options.address``, or one started on this machine)."""

    name = "ray"
    runs_here = False

    def __init__(self, options: ExecutorOptions) -> None:
        self.options = options

    def map(self, tasks: Sequence[Task], *, started: Optional[Callable[[int], None]] = None) -> Iterator[Outcome]:
        ray = connect(self.options.address)
        progress = Progress(total=len(tasks), what="models")
        calls = ((f"wbfe:{task.name}"[:200], task.device, largest_tensor_elements(task.sized_by), (task.fn, task.args))
                 for task in tasks)
        for k, ref in run_tasks(ray, _run_task, self.options.max_retries, calls):
            try:
                answer = ray.get(ref)
            except ray.exceptions.RayTaskError as exc:  # a system error, retries spent
                cause = getattr(exc, "cause", None) or exc
                ip = getattr(exc, "ip", None)
                answer = {"error": failure_reason(cause), "node": f"node ({ip})" if ip else "an unknown node"}
            except ray.exceptions.RayError as exc:  # the worker or node died, retries spent
                answer = {"error": failure_reason(exc), "node": "a lost node"}
            note = progress.step(answer["node"])
            yield Outcome(k, value=answer.get("value"), error=answer.get("error"), note=note)

    def score(self, ref: Any, options: Any, score_here: ScoreHere, *,
              progress: Optional[Callable[[int, Optional[int], str], None]] = None) -> Any:
        return score_on_ray(ref, options, self.options, score_here, progress=progress)
