"""Local files and folders: pick the weight files a folder holds and open them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Sequence

from wbfe.errors import CorruptCheckpointError, SourceNotFoundError, WbfeError
from wbfe.sources._base import TORCH_SUFFIXES, TensorSource, open_regular, unreadable
from wbfe.sources.formats import open_other_format, pick_other_format, sniff_format
from wbfe.sources.safetensors_files import SafetensorsSource
from wbfe.sources.torch_pickle import TorchPickleSource

__all__ = ["open_path", "pick_weight_files", "read_model_config"]


def pick_weight_files(names: Sequence[str]) -> list[str]:
    """Choose which of a folder's (or repo's) top-level files hold the weights.

    Preference: a safetensors index, ``model.safetensors``, a single ``*.safetensors``, a bin index,
    ``pytorch_model.bin``, a single PyTorch file, a single GGUF (split set), Keras or ONNX file.
    Returns ``[index]`` for sharded checkpoints and ``[file]`` otherwise; an empty list when nothing fits.

    Raises:
        CorruptCheckpointError: several candidate files and no index to say how they go together.
    """
    top = sorted(n for n in names if "/" not in n)
    for kind, single, suffixes in (
        ("safetensors", "model.safetensors", (".safetensors",)),
        ("torch", "pytorch_model.bin", TORCH_SUFFIXES),
    ):
        indexes = [n for n in top if any(n.endswith(s + ".index.json") for s in suffixes)]
        if len(indexes) == 1:
            return indexes
        if single in top:
            return [single]
        files = [n for n in top if n.endswith(suffixes)]
        if len(files) == 1:
            return files
        if len(files) > 1 or len(indexes) > 1:
            raise CorruptCheckpointError(
                f"several {kind} weight files and no single index ({', '.join((indexes or files)[:4])}, ...); "
                "pass one file explicitly"
            )
    return pick_other_format(top)


def open_path(path: Path, *, ref: str | None = None, fmt: str | None = None) -> TensorSource:
    """Open a checkpoint file or folder.

    Raises:
        SourceNotFoundError: the path does not exist or cannot be read, or a folder holds no weight files.
        CorruptCheckpointError / TruncatedCheckpointError / UnsafePickleError: as the readers raise.
    """
    try:
        return _open_path(path, ref if ref is not None else str(path), fmt)
    except OSError as exc:  # e.g. a folder or file that cannot be read: never a traceback
        if isinstance(exc, WbfeError):
            raise
        raise unreadable(getattr(exc, "filename", None) or path, exc) from None


def _open_path(path: Path, ref: str, fmt: str | None) -> TensorSource:
    if not path.exists():
        raise SourceNotFoundError(f"no such file or folder: {path}", path=str(path))
    folder = path if path.is_dir() else None
    if folder is not None and (folder / "adapter_config.json").is_file():  # a PEFT LoRA adapter
        from wbfe.sources.peft_adapter import open_adapter

        return open_adapter(folder, ref)
    if folder is not None:
        try:
            chosen = pick_weight_files([p.name for p in path.iterdir() if p.is_file()])
        except CorruptCheckpointError as exc:
            raise CorruptCheckpointError(f"{path}: {exc}", path=str(path)) from None
        if not chosen:
            raise SourceNotFoundError(
                f"{path}: no weight files (*.safetensors, *.bin, *.pt, *.pth, *.th, *.gguf, *.h5, *.keras, *.onnx) "
                "in this folder",
                path=str(path),
            )
        path = path / chosen[0]
    source = _open_file(path, ref, fmt)
    if folder is not None:  # a file named alone is read alone
        source.config = read_model_config(folder)
    return source


_MAX_CONFIG = 50_000_000


def read_model_config(folder: Path) -> dict[str, Any] | None:
    """The Hugging Face ``config.json`` in ``folder`` (with ``quantize_config.json``, which GPTQ
    writers put beside it, as its ``quantization_config``); None where there is none or it is not
    a JSON object (the weights are still scored, with the rules that need no config)."""
    found: dict[str, Any] = {}
    for file_name in ("config.json", "quantize_config.json"):
        try:  # a FIFO named config.json must not block, nor deep nesting crash
            with open_regular(folder / file_name) as fh:
                parsed = json.loads(fh.read(_MAX_CONFIG).decode("utf-8"))
        except (WbfeError, OSError, ValueError, RecursionError):  # UnicodeDecodeError, JSONDecodeError too
            continue
        if isinstance(parsed, dict):
            if file_name == "config.json":
                found = {**parsed, **found}
            else:
                found.setdefault("quantization_config", parsed)
    return found or None


def _open_file(path: Path, ref: str, fmt: str | None) -> TensorSource:
    kind = sniff_format(path)  # GGUF, Keras, ONNX: by magic bytes first, then suffix
    if kind is not None:
        return open_other_format(path, kind, ref)
    name = path.name
    if name.endswith(".safetensors.index.json"):
        return SafetensorsSource(ref, [], index=path, fmt=fmt)
    if name.endswith(".safetensors"):
        return SafetensorsSource(ref, [path], fmt=fmt)
    if name.endswith(".index.json"):
        return TorchPickleSource(ref, [], index=path)
    if name.endswith(TORCH_SUFFIXES):
        return TorchPickleSource(ref, [path])
    raise SourceNotFoundError(
        f"{path}: not a checkpoint format wbfe reads (expected .safetensors, .bin, .pt, .pth, .th, .ckpt, "
        ".gguf, .h5, .keras, .onnx)",
        path=str(path),
    )
