"""Local files and folders (the ``path`` location): a folder's weight files picked and opened with the reader
the format registry (:mod:`wbfe.sources.registry`) names."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Callable, Sequence

from wbfe._config import user_path
from wbfe.errors import CorruptCheckpointError, SourceNotFoundError, WbfeError
from wbfe.sources._base import TensorSource, missing, open_regular, unreadable
from wbfe.sources.registry import (checkpoint_suffixes, folder_kinds, format_of, other_formats, pick_files,
                                   register_location)

__all__ = ["open_path", "open_file", "pick_weight_files", "read_model_config", "model_config", "MODEL_CONFIGS",
           "MAX_CONFIG", "no_weight_files"]

MAX_CONFIG = 50_000_000
MODEL_CONFIGS = ("config.json", "quantize_config.json")
# Which of a folder's (or repo's) top-level files hold the weights, by the registered formats' ranks.
pick_weight_files = pick_files


def no_weight_files(folder: Path | str) -> SourceNotFoundError:
    """The error for a folder (local or in a store) that holds no file of any format wbfe reads."""
    listed = ", ".join(f"*{suffix}" for suffix in checkpoint_suffixes())
    return SourceNotFoundError.at(folder, f"no weight files ({listed}) in this folder")


def open_path(path: Path, *, ref: str | None = None, fmt: str | None = None) -> TensorSource:
    """Open a checkpoint file or folder (``SourceNotFoundError`` where it is missing or holds no weight files)."""
    ref = ref if ref is not None else str(path)
    try:
        if not path.exists():
            raise missing(path)
        if not path.is_dir():  # a file named alone is read alone
            return open_file(path, ref, fmt)
        for kind in folder_kinds():  # a folder that is a checkpoint of its own kind (a PEFT adapter)
            if kind.claims(path):
                return kind.open(path, ref)
        # a broken link stays listed: a weight file that cannot be read is said, not passed over for another
        listing = [p.name for p in path.iterdir() if p.is_file() or (p.is_symlink() and not p.exists())]
        chosen = pick_weight_files(listing, path)
        if not chosen:
            raise no_weight_files(path)
        others = other_formats(listing, chosen[0])
        if others and not (path / "config.json").is_file():  # several formats are several checkpoints
            shown = ", ".join([chosen[0], *others][:6]) + (", ..." if len(others) > 5 else "")
            raise CorruptCheckpointError.at(path, f"this folder holds checkpoints of more than one format ({shown}); "
                                            f"name the file to score, e.g. {path / chosen[0]}")
        path = path / chosen[0]
        source = open_file(path, ref, fmt)
        source.config = read_model_config(path.parent)
        return source
    except OSError as exc:  # e.g. a folder or file that cannot be read: never a traceback
        if isinstance(exc, WbfeError):
            raise
        raise unreadable(getattr(exc, "filename", None) or path, exc) from None


def read_model_config(folder: Path) -> dict[str, Any] | None:
    """The Hugging Face ``config.json`` in ``folder`` (a GPTQ ``quantize_config.json`` as its
    ``quantization_config``); None where there is none or it is not a JSON object."""

    def read(file_name: str) -> bytes:
        with open_regular(folder / file_name) as fh:  # a FIFO named config.json must not block
            return fh.read(MAX_CONFIG)

    return model_config(read)


def model_config(read: Callable[[str], bytes], names: Sequence[str] = MODEL_CONFIGS) -> dict[str, Any] | None:
    """The model configuration from the bytes ``read(name)`` gives of its files in ``names`` (local or remote)."""
    found: dict[str, Any] = {}
    for file_name in (name for name in MODEL_CONFIGS if name in names):
        try:  # deep nesting must not crash
            parsed = json.loads(read(file_name).decode("utf-8"))
        except (WbfeError, OSError, ValueError, RecursionError):  # UnicodeDecodeError, JSONDecodeError too
            continue
        if isinstance(parsed, dict):
            if file_name == "config.json":
                found = {**parsed, **found}
            else:
                found.setdefault("quantization_config", parsed)
    return found or None


def open_file(path: Path, ref: str, fmt: str | None = None) -> TensorSource:
    """Open one checkpoint file with the registered format that reads it (by its first bytes, then its
    suffix); ``fmt``: a provenance format label for readers that take one (``hf-hub``).

    Raises:
        SourceNotFoundError: no registered format reads such a file, or it cannot be read.
        CorruptCheckpointError: not a regular file (a FIFO, a device), or as the reader raises.
    """
    found = format_of(path)
    if found is None:
        expected = ", ".join(checkpoint_suffixes())
        raise SourceNotFoundError.at(path, f"not a checkpoint format wbfe reads (expected {expected})")
    open_regular(path).close()  # a FIFO or device named like a checkpoint is refused, never read
    return found.open(path, ref, fmt)


def _is_path(ref: Any) -> bool:
    # A dangling symlink too: open_path says what it is. os.path.expanduser leaves "~nouser/x" as it is
    # (Path.expanduser raises RuntimeError).
    return isinstance(ref, (str, Path)) and os.path.lexists(user_path(ref))


@register_location("path", order=30, claims=_is_path)
def open_local(ref: Any) -> TensorSource:
    return open_path(user_path(ref), ref=str(ref))
