"""The input checks the theory modules share (no imports of theirs, so that any of them can use it)."""

from __future__ import annotations

import math
import numbers
from typing import Any, Callable

from wbfe.errors import InvalidOptionError
from wbfe.options.constraints import Integer

__all__ = ["MAX_BYTES", "SEED_LIMIT", "SEED_WORDS", "SEED", "WIDTH", "is_whole", "is_number", "finite_number",
           "refuse_unless", "check_bytes", "check_seed", "check_each", "check_runs"]

MAX_BYTES = 4 * 2**30  # the largest array a simulation allocates
# The seeds every random step in wbfe takes: numpy's legacy RandomState (WeightWatcher's draws) stops at 32 bits,
# torch's generators at 64 (less the offsets the HMC and student draws add), numpy's SeedSequence has no limit.
SEED_LIMIT = 2**32
SEED_WORDS = "an integer in [0, 2**32) (the seeds every random generator in wbfe takes)"
# wbfe.options' Integer rule, as `wbfe score --seed`: a float, even a whole one (3.0), is refused
SEED = Integer(0, SEED_LIMIT - 1, words=SEED_WORDS)
WIDTH = Integer(1)  # a student's width


def is_whole(value: object) -> bool:
    """Whether ``value`` is a whole number (3, 3.0, numpy's integers); False for inf, NaN, None, strings, bools."""
    try:
        return not isinstance(value, bool) and int(value) == value  # type: ignore[call-overload]
    except (TypeError, ValueError, OverflowError):
        return False


def is_number(value: Any) -> bool:
    """Whether ``value`` is a real number (NumPy's included: numbers' ABCs, numpy not imported); never a bool."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def finite_number(value: Any) -> bool:
    return is_number(value) and math.isfinite(value)


def refuse_unless(ok: object, message: str) -> None:
    """The one refusal of the theory's checks: InvalidOptionError(``message``) unless ``ok``."""
    if not ok:
        raise InvalidOptionError(message)


def check_bytes(floats: int, what: str, fix: str) -> None:
    """Refuse, before allocating, ``floats`` float64 values over :data:`MAX_BYTES` (a MemoryError after minutes)."""
    if floats * 8 > MAX_BYTES:
        gib = floats * 8 / 2**30  # an r of 1e300 needs a 290-digit number of GiB: written short
        shown = f"{gib:.1f}" if gib < 1e6 else f"{gib:.3g}"
        raise InvalidOptionError(f"{what} need {shown} GiB (limit {MAX_BYTES / 2**30:.0f} GiB); {fix}")


def check_seed(seed: Any, name: str = "seed") -> int:
    """``seed`` as an int, refused unless an integer in [0, :data:`SEED_LIMIT`) (no generator can fail on it)."""
    return SEED(name, seed)


def check_each(name: str, values: Any, rule: Callable[[str, Any], Any]) -> tuple[Any, ...]:
    """``rule(name, v)`` for each of ``values``, refused if a value repeats (a repeated seed is no new sample, a
    repeated width no new point)."""
    out = tuple(rule(name, v) for v in values)
    try:
        distinct = len(set(out)) == len(out)
    except TypeError:  # an unhashable value a rule let through: the run's own check refuses it
        distinct = True
    refuse_unless(distinct, f"{name} must not repeat a value, got {values!r}")
    return out


def check_runs(name: str, values: Any, seeds: Any, rule: Callable[[str, Any], Any]) -> None:
    """Refuse, before the first run, a sweep's ``values`` (one run each) or ``seeds`` that are not non-empty flat
    lists, or that :func:`check_each` refuses (a repeated seed: copies of one run, a standard error of 0)."""
    import numpy as np  # not at the top: the CLI's --help imports this module and must not load numpy

    def flat(x: Any) -> bool:
        try:
            return np.ndim(x) == 1 and len(x) > 0
        except ValueError:  # a ragged list: numpy's inhomogeneous-shape error
            return False

    refuse_unless(flat(values) and flat(seeds), f"{name} and seeds must be non-empty lists")
    check_each(name, values, rule)
    check_each("seeds", seeds, SEED)
