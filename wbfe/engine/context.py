"""What one scoring run resolves once from its options: metric groups, device, metric settings."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from wbfe.linalg.spectra import resolve_device
from wbfe.metrics import MetricOptions, resolve_groups
from wbfe.options import ScoreOptions

__all__ = ["Context"]


@dataclass(frozen=True)
class Context:
    """A run's resolved settings (groups, device, metric options), built by :meth:`of` from validated options."""

    options: ScoreOptions
    groups: tuple[Any, ...]
    device: Any
    metric_options: MetricOptions

    @classmethod
    def of(cls, options: ScoreOptions) -> "Context":
        """Resolve ``options`` (groups by name, the device)."""
        return cls(options=options, groups=resolve_groups(options.metrics), device=resolve_device(options.device),
                   metric_options=MetricOptions.from_score_options(options))
