"""A checkpoint's own description (order, head, ties, layouts), from the framework that wrote it.

Where there is none, wbfe's name and shape rules decide (docs/checkpoints.md). Importing this
package imports no framework."""

from __future__ import annotations

from typing import Any, Union

from wbfe.framework.description import (IN_OUT, LAYOUTS, OUT_IN, Fallback, FrameworkDescription, Layout, check_layout,
                                        order_rows, out_in)
from wbfe.framework.modules import describe_module
from wbfe.framework.timm_model import describe_timm, is_timm_config
from wbfe.framework.transformers_model import describe_transformers

__all__ = [
    "FrameworkDescription", "Fallback", "Layout", "OUT_IN", "IN_OUT", "LAYOUTS", "check_layout", "out_in",
    "order_rows", "describe_config", "describe_module",
]


def describe_config(config: Any) -> Union[FrameworkDescription, Fallback, None]:
    """What the framework of a ``config.json`` says about the model: a :class:`Fallback` (why not) when
    the model cannot be built here; None for a config that names no framework's model."""
    if not isinstance(config, dict):
        return None
    if is_timm_config(config):
        return describe_timm(config["architecture"], config)
    if isinstance(config.get("architectures"), list):
        return describe_transformers(config)
    return None
