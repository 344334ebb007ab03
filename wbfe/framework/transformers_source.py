"""Whether a transformers model stores any weight transposed, read from transformers' modeling files
as text (no import of transformers or torch, seconds saved): only ``Conv1D`` and ``ConvTranspose*``
do. The files it imports from and its sub-configs' are read too; anything not found is "cannot tell"."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from typing import Any, Optional

__all__ = ["plain_layouts"]

# What builds a weight stored [in, out, k...]; a mention in a comment only makes the answer "cannot tell".
_TRANSPOSED = re.compile(r"\bConv1D\b|ConvTranspose")
_IMPORTED = re.compile(r"^from \.\.(?!auto\.)(\w+)\.modeling_\w+ import", re.MULTILINE)


def plain_layouts(config: Any) -> Optional[str]:
    """Why every weight of the transformers model ``config`` names is stored ``out_in``; None where
    transformers' files do not say so (a transposed layer, a file not found, no transformers).

    Example:
        >>> plain_layouts({"architectures": ["NoSuchModel"], "model_type": "no_such_type"}) is None
        True
    """
    if not isinstance(config, dict):
        return None
    architectures = config.get("architectures")
    arch = architectures[0] if isinstance(architectures, list) and architectures else None
    try:
        spec = importlib.util.find_spec("transformers")  # locates the package without running it
    except (ImportError, ValueError):
        return None
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    models = Path(locations[0]) / "models" if locations else None
    files = _model_files(models, config, arch) if isinstance(arch, str) and models and models.is_dir() else None
    if files is None or any(_TRANSPOSED.search(p.read_text(encoding="utf-8", errors="replace")) for p in files):
        return None
    names = ", ".join(sorted(p.name for p in files))
    return f"no layer stored transposed (Conv1D, ConvTranspose) in transformers' {names}"


def _model_files(models: Path, config: dict[str, Any], arch: Optional[str]) -> Optional[list[Path]]:
    """The modeling files that build the model of ``config`` (class ``arch``); None where one is not found."""
    model_type = config.get("model_type")
    if not isinstance(model_type, str) or not model_type.replace("-", "_").isidentifier():
        return None
    if (own := _modeling_file(models, model_type.replace("-", "_"))) is None:
        return None
    text = own.read_text(encoding="utf-8", errors="replace")
    if arch is not None and not re.search(rf"^class {re.escape(arch)}\(", text, re.MULTILINE):
        return None  # the class is not where the model type says: cannot tell
    files, pending = [own], _IMPORTED.findall(text)
    sub_configs = [v for v in config.values() if isinstance(v, dict) and "model_type" in v]
    if "from ..auto" in text and not sub_configs:
        return None  # built through the auto classes from a sub-config the file does not show
    for sub in sub_configs:
        if (found := _model_files(models, sub, None)) is None:
            return None
        files += found
    while pending:
        folder = pending.pop()
        if (path := _modeling_file(models, folder)) is None:
            return None
        if path not in files:
            files.append(path)
            pending += _IMPORTED.findall(path.read_text(encoding="utf-8", errors="replace"))
    return files


def _modeling_file(models: Path, folder: str) -> Optional[Path]:
    path = models / folder / f"modeling_{folder}.py"
    return path if path.is_file() else None
