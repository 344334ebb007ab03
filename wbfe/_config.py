"""Environment variables wbfe honours, read at call time (so tests and callers can change them)."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["hf_offline", "hf_cache_dir", "torch_hub_dir", "wbfe_cache_dir", "wbfe_cache_max_size", "shared_zoo_dir",
           "usable_cpus", "blas_threads", "user_path"]


def user_path(path: "str | os.PathLike[str]") -> Path:
    """``path`` with a leading ``~`` or ``~user`` expanded; ``~user`` of no user here stays a name like any other
    (``Path.expanduser`` raises RuntimeError for it)."""
    return Path(os.path.expanduser(path))


def _env_path(*names: str) -> "Path | None":
    """The first of the variables ``names`` that is set (non-empty), as a path."""
    return next((user_path(os.environ[name]) for name in names if os.environ.get(name)), None)


def _cache_home() -> Path:
    """``$XDG_CACHE_HOME``, else ``~/.cache``: where the hub, torch and wbfe caches go by default."""
    return user_path(os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache"))


def hf_offline() -> bool:
    """True when ``HF_HUB_OFFLINE`` (or the older ``TRANSFORMERS_OFFLINE``) is set."""
    return any(os.environ.get(name, "").strip().lower() in {"1", "true", "yes", "on"}
               for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))


def hf_cache_dir() -> Path:
    """The Hugging Face hub cache, with huggingface_hub's precedence of variables."""
    return (_env_path("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE")
            or (_env_path("HF_HOME") or _cache_home() / "huggingface") / "hub")


def torch_hub_dir() -> Path:
    """PyTorch's hub folder (``TORCH_HOME``/hub), where timm and torchvision keep URL downloads."""
    return (_env_path("TORCH_HOME") or _cache_home() / "torch") / "hub"


def wbfe_cache_dir() -> Path:
    """wbfe's score cache: ``$WBFE_CACHE_DIR``, else ``$XDG_CACHE_HOME/wbfe/scores``, else ``~/.cache/wbfe/scores``."""
    return _env_path("WBFE_CACHE_DIR") or _cache_home() / "wbfe" / "scores"


def wbfe_cache_max_size() -> str:
    """``$WBFE_CACHE_MAX_SIZE`` as written ('' when unset), parsed by ``wbfe.sources.object_bound``."""
    return os.environ.get("WBFE_CACHE_MAX_SIZE", "").strip()


def shared_zoo_dir() -> Path:
    """The project's shared real checkpoints: ``$WBFE_SHARED_ZOO`` or ``<checkout>/../shared/zoo``."""
    return _env_path("WBFE_SHARED_ZOO") or Path(__file__).resolve().parents[1].parent / "shared" / "zoo"


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity mask, which a container or ``taskset`` narrows)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def blas_threads() -> int:
    """``OPENBLAS_NUM_THREADS``, else ``OMP_NUM_THREADS`` (a positive whole number), else the usable
    CPUs, and never more than those."""
    cpus = max(1, usable_cpus())
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS"):
        value = os.environ.get(var, "").strip()
        if value.isdigit() and int(value) > 0:
            return min(int(value), cpus)
    return cpus
