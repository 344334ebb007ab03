"""A timm model described by timm itself: ``timm.create_model(name, pretrained=False)`` on the meta
device, with a ``config.json``'s ``model_args`` as timm's hub loader applies them (docs/checkpoints.md)."""

from __future__ import annotations

import functools
import json
from typing import Any, Optional, Union

from wbfe._deps import TORCH_INSTALL, torch_installed
from wbfe.framework.description import Fallback, FrameworkDescription
from wbfe.framework.head_facts import head_facts
from wbfe.framework.parameters import shared_parameters, transposed_weights, weight_name
from wbfe.framework.stored import cached

__all__ = ["describe_timm", "is_timm_config"]

# create_model arguments a config's model_args never pass: each would read a file, fetch weights or place the model
_NOT_MODEL_ARGS = frozenset({"pretrained", "pretrained_cfg", "pretrained_cfg_overlay", "pretrained_strict",
                             "checkpoint_path", "cache_dir", "device", "dtype", "features_only", "scriptable",
                             "exportable", "no_jit"})


def is_timm_config(config: Any) -> bool:
    """Whether ``config`` is a timm ``config.json`` (``architecture`` and ``pretrained_cfg``)."""
    return isinstance(config, dict) and isinstance(config.get("architecture"), str) and "pretrained_cfg" in config


def describe_timm(architecture: str, config: Optional[dict[str, Any]] = None) -> Union[FrameworkDescription, Fallback]:
    """timm model ``architecture`` (``resnet18.a1_in1k``) as timm builds it with the ``model_args``,
    then ``num_classes``, ``in_chans``, ``global_pool``, ``drop_rate`` of its ``config.json``; or a
    :class:`Fallback` saying why there is no description."""
    config = config or {}
    args = config.get("model_args")  # only the arguments that shape the model (plain JSON values)
    kwargs = ({k: v for k, v in args.items() if isinstance(k, str) and k not in _NOT_MODEL_ARGS and _plain(v)}
              if isinstance(args, dict) else {})
    pretrained = config.get("pretrained_cfg")
    for key in ("num_classes", "in_chans", "global_pool", "drop_rate"):
        value = config.get(key)
        if value is None and key == "drop_rate" and isinstance(pretrained, dict):
            value = pretrained.get(key)
        if value is not None:
            kwargs.setdefault(key, value)
    classifier = pretrained.get("classifier") if isinstance(pretrained, dict) else None
    return _describe(architecture, json.dumps(kwargs, sort_keys=True, default=str),
                     classifier if isinstance(classifier, str) else None)


def _plain(value: Any) -> bool:
    if isinstance(value, (list, tuple)):
        return all(_plain(v) for v in value)
    return value is None or isinstance(value, (bool, int, float, str))


@functools.lru_cache(maxsize=64)
def _describe(architecture: str, kwargs_json: str, classifier: Optional[str]) -> Union[FrameworkDescription, Fallback]:
    if not torch_installed():  # timm is built on torch: without it the rules decide, as without timm
        return Fallback(f"torch is not installed, so {architecture} is not built ({TORCH_INSTALL})")
    read = {"architecture": architecture, "kwargs": json.loads(kwargs_json), "classifier": classifier}
    return cached("timm", ("timm", "torch"), read, lambda: _built(architecture, kwargs_json, classifier))


def _built(architecture: str, kwargs_json: str, classifier: Optional[str]) -> Union[FrameworkDescription, Fallback]:
    try:
        import timm
        import torch
    except ImportError:
        return Fallback(f"timm is not installed, so {architecture} is not built (pip install timm)")
    name = architecture.split(".")[0]
    if not timm.is_model(name):
        return Fallback(f"timm {timm.__version__} has no model {name}")
    try:
        with torch.device("meta"):
            model: Any = timm.create_model(name, pretrained=False, **json.loads(kwargs_json))
    except Exception as exc:  # noqa: BLE001 - any failure to build means "use the rules"
        return Fallback(f"timm could not build {name} ({type(exc).__name__})")
    order, tied = shared_parameters(model)
    layouts = transposed_weights(model)
    head = weight_name(model, model.get_classifier() if hasattr(model, "get_classifier") else None)
    declared = classifier or getattr(model, "pretrained_cfg", {}).get("classifier")
    if head is None and declared:
        params = dict(model.named_parameters())
        head = next((c for c in (declared, f"{declared}.weight") if c in params and params[c].ndim >= 2), None)
    note = None if head else f"timm's {name} names no classifier weight"
    # timm applies its drop_rate functionally before the classifier in many models (ResNet, ...)
    facts = {"family": name, **head_facts(model, head, drop_rate=getattr(model, "drop_rate", None))}
    return FrameworkDescription("timm", architecture, tuple(order), head, tied, layouts, note, facts=facts)
