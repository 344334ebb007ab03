"""``wbfe rank --executor ray``: one Ray task per model, each result cached as it arrives.

The driver keeps every decision a local run makes (cache look-ups, failures, order, statistics):
only the scoring of the pending models moves to the cluster. A result is written into the score
cache as soon as its task finishes, so a driver that dies loses nothing done, and the re-run scores
only what is left. Ray reruns a task whose worker or node died (up to ``max_retries`` times); a
checkpoint that wbfe refuses comes back as that model's failure, with the node it ran on, and is
never retried.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from wbfe.errors import WbfeError
from wbfe.executors import ExecutorOptions
from wbfe.executors._ray import SYSTEM_ERRORS, Progress, connect, largest_tensor_elements, node_of_this_task, task_resources
from wbfe.options import ScoreOptions

if TYPE_CHECKING:
    from wbfe.ranking.ranker import Scorer, _Pending, _Run

__all__ = ["score_on_ray"]


def _score_task(score_fn: "Scorer", ref: str, options: ScoreOptions) -> dict[str, Any]:
    """Runs on a Ray worker: the model's payload, or the reason wbfe refused it, with the node."""
    from wbfe.ranking.ranker import _reason

    node = node_of_this_task()
    try:
        payload = score_fn(ref, options)
    except WbfeError as exc:
        return {"error": _reason(exc), "node": node}
    except tuple(SYSTEM_ERRORS):
        raise  # Ray reruns it (retry_exceptions)
    except Exception as exc:  # noqa: BLE001 - as a local run: this model's failure
        return {"error": _reason(exc), "node": node}
    return {"payload": dict(payload), "node": node}


def score_on_ray(run: "_Run", pending: list["_Pending"], score_fn: "Scorer", options: ScoreOptions,
                 executor: ExecutorOptions) -> None:
    """Score ``pending`` as Ray tasks; each outcome goes through ``run.finish`` as it arrives."""
    from wbfe.ranking.ranker import _reason

    ray = connect(executor.address)
    remote = ray.remote(_score_task)
    progress = Progress(total=len(pending), say=run.say, what="models")
    tasks: dict[Any, "_Pending"] = {}
    try:
        for item in pending:
            resources = task_resources(options.device, largest_tensor_elements(item[1].ref))
            ref = remote.options(max_retries=executor.max_retries, retry_exceptions=SYSTEM_ERRORS,
                                 name=f"wbfe-score:{item[1].name}"[:200], **resources).remote(score_fn, item[1].ref, options)
            tasks[ref] = item
        while tasks:
            ready, _ = ray.wait(list(tasks), num_returns=1)
            for ref in ready:
                item = tasks.pop(ref)
                try:
                    answer = ray.get(ref)
                except ray.exceptions.RayTaskError as exc:  # a system error, retries spent
                    cause = getattr(exc, "cause", None) or exc
                    answer = {"error": _reason(cause), "node": _node_of(exc)}
                except ray.exceptions.RayError as exc:  # the worker or node died, retries spent
                    answer = {"error": _reason(exc), "node": "a lost node"}
                if "error" in answer:
                    run.fail(item, answer["error"], progress.step(answer["node"]))
                else:
                    run.finish(item, answer["payload"], progress.step(answer["node"]))
    except BaseException:
        # Interrupted: finished models are cached; stop the rest instead of leaving them running.
        for ref in tasks:
            ray.cancel(ref, force=True)
        raise


def _node_of(exc: BaseException) -> str:
    ip = getattr(exc, "ip", None)
    return f"node ({ip})" if ip else "an unknown node"
