"""What a built ``torch.nn.Module`` says of its weights (order, sharing, layout, role), for every
framework that builds one."""

from __future__ import annotations

import re
from typing import Any, Optional

from wbfe.framework.description import IN_OUT

__all__ = ["shared_parameters", "transposed_weights", "module_roles", "weight_name"]

# A module class whose weights have one role whatever their names (transformers' MoE classes:
# GraniteMoeTopKRouter, MixtralExperts, DeepseekV3TopkRouter, ...).
_ROLE_CLASSES = (("router", re.compile(r"(Router|Gating|MoEGate|TopKGate)$", re.IGNORECASE)),
                 ("expert", re.compile(r"(?<!Shared)Experts$")))


def shared_parameters(module: Any) -> tuple[list[str], dict[str, str]]:
    """``(names, shared)``: each parameter's first name in ``named_parameters()`` order, and every
    further name of a parameter held twice (a tied LM head) -> its first name."""
    first: dict[int, str] = {}
    shared: dict[str, str] = {}
    for name, param in module.named_parameters(remove_duplicate=False):
        if (owner := first.setdefault(id(param), name)) != name:
            shared[name] = owner
    return list(first.values()), shared


def weight_name(model: Any, module: Any) -> Optional[str]:
    """The name ``named_parameters()`` gives ``module.weight`` first; None where it has no weight."""
    if module is None or getattr(module, "weight", None) is None:
        return None
    return next((f"{name}.weight" if name else "weight" for name, sub in model.named_modules() if sub is module), None)


def transposed_weights(module: Any, also: tuple[type, ...] = ()) -> dict[str, str]:
    """``{weight name: "in_out"}`` for the submodules that store their weight [in, out, k...]: the
    transposed convolutions, and the classes in ``also`` (transformers' ``Conv1D``)."""
    import torch

    kinds = (torch.nn.ConvTranspose1d, torch.nn.ConvTranspose2d, torch.nn.ConvTranspose3d) + also
    return {f"{name}.weight" if name else "weight": IN_OUT for name, sub in module.named_modules()
            if isinstance(sub, kinds) and getattr(sub, "weight", None) is not None}


def module_roles(module: Any) -> dict[str, str]:
    """``{weight name: role}`` for the 2-D and larger parameters inside a module whose class names a
    role (:data:`_ROLE_CLASSES`; the nearest such module decides)."""
    classes = {name: type(sub).__name__ for name, sub in module.named_modules()}
    roles: dict[str, str] = {}
    for name, param in module.named_parameters():
        parts = name.split(".")[:-1]
        owners = [classes.get(".".join(parts[:k]), "") for k in range(len(parts), 0, -1)]  # the nearest first
        role = next((r for owner in owners for r, pattern in _ROLE_CLASSES if pattern.search(owner)), None)
        if role is not None and param.ndim >= 2:
            roles[name] = role
    return roles
