"""The local executor: tasks one after another in this process, or in ``workers`` spawned
processes that split the cores between them; a score runs the engine here."""

from __future__ import annotations

import functools
import multiprocessing
from concurrent.futures import ProcessPoolExecutor, as_completed
from typing import Any, Callable, Iterator, Optional, Sequence

from wbfe._config import usable_cpus
from wbfe._deps import loaded
from wbfe.executors import ExecutorOptions, Outcome, ScoreHere, Task, failure_reason

__all__ = ["LocalExecutor", "run_with_threads"]


class LocalExecutor:
    """Runs work in this process (``workers`` = 1) or in a pool of spawned processes."""

    name = "local"
    runs_here = True

    def __init__(self, options: ExecutorOptions) -> None:
        self.workers = options.workers

    def map(self, tasks: Sequence[Task], *, started: Optional[Callable[[int], None]] = None) -> Iterator[Outcome]:
        if self.workers > 1 and len(tasks) > 1:
            yield from self._in_processes(tasks)
            return
        for k, task in enumerate(tasks):
            if started is not None:
                started(k)
            yield _outcome(k, functools.partial(task.fn, *task.args))

    def _in_processes(self, tasks: Sequence[Task]) -> Iterator[Outcome]:
        threads = max(1, usable_cpus() // self.workers)
        context = multiprocessing.get_context("spawn")  # fork + torch threads can deadlock
        pool = ProcessPoolExecutor(max_workers=self.workers, mp_context=context)
        try:
            futures = {pool.submit(run_with_threads, threads, task.fn, task.args): k for k, task in enumerate(tasks)}
            for future in as_completed(futures):
                yield _outcome(futures[future], future.result)
        except BaseException:
            # Interrupted (or the consumer stopped): drop the queued tasks and stop.
            pool.shutdown(wait=False, cancel_futures=True)
            raise
        pool.shutdown()

    def score(self, ref: Any, options: Any, score_here: ScoreHere, *,
              progress: Optional[Callable[[int, Optional[int], str], None]] = None) -> Any:
        return score_here(ref, options, progress=progress)


def _outcome(k: int, call: Callable[[], Any]) -> Outcome:
    try:
        return Outcome(k, value=call())
    except Exception as exc:  # noqa: BLE001 - this task's failure; the run goes on
        return Outcome(k, error=failure_reason(exc))


def run_with_threads(threads: int, fn: Callable[..., Any], args: tuple[Any, ...]) -> Any:
    """``fn(*args)`` with every BLAS pool and torch's own held at ``threads`` (a worker process's share)."""
    # Environment variables would come too late: NumPy's BLAS is loaded by the time this runs.
    from threadpoolctl import threadpool_limits

    torch = loaded("torch")
    if torch is not None:
        torch.set_num_threads(threads)
    with threadpool_limits(limits=threads):
        return fn(*args)
