"""Which weights a transformers model stores transposed, from its ``config.json`` alone (where the
model cannot be built): the ``Conv1D`` layers (``c_attn``, ``q_attn``, ``c_proj``, ``c_fc``) of the
model types built of it, checked against transformers' own build by tests/test_description_store.py."""

from __future__ import annotations

import re
from typing import Any, Optional

from wbfe.framework.description import IN_OUT

__all__ = ["CONV1D_MODEL_TYPES", "conv1d_family", "rule_layout"]

# model_type -> the transformers models built of Conv1D
CONV1D_MODEL_TYPES = frozenset({"gpt2", "openai-gpt", "imagegpt", "decision_transformer"})
_CONV1D_WEIGHT = re.compile(r"(?:^|\.)(?:c_attn|q_attn|c_proj|c_fc)\.weight$")


def conv1d_family(config: Any) -> Optional[str]:
    """The ``model_type`` of ``config`` when it is one of :data:`CONV1D_MODEL_TYPES`; else None."""
    model_type = config.get("model_type") if isinstance(config, dict) else None
    return model_type if isinstance(model_type, str) and model_type in CONV1D_MODEL_TYPES else None


def rule_layout(config: Any, name: str) -> Optional[str]:
    """``in_out`` for a Conv1D weight ``name`` of a model of ``config``'s type; None where the rule says nothing.

    Example:
        >>> rule_layout({"model_type": "gpt2"}, "transformer.h.0.mlp.c_fc.weight")
        'in_out'
        >>> rule_layout({"model_type": "gpt2"}, "lm_head.weight") is None
        True
    """
    return IN_OUT if conv1d_family(config) is not None and _CONV1D_WEIGHT.search(name) else None
