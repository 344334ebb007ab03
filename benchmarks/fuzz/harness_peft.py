"""Fuzz the PEFT adapter config: ``adapter_config.json`` beside a fixed LoRA ``adapter_model.safetensors``.

The folder is read as a source and scored as an adapter (ΔW = s·B·A per module): the config's
rank, α, patterns and flags decide the scaling, so a bad value must be refused, not computed with.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Optional

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
                for module in _MODULES:
                    scale = lora.scaling(module)
                    assert isinstance(scale, float) and math.isfinite(scale) and scale >= 0, (
                        f"{module}: scaling {scale!r} from a config that was accepted")
        with time_bound():
            result = wbfe.score(folder, metrics="bfe", device="cpu")
    except WbfeError as exc:
        refused(exc)
        return
    for skip in result.skipped:
        assert isinstance(skip.get("reason"), str) and skip["reason"].strip(), f"skip without a reason: {skip!r}"
    assert result.layers or result.skipped, "an adapter scored to nothing, with no reason"


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
