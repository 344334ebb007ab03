"""Settings of a hierarchical sweep (docs/math.md §7), validated once when constructed; the result's
``settings`` (and so its JSON) records them."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Optional

import numpy as np

from wbfe.errors import InvalidOptionError, unknown_name
from wbfe.theory.hierarchical.model import ACTIVATIONS, FEATURE_KINDS, feature_dim
from wbfe.theory.hierarchical.spectral import SOLVERS

__all__ = ["MAX_TRAIN_BYTES", "HierarchicalSettings"]

MAX_TRAIN_BYTES = 4 * 2**30  # the largest training draw kept in memory


def _is_int(value: Any, minimum: int) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, float)) and int(value) == value and value >= minimum


@dataclass(frozen=True)
class HierarchicalSettings:
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
        InvalidOptionError: an option out of range, or a largest training set over MAX_TRAIN_BYTES.
        UnknownNameError: unknown activation, feature kind or solver.
    """

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

    def __post_init__(self) -> None:
        a_min, a_max = self.alpha_min, self.alpha_max
        if not (math.isfinite(a_min) and math.isfinite(a_max) and 0.0 < a_min < a_max):
            raise InvalidOptionError(f"need 0 < alpha_min < alpha_max, not {a_min!r} and {a_max!r}")
        if not _is_int(self.points, 2):
            raise InvalidOptionError(f"points must be an integer >= 2, not {self.points!r}")
        if not _is_int(self.seeds, 1):
            raise InvalidOptionError(f"seeds must be a positive integer, not {self.seeds!r}")
        if not self.gamma > 0.5:
            raise InvalidOptionError(f"the sequential-recovery predictions need gamma > 1/2, not {self.gamma!r}")
        if not _is_int(self.n_test, 10):
            raise InvalidOptionError(f"n_test must be an integer >= 10, not {self.n_test!r}")
        if not _is_int(self.kernel_max_n, 0):
            raise InvalidOptionError(f"kernel_max_n must be a non-negative integer, not {self.kernel_max_n!r}")
        if not 0.0 < self.q_level < 1.0:
            raise InvalidOptionError(f"q_level must lie in (0, 1), not {self.q_level!r}")
        for kind, value, known in (("activation", self.activation, ACTIVATIONS),
                                   ("feature kind", self.features, FEATURE_KINDS), ("eigensolver", self.solver, SOLVERS)):
            if value not in known:
                raise unknown_name(kind, value, known)
        if not _is_int(self.d, 2):
            raise InvalidOptionError(f"d must be an integer >= 2, not {self.d!r}")
        ns = self.sample_sizes()
        width = self.d if self.features == "hermite" else feature_dim(int(self.d))
        if ns[-1] * width * 8 > MAX_TRAIN_BYTES:
            raise InvalidOptionError(
                f"n = {ns[-1]} samples of dimension {width} need {ns[-1] * width * 8 / 2**30:.1f} GiB "
                f"(limit {MAX_TRAIN_BYTES / 2**30:.0f} GiB); lower alpha_max or d"
            )

    def alphas(self) -> np.ndarray:
        """The α grid."""
        return np.linspace(self.alpha_min, self.alpha_max, int(self.points))

    def sample_sizes(self) -> list[int]:
        """n = round(d^α) at each α (at least 2)."""
        return [max(2, int(round(self.d**a))) for a in self.alphas()]

    def to_dict(self, *, p: int) -> dict[str, Any]:
        """The settings as recorded in a result, with ``D`` and the resolved number of features ``p``."""
        s = self
        return {"d": int(s.d), "D": feature_dim(int(s.d)), "p": p, "gamma": float(s.gamma), "eps": float(s.eps),
                "activation": s.activation, "features": s.features, "alpha_min": float(s.alpha_min),
                "alpha_max": float(s.alpha_max), "points": int(s.points), "seeds": int(s.seeds),
                "n_test": int(s.n_test), "kernel_max_n": int(s.kernel_max_n), "q_level": float(s.q_level),
                "solver": s.solver, "seed": int(s.seed)}
