"""A checkpoint's own description, from the framework that wrote it.

A checkpoint usually carries what its framework knows about it: a Hugging Face ``config.json``
names a transformers class, timm's names a timm model, a Keras file holds its layer graph, a GGUF
file lists its tensors in the model's order. :func:`describe_config` turns a ``config.json`` into a
:class:`FrameworkDescription` (model order, head, tied weights, layouts) by building the model on
the meta device; the Keras and GGUF readers fill theirs from the file. Where there is no
description, or it cannot be built, wbfe's name and shape rules decide, and the result says so
(``summary.head_source``, ``model.framework``). Importing this package imports no framework.
"""

from __future__ import annotations

from typing import Any, Union

from wbfe.framework.description import (
    IN_OUT,
    LAYOUTS,
    OUT_IN,
    Fallback,
    FrameworkDescription,
    Layout,
    check_layout,
    order_rows,
    out_in,
)

__all__ = [
    "FrameworkDescription", "Fallback", "Layout", "OUT_IN", "IN_OUT", "LAYOUTS", "check_layout", "out_in",
    "order_rows", "describe_config", "describe_module",
]


def describe_config(config: Any) -> Union[FrameworkDescription, Fallback, None]:
    """What the framework a ``config.json`` belongs to says about the model.

    Returns:
        A :class:`FrameworkDescription`; a :class:`Fallback` (why not) when the config names a
        model that cannot be built here; None for a config that names no framework's model.
    """
    if not isinstance(config, dict):
        return None
    from wbfe.framework.timm_model import describe_timm, is_timm_config

    if is_timm_config(config):
        return describe_timm(config["architecture"], config)
    if isinstance(config.get("architectures"), list):
        from wbfe.framework.transformers_model import describe_transformers

        return describe_transformers(config)
    return None


def describe_module(module: Any) -> Union[FrameworkDescription, None]:
    """What an in-memory model says about itself (a model handed to ``wbfe.score`` as an object):
    for a transformers ``PreTrainedModel`` everything :func:`describe_config` gives; for another
    ``nn.Module`` (a timm model, a torchvision one) the order of ``named_parameters()``, the head
    its ``get_output_embeddings()`` or ``get_classifier()`` returns, and the ``in_out`` layout of
    transposed convolutions. None for something that is not an ``nn.Module`` (a state dict).
    """
    from wbfe.framework.modules import describe_module as describe

    return describe(module)
