"""What the Ray executors share: connecting, per-task resources, the node a task ran on, progress."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from wbfe.errors import InvalidOptionError, MissingDependencyError

__all__ = ["connect", "node_of_this_task", "task_resources", "largest_tensor_elements", "Progress", "SYSTEM_ERRORS"]

# Exceptions a rerun elsewhere may cure (a flaky network filesystem, a node short of memory). A
# WbfeError (a corrupt checkpoint, a bad option) is caught inside the task and never reaches Ray.
SYSTEM_ERRORS: list[type[BaseException]] = [OSError, MemoryError, ConnectionError, TimeoutError]

# A matrix is read, widened to float64 for the eigen-solve and its Gram matrix formed beside it:
# three copies of its largest tensor at 8 bytes per element bound one task's working set.
_BYTES_PER_ELEMENT = 8 * 3


def import_ray() -> Any:
    try:
        import ray
    except ModuleNotFoundError:
        from wbfe.executors import RAY_INSTALL

        raise MissingDependencyError(f"--executor ray needs Ray: {RAY_INSTALL}") from None
    return ray


def connect(address: Optional[str]) -> Any:
    """The ``ray`` module, connected: to ``address``, or to a Ray instance started on this machine
    when None. A connection made earlier in this process (``ray.init(...)``) is used as it is and
    left open; one made here is left open for later calls too (Ray closes it at exit).

    Raises:
        InvalidOptionError: no Ray cluster answers at ``address``.
    """
    ray = import_ray()
    from wbfe.render.diagnostics import route_logger

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


def check_reachable(address: str, timeout: float = 5.0) -> None:
    """Refuse at once an address where nothing listens: ``ray.init`` would retry for minutes.

    Raises:
        InvalidOptionError: no TCP connection to ``host:port`` within ``timeout`` seconds.
    """
    import socket

    host, _, port = address.removeprefix("ray://").rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout):
            pass
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


def largest_tensor_elements(ref: Any) -> Optional[int]:
    """Elements of the largest tensor of a local safetensors checkpoint, from its headers alone; None
    for anything whose sizes cannot be read that cheaply (a hub id, a pickle, an unreadable file)."""
    from wbfe.sources.safetensors_files import read_header

    if not isinstance(ref, (str, Path)):
        return None
    path = Path(ref).expanduser()
    try:
        files = [path] if path.is_file() else sorted(path.glob("*.safetensors")) if path.is_dir() else []
        sizes = [_numel(info["shape"]) for f in files if f.suffix == ".safetensors"
                 for info in read_header(f)[0].values()]
    except Exception:  # noqa: BLE001 - the task itself reports an unreadable checkpoint
        return None
    return max(sizes) if sizes else None


def _numel(shape: Any) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n


def task_resources(device: str, largest: Optional[int]) -> dict[str, Any]:
    """``ray.remote`` resource options of one task: one CPU, one GPU when the eigen-solves run on
    CUDA, and the memory of its largest tensor's working set when known (so the scheduler never
    puts more such tasks on a node than its memory holds)."""
    options: dict[str, Any] = {"num_cpus": 1}
    if device.startswith("cuda"):
        options["num_gpus"] = 1
    if largest:
        options["memory"] = largest * _BYTES_PER_ELEMENT
    return options


@dataclass
class Progress:
    """Tasks done of ``total`` on the driver (and bytes scored of ``total_bytes`` when known), with
    an estimate of the time left."""

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
        scored = f", {_size(self.done_bytes)} of {_size(self.total_bytes)}" if self.total_bytes else ""
        return f" on {node} ({self.done}/{self.total} {self.what} by Ray{scored}, {when})"


def _size(nbytes: int) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if nbytes >= scale:
            return f"{nbytes / scale:.1f} {unit}"
    return f"{nbytes} B"
