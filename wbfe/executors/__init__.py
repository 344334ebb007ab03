"""Where the work of ``wbfe rank`` / ``wbfe score`` runs: this process (``local``, the default) or a
Ray cluster (``ray``, the optional extra ``pip install 'wbfe[ray]'``).

:class:`ExecutorOptions` is checked before any work, like :class:`~wbfe.options.ScoreOptions`; the
Ray code (:mod:`wbfe.executors.ray_rank`, :mod:`wbfe.executors.ray_score`) imports ``ray`` lazily.
"""

from __future__ import annotations

import importlib.util
import re
from dataclasses import dataclass
from typing import Literal, Optional

from wbfe.errors import InvalidOptionError, MissingDependencyError

__all__ = ["ExecutorOptions", "EXECUTORS", "RAY_INSTALL"]

EXECUTORS = ("local", "ray")
RAY_INSTALL = "pip install 'wbfe[ray]'"

# "auto" (a cluster started with `ray start` on this machine), "ray://host:port" (Ray Client) or
# "host:port" (a GCS address, as `ray start --head` prints it).
_ADDRESS = re.compile(r"^(?:auto|(?:ray://)?[A-Za-z0-9_.\-]+:\d{1,5}|(?:ray://)?\[[0-9A-Fa-f:]+\]:\d{1,5})$")


@dataclass(frozen=True)
class ExecutorOptions:
    """Where a run's tasks execute.

    Attributes:
        executor: ``local`` (this process, or ``workers`` local processes) or ``ray``.
        address: the Ray cluster to join: ``auto``, ``ray://host:port`` or ``host:port``; None starts
            (or reuses) a Ray instance on this machine. Only with ``executor="ray"``.
        max_retries: how often Ray reruns a task whose worker or node died, or that raised a system
            error (OSError, MemoryError); a checkpoint wbfe refuses is a failed model, never retried.

    Raises:
        InvalidOptionError: an unknown executor, a malformed address, an address without Ray.
        MissingDependencyError: ``executor="ray"`` where ray is not installed.
    """

    executor: Literal["local", "ray"] = "local"
    address: Optional[str] = None
    max_retries: int = 3

    def __post_init__(self) -> None:
        if self.executor not in EXECUTORS:
            raise InvalidOptionError(f"executor must be 'local' or 'ray', not {self.executor!r}")
        if self.address is not None:
            if self.executor != "ray":
                raise InvalidOptionError("--address needs --executor ray")
            if not isinstance(self.address, str) or not _ADDRESS.match(self.address):
                raise InvalidOptionError(
                    f"Ray address must be auto, ray://host:port or host:port, not {self.address!r}")
        if isinstance(self.max_retries, bool) or not isinstance(self.max_retries, int) or self.max_retries < 0:
            raise InvalidOptionError(f"max_retries must be a non-negative integer, not {self.max_retries!r}")
        if self.executor == "ray" and importlib.util.find_spec("ray") is None:
            raise MissingDependencyError(f"--executor ray needs Ray: {RAY_INSTALL}")

    @property
    def is_ray(self) -> bool:
        return self.executor == "ray"
