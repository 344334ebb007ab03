"""What the Ray executors share: connecting, per-task resources, the node a task ran on, progress."""

from __future__ import annotations

import logging
import math
import socket
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator, Optional

from wbfe.errors import InvalidOptionError, MissingDependencyError
from wbfe.executors import RAY_INSTALL
from wbfe.render.diagnostics import route_logger
from wbfe.sources.object_bound import format_size

__all__ = ["connect", "node_of_this_task", "task_resources", "run_tasks", "numel",
           "Progress", "SYSTEM_ERRORS", "format_size"]

# Exceptions a rerun elsewhere may cure (a flaky network filesystem); a WbfeError never reaches Ray.
SYSTEM_ERRORS: list[type[BaseException]] = [OSError, MemoryError, ConnectionError, TimeoutError]

# Three float64 copies of the largest tensor (read, widened, its Gram matrix) bound a task's working set.
_BYTES_PER_ELEMENT = 8 * 3


def connect(address: Optional[str]) -> Any:
    """The ``ray`` module, connected to ``address`` (None: a Ray instance on this machine); an earlier
    connection of this process is used as it is, and one made here is left open for later calls."""
    try:
        import ray
    except ModuleNotFoundError:
        raise MissingDependencyError(f"--executor ray needs Ray: {RAY_INSTALL}") from None
    route_logger("ray")  # its warnings (a token, a runtime environment): wbfe's diagnostics
    if ray.is_initialized():
        return ray
    if address is not None and address != "auto":
        check_reachable(address)
    try:
        ray.init(address=address, include_dashboard=False, logging_level=logging.WARNING, configure_logging=True)
    except ConnectionError as exc:
        raise InvalidOptionError(f"no Ray cluster at {address!r}: {' '.join(str(exc).split())[:200]}") from None
    return ray


def check_reachable(address: str) -> None:
    """Refuse at once an address where nothing listens (``ray.init`` would retry for minutes)."""
    host, _, port = address.removeprefix("ray://").rpartition(":")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=5.0).close()
    except OSError as exc:
        raise InvalidOptionError(f"no Ray cluster answers at {address} ({exc.strerror or exc})") from None


def node_of_this_task() -> str:
    """``node <id prefix> (<ip>)`` of the Ray node running the caller (inside a task)."""
    import ray

    node_id = ray.get_runtime_context().get_node_id()
    try:
        ip = ray.util.get_node_ip_address()
    except Exception:  # noqa: BLE001 - the IP only decorates the message
        ip = "?"
    return f"node {node_id[:12]} ({ip})"


def numel(shape: Any) -> int:
    return math.prod(int(d) for d in shape)


def task_resources(device: str, largest: Optional[int]) -> dict[str, Any]:
    """``ray.remote`` options of one task: one CPU, a GPU for CUDA, and its working set's memory when known."""
    options: dict[str, Any] = {"num_cpus": 1}
    if device.startswith("cuda"):
        options["num_gpus"] = 1
    if largest:
        options["memory"] = largest * _BYTES_PER_ELEMENT
    return options


def run_tasks(ray: Any, fn: Callable[..., Any], max_retries: int,
              tasks: Iterable[tuple[str, str, Optional[int], tuple[Any, ...]]]) -> Iterator[tuple[int, Any]]:
    """Each ``(name, device, largest, args)`` of ``tasks`` as the Ray task ``fn(*args)``, rerun up to ``max_retries``
    times on a system error; ``(index, object ref)`` of each as it finishes. Left early (interrupted, or a part
    refused), the tasks still running are cancelled instead of left running on the cluster."""
    remote = ray.remote(fn)
    running: dict[Any, int] = {}
    try:
        for k, (name, device, largest, args) in enumerate(tasks):
            running[remote.options(max_retries=max_retries, retry_exceptions=SYSTEM_ERRORS, name=name,
                                   **task_resources(device, largest)).remote(*args)] = k
        while running:
            ready, _ = ray.wait(list(running), num_returns=1)
            for ref in ready:
                yield running.pop(ref), ref
    finally:
        for ref in running:
            ray.cancel(ref, force=True)


@dataclass
class Progress:
    """Tasks (and bytes, where ``total_bytes``) done of ``total`` on the driver, with the time left."""

    total: int
    what: str = "models"
    total_bytes: int = 0
    done: int = 0
    done_bytes: int = 0
    start: float = field(default_factory=time.monotonic)

    def step(self, node: str, nbytes: int = 0) -> str:
        """Count one finished task; the note for its progress line (node, done/total, bytes, ETA)."""
        self.done += 1
        self.done_bytes += nbytes
        elapsed = time.monotonic() - self.start
        share = self.done_bytes / self.total_bytes if self.total_bytes else self.done / self.total
        left = elapsed / share * (1 - share) if share > 0 else float("nan")
        when = f"ETA {left:.0f} s" if self.done < self.total else f"all done in {elapsed:.0f} s"
        scored = f", {format_size(self.done_bytes)} of {format_size(self.total_bytes)}" if self.total_bytes else ""
        return f" on {node} ({self.done}/{self.total} {self.what} by Ray{scored}, {when})"
