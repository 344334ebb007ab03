"""Metric groups: pure functions of a spectrum, looked up by stable name; each group's columns are in docs/metrics.md,
and each group's ``description`` says what it computes."""

from __future__ import annotations

import importlib
from typing import Iterable

from wbfe.errors import unknown_name
from wbfe.linalg.spectra import Spectrum
from wbfe.metrics._group import GroupResult, MetricGroup, MetricOptions
from wbfe.options import DEFAULT_GROUPS, parse_metrics

__all__ = ["GroupResult", "MetricGroup", "MetricOptions", "Spectrum", "DEFAULT_GROUPS", "get_group", "resolve_groups"]

# name -> "module:attribute"; modules are imported on first use so `import wbfe` stays light. The names and
# DEFAULT_GROUPS are wbfe.options' (METRIC_GROUPS), which checks them without importing the groups.
_REGISTRY: dict[str, str] = {
    "bfe": "wbfe.metrics.bfe:GROUP",
    "htsr": "wbfe.metrics.htsr:GROUP",
    "htmp": "wbfe.metrics.htmp:GROUP",  # opt-in, as every group not in DEFAULT_GROUPS
    "rand": "wbfe.metrics.rand:GROUP",
    "vectors": "wbfe.metrics.vectors:GROUP",  # an eigen-decomposition with vectors per matrix
    "detx": "wbfe.metrics.detx:GROUP",
    "fingers": "wbfe.metrics.fingers:GROUP",  # num_fingers, raw_alpha, Lambda of --fix-fingers / --fit
}


def get_group(name: str) -> MetricGroup:
    """The metric group registered as ``name``; UnknownNameError (with close matches) if none is."""
    if name not in _REGISTRY:
        raise unknown_name("metric group", name, tuple(_REGISTRY))
    module_name, attr = _REGISTRY[name].split(":")
    return getattr(importlib.import_module(module_name), attr)


def resolve_groups(metrics: str | Iterable[str] | None) -> tuple[MetricGroup, ...]:
    """Parse ``"bfe,htsr"`` (or an iterable of names, or None for the default) into groups.

    Raises UnknownNameError for a name not registered, InvalidOptionError for an empty list
    (:func:`wbfe.options.parse_metrics`)."""
    return tuple(get_group(name) for name in parse_metrics(metrics))
