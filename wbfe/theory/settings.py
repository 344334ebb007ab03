"""Settings of the teacher–student sweeps (docs/math.md §6), validated once when constructed.

The CLI builds one of these from its options, :mod:`wbfe.theory.reports` runs it, and the JSON it
writes records it under ``settings``: one spelling of every parameter from the command line to the file.

>>> CurveSettings(r_min=5.0, r_max=1.0)
Traceback (most recent call last):
...
wbfe.errors.InvalidOptionError: need 0 < r_min < r_max and points >= 2 (got 5.0, 1.0, 80)
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Mapping

from wbfe.errors import InvalidOptionError
from wbfe.options import DEVICE  # one device rule with wbfe score's: a device this machine lacks is refused here
from wbfe.options.constraints import Constraint, Custom, Integer, Text, Validated
from wbfe.theory.checks import SEED, WIDTH, check_each, finite_number, refuse_unless

__all__ = ["CurveSettings", "HmcSettings", "StudentSettings"]


def custom_rule(words: str, test: Callable[[Any], object], bad: tuple[Any, ...], *,
                say: str = "{name} must be {words}, got {value!r}") -> Custom:
    """A constraint that refuses a value failing ``test`` with the message ``say``."""

    def check(name: str, value: Any) -> Any:
        try:
            ok = test(value)
        except (ArithmeticError, ValueError):  # int(inf), int(nan), an int past a float
            ok = False
        if not ok:
            raise InvalidOptionError(say.format(name=name, words=words, value=value))
        # np.int64(5) is recorded as 5 (numpy is not imported here: the CLI's --help must not load it)
        return value.item() if isinstance(value, numbers.Number) and hasattr(value, "item") else value

    return Custom(check, words, bad=bad, named=True)


def _check_model(activation: str, readout: str, k: int, *, beta: float, rate: float = 0.2, nonzeros: int = 3) -> None:
    """The activation and the readout, checked as the functions that build them check them (cheap: no kernel)."""
    from wbfe.theory.hermite import get_activation
    from wbfe.theory.teacher_student import check_readout

    get_activation(activation)
    check_readout(readout, k, beta=beta, rate=rate, nonzeros=nonzeros)


def _each(rule: Constraint, cast: Callable[[Any], Any], words: str, bad: tuple[Any, ...]) -> Custom:
    """A non-empty tuple (list, range, array) of different values, each passing ``rule`` (the library's
    :func:`~wbfe.theory.checks.check_each`)."""

    def check(name: str, values: Any) -> tuple[Any, ...]:
        values = (tuple(values.tolist()) if hasattr(values, "tolist") and hasattr(values, "ndim")  # a numpy array
                  else tuple(values) if isinstance(values, (tuple, list, range)) else values)
        refuse_unless(isinstance(values, tuple) and values, f"{name} must not be empty")
        return tuple(cast(v) for v in check_each(name, values, rule))

    return Custom(check, words, bad=bad, named=True)


POSITIVE = custom_rule("positive and finite", lambda v: finite_number(v) and v > 0,
                       (0.0, -1.0, math.nan, True, 2**1024))
# Its range is the model's (below).
NUMBER = custom_rule("a finite number", finite_number, (math.nan, "x"))
NAME = Text("a name")  # activation, readout: known names, checked with the model they build
SEEDS = _each(SEED, int, "integers in [0, 2**32)", ((), (-1,), (0, 0), (2**32,)))


@dataclass(frozen=True)
class CurveSettings(Validated):
    """A sweep of the fixed point over r = n/(kd) (``wbfe theory curve``)."""

    CONSTRAINTS: ClassVar[Mapping[str, Constraint]] = {
        "beta": NUMBER, "delta": POSITIVE, "d": Integer(1), "k": Integer(1), "r_min": NUMBER, "r_max": NUMBER,
        "points": Integer(1), "activation": NAME, "readout": NAME, "rate": NUMBER, "nonzeros": Integer(0),
    }

    beta: float = 0.3
    delta: float = 0.04
    d: int = 200
    k: int = 100
    r_min: float = 0.01
    r_max: float = 100.0
    points: int = 80
    activation: str = "tanh2"
    readout: str = "power"
    rate: float = 0.2
    nonzeros: int = 3

    def _cross_check(self) -> None:
        refuse_unless(0 < self.r_min < self.r_max and self.points >= 2,
                      f"need 0 < r_min < r_max and points >= 2 (got {self.r_min}, {self.r_max}, {self.points})")
        _check_model(self.activation, self.readout, self.k, beta=self.beta, rate=self.rate, nonzeros=self.nonzeros)


@dataclass(frozen=True)
class HmcSettings(Validated):
    """HMC posterior sampling against the fixed point (``wbfe theory hmc``)."""

    CONSTRAINTS: ClassVar[Mapping[str, Constraint]] = {
        "r_values": _each(POSITIVE, float, "positive numbers", ((), (0.0,))), "seeds": SEEDS, "d": Integer(1),
        "k": Integer(1), "delta": POSITIVE, "beta": NUMBER, "activation": NAME, "warmup": Integer(0),
        "samples": Integer(10, words="an integer of at least 10 (one sample in 10 is kept)"), "device": DEVICE,
    }

    r_values: tuple[float, ...] = (0.5, 2.0, 5.0)
    d: int = 40
    k: int = 20
    delta: float = 0.04
    beta: float = 0.3
    activation: str = "tanh2"
    seeds: tuple[int, ...] = (0, 1, 2)
    warmup: int = 600
    samples: int = 300
    device: str = "cpu"

    def _cross_check(self) -> None:
        refuse_unless(self.k <= self.d, f"need k <= d for HMC, got k={self.k}, d={self.d}")
        _check_model(self.activation, "power", self.k, beta=self.beta)


@dataclass(frozen=True)
class StudentSettings(Validated):
    """Adam-trained students of several widths against k_c (``wbfe theory student``)."""

    CONSTRAINTS: ClassVar[Mapping[str, Constraint]] = {
        "widths": _each(WIDTH, int, "integers >= 1", ((), (0,))), "seeds": SEEDS, "n": Integer(1), "d": Integer(1),
        "k": Integer(1), "delta": POSITIVE, "beta": NUMBER, "activation": NAME, "epochs": Integer(1), "lr": POSITIVE,
        "device": DEVICE,
    }

    widths: tuple[int, ...] = (1, 2, 4, 6, 8, 12, 16, 24, 32, 48)
    n: int = 2000
    d: int = 30
    k: int = 30
    delta: float = 0.05
    beta: float = 1.0
    activation: str = "tanh2"
    seeds: tuple[int, ...] = (0,)
    epochs: int = 1000
    lr: float = 0.01
    device: str = "cpu"

    def _cross_check(self) -> None:
        _check_model(self.activation, "power", self.k, beta=self.beta)
