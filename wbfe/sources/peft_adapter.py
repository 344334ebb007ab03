"""PEFT LoRA adapter folders (``adapter_config.json`` beside ``adapter_model.safetensors`` or ``.bin``): the
tensors stream through the ordinary readers; the configuration is parsed and checked here (docs/adapters.md)."""

from __future__ import annotations

import dataclasses
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Mapping, Optional

from wbfe.errors import CorruptCheckpointError, SourceNotFoundError
from wbfe.sources._base import TensorEntry, TensorSource
from wbfe.sources.local import open_file
from wbfe.sources.registry import register_folder

__all__ = ["LoraConfig", "AdapterSource", "open_adapter", "read_lora_config", "ADAPTER_CONFIG", "PREFIX"]

ADAPTER_CONFIG = "adapter_config.json"
# PEFT saves every key under the wrapper's prefix: base_model.model.<module name in the base model>.
PREFIX = "base_model.model."
_WEIGHT_FILES = ("adapter_model.safetensors", "adapter_model.bin")
# A LoRA factor: lora_A / lora_B of a linear or convolution ([r, in, k…] / [out, r, 1…]), or of an embedding.
_FACTOR_NAME = re.compile(r"\.(lora_A|lora_B)\.weight$|\.lora_embedding_[AB]$")


@dataclass(frozen=True)
class LoraConfig:
    """The parts of a PEFT ``LoraConfig`` that fix what each adapted matrix is.

    Attributes:
        r, lora_alpha: the default rank and α (s = α/r, or α/√r with ``use_rslora``).
        rank_pattern, alpha_pattern: per-module overrides (regular expressions matched as PEFT does).
        use_dora: a magnitude vector per adapted module rescales the merged weight's rows.
        fan_in_fan_out: the base layer stores its weight as in × out (GPT-2's Conv1D).
        base_model: ``base_model_name_or_path`` as recorded (informative only).
    """

    r: int
    lora_alpha: float
    use_rslora: bool = False
    rank_pattern: Mapping[str, int] = field(default_factory=dict)
    alpha_pattern: Mapping[str, float] = field(default_factory=dict)
    use_dora: bool = False
    fan_in_fan_out: bool = False
    modules_to_save: tuple[str, ...] = ()
    base_model: Optional[str] = None

    def rank_and_alpha(self, module: str) -> tuple[int, float]:
        """``(r, α)`` of one module (its name in the base model), as PEFT resolves them: the first
        pattern key k for which ``(.*\\.)?(k)$`` matches the name (peft.utils.other.get_pattern_key)."""
        return (int(_pattern_value(self.rank_pattern, module, self.r)),
                float(_pattern_value(self.alpha_pattern, module, self.lora_alpha)))

    def scaling(self, module: str) -> float:
        """s = α/r, or α/√r with rsLoRA."""
        r, alpha = self.rank_and_alpha(module)
        return alpha / math.sqrt(r) if self.use_rslora else alpha / r

    def to_dict(self) -> dict[str, Any]:
        out = {**dataclasses.asdict(self), "modules_to_save": list(self.modules_to_save)}
        out["base_model_name_or_path"] = out.pop("base_model")  # the last field: the order is kept
        return out


def _pattern_value(patterns: Mapping[str, Any], module: str, default: Any) -> Any:
    return next((value for key, value in patterns.items() if re.match(rf"(.*\.)?({key})$", module)), default)


def read_lora_config(path: Path) -> LoraConfig:
    """Parse and check ``adapter_config.json`` (``CorruptCheckpointError``: not JSON, not LoRA, a bad rank or α)."""
    try:
        raw = json.loads(path.read_text())
    except (OSError, ValueError, RecursionError) as exc:
        reason = "nested too deeply" if isinstance(exc, RecursionError) else exc
        raise CorruptCheckpointError.at(path, f"not a readable JSON adapter config ({reason})") from None
    if not isinstance(raw, dict):
        raise CorruptCheckpointError.at(path, "the adapter config is not a JSON object")
    kind = raw.get("peft_type")
    if kind != "LORA":
        raise CorruptCheckpointError.at(path, f"peft_type {kind!r} is not supported (LoRA adapters only)")

    def positive(value: Any, what: str) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
            raise CorruptCheckpointError.at(path, f"{what} must be a positive number, not {value!r}")
        return float(value)

    def rank(value: Any, what: str) -> int:  # PEFT's ranks are integers: r = 0.5 would scale by α/0
        if positive(value, what) != int(value):
            raise CorruptCheckpointError.at(path, f"{what} must be a positive integer, not {value!r}")
        return int(value)

    def mapping(key: str) -> dict[Any, Any]:
        value = raw.get(key) or {}
        if not isinstance(value, dict):
            raise CorruptCheckpointError.at(path, f"{key} must map module patterns to values, not a "
                                            f"{type(value).__name__}")
        return value

    def flag(key: str) -> bool:
        value = raw.get(key, False)
        if value is not None and not isinstance(value, bool):
            raise CorruptCheckpointError.at(path, f"{key} must be true or false, not {value!r}")
        return bool(value)

    r = rank(raw.get("r"), "r")
    alpha = positive(raw.get("lora_alpha"), "lora_alpha")
    ranks = {str(k): rank(v, f"rank_pattern[{k!r}]") for k, v in mapping("rank_pattern").items()}
    alphas = {str(k): positive(v, f"alpha_pattern[{k!r}]") for k, v in mapping("alpha_pattern").items()}
    for key in (*ranks, *alphas):
        try:
            re.compile(key)
        except re.error as exc:
            raise CorruptCheckpointError.at(path, f"pattern {key!r} is not a regular expression ({exc})") from None
    saved = raw.get("modules_to_save") or []
    if not isinstance(saved, list) or not all(isinstance(m, str) for m in saved):
        raise CorruptCheckpointError.at(path, "modules_to_save must be a list of module names")
    base = raw.get("base_model_name_or_path")
    return LoraConfig(r=r, lora_alpha=alpha, use_rslora=flag("use_rslora"), rank_pattern=ranks, alpha_pattern=alphas,
                      use_dora=flag("use_dora"), fan_in_fan_out=flag("fan_in_fan_out"), modules_to_save=tuple(saved),
                      base_model=base if isinstance(base, str) else None)


class AdapterSource(TensorSource):
    """An adapter folder: its stored tensors (names as saved), with the parsed ``lora`` config."""

    def __init__(self, inner: TensorSource, lora: LoraConfig, folder: Path):
        self._inner = inner
        self._folder = folder
        self.lora = lora
        self.provenance = inner.provenance
        self.provenance.format = "peft-lora"
        self.provenance.files = [str(folder / ADAPTER_CONFIG), *self.provenance.files]
        self.provenance.extra["adapter"] = lora.to_dict()

    def __len__(self) -> int:
        return len(self._inner)

    def entries(self) -> Iterator[TensorEntry]:
        """The stored tensors; ``CorruptCheckpointError`` for a LoRA factor that is not a matrix (0-D, 1-D) or
        has no entries, whose ΔW = B·A has no meaning (a 1-D one was read as a column)."""
        for entry in self._inner.entries():
            if _FACTOR_NAME.search(entry.name) and (len(entry.shape) < 2 or 0 in entry.shape):
                raise CorruptCheckpointError.at(self._folder, f"LoRA factor {entry.name[:200]!r} of shape "
                                                f"{list(entry.shape)}: a factor is a matrix with at least one entry")
            yield entry

    def close(self) -> None:
        self._inner.close()


@register_folder("peft-lora", claims=lambda folder: (folder / ADAPTER_CONFIG).is_file())
def open_adapter(folder: Path, ref: Optional[str] = None) -> AdapterSource:
    """Open a PEFT LoRA adapter folder (``SourceNotFoundError`` where no weight file is beside the config)."""
    lora = read_lora_config(folder / ADAPTER_CONFIG)
    for name in _WEIGHT_FILES:
        if (folder / name).is_file():
            return AdapterSource(open_file(folder / name, ref if ref is not None else str(folder), None), lora, folder)
    raise SourceNotFoundError.at(folder, f"adapter_config.json but no {' or '.join(_WEIGHT_FILES)} beside it")
