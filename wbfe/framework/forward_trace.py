"""Which dropout acts on the features a head reads, seen in the skeleton's own forward pass on the meta device: the
module tree shows neither call order nor functional dropout (T5's decoder, BART). Where the pass cannot run, the
module-tree reading (:mod:`wbfe.framework.head_facts`) decides (docs/metrics.md, "Where BFE-W applies")."""

from __future__ import annotations

import contextlib
import functools
import inspect
from dataclasses import dataclass
from typing import Any, Iterator, Optional, Union

from wbfe.framework.head_facts import DROPOUT_CLASSES

__all__ = ["HeadInput", "head_input_dropouts", "meta_inputs"]

# How many tokens, and which side, the tiny input has: enough for every position-dependent branch.
_TOKENS = 4
# The image side for a conv net whose config gives none (ResNet, ConvNeXt): any size runs.
_CONV_IMAGE = 64


def meta_inputs(model: Any) -> Union[dict[str, Any], str]:
    """Keyword inputs for one forward pass of a skeleton on the meta device; a string saying why there are none."""
    import torch

    try:
        params = inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        return "its forward pass has no signature to read"
    config = getattr(model, "config", None)
    kwargs: dict[str, Any] = {}
    if "input_ids" in params:
        kwargs["input_ids"] = torch.zeros(1, _TOKENS, dtype=torch.long, device="meta")
        if "decoder_input_ids" in params and getattr(config, "is_encoder_decoder", False):
            kwargs["decoder_input_ids"] = torch.zeros(1, _TOKENS, dtype=torch.long, device="meta")
    elif "pixel_values" in params:
        vision = getattr(config, "vision_config", None) or config
        size = getattr(vision, "image_size", None)
        size = size[0] if isinstance(size, (list, tuple)) and size else size
        if size is None and not hasattr(vision, "patch_size"):
            size = _CONV_IMAGE  # a conv net takes any size; a patch model needs its own
        channels = getattr(vision, "num_channels", 3)
        if not isinstance(size, int) or not isinstance(channels, int):
            return "its config gives no image size"
        kwargs["pixel_values"] = torch.zeros(1, channels, size, size, device="meta")
    else:
        return "its forward pass takes neither input_ids nor pixel_values"
    return kwargs


@dataclass(frozen=True)
class HeadInput:
    """What the forward pass showed about the head's input."""

    dropout: list[list[Any]]  # [[layer, rate], ...], in call order
    feeds: Optional[str]  # the layer with weights whose output the head reads (None: the input itself)


def head_input_dropouts(model: Any, head: str) -> Union[HeadInput, str]:
    """The dropouts with rate > 0 on the input of the head weight ``head`` of ``model`` (a skeleton on
    the meta device, in training mode as built), a functional one named ``<caller> (functional)``; or
    a string saying why the forward pass could not tell.

    Layer stacks are cut to their first and last block for the pass (what reaches the head runs after
    the last one); where the cut model does not run, the whole one is run."""
    inputs = meta_inputs(model)
    if isinstance(inputs, str):
        return inputs
    head_module = head.rsplit(".", 1)[0] if "." in head else ""
    modules = dict(model.named_modules())
    if head_module not in modules:
        return f"the head module {head_module} is not in the model"
    with contextlib.suppress(Exception), _cut_stacks(model):  # where the cut model fails, the whole one decides
        return _trace(model, modules, head_module, inputs)
    try:
        return _trace(model, modules, head_module, inputs)
    except Exception as exc:  # noqa: BLE001 - any model code that cannot run on meta: the tree decides
        return f"its forward pass does not run on the meta device ({type(exc).__name__})"


def _trace(model: Any, modules: dict[str, Any], head_module: str, inputs: dict[str, Any]) -> Union[HeadInput, str]:
    import torch
    import torch.nn.functional as F
    from torch.overrides import TorchFunctionMode

    functions = {F.dropout, F.dropout1d, F.dropout2d, F.dropout3d, F.alpha_dropout, F.feature_alpha_dropout}
    events: list[tuple[str, Any]] = []  # ("weighted" | "head" | "dropout", name or [layer, rate])
    stack: list[str] = []
    dropouts = {name for name, m in modules.items() if type(m).__name__ in DROPOUT_CLASSES}

    class _Dropouts(TorchFunctionMode):
        def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            kwargs = kwargs or {}
            if func in functions:
                rate = kwargs.get("p", args[1] if len(args) > 1 else 0.5)
                training = kwargs.get("training", args[2] if len(args) > 2 else True)
                if training and isinstance(rate, (int, float)) and rate > 0:
                    caller = stack[-1] if stack else ""
                    layer = caller if caller in dropouts else f"{caller or 'model'} (functional)"
                    events.append(("dropout", [layer, float(rate)]))
            return func(*args, **kwargs)

    def before(name: str, *_: Any) -> None:
        stack.append(name)
        if name == head_module:
            events.append(("head", name))

    def after(name: str, computes: bool, *_: Any) -> None:
        stack.pop()
        if computes and name != head_module:
            events.append(("weighted", name))

    hooks = []
    for name, module in modules.items():
        # a layer with weights of its own, not a container that also holds one (XLNet's mask_emb): a
        # container ends after its last step, which may be the very dropout sought
        computes = (next(module.parameters(recurse=False), None) is not None
                    and all(next(child.parameters(), None) is None for child in module.children()))
        hooks.append(module.register_forward_pre_hook(functools.partial(before, name)))
        hooks.append(module.register_forward_hook(functools.partial(after, name, computes)))
    try:
        with torch.no_grad(), _Dropouts():
            model(**inputs)
    finally:
        for hook in hooks:
            hook.remove()
    if not (calls := [k for k, (kind, _) in enumerate(events) if kind == "head"]):
        return f"the forward pass never calls the head module {head_module}"
    found: list[list[Any]] = []
    feeds: Optional[str] = None
    for k in reversed(range(calls[-1])):
        kind, value = events[k]
        if kind in ("weighted", "head"):
            feeds = str(value)  # the layer that computes the head's input: dropout before it is not on that input
            break
        if kind == "dropout":
            found.append(value)
    return HeadInput(found[::-1], feeds)


@contextlib.contextmanager
def _cut_stacks(model: Any) -> Iterator[None]:
    import torch

    cut = [(module, name, child) for module in list(model.modules()) for name, child in list(module.named_children())
           if isinstance(child, torch.nn.ModuleList) and len(child) > 2 and len({type(b) for b in child}) == 1]
    try:
        for module, name, child in cut:
            setattr(module, name, torch.nn.ModuleList([child[0], child[len(child) - 1]]))
        yield
    finally:
        for module, name, child in cut:
            setattr(module, name, child)
