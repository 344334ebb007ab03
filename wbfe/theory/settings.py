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
from dataclasses import dataclass
from typing import Any

from wbfe.errors import InvalidOptionError
from wbfe.theory.json_io import fields_dict

__all__ = ["CurveSettings", "HmcSettings", "StudentSettings"]


def _check_int(name: str, value: Any, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise InvalidOptionError(f"{name} must be an integer >= {minimum}, got {value!r}")


def _check_positive(name: str, value: Any) -> None:
    if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
        raise InvalidOptionError(f"{name} must be positive and finite, got {value!r}")


def _check_model(activation: str, readout: str, k: int, *, beta: float, rate: float = 0.2, nonzeros: int = 3) -> None:
    """The activation and the readout, checked by the functions that build them (cheap: no kernel)."""
    from wbfe.theory.hermite import get_activation
    from wbfe.theory.teacher_student import readout as make_readout

    get_activation(activation)
    make_readout(readout, k, beta=beta, rate=rate, nonzeros=nonzeros)


def _check_common(d: int, k: int, delta: float) -> None:
    _check_int("d", d, 1)
    _check_int("k", k, 1)
    _check_positive("delta", delta)


def _check_list(name: str, values: tuple, minimum: int) -> None:
    if not values:
        raise InvalidOptionError(f"{name} must not be empty")
    for v in values:
        _check_int(name, v, minimum)


class _Settings:
    def to_dict(self) -> dict[str, Any]:
        """The settings as a JSON-ready dict."""
        return fields_dict(self)


@dataclass(frozen=True)
class CurveSettings(_Settings):
    """A sweep of the fixed point over r = n/(kd) (``wbfe theory curve``)."""

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

    def __post_init__(self) -> None:
        if not (0 < self.r_min < self.r_max and math.isfinite(self.r_max) and self.points >= 2):
            raise InvalidOptionError(
                f"need 0 < r_min < r_max and points >= 2 (got {self.r_min}, {self.r_max}, {self.points})")
        _check_int("points", self.points, 2)
        _check_common(self.d, self.k, self.delta)
        _check_model(self.activation, self.readout, self.k, beta=self.beta, rate=self.rate, nonzeros=self.nonzeros)


@dataclass(frozen=True)
class HmcSettings(_Settings):
    """HMC posterior sampling against the fixed point (``wbfe theory hmc``)."""

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

    def __post_init__(self) -> None:
        object.__setattr__(self, "r_values", tuple(float(r) for r in self.r_values))
        object.__setattr__(self, "seeds", tuple(self.seeds))
        if not self.r_values:
            raise InvalidOptionError("r_values must not be empty")
        for r in self.r_values:
            _check_positive("r_values", r)
        _check_list("seeds", self.seeds, 0)
        _check_common(self.d, self.k, self.delta)
        if self.k > self.d:
            raise InvalidOptionError(f"need k <= d for HMC, got k={self.k}, d={self.d}")
        _check_int("warmup", self.warmup, 0)
        _check_int("samples", self.samples, 1)
        _check_model(self.activation, "power", self.k, beta=self.beta)


@dataclass(frozen=True)
class StudentSettings(_Settings):
    """Adam-trained students of several widths against k_c (``wbfe theory student``)."""

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

    def __post_init__(self) -> None:
        object.__setattr__(self, "widths", tuple(self.widths))
        object.__setattr__(self, "seeds", tuple(self.seeds))
        _check_list("widths", self.widths, 1)
        _check_list("seeds", self.seeds, 0)
        _check_int("n", self.n, 1)
        _check_common(self.d, self.k, self.delta)
        _check_int("epochs", self.epochs, 1)
        _check_positive("lr", self.lr)
        _check_model(self.activation, "power", self.k, beta=self.beta)
