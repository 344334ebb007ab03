"""Where work runs: this process (``local``, the default) or a Ray cluster (``ray``, docs/ray.md).
``wbfe.score`` and ``wbfe.rank`` receive an :class:`Executor` from :func:`executor_for` and never
ask which it is; the Ray code imports ``ray`` lazily.
"""

from __future__ import annotations

import importlib
import importlib.util
import re
from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Iterator, Literal, Mapping, Optional, Protocol, Sequence

from wbfe.errors import InvalidOptionError, MissingDependencyError
from wbfe.options.constraints import Choice, Constraint, Custom, Integer, Validated

__all__ = ["ExecutorOptions", "Executor", "Task", "Outcome", "executor_for", "failure_reason", "EXECUTORS",
           "RAY_INSTALL", "ScoreHere"]

RAY_INSTALL = "pip install 'wbfe[ray]'"

_IMPLEMENTATIONS = {"local": "wbfe.executors.local:LocalExecutor", "ray": "wbfe.executors.ray_executor:RayExecutor"}
EXECUTORS = tuple(_IMPLEMENTATIONS)

# "auto" (a cluster started with `ray start` on this machine), "ray://host:port" (Ray Client) or
# "host:port" (a GCS address, as `ray start --head` prints it).
_ADDRESS = re.compile(r"^(?:auto|(?:ray://)?[A-Za-z0-9_.\-]+:\d{1,5}|(?:ray://)?\[[0-9A-Fa-f:]+\]:\d{1,5})$")

# score_here(ref, options, progress=...): one checkpoint's whole score where it runs (module-level: it pickles)
ScoreHere = Callable[..., Any]


def _check_address(address: Any) -> str:
    if not isinstance(address, str) or not _ADDRESS.match(address):
        raise InvalidOptionError(f"Ray address must be auto, ray://host:port or host:port, not {address!r}")
    return address


@dataclass(frozen=True)
class ExecutorOptions(Validated):
    """Where a run's tasks execute, checked before any work.

    Attributes:
        executor: ``local`` (this process, or ``workers`` local processes) or ``ray``.
        address: the Ray cluster to join (``auto``, ``ray://host:port``, ``host:port``); None starts
            (or reuses) one on this machine.
        max_retries: how often Ray reruns a task whose worker or node died, or that raised a system
            error (OSError, MemoryError); a checkpoint wbfe refuses is never retried.
        workers: local processes for independent tasks (a ranking's models); 1 with Ray.
    """

    CONSTRAINTS: ClassVar[Mapping[str, Constraint]] = {
        "executor": Choice(EXECUTORS),
        "address": Custom(_check_address, "auto, ray://host:port or host:port", bad=("nowhere", 3), optional=True),
        "max_retries": Integer(0), "workers": Integer(1, words="at least 1"),
    }

    executor: Literal["local", "ray"] = "local"
    address: Optional[str] = None
    max_retries: int = 3
    workers: int = 1

    def _cross_check(self) -> None:
        if self.address is not None and self.executor != "ray":
            raise InvalidOptionError("--address needs --executor ray")
        if self.executor == "ray":
            if self.workers != 1:
                raise InvalidOptionError("--workers is for the local executor; under Ray every model is its own task")
            if importlib.util.find_spec("ray") is None:
                raise MissingDependencyError(f"--executor ray needs Ray: {RAY_INSTALL}")

    @property
    def is_ray(self) -> bool:
        return self.executor == "ray"


@dataclass(frozen=True)
class Task:
    """One independent piece of work, ``fn(*args)`` (``fn`` module-level: it may be pickled); ``device``:
    where its eigen-solves run; ``sized_by``: a checkpoint whose largest tensor bounds its memory."""

    name: str
    fn: Callable[..., Any]
    args: tuple[Any, ...]
    device: str = "cpu"
    sized_by: Any = None


@dataclass(frozen=True)
class Outcome:
    """What became of the task at ``index``: its ``value``, or ``error`` (why it failed); ``note``
    says where it ran and how far the run is (a suffix for its progress line)."""

    index: int
    value: Any = None
    error: Optional[str] = None
    note: str = ""


class Executor(Protocol):
    """Where tasks run (:class:`~wbfe.executors.local.LocalExecutor`, :class:`~wbfe.executors.ray_executor.RayExecutor`)."""

    name: str
    runs_here: bool
    """Whether work runs in this process (a LoRA adapter with its base is scored only there)."""

    def map(self, tasks: Sequence[Task], *, started: Optional[Callable[[int], None]] = None) -> Iterator[Outcome]:
        """Run every task; yield each outcome as it finishes. A task's exception is its outcome's
        ``error`` (the run goes on), except KeyboardInterrupt, which stops the queued tasks.
        ``started(index)`` is called as a task starts, where the executor knows it."""
        ...

    def score(self, ref: Any, options: Any, score_here: ScoreHere, *,
              progress: Optional[Callable[[int, Optional[int], str], None]] = None) -> Any:
        """The :class:`~wbfe.engine.ModelScore` of one checkpoint, the same wherever it runs."""
        ...


def executor_for(options: ExecutorOptions) -> Executor:
    module_name, _, name = _IMPLEMENTATIONS[options.executor].partition(":")
    implementation: Callable[[ExecutorOptions], Executor] = getattr(importlib.import_module(module_name), name)
    return implementation(options)


def failure_reason(exc: BaseException) -> str:
    """A task's failure as one line: the exception's type and its message."""
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
