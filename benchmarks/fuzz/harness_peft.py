"""Fuzz the PEFT adapter config: ``adapter_config.json`` beside a fixed LoRA ``adapter_model.safetensors``.

The folder is read as a source and scored as an adapter (ΔW = s·B·A per module): the config's
rank, α, patterns and flags decide the scaling, so a bad value must be refused, not computed with.

Independent check: where the reader accepts a config, :mod:`json`'s parse of the same bytes, with
PEFT's own pattern lookup (``peft.utils.other.get_pattern_key``, as ``LoraModel`` resolves a
module's r and α) and ``LoraLayer``'s scale (α/r, α/√r with rsLoRA), gives each module's scaling;
the flags and ``modules_to_save`` are the parse's. A config :mod:`json` refuses that the reader
accepted is a finding.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Optional

from benchmarks.fuzz.common import refused, check_source, fresh_folder, put, time_bound
from wbfe.errors import WbfeError

NAME = "peft"

# Tokens for libFuzzer's -dict: the config's keys and the values that change its meaning.
DICTIONARY = ('"peft_type"', '"LORA"', '"r"', '"lora_alpha"', '"rank_pattern"', '"alpha_pattern"', '"use_rslora"',
              '"use_dora"', '"fan_in_fan_out"', '"modules_to_save"', '"base_model_name_or_path"', "null", "true",
              "false", "[]", "{}", "0", "-1", "0.5", "1e309", "NaN", '"(a|a)*"', '"q_proj"', "[1]")
_FOLDER: Optional[Path] = None
_MODULES = ("model.layers.0.self_attn.q_proj", "model.layers.0.self_attn.v_proj")


def _folder() -> Path:
    global _FOLDER
    if _FOLDER is None:
        import torch
        from safetensors.torch import save

        g = torch.Generator().manual_seed(9)
        tensors = {}
        for module in _MODULES:
            tensors[f"base_model.model.{module}.lora_A.weight"] = torch.randn(4, 16, generator=g)
            tensors[f"base_model.model.{module}.lora_B.weight"] = torch.randn(16, 4, generator=g)
        _FOLDER = fresh_folder("adapter")
        put("adapter_model.safetensors", save(tensors), _FOLDER)
    return _FOLDER


def fuzz_one(data: bytes) -> None:
    """Read and score the adapter folder with ``data`` as its config; raise on a finding."""
    import wbfe
    from wbfe.sources import open_source

    folder = _folder()
    put("adapter_config.json", data, folder)
    check_source(folder, engine=False)
    try:
        with time_bound(), open_source(folder) as source:
            lora = getattr(source, "lora", None)
            if lora is not None:
                want = _peft_parse(data)
                for module in _MODULES:
                    scale = lora.scaling(module)
                    assert isinstance(scale, float) and math.isfinite(scale) and scale >= 0, (
                        f"{module}: scaling {scale!r} from a config that was accepted")
                    # (a relative 1e-12: an integer α over 2**53 divides exactly in PEFT, as a float here)
                    assert math.isclose(scale, want[module], rel_tol=1e-12), (
                        f"{module}: scaling {scale!r}, PEFT's rules on the JSON give {want[module]!r}")
                assert (lora.use_dora, lora.fan_in_fan_out, list(lora.modules_to_save)) == (
                    want["use_dora"], want["fan_in_fan_out"], want["modules_to_save"]), "flags not the JSON's"
        with time_bound():
            result = wbfe.score(folder, metrics="bfe", device="cpu")
    except WbfeError as exc:
        refused(exc)
        return
    for skip in result.skipped:
        assert isinstance(skip.get("reason"), str) and skip["reason"].strip(), f"skip without a reason: {skip!r}"
    assert result.layers or result.skipped, "an adapter scored to nothing, with no reason"


def _peft_parse(data: bytes) -> dict[str, Any]:
    from peft.utils.other import get_pattern_key

    try:
        raw: Any = json.loads(data)
        out: dict[str, Any] = {}
        ranks: Any = raw.get("rank_pattern") or {}
        alphas: Any = raw.get("alpha_pattern") or {}
        for module in _MODULES:  # peft.tuners.lora.model.LoraModel._create_and_replace, LoraLayer.update_layer
            r: Any = ranks.get(get_pattern_key(list(ranks), module), raw["r"])
            alpha: Any = alphas.get(get_pattern_key(list(alphas), module), raw["lora_alpha"])
            out[module] = alpha / math.sqrt(r) if raw.get("use_rslora") else alpha / r
        out.update(use_dora=bool(raw.get("use_dora")), fan_in_fan_out=bool(raw.get("fan_in_fan_out")),
                   modules_to_save=list(raw.get("modules_to_save") or []))
    except Exception as exc:  # noqa: BLE001 - json (or PEFT's rules) refuses a config the reader accepted
        raise AssertionError(f"PEFT's rules refuse a config the reader accepted: {type(exc).__name__}: {exc}") from None
    return out


def seeds() -> dict[str, bytes]:
    """Configs as ``peft.LoraConfig.save_pretrained`` writes them (plain, rsLoRA with patterns, DoRA)."""
    base = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": 4, "lora_alpha": 8, "lora_dropout": 0.05,
            "target_modules": ["q_proj", "v_proj"], "bias": "none", "fan_in_fan_out": False,
            "base_model_name_or_path": "org/base", "modules_to_save": None, "rank_pattern": {}, "alpha_pattern": {},
            "use_rslora": False, "use_dora": False, "inference_mode": True}
    patterned = {**base, "use_rslora": True, "rank_pattern": {"q_proj": 4},
                 "alpha_pattern": {r"layers\.0\.self_attn\.v_proj": 16}}
    dora = {**base, "use_dora": True, "lora_alpha": 4.5, "modules_to_save": ["lm_head"]}
    return {name: json.dumps(config, indent=2).encode()
            for name, config in (("plain.json", base), ("patterns.json", patterned), ("dora.json", dora))}
