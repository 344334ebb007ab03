"""What a built ``torch.nn.Module`` says of its weights, for every framework that builds one
(transformers, timm, an in-memory module): their order, the ones shared by two names, and the ones
stored transposed."""

from __future__ import annotations

from typing import Any

from wbfe.framework.description import IN_OUT

__all__ = ["shared_parameters", "transposed_weights"]


def shared_parameters(module: Any) -> tuple[list[str], dict[str, str]]:
    """``(names, shared)``: each parameter's first name in ``named_parameters()`` order, and every
    further name of a parameter held twice (a tied LM head) -> its first name."""
    first: dict[int, str] = {}
    shared: dict[str, str] = {}
    for name, param in module.named_parameters(remove_duplicate=False):
        if id(param) in first:
            shared[name] = first[id(param)]
        else:
            first[id(param)] = name
    return list(first.values()), shared


def transposed_weights(module: Any, also: tuple[type, ...] = ()) -> dict[str, str]:
    """``{weight name: "in_out"}`` for the submodules that store their weight [in, out, k...]: the
    transposed convolutions, and the classes in ``also`` (transformers' ``Conv1D``)."""
    import torch

    kinds = (torch.nn.ConvTranspose1d, torch.nn.ConvTranspose2d, torch.nn.ConvTranspose3d) + also
    return {f"{name}.weight" if name else "weight": IN_OUT for name, sub in module.named_modules()
            if isinstance(sub, kinds) and getattr(sub, "weight", None) is not None}
