"""An in-memory ``nn.Module`` described by itself. One that names no head (``get_output_embeddings()``,
``get_classifier()``) has its last registered ``nn.Linear`` taken, where it matches ``num_classes``; the dropout into
it, inside an ``nn.Sequential``, is read between it and the layer before it (docs/metrics.md, "Where BFE-W applies")."""

from __future__ import annotations

import contextlib
from typing import Any, Optional

from wbfe._deps import loaded
from wbfe.framework.description import FrameworkDescription
from wbfe.framework.head_facts import dropout_rate, head_facts
from wbfe.framework.parameters import module_roles, shared_parameters, transposed_weights, weight_name
from wbfe.framework.transformers_model import describe_built

__all__ = ["describe_module"]


def describe_module(module: Any) -> Optional[FrameworkDescription]:
    """The description an ``nn.Module`` gives of itself (see :func:`wbfe.framework.describe_module`)."""
    torch = loaded("torch")
    if torch is None or not isinstance(module, torch.nn.Module):
        return None
    transformers = loaded("transformers")
    if transformers is not None and isinstance(module, transformers.PreTrainedModel):
        return describe_built(module)
    order, tied = shared_parameters(module)
    layouts = transposed_weights(module)
    head_module = None
    for method in ("get_output_embeddings", "get_classifier"):
        if head_module is None and callable(getattr(module, method, None)):
            with contextlib.suppress(NotImplementedError, AttributeError, TypeError):
                head_module = getattr(module, method)()
    rule = None
    if head_module is None:
        head_module, rule = _last_linear(module, torch.nn.Linear)
    head = weight_name(module, head_module)
    # timm models keep the rate they apply before the classifier in drop_rate
    facts = {"family": type(module).__name__, **head_facts(module, head, drop_rate=getattr(module, "drop_rate", None))}
    if head is not None and rule is not None:
        facts["head_rule"] = rule
        if (in_sequence := _dropout_in_sequence(module, head, torch.nn.Sequential)) is not None:
            facts["dropout"] = in_sequence
    note = None if head else (rule or "the module names no output embeddings or classifier")
    return FrameworkDescription("torch", type(module).__name__, tuple(order), head, tied, layouts, note, facts=facts,
                                roles=module_roles(module))


def _last_linear(module: Any, linear: Any) -> tuple[Any, str]:
    """``(head, rule)``: the last registered ``nn.Linear`` and the rule that found it; ``(None, why not)``."""
    found: list[tuple[str, Any]] = [(name, sub) for name, sub in module.named_modules() if isinstance(sub, linear)]
    if not found:
        return None, "the module names no output embeddings or classifier and has no nn.Linear layer"
    name, last = found[-1]
    classes = getattr(module, "num_classes", None)
    if isinstance(classes, int) and not isinstance(classes, bool) and last.out_features != classes:
        return None, (f"the module names no output embeddings or classifier, and its last nn.Linear ({name}, "
                      f"{last.out_features} outputs) does not map to its num_classes ({classes})")
    return last, (f"the last nn.Linear registered in the module tree ({last.out_features} outputs): the module "
                  "names no classifier (no get_classifier() or get_output_embeddings())")


def _dropout_in_sequence(module: Any, head: str, sequential: Any) -> Any:
    """``[[layer, rate], ...]`` between ``head`` and the module with weights before it in its
    ``nn.Sequential``; None for another parent (whose order says nothing about the forward pass)."""
    path = head.rsplit(".", 1)[0]
    parent_name, child = path.rsplit(".", 1) if "." in path else ("", path)
    parent: Any = dict(module.named_modules()).get(parent_name)
    if not isinstance(parent, sequential):
        return None
    children = list(parent.named_children())
    position = next(k for k, (name, _) in enumerate(children) if name == child)
    found: list[list[Any]] = []
    for name, sub in reversed(children[:position]):
        if next(sub.parameters(), None) is not None:
            break  # the layer that computes the head's input: dropout before it is not on the head's input
        if dropout_rate(sub) > 0:
            found.append([f"{parent_name}.{name}" if parent_name else name, dropout_rate(sub)])
    return found[::-1]
