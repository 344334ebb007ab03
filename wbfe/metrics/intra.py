"""Products of consecutive layers (WeightWatcher 0.7.7's ``intra=True``), scored with the metric groups.

The definition (alignment, the ``sparsify`` mask, the singular values analysed) is in docs/metrics.md (Products of
consecutive layers); the engine's chain is :mod:`wbfe.engine.products`."""

from __future__ import annotations

import math
from typing import Optional

import numpy as np

from wbfe.errors import InvalidOptionError
from wbfe.linalg.spectra import DegenerateMatrixError, near_one
from wbfe.options.constraints import Integer
from wbfe.metrics._group import Spectrum

__all__ = ["align_pair", "aligned_shapes", "intra_mask", "intra_matrix", "intra_spectrum"]


def align_pair(w0: np.ndarray, w1: np.ndarray) -> Optional[tuple[np.ndarray, np.ndarray]]:
    """WeightWatcher's ``align_mats``: (W₀, W₁) oriented so that W₀·W₁ is defined (the shared side is the largest side
    length that occurs twice among the four), or None."""
    flips = aligned_shapes(w0.shape, w1.shape)
    if flips is None:
        return None
    return (w0.T if flips[0] else w0), (w1.T if flips[1] else w1)


def aligned_shapes(s0: tuple[int, ...], s1: tuple[int, ...]) -> Optional[tuple[bool, bool, int]]:
    """:func:`align_pair` from the shapes alone: (transpose W₀?, transpose W₁?, shared side m), or None."""
    shapes = [s0[0], s0[1], s1[0], s1[1]]
    repeated = [x for x in set(shapes) if shapes.count(x) > 1]
    flip0 = flip1 = False
    if repeated:
        shared = max(repeated)
        flip0, flip1 = s0[1] != shared, s1[0] != shared
    inner0, inner1 = (s0[0] if flip0 else s0[1]), (s1[1] if flip1 else s1[0])
    return (flip0, flip1, int(inner1)) if inner0 == inner1 else None


def intra_mask(rng: np.random.RandomState, m: int) -> np.ndarray:
    """WeightWatcher's ``sparsify`` mask S for a shared side m: ``rng.randint(2, size=m·m)`` as m × m."""
    try:
        m = Integer(1).check(m)
    except ValueError:
        raise InvalidOptionError(f"the sparsify mask needs a shared side m, a whole number >= 1, not {m!r}") from None
    return rng.randint(2, size=m * m).reshape((m, m))


def intra_matrix(w0: np.ndarray, w1: np.ndarray, *, rng: Optional[np.random.RandomState] = None,
                 mask: Optional[np.ndarray] = None) -> Optional[np.ndarray]:
    """X = W₀·W₁/(‖W₀‖·‖W₁‖) after :func:`align_pair`, in float64; None when they do not chain.

    With ``rng`` (WeightWatcher's ``sparsify``), or ``mask`` drawn already, X = W₀·S·W₁/(‖W₀‖·‖W₁‖ + √‖S‖).

    Raises:
        DegenerateMatrixError: that masked X is nonzero but too small for float64 (weights around 1e-160 or less)."""
    aligned = align_pair(np.asarray(w0, dtype=np.float64), np.asarray(w1, dtype=np.float64))
    if aligned is None:
        return None
    a, b = aligned
    if rng is not None:
        mask = intra_mask(rng, b.shape[0])
    if mask is not None:
        return _masked(a, mask, b)
    with np.errstate(over="ignore", invalid="ignore"):  # inf (or 0·inf) is the signal for the rescale, not a warning
        norm = np.linalg.norm(a) * np.linalg.norm(b)
    if not 0.0 < norm < math.inf:  # X is free of either factor's scale: each brought near 1 (exactly) first
        a, b = near_one(a)[0], near_one(b)[0]
        norm = np.linalg.norm(a) * np.linalg.norm(b)
    return np.dot(a, b) / norm


def _masked(a: np.ndarray, mask: np.ndarray, b: np.ndarray) -> np.ndarray:
    """W₀·S·W₁/(‖W₀‖·‖W₁‖ + √‖S‖), which is not free of the weights' scale, computed from 2^k₀·W₀ and 2^k₁·W₁
    (each brought near 1 exactly, k₀ = k₁ = 0 in float64's usual range): with k = k₀ + k₁ it is
    2^-k·(2^k₀W₀)·S·(2^k₁W₁)/(2^-k·‖2^k₀W₀‖·‖2^k₁W₁‖ + √‖S‖)."""
    (a, fa), (b, fb) = near_one(a), near_one(b)
    k = (math.frexp(fa)[1] - 1) + (math.frexp(fb)[1] - 1)  # fa, fb are powers of two
    root = np.sqrt(np.linalg.norm(mask))
    num, norm = np.dot(np.dot(a, mask), b), np.linalg.norm(a) * np.linalg.norm(b)
    if k <= 0:  # large weights (or k = 0: as computed unscaled): the mask's term only shrinks
        return num / (norm + math.ldexp(root, k))
    y = num / (math.ldexp(norm, -k) + root)
    top = float(np.max(np.abs(y))) if y.size else 0.0
    if top and math.ldexp(top, -k) < np.finfo(np.float64).tiny:  # its entries would be subnormal or zero
        raise DegenerateMatrixError(
            f"the sparsify product of two consecutive matrices is below float64's range (largest entry about "
            f"1e{math.log10(top) - k * math.log10(2.0):.0f}): WeightWatcher's W₀·S·W₁/(‖W₀‖·‖W₁‖ + √‖S‖) keeps the "
            f"weights' scale; rescale them")
    return np.ldexp(y, -k)


def intra_spectrum(x: np.ndarray, n_comp: int) -> Spectrum:
    """The spectrum WeightWatcher analyses for X: its largest ``n_comp`` singular values."""
    sv = np.sort(np.linalg.svd(x, compute_uv=False))[-n_comp:]
    return Spectrum(eigs=sv, rows=int(x.shape[0]), cols=int(x.shape[1]))
