"""How one checkpoint's tensors flow to their spectra: scored on workers side by side where that is faster, within a
memory budget, and handed back in the order they were stored (docs/performance.md, How a checkpoint flows)."""

from __future__ import annotations

import collections
import contextlib
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor
from concurrent.futures import wait as futures_wait
from typing import TYPE_CHECKING, Any, Callable, Iterator, Optional

from wbfe._config import blas_threads
from wbfe.engine.matrices import MatrixPlan, Plan, Skip
from wbfe.linalg.spectra import multithreaded, pin_threads, releases_gil, work_bytes
from wbfe.sources import TensorEntry

if TYPE_CHECKING:
    from wbfe.linalg.spectra import Device

__all__ = ["Pipeline", "worker_count"]

# Smaller matrices (p²·P flops) are scored in line: on a worker, the hand-offs and the GIL cost more.
_WORKER_FLOPS = 1 << 24
# × the largest tensor: the most tensor and float64 work bytes in flight at once, leaving room under
# 3× + 500 MB for what scoring loads besides (scipy, per-thread malloc arenas).
_BUDGET = 2.5
# ... or this much, whichever is more: a small model's largest tensor leaves no room for two at once.
_BUDGET_FLOOR = 64 << 20


def worker_count(device: "Device") -> int:
    """How many matrices to score side by side: the BLAS threads the environment allows; 1 on a GPU."""
    return 1 if device.type != "cpu" else blas_threads()


class Pipeline:
    """One scoring run's threads and memory budget, as a context manager.

    Entries go through :meth:`put` (a skip) or :meth:`compute` (a job that returns its spectrum); :meth:`finished`
    yields ``(entry, plan, outcome)`` in stream order. For other jobs (compare's), ``loaded_bytes(entry)`` and
    ``job_bytes(plan)`` size what they hold."""

    def __init__(self, device: "Device", workers: Optional[int] = None, *,
                 loaded_bytes: Optional[Callable[[TensorEntry], int]] = None,
                 job_bytes: Optional[Callable[[MatrixPlan], int]] = None):
        self.device = device
        self.workers = worker_count(device) if workers is None else workers
        self._loaded = loaded_bytes or (lambda entry: entry.nbytes)
        self._work = job_bytes or (lambda plan: work_bytes(plan.rows, plan.cols, device))
        self._largest = 0
        self._running: dict[Future[Any], int] = {}  # jobs on the workers and the bytes they hold
        self._done: collections.deque[tuple[TensorEntry, Plan, Any]] = collections.deque()
        self._stack = contextlib.ExitStack()
        self._pinned: Optional[contextlib.ExitStack] = None
        self._pool: Optional[ThreadPoolExecutor] = None

    def __enter__(self) -> "Pipeline":
        if self.workers > 1:
            self._pool = self._stack.enter_context(ThreadPoolExecutor(self.workers, thread_name_prefix="wbfe-score"))
        return self

    def __exit__(self, *exc: object) -> None:
        for future in self._running:
            future.cancel()
        futures_wait(list(self._running))
        self._running.clear()
        self._unpin()
        self._stack.close()

    def put(self, entry: TensorEntry, skip: Skip) -> None:
        """An entry with nothing to compute, kept in its place in the stream."""
        self._done.append((entry, skip, skip))

    def compute(self, entry: TensorEntry, plan: MatrixPlan, job: Callable[[], Any]) -> None:
        """Run ``job`` (the entry's spectrum) on a worker where it releases the GIL, else here; the
        entry keeps its place in the stream."""
        self._largest = max(self._largest, self._loaded(entry))
        cost, budget = self._loaded(entry) + self._work(plan), max(int(_BUDGET * self._largest), _BUDGET_FLOOR)
        p, big = sorted((plan.rows, plan.cols))
        if (self._pool is not None and p * p * big * plan.n_slices >= _WORKER_FLOPS
                and releases_gil(plan.rows, plan.cols, self.device)):
            self._pin()
            while self._running and (len(self._running) >= self.workers
                                     or sum(self._running.values()) + cost > budget):
                self._wait(FIRST_COMPLETED)
            future = self._pool.submit(job)
            self._running[future] = cost
        else:
            if multithreaded(plan.rows, plan.cols):  # alone, with all BLAS threads (small ones use one anyway)
                self._wait()
                self._unpin()
            future = Future()
            try:
                future.set_result(job())
            except Exception as exc:  # raised in stream order by finished(), as a worker's would be
                future.set_exception(exc)
        self._done.append((entry, plan, future))

    def finished(self, *, wait: bool = False) -> Iterator[tuple[TensorEntry, Plan, Any]]:
        """Outcomes in stream order, as far as they are done (all of them with ``wait``). A job's
        outcome is its return value; an exception it raised is raised here."""
        while self._done:
            entry, plan, outcome = self._done[0]
            if isinstance(outcome, Future):
                if not (wait or outcome.done()):
                    return
                self._running.pop(outcome, None)  # its bytes are free again
                outcome = outcome.result()
            self._done.popleft()
            yield entry, plan, outcome

    def _wait(self, return_when: str = "ALL_COMPLETED") -> None:
        """Until one job (or all) on the workers is done; their bytes are free again."""
        done, _ = futures_wait(list(self._running), return_when=return_when)
        for future in done:
            self._running.pop(future)

    def _pin(self) -> None:
        if self._pinned is None:
            self._pinned = contextlib.ExitStack()
            self._pinned.enter_context(pin_threads())

    def _unpin(self) -> None:
        if self._pinned is not None:
            self._pinned.close()
            self._pinned = None
