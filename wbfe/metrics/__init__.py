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

# Each group is the GROUP of the module wbfe.metrics.<name>, imported on first use so `import wbfe` stays light. The
# names and DEFAULT_GROUPS are wbfe.options' (METRIC_GROUPS), which checks them without importing the groups.
_REGISTRY = ("bfe", "htsr", "htmp", "rand", "vectors", "detx", "fingers")


def get_group(name: str) -> MetricGroup:
    """The metric group registered as ``name``; UnknownNameError (with close matches) if none is."""
    if name not in _REGISTRY:
        raise unknown_name("metric group", name, _REGISTRY)
    return importlib.import_module(f"wbfe.metrics.{name}").GROUP


def resolve_groups(metrics: str | Iterable[str] | None) -> tuple[MetricGroup, ...]:
    """Parse ``"bfe,htsr"`` (or an iterable of names, or None for the default) into groups.

    Raises UnknownNameError for a name not registered, InvalidOptionError for an empty list
    (:func:`wbfe.options.parse_metrics`)."""
    return tuple(get_group(name) for name in parse_metrics(metrics))
