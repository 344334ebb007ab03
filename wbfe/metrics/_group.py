"""The contract between a spectrum and the metric groups computed on it.

A metric group is a pure function of one :class:`Spectrum` (plus :class:`MetricOptions`) returning a
:class:`GroupResult`: a flat dict of column values and, for any column that could not be computed, a reason. Groups
never see tensors, files or devices."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Literal, Mapping, Optional, Sequence, Union

import numpy as np

from wbfe.errors import InvalidOptionError
from wbfe.options import FIX_FINGERS, LAMBDA, TAIL_MODEL, FingerFix, TailModel, check_tail_pair
from wbfe.options.constraints import Constraint, Custom, Integer, Validated
from wbfe.options.conventions import WBFE, Conventions, check_conventions
from wbfe.linalg.spectra import Form, Spectrum  # noqa: F401 - re-exported: the groups' input, defined where it is computed

Value = Union[float, int, str, None]

# exp() of more than this overflows float64; of less than _LOG_TINY it is 0.
_LOG_HUGE = math.log(np.finfo(np.float64).max)
_LOG_TINY = math.log(np.finfo(np.float64).smallest_normal)


def rescaled(value: float, power: float, log_scale: float) -> float:
    """``value · exp(power · log_scale)``: a column that scales like e^power, from the stored eigenvalues to
    the true ones (:attr:`Spectrum.log_scale`); NaN outside float64's normal range."""
    if log_scale == 0.0 or value == 0.0 or not math.isfinite(value):
        return value
    log_abs = math.log(abs(value)) + power * log_scale
    if not _LOG_TINY <= log_abs <= _LOG_HUGE:
        return math.nan
    return math.copysign(math.exp(log_abs), value)


def stored_threshold(threshold: float, log_scale: float) -> float:
    """An eigenvalue threshold on the true eigenvalues (WeightWatcher's) in the units of the stored ones, which are
    the true ones over exp(log_scale): one rule for every group that thresholds (htsr, fingers)."""
    if not threshold:
        return 0.0
    stored = rescaled(threshold, 1.0, -log_scale)
    if math.isnan(stored):
        return math.inf if log_scale < 0.0 else 0.0
    return stored


def check_gamma(gamma: float) -> float:
    """``gamma`` (an aspect ratio, the laws' γ = p/P) when it lies in (0, 1); InvalidOptionError otherwise."""
    if not 0.0 < gamma < 1.0:
        raise InvalidOptionError(f"gamma must lie in (0, 1), not {gamma!r}")
    return gamma


def out_of_range(log_scale: float) -> str:
    """The reason for a NaN from :func:`rescaled`."""
    return f"outside float64's range: the eigenvalues are of order 1e{log_scale / math.log(10.0):+.0f}"


@dataclass(frozen=True)
class MetricOptions(Validated):
    """Options every metric group may read: ``lam``, ``seed``, ``fix_fingers`` and ``fit`` as
    :class:`~wbfe.options.ScoreOptions` has them; ``conventions`` wbfe's or WeightWatcher's
    (:mod:`wbfe.options.conventions`; :meth:`to_dict` records its name); ``min_tail`` the smallest power-law tail
    (≥ 2; not under WeightWatcher's fit).

    Raises:
        InvalidOptionError: a value outside :attr:`CONSTRAINTS`, or ``clip_xmax`` with a truncated fit.
    """

    CONSTRAINTS: ClassVar[Mapping[str, Constraint]] = {
        "lam": LAMBDA, "min_tail": Integer(2), "seed": Integer(0), "fit": TAIL_MODEL,
        "conventions": Custom(check_conventions, "'wbfe' or 'weightwatcher'", bad=("ww", None, 3)),
        "fix_fingers": FIX_FINGERS,
    }

    lam: Union[Literal["opt"], float] = "opt"
    conventions: Conventions = WBFE
    min_tail: int = 10
    seed: int = 0
    fix_fingers: Optional[FingerFix] = None
    fit: TailModel = "pl"

    def _cross_check(self) -> None:
        check_tail_pair(self.fix_fingers, self.fit)

    def to_dict(self) -> dict[str, Any]:
        """The fields, :attr:`conventions` by its name."""
        return {**super().to_dict(), "conventions": self.conventions.name}

    @classmethod
    def from_score_options(cls, options: Any) -> "MetricOptions":
        """The metric options of a :class:`~wbfe.options.ScoreOptions` (the one place that maps one onto the other)."""
        return cls(lam=options.lam, conventions=options.conventions, seed=options.seed, fix_fingers=options.fix_fingers,
                   fit=options.fit)


@dataclass
class GroupResult:
    """Column values of one group for one matrix; NaN columns carry a reason."""

    values: dict[str, Value] = field(default_factory=dict)
    reasons: dict[str, str] = field(default_factory=dict)

    def fail(self, column: str, reason: str) -> None:
        """Mark ``column`` as NaN because of ``reason``."""
        self.values[column] = math.nan
        self.reasons[column] = reason

    def fail_all(self, columns: Sequence[str], reason: str) -> None:
        """Mark each of ``columns`` as NaN because of ``reason``."""
        for column in columns:
            self.fail(column, reason)

    def put_rescaled(self, column: str, value: float, power: float, log_scale: float) -> None:
        """``column`` = :func:`rescaled` ``(value, power, log_scale)``, or NaN with the reason."""
        true = rescaled(value, power, log_scale)
        if math.isnan(true) and not math.isnan(value):
            self.fail(column, out_of_range(log_scale))
        else:
            self.values[column] = true


@dataclass(frozen=True)
class MetricGroup:
    """A named set of columns computed together from one spectrum.

    Attributes:
        summary_columns: columns summarised per model as ``<col>_head`` and ``<col>_mean``.
        needs_eigenvalues: False when ``compute`` uses only ``Spectrum.log_moments()`` (the pipeline
            may then replace the eigen-solve by a Cholesky factorisation).
        from_matrices: for a group that needs the matrix itself: called in the spectrum job with
            ``(matrices, device, options, tensor name)``; its result reaches ``compute`` as
            ``Spectrum.extra[name]``.
        compute_many: optional ``compute`` of several spectra of one shape at once, each result
            equal to ``compute`` on that spectrum.
        tail_columns: the columns that fit the tail (or bulk) and so need ``--min-eigs`` eigenvalues.
    """

    name: str
    columns: tuple[str, ...]
    summary_columns: tuple[str, ...]
    compute: Callable[[Spectrum, MetricOptions], GroupResult]
    description: str = ""
    needs_eigenvalues: bool = True
    from_matrices: Optional[Callable[[Sequence[Any], Any, MetricOptions, str], Any]] = None
    compute_many: Optional[Callable[[Sequence[Spectrum], MetricOptions], list[GroupResult]]] = None
    tail_columns: tuple[str, ...] = ()

