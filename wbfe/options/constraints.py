"""Declared parameter constraints (scikit-learn's ``_parameter_constraints``), one table per options class: each
normalises a good value, refuses a bad one with an :class:`~wbfe.errors.InvalidOptionError` worded from the same
declaration, and lists a few values it refuses (:attr:`Constraint.invalid`) for the generated tests."""

from __future__ import annotations

import dataclasses
import math
import numbers
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Callable, ClassVar, Mapping, Optional

from wbfe.errors import InvalidOptionError

__all__ = ["Constraint", "Integer", "Real", "Choice", "Flag", "Text", "Custom", "Validated"]


@dataclass(frozen=True)
class Constraint:
    """What one parameter accepts: :attr:`invalid` lists values it refuses (examples for the generated tests);
    with :attr:`optional`, None is accepted (and kept as None)."""

    invalid: ClassVar[tuple[Any, ...]] = ()
    optional: bool = field(default=False, kw_only=True)

    def describe(self) -> str:
        """The allowed values in words, completing "NAME must be ..."."""
        raise NotImplementedError

    def check(self, value: Any) -> Any:
        """The normalised value; raises ValueError or TypeError for a value outside the constraint."""
        raise NotImplementedError

    def __call__(self, name: str, value: Any) -> Any:
        if value is None and self.optional:
            return None
        try:
            return self.check(value)
        except (TypeError, ValueError, OverflowError):  # OverflowError: an int past a float (math.isfinite)
            raise InvalidOptionError(f"{name} must be {self.describe()}, not {value!r}", name=name,
                                     value=value) from None


@dataclass(frozen=True)
class Integer(Constraint):
    """An integer (never a bool) in [low, high]."""

    low: int
    high: Optional[int] = None
    words: Optional[str] = None

    def describe(self) -> str:
        if self.words is not None:
            return self.words
        if self.high is not None:
            return f"an integer between {self.low} and {self.high}"
        return {0: "a non-negative integer", 1: "a positive integer"}.get(self.low, f"an integer of at least {self.low}")

    def check(self, value: Any) -> int:
        # numbers.Integral: NumPy's integers too (np.int64(5) is a positive integer); never a bool
        if not isinstance(value, numbers.Integral) or isinstance(value, bool):
            raise ValueError
        number = int(value)
        if number < self.low or (self.high is not None and number > self.high):
            raise ValueError
        return number

    @property
    def invalid(self) -> tuple[Any, ...]:  # type: ignore[override]
        return (self.low - 1, 1.5, "3", True) + ((self.high + 1,) if self.high is not None else ())


@dataclass(frozen=True)
class Real(Constraint):
    """A finite real number in an open or closed interval."""

    low: float
    high: float
    open: bool = True

    def describe(self) -> str:
        left, right = ("(", ")") if self.open else ("[", "]")
        return f"in {left}{self.low:g}, {self.high:g}{right}"

    def check(self, value: Any) -> float:
        if isinstance(value, bool) or not isinstance(value, numbers.Real):  # np.float32 too
            raise ValueError
        number = float(value)  # OverflowError past the float range (2**1024)
        if not math.isfinite(number) or not (self.low < number < self.high if self.open
                                             else self.low <= number <= self.high):
            raise ValueError
        return number

    @property
    def invalid(self) -> tuple[Any, ...]:  # type: ignore[override]
        ends = (self.low, self.high) if self.open else ()
        return (self.low - 1.0, self.high + 1.0, math.nan, "0.5", 2**1024) + ends


@dataclass(frozen=True)
class Choice(Constraint):
    """One of a fixed set of strings."""

    values: tuple[str, ...]

    def describe(self) -> str:
        quoted = [repr(v) for v in self.values]
        return " or ".join(quoted) if len(quoted) <= 2 else f"one of {', '.join(quoted)}"

    def check(self, value: Any) -> str:
        if value not in self.values:
            raise ValueError
        return value

    invalid = ("no-such-choice", 1)


@dataclass(frozen=True)
class Flag(Constraint):
    """True or False (not 0, 1 or a string); also None when ``optional`` (an automatic choice)."""

    def describe(self) -> str:
        return "True, False or None" if self.optional else "True or False"

    def check(self, value: Any) -> bool:
        if not isinstance(value, bool):
            raise TypeError
        return value

    invalid = ("yes", 1)


@dataclass(frozen=True)
class Text(Constraint):
    """A non-empty string (a name, a path)."""

    what: str = "a non-empty string"

    def describe(self) -> str:
        return self.what

    def check(self, value: Any) -> str:
        if not isinstance(value, str) or not value:
            raise ValueError
        return value

    invalid = ("", 3)


@dataclass(frozen=True)
class Custom(Constraint):
    """A check that words its own message: ``checker(value)`` (``checker(name, value)`` when ``named``) gives the
    normalised value or raises :class:`InvalidOptionError`; ``bad`` lists values it refuses."""

    checker: Callable[..., Any]
    words: str
    bad: tuple[Any, ...] = ()
    named: bool = False

    def __call__(self, name: str, value: Any) -> Any:
        if value is None and self.optional:
            return None
        return self.checker(name, value) if self.named else self.checker(value)

    @property
    def invalid(self) -> tuple[Any, ...]:  # type: ignore[override]
        return self.bad


class Validated:
    """The options classes' shared behaviour: every field checked against ``CONSTRAINTS`` when built, in table
    order; a plain :meth:`to_dict`, and :meth:`from_dict` that replays it."""

    CONSTRAINTS: ClassVar[Mapping[str, Constraint]] = {}

    def __post_init__(self) -> None:
        for name, constraint in self.CONSTRAINTS.items():
            object.__setattr__(self, name, constraint(name, getattr(self, name)))
        self._cross_check()

    def _cross_check(self) -> None:
        """Rules that tie fields together."""

    def to_dict(self) -> dict[str, Any]:
        """Plain dict of the compared fields (lists for tuples) under their ``RENAMED`` keys, and ``CONSTANT``."""
        key = {name: written for written, name in self.RENAMED.items()}
        return {**{key.get(f.name, f.name): _plain(getattr(self, f.name))
                   for f in fields(self) if f.compare}, **self.CONSTANT}  # type: ignore[arg-type]

    def replace(self, **changes: Any) -> Any:
        """A copy with ``changes`` (``dataclasses.replace``): a field the conventions filled is filled again."""
        return dataclasses.replace(self, **changes)  # type: ignore[type-var]

    # Keys :meth:`to_dict` writes under another name than the field's, keys it writes that are no field
    # (with the one value they may have), and keys a result records beside the options (not settings).
    RENAMED: ClassVar[Mapping[str, str]] = {}
    CONSTANT: ClassVar[Mapping[str, Any]] = {}
    BESIDE: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Any:
        """The options a :meth:`to_dict` describes (keys left out take their defaults, ``BESIDE`` keys are
        ignored); InvalidOptionError for anything else than a dict, an unknown key, or a bad value."""
        if not isinstance(data, Mapping):
            raise InvalidOptionError(f"{cls.__name__}.from_dict needs a dict of options, not {type(data).__name__}")
        names = {f.name for f in fields(cls) if f.init} - set(cls.RENAMED.values())  # type: ignore[arg-type]
        known = sorted(names | set(cls.RENAMED) | set(cls.CONSTANT))
        given = {}
        for key, value in data.items():
            if key in cls.CONSTANT:
                if value != cls.CONSTANT[key]:
                    raise InvalidOptionError(f"{cls.__name__} option {key} is always {cls.CONSTANT[key]!r}, not {value!r}")
            elif key in names or key in cls.RENAMED:
                given[cls.RENAMED.get(key, key)] = _tupled(value)
            elif key not in cls.BESIDE:
                raise InvalidOptionError(f"unknown {cls.__name__} option {key!r} (known: {', '.join(known)})")
        return cls(**given)


def _tupled(value: Any) -> Any:
    return tuple(_tupled(v) for v in value) if isinstance(value, list) else value


def _plain(value: Any) -> Any:
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    return str(value) if isinstance(value, (str, Path)) else value  # a str subclass (a filled mark) too
