"""Settings of a hierarchical sweep (docs/math.md §7), validated once when constructed; the result's
``settings`` (and so its JSON) records them."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, ClassVar, Mapping, Optional

import numpy as np

from wbfe.errors import InvalidOptionError, unknown_name
from wbfe.options.constraints import Constraint, Custom, Integer, Validated
from wbfe.theory.hierarchical.model import ACTIVATIONS, FEATURE_KINDS, feature_dim
from wbfe.theory.hierarchical.spectral import SOLVERS
from wbfe.theory.checks import SEED, check_bytes, finite_number, refuse_unless
from wbfe.theory.settings import custom_rule

__all__ = ["HierarchicalSettings"]

_FINITE = custom_rule("a finite number", finite_number, (math.nan, math.inf),
                      say="{name} must be {words}, not {value!r}")


def _known(kind: str, names: Any) -> Custom:
    def check(value: Any) -> Any:
        if not isinstance(value, str) or value not in names:
            raise unknown_name(kind, str(value), names)
        return value

    return Custom(check, f"a known {kind}", bad=("no-such-name", 1.5))


@dataclass(frozen=True)
class HierarchicalSettings(Validated):
    """A sweep of n = d^α over ``points`` values of α in [alpha_min, alpha_max], ``seeds`` times.

    Args:
        p: number of latent features (default round(d^eps)); the learner keeps p directions.
        gamma: decay exponent of |b_i| (> 1/2).
        seeds: independent repetitions (teacher and data).
        kernel_max_n: largest training set given to kernel ridge (its cost is O(n³)); 0 switches it off.
        q_level: overlap above which a feature counts as recovered, and the level whose crossing
            defines a measured threshold.
        seed: master seed; the same settings give the same result.

    Raises:
        InvalidOptionError: an option out of range, or a largest training set over 4 GiB
            (:data:`wbfe.theory.checks.MAX_BYTES`).
        UnknownNameError: unknown activation, feature kind or solver.
    """

    CONSTRAINTS: ClassVar[Mapping[str, Constraint]] = {
        "d": Integer(2, words="an integer >= 2"), "p": Integer(1, optional=True),
        "gamma": custom_rule("a number > 1/2", lambda v: finite_number(v) and v > 0.5, (0.5, math.nan),
                             say="the sequential-recovery predictions need gamma > 1/2, not {value!r}"),
        "alpha_min": _FINITE, "alpha_max": _FINITE, "points": Integer(2, words="an integer >= 2"),
        "seeds": Integer(1), "eps": _FINITE,
        "activation": _known("activation", ACTIVATIONS), "features": _known("feature kind", FEATURE_KINDS),
        "n_test": Integer(10, words="an integer >= 10"), "kernel_max_n": Integer(0),
        "q_level": custom_rule("in (0, 1)", lambda v: finite_number(v) and 0.0 < v < 1.0, (0.0, 1.0),
                               say="q_level must lie in (0, 1), not {value!r}"),
        "solver": _known("eigensolver", SOLVERS), "seed": SEED,
    }
    BESIDE: ClassVar[tuple[str, ...]] = ("D",)  # derived from d: from_dict checks it

    d: int
    p: Optional[int] = None
    gamma: float = 1.0
    alpha_min: float = 2.0
    alpha_max: float = 3.6
    points: int = 9
    seeds: int = 3
    eps: float = 0.5
    activation: str = "identity"
    features: str = "hermite"
    n_test: int = 2000
    kernel_max_n: int = 2000
    q_level: float = 0.5
    solver: str = "auto"
    seed: int = 0

    def _cross_check(self) -> None:
        a_min, a_max = self.alpha_min, self.alpha_max
        refuse_unless(0.0 < a_min < a_max, f"need 0 < alpha_min < alpha_max, not {a_min!r} and {a_max!r}")
        try:
            n = max(2, int(round(self.d ** float(a_max))))  # the largest of sample_sizes()
        except OverflowError:
            raise InvalidOptionError(f"n = d^alpha_max = {self.d!r}^{a_max!r} is past a float's range; lower alpha_max "
                                     "or d") from None
        width = self.d if self.features == "hermite" else feature_dim(self.d)
        check_bytes(n * width, f"n = {n} samples of dimension {width}", "lower alpha_max or d")

    def alphas(self) -> np.ndarray:
        return np.linspace(self.alpha_min, self.alpha_max, self.points)

    def sample_sizes(self) -> list[int]:
        """n = round(d^α) at each α (at least 2)."""
        return [max(2, int(round(self.d**a))) for a in self.alphas()]

    def to_dict(self, *, p: Optional[int] = None) -> dict[str, Any]:
        """The settings as recorded in a result, with ``D`` and the resolved number of features ``p``
        (None: :attr:`p` as given)."""
        full = {**asdict(self), "D": feature_dim(self.d), "p": self.p if p is None else p}
        full.update({k: float(full[k]) for k in ("gamma", "eps", "alpha_min", "alpha_max", "q_level")})
        return {k: full[k] for k in ("d", "D", "p", "gamma", "eps", "activation", "features", "alpha_min", "alpha_max",
                                     "points", "seeds", "n_test", "kernel_max_n", "q_level", "solver", "seed")}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "HierarchicalSettings":
        """The settings a result recorded (:meth:`to_dict`; ``D`` is derived from ``d``).

        Raises:
            InvalidOptionError: an unknown key, a bad value, or a ``D`` that is not ``d``'s.
        """
        settings: HierarchicalSettings = super().from_dict(data)
        big_d = feature_dim(settings.d)
        refuse_unless(data.get("D", big_d) == big_d,
                      f"D = {data.get('D')!r} is not the feature dimension of d = {settings.d} ({big_d})")
        return settings
