"""What a built ``nn.Module``'s tree says about the path into its head: the dropout beside the head (with the rates the
framework took from the config), a summary stage it reads (XLNet's SequenceSummary), and other heads with the same
outputs (DeiT's distillation head). The rules: docs/metrics.md, "Where BFE-W applies"."""

from __future__ import annotations

from typing import Any, Optional

from wbfe.render.text import is_number

__all__ = ["DROPOUT_CLASSES", "dropout_rate", "head_facts"]

# by class name: a module tree on the meta device is read without torch's types
DROPOUT_CLASSES = ("Dropout", "Dropout1d", "Dropout2d", "Dropout3d", "AlphaDropout", "FeatureAlphaDropout")


def dropout_rate(module: Any) -> float:
    """The rate of a torch dropout module; 0 for any other module."""
    return float(getattr(module, "p", 0.0) or 0.0) if type(module).__name__ in DROPOUT_CLASSES else 0.0


def head_facts(model: Any, head: Optional[str], *, drop_rate: Any = None) -> dict[str, Any]:
    """``{"dropout": [[layer, rate], ...], "heads": [layer, ...]}`` (and ``summary_stage``,
    ``hidden_dropout`` where a stage is read) for the head weight ``head`` of ``model`` (no weight is
    read). ``drop_rate``: a rate the model applies functionally before its head (timm's), reported as
    the layer ``drop_rate`` where no Dropout module beside the head holds it."""
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
    if is_number(drop_rate) and drop_rate and not facts["dropout"]:  # a Dropout module, where there is one, holds it
        facts["dropout"].append(["drop_rate", float(drop_rate)])
    return facts


def _is_summary_stage(module: Any) -> bool:
    """A pooler / sequence-summary stage: only leaf layers, a Linear among them."""
    children = list(module.children())
    return (any(type(c).__name__ == "Linear" for c in children)
            and all(next(iter(c.children()), None) is None for c in children))


def _stage_dropouts(stage: Any) -> tuple[list[tuple[str, float]], list[tuple[str, float]]]:
    """A summary stage's dropouts with rate > 0 after its last weighted layer (on the head's input) and
    before it (on a hidden layer's), in call order; every one counts where that order is unread."""
    rated = {name: dropout_rate(layer) for name, layer in stage.named_children() if dropout_rate(layer) > 0}
    if not rated:
        return [], []
    if (order := _call_order(stage)) is None:
        return list(rated.items()), []
    weighted = [k for k, name in enumerate(order) if next(getattr(stage, name).parameters(), None) is not None]
    last = weighted[-1] if weighted else -1
    return ([(name, rated[name]) for name in order[last + 1:] if name in rated],
            [(name, rated[name]) for name in order[:last + 1] if name in rated])


def _call_order(stage: Any) -> Optional[list[str]]:
    """``stage``'s children in the order one tiny batch calls them (registration order is not call
    order: SequenceSummary registers its linear layer first); None where it cannot tell."""
    import torch

    linear = next((c for c in stage.children() if type(c).__name__ == "Linear"), None)
    if linear is None:
        return None
    order: list[str] = []
    hooks = [child.register_forward_hook(lambda *_, name=name: order.append(name))
             for name, child in stage.named_children()]
    try:
        with torch.no_grad():
            stage(torch.zeros(1, 2, linear.in_features, device=linear.weight.device, dtype=linear.weight.dtype))
    except Exception:  # noqa: BLE001 - a stage with another signature: its order stays unread
        return None
    finally:
        for hook in hooks:
            hook.remove()
    called = set(order)
    return order if len(called) == len(order) and called == {n for n, _ in stage.named_children()} else None


def _outputs(module: Any) -> Optional[int]:
    return getattr(module, "out_features", None) if type(module).__name__ == "Linear" else None
