"""What computed the numbers: library versions, and a digest of wbfe's own source (a development
install keeps one version across edits: the rank cache keys on the digest too)."""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path

__all__ = ["installed_versions", "source_digest", "tree_digest"]


def installed_versions() -> dict[str, str]:
    """``python``, ``wbfe``, ``torch``, ``numpy``, ``scipy`` -> version (or ``not installed``)."""
    # A loaded package's __version__ is free; reading its metadata parses files.
    import platform
    from importlib import metadata

    from wbfe._deps import loaded as loaded_module

    out = {"python": platform.python_version()}
    # (safetensors files are parsed by wbfe itself, not that package)
    for package in ("wbfe", "torch", "numpy", "scipy"):
        version = getattr(loaded_module(package), "__version__", None)
        if not isinstance(version, str) and package == "torch":
            version = _torch_version_unimported()
        try:
            out[package] = version if isinstance(version, str) else metadata.version(package)
        except metadata.PackageNotFoundError:
            out[package] = "not installed"
    return out


def _torch_version_unimported() -> str | None:
    """torch's ``__version__`` with its build tag (``2.14.1+cu130``, which the metadata lacks), read from
    its ``version.py`` unimported: a score that never needed torch records what one that did records."""
    import re
    from importlib.util import find_spec

    try:
        spec = find_spec("torch")
        if spec is None or spec.origin is None:
            return None
        text = (Path(spec.origin).parent / "version.py").read_text(encoding="utf-8")
    except (ImportError, OSError, ValueError):
        return None
    found = re.search(r"^__version__\s*=\s*['\"]([^'\"]+)['\"]", text, flags=re.MULTILINE)
    return found.group(1) if found else None


@functools.lru_cache(maxsize=1)
def source_digest() -> str:
    """:func:`tree_digest` of the installed wbfe package, once a process (not in a score's provenance:
    reading the files would cost a small model's score a noticeable share)."""
    return tree_digest(Path(__file__).resolve().parent)


def tree_digest(root: Path) -> str:
    """SHA-256 (hex, first 16 digits) of every ``.py`` file under ``root``, with its relative path."""
    h = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        h.update(path.relative_to(root).as_posix().encode() + b"\0")
        h.update(path.read_bytes() + b"\0")
    return h.hexdigest()[:16]
