"""What a built ``nn.Module`` says about the path into its head: the dropout layers beside the
head (the classifier's own module, where frameworks put the dropout they apply to the features the
head reads) and the other heads beside it that produce the same outputs (DeiT's distillation head,
averaged with the classifier: no single head).

Read from the module tree, so the rates are the ones the framework itself took from the config
(BERT's ``classifier_dropout`` else ``hidden_dropout_prob``, DistilBERT's ``seq_classif_dropout``,
timm's ``drop_rate``...).

A head may read a summary or pooler stage beside it instead of the backbone's output directly
(transformers' SequenceSummary in XLNet, GPT-2 double heads: first_dropout → summary linear →
activation → last_dropout). Such a stage is a sibling made only of leaf layers with a Linear among
them (the backbone beside the head is a tree of blocks, never only leaves). Its dropouts after its
linear layer are on the head's input and are reported under the stage's name
(``sequence_summary.last_dropout``); one before the linear layer feeds a hidden layer, which is not
the head's input, as everywhere else (``nn.Sequential``, a Keras graph), and is listed apart
(``hidden_dropout``).
"""

from __future__ import annotations

from typing import Any, Optional

__all__ = ["DROPOUT_CLASSES", "dropout_rate", "head_facts"]

# torch's dropout modules, by class name (a module tree on the meta device is read without torch's types)
DROPOUT_CLASSES = ("Dropout", "Dropout1d", "Dropout2d", "Dropout3d", "AlphaDropout", "FeatureAlphaDropout")


def dropout_rate(module: Any) -> float:
    """The rate of a torch dropout module; 0 for any other module."""
    if type(module).__name__ not in DROPOUT_CLASSES:
        return 0.0
    return float(getattr(module, "p", 0.0) or 0.0)


def head_facts(model: Any, head: Optional[str], *, drop_rate: Optional[float] = None) -> dict[str, Any]:
    """The facts about the path into ``model``'s head weight ``head`` (a ``named_parameters`` name).

    Args:
        model: a built ``torch.nn.Module`` (on the meta device is fine: no weight is read).
        head: the head weight's name, e.g. ``classifier.weight``; None gives no facts.
        drop_rate: a dropout rate the model applies functionally before its head (timm's
            ``drop_rate`` attribute), reported as the layer ``drop_rate`` where no Dropout module
            beside the head holds it.

    Returns:
        ``{"dropout": [[layer, rate], ...], "heads": [layer, ...]}``: the dropout modules with rate > 0
        in the head's own module (siblings of the head), and the other linear layers beside the head
        with as many outputs as it (a second head whose output is combined with it); either may be empty.
    """
    facts: dict[str, Any] = {"dropout": [], "heads": []}
    if head is None:
        return facts
    module_name = head.rsplit(".", 1)[0] if "." in head else ""
    parent_name = module_name.rsplit(".", 1)[0] if "." in module_name else ""
    modules = dict(model.named_modules())
    parent = modules.get(parent_name)
    if parent is None or module_name not in modules:
        return facts
    outputs = _outputs(modules[module_name])
    for child_name, child in parent.named_children():
        full = f"{parent_name}.{child_name}" if parent_name else child_name
        if dropout_rate(child) > 0:
            facts["dropout"].append([full, dropout_rate(child)])
        elif full != module_name and _is_summary_stage(child):
            facts.setdefault("summary_stage", full)
            on_input, hidden = _stage_dropouts(child)
            facts["dropout"] += [[f"{full}.{name}", rate] for name, rate in on_input]
            if hidden:
                facts["hidden_dropout"] = [[f"{full}.{name}", rate] for name, rate in hidden]
        elif full != module_name and outputs is not None and _outputs(child) == outputs:
            facts["heads"].append(full)
    if drop_rate and not facts["dropout"]:  # a Dropout module already holds the rate where there is one
        facts["dropout"].append(["drop_rate", float(drop_rate)])
    return facts


def _is_summary_stage(module: Any) -> bool:
    """A pooler / sequence-summary stage: only leaf layers, a Linear among them."""
    children = list(module.children())
    return (any(type(c).__name__ == "Linear" for c in children)
            and all(next(iter(c.children()), None) is None for c in children))


def _stage_dropouts(stage: Any) -> tuple[list[tuple[str, float]], list[tuple[str, float]]]:
    """A summary stage's dropouts with rate > 0: those after its last weighted layer (on the features
    the head reads) and those before it (on a hidden layer's input, which the rule for a dropout behind
    another layer does not count, as in an ``nn.Sequential`` or a Keras graph).

    The order is the forward pass's, seen by calling the stage once on one tiny batch (a meta tensor for a
    skeleton) with a hook on each child: registration order is not call order (SequenceSummary registers its linear layer
    before first_dropout, which runs first). Where the stage cannot be called so, every dropout in it
    counts, as the cautious reading."""
    rated = {name: dropout_rate(layer) for name, layer in stage.named_children() if dropout_rate(layer) > 0}
    if not rated:
        return [], []
    order = _call_order(stage)
    if order is None:
        return list(rated.items()), []
    weighted = [k for k, name in enumerate(order) if next(getattr(stage, name).parameters(), None) is not None]
    last = weighted[-1] if weighted else -1
    return ([(name, rated[name]) for name in order[last + 1:] if name in rated],
            [(name, rated[name]) for name in order[:last + 1] if name in rated])


def _call_order(stage: Any) -> Optional[list[str]]:
    """The names of ``stage``'s children in the order its forward pass calls them; None when the
    stage cannot be called with one batch of features (it needs other inputs), or skips a child."""
    import torch

    linear = next((c for c in stage.children() if type(c).__name__ == "Linear"), None)
    if linear is None:
        return None
    order: list[str] = []
    hooks = [child.register_forward_hook(lambda *_, name=name: order.append(name))
             for name, child in stage.named_children()]
    try:
        with torch.no_grad():
            # on the weights' own device and dtype (meta for a skeleton): one tiny batch, nothing kept
            stage(torch.zeros(1, 2, linear.in_features, device=linear.weight.device, dtype=linear.weight.dtype))
    except Exception:  # noqa: BLE001 - a stage with another signature: its order stays unread
        return None
    finally:
        for hook in hooks:
            hook.remove()
    called = set(order)
    return order if len(called) == len(order) and called == {n for n, _ in stage.named_children()} else None


def _outputs(module: Any) -> Optional[int]:
    """A linear layer's number of outputs; None for any other module."""
    return getattr(module, "out_features", None) if type(module).__name__ == "Linear" else None
