"""The contract between a spectrum and the metric groups computed on it.

A metric group is a pure function of one :class:`Spectrum` (plus :class:`MetricOptions`) returning
a :class:`GroupResult`: a flat dict of column values and, for any column that could not be
computed, a reason. Groups never see tensors, files or devices.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Literal, Mapping, Optional, Sequence, Union

import numpy as np

Value = Union[float, int, str, None]
Form = Literal["primal", "dual"]


@dataclass(frozen=True)
class Spectrum:
    """Eigenvalues of the smaller Gram matrix of one weight matrix (or of pooled conv slices).

    Attributes:
        eigs: float64 eigenvalues in ascending order, noise-level values clipped to exactly 0; None
            when only the moments were computed (every requested group has ``needs_eigenvalues=False``).
        rows: rows of the matrix (of one slice, for pooled slices) as stored: PyTorch ``out``.
        cols: columns of the matrix (of one slice): PyTorch ``in`` (times kernel size if flattened).
        n_slices: number of matrices whose spectra were pooled (1 unless conv ``slices``).
        moments: ``(mean(e), mean(log e), n, n_zero)`` when ``eigs`` is None.
        extra: what groups with a ``from_matrices`` hook computed from the matrices themselves,
            by group name (e.g. the ``rand`` group's shuffled spectrum).
    """

    eigs: Optional[np.ndarray]
    rows: int
    cols: int
    n_slices: int = 1
    moments: Optional[tuple[float, float, int, int]] = None
    extra: Mapping[str, Any] = field(default_factory=dict)

    @property
    def n_eigs(self) -> int:
        """Number of (pooled) eigenvalues."""
        return int(self.eigs.size) if self.eigs is not None else int(self.moments[2])  # type: ignore[index]

    def log_moments(self) -> tuple[float, float, int, int]:
        """``(mean(e), mean(log e), n, n_zero)``; mean(log e) is −inf when an eigenvalue is exactly 0."""
        if self.eigs is None:
            assert self.moments is not None
            return self.moments
        e = self.eigs
        with np.errstate(divide="ignore"):
            mean_log = float(np.mean(np.log(e))) if np.all(e > 0.0) else -math.inf
        return float(np.mean(e)), mean_log, int(e.size), int(np.count_nonzero(e <= 0.0))

    @property
    def p(self) -> int:
        """Smaller side of one matrix: the number of eigenvalues per slice."""
        return min(self.rows, self.cols)

    @property
    def P(self) -> int:  # noqa: N802 - the MATH.md name
        """Larger side of one matrix."""
        return max(self.rows, self.cols)

    @property
    def gamma(self) -> float:
        """Aspect ratio p / P in (0, 1]."""
        return self.p / self.P

    @property
    def form(self) -> Form:
        """``primal`` when out <= in (the paper's m <= d_L), else ``dual``."""
        return "primal" if self.rows <= self.cols else "dual"


@dataclass(frozen=True)
class MetricOptions:
    """Options every metric group may read.

    Attributes:
        lam: prior precision for BFE-W and F-infinity: ``"opt"`` (lambda* = 1/mean(e)) or a value.
        ww_compatible: reproduce WeightWatcher 0.7.7's fitting choices where they differ.
        min_tail: smallest power-law tail accepted (ignored in WeightWatcher-compatible mode).
        seed: seed of every random step a group takes (the ``rand`` group's permutations).
    """

    lam: Union[Literal["opt"], float] = "opt"
    ww_compatible: bool = False
    min_tail: int = 10
    seed: int = 0


@dataclass
class GroupResult:
    """Column values of one group for one matrix; NaN columns carry a reason."""

    values: dict[str, Value] = field(default_factory=dict)
    reasons: dict[str, str] = field(default_factory=dict)

    def fail(self, column: str, reason: str) -> None:
        """Mark ``column`` as NaN because of ``reason``."""
        self.values[column] = math.nan
        self.reasons[column] = reason


@dataclass(frozen=True)
class MetricGroup:
    """A named set of columns computed together from one spectrum.

    Attributes:
        name: the stable name used by ``--metrics`` / ``metrics=``.
        columns: every column the group produces, in display order.
        summary_columns: columns summarised per model as ``<col>_head`` and ``<col>_mean``.
        compute: the pure function.
        needs_eigenvalues: False when ``compute`` uses only ``Spectrum.log_moments()``, which lets
            the pipeline replace the eigen-solve by a Cholesky factorisation.
        from_matrices: for a group that needs the matrix itself, not only its spectrum: called in
            the spectrum job with ``(matrices, device, options, tensor name)``; what it returns is
            handed to ``compute`` as ``Spectrum.extra[name]``.
    """

    name: str
    columns: tuple[str, ...]
    summary_columns: tuple[str, ...]
    compute: Callable[[Spectrum, MetricOptions], GroupResult]
    description: str = ""
    needs_eigenvalues: bool = True
    from_matrices: Optional[Callable[[Sequence[Any], Any, MetricOptions, str], Any]] = None
