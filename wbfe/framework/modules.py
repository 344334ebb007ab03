"""An in-memory ``nn.Module`` described by itself (see :func:`wbfe.framework.describe_module`).

A module names its head through ``get_output_embeddings()`` (transformers) or ``get_classifier()``
(timm). A plain ``nn.Module`` (torchvision's VGG and ResNet, a user's own network) names none; its
head is then read from the module tree: the last ``nn.Linear`` registered, which is the classifier of
every feed-forward network that builds its layers in the order it runs them (torchvision's
classifiers, ``nn.Sequential`` stacks), and only when its outputs match the module's ``num_classes``
where it has one. Which dropout reaches that head: inside an ``nn.Sequential``, the ``Dropout``
modules between the head and the layer with weights before it (VGG's ``classifier.5``, not its
``classifier.2``, which feeds another hidden layer); elsewhere the ``Dropout`` modules beside it.
"""

from __future__ import annotations

from typing import Any, Optional

from wbfe._deps import loaded
from wbfe.framework.parameters import module_roles, shared_parameters, transposed_weights
from wbfe.framework.description import FrameworkDescription
from wbfe.framework.head_facts import dropout_rate, head_facts

__all__ = ["describe_module"]


def describe_module(module: Any) -> Optional[FrameworkDescription]:
    """The description an ``nn.Module`` gives of itself; None for anything else."""
    torch = loaded("torch")
    if torch is None or not isinstance(module, torch.nn.Module):
        return None
    transformers = loaded("transformers")
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
    rule = None
    if head_module is None:
        head_module, rule = _last_linear(module, torch.nn.Linear)
    head = next((f"{name}.weight" if name else "weight" for name, sub in module.named_modules()
                 if head_module is not None and sub is head_module and getattr(sub, "weight", None) is not None),
                None)
    # timm models keep the rate they apply before the classifier in drop_rate
    facts = {"family": type(module).__name__,
             **head_facts(module, head, drop_rate=_rate(getattr(module, "drop_rate", None)))}
    if head is not None and rule is not None:
        facts["head_rule"] = rule
        in_sequence = _dropout_in_sequence(module, head, torch.nn.Sequential)
        if in_sequence is not None:
            facts["dropout"] = in_sequence
    note = None if head else (rule or "the module names no output embeddings or classifier")
    return FrameworkDescription("torch", type(module).__name__, tuple(order), head, tied, layouts, note, facts=facts,
                                roles=module_roles(module))


def _last_linear(module: Any, linear: Any) -> tuple[Any, str]:
    """The head of a module that names none: its last registered ``nn.Linear``, and the rule that found it.

    Returns:
        ``(head_module, rule)``; ``head_module`` is None (and ``rule`` says why) when the module has no
        ``nn.Linear`` or the last one's outputs differ from the module's ``num_classes``.
    """
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
    """The dropout on the path into ``head`` where the head sits in an ``nn.Sequential``.

    Returns:
        ``[[layer, rate], ...]``: the ``Dropout`` modules with rate > 0 between the head and the
        nearest module before it that holds weights (or the start of the sequence); None when the
        head's parent is not an ``nn.Sequential`` (its order says nothing about the forward pass then).
    """
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


def _rate(value: Any) -> Optional[float]:
    """A dropout rate attribute as a float; None when it is not a number."""
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None
