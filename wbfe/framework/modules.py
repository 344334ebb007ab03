"""An in-memory ``nn.Module`` described by itself (see :func:`wbfe.framework.describe_module`)."""

from __future__ import annotations

import sys
from typing import Any, Optional

from wbfe.framework.parameters import shared_parameters, transposed_weights
from wbfe.framework.description import FrameworkDescription

__all__ = ["describe_module"]


def describe_module(module: Any) -> Optional[FrameworkDescription]:
    """The description an ``nn.Module`` gives of itself; None for anything else."""
    torch = sys.modules.get("torch")
    if torch is None or not isinstance(module, torch.nn.Module):
        return None
    transformers = sys.modules.get("transformers")
    if transformers is not None and isinstance(module, transformers.PreTrainedModel):
        from wbfe.framework.transformers_model import describe_built

        return describe_built(module)
    order, tied = shared_parameters(module)
    layouts = transposed_weights(module)
    head_module = None
    for method in ("get_output_embeddings", "get_classifier"):
        if callable(getattr(module, method, None)):
            try:
                head_module = getattr(module, method)()
            except (NotImplementedError, AttributeError, TypeError):
                head_module = None
            if head_module is not None:
                break
    head = next((f"{name}.weight" if name else "weight" for name, sub in module.named_modules()
                 if head_module is not None and sub is head_module and getattr(sub, "weight", None) is not None),
                None)
    from wbfe.framework.head_facts import head_facts

    return FrameworkDescription("torch", type(module).__name__, tuple(order), head, tied, layouts,
                                None if head else "the module names no output embeddings or classifier",
                                facts={"family": type(module).__name__,
                                       # timm models keep the rate they apply before the classifier in drop_rate
                                       **head_facts(module, head, drop_rate=_rate(getattr(module, "drop_rate", None)))})


def _rate(value: Any) -> Optional[float]:
    """A dropout rate attribute as a float; None when it is not a number."""
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None
