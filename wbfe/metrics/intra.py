"""Products of consecutive layers (WeightWatcher 0.7.7's ``intra=True``), scored with the metric groups.

For consecutive weight matrices W₀, W₁ of the stream (WeightWatcher's ``WWIntraLayerIterator``):

- align them on a shared side (``align_mats``): W₀ is transposed unless its second side is the
  shared one, W₁ unless its first side is; a pair without a shared side is skipped;
- X = W₀·W₁ / (‖W₀‖_F·‖W₁‖_F), or with ``sparsify`` (WeightWatcher's default) X = W₀·S·W₁ /
  (‖W₀‖_F·‖W₁‖_F + √‖S‖_F) with S a random 0/1 matrix on the shared side (its normalisation,
  marked "probably wrong" in its source, is kept); S is drawn with NumPy's legacy generator seeded
  by ``seed``, pair after pair, so ``np.random.seed(seed)`` before WeightWatcher's ``analyze``
  draws the same S;
- the "eigenvalues" analysed are the *singular values* of X, not their squares
  (``combined_eigenvalues`` with ``INTRA``: ``evals = sv``), so a group's ``lambda_max`` is σ_max(X)
  and ``alpha`` is the tail exponent of the singular values. Only the largest ``n_comp`` of them are
  kept, n_comp = min side of W₁ (WeightWatcher copies the second layer's ``num_components``).

Here the pairs are consecutive 2-D float weights in the order the source gives them (a model's
module order); a tensor of another rank ends the chain and starts a new one. (WeightWatcher pairs
a convolution by its first kernel slice; the engine's chain does so in WeightWatcher-compatible
mode, :mod:`wbfe.engine.products`.) Each pair is scored by
:func:`wbfe.engine.score_intra` with the groups that work from a spectrum alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Optional

import numpy as np

from wbfe.linalg.arrays import to_numpy
from wbfe.metrics._group import Spectrum

__all__ = ["IntraPair", "align_pair", "aligned_shapes", "intra_mask", "intra_matrix", "intra_spectrum", "intra_pairs"]


@dataclass(frozen=True)
class IntraPair:
    """One product of consecutive layers: ``name`` is ``"<first> X <second>"``."""

    name: str
    first: str
    second: str
    spectrum: Spectrum


def align_pair(w0: np.ndarray, w1: np.ndarray) -> Optional[tuple[np.ndarray, np.ndarray]]:
    """WeightWatcher's ``align_mats``: (W₀, W₁) oriented so that W₀·W₁ is defined, or None.

    The shared side is the largest side length that occurs twice among the four; WeightWatcher
    then transposes each matrix that does not have it in the needed place, and skips the pair if
    the product is still undefined.
    """
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
    return rng.randint(2, size=m * m).reshape((m, m))


def intra_matrix(w0: np.ndarray, w1: np.ndarray, *, rng: Optional[np.random.RandomState] = None,
                 mask: Optional[np.ndarray] = None) -> Optional[np.ndarray]:
    """X = W₀·W₁/(‖W₀‖·‖W₁‖) after :func:`align_pair`, in float64; None when they do not chain.

    Args:
        rng: with a generator, WeightWatcher's ``sparsify``: X = W₀·S·W₁/(‖W₀‖·‖W₁‖ + √‖S‖),
            S = :func:`intra_mask` of the shared side.
        mask: that S, drawn already (the engine draws the masks in stream order, then multiplies
            on a worker).
    """
    aligned = align_pair(np.asarray(w0, dtype=np.float64), np.asarray(w1, dtype=np.float64))
    if aligned is None:
        return None
    a, b = aligned
    norm = np.linalg.norm(a) * np.linalg.norm(b)
    if rng is not None:
        mask = intra_mask(rng, b.shape[0])
    if mask is None:
        return np.dot(a, b) / norm
    return np.dot(np.dot(a, mask), b) / (norm + np.sqrt(np.linalg.norm(mask)))


def intra_spectrum(x: np.ndarray, n_comp: int) -> Spectrum:
    """The spectrum WeightWatcher analyses for X: its largest ``n_comp`` singular values."""
    sv = np.sort(np.linalg.svd(x, compute_uv=False))[-n_comp:]
    return Spectrum(eigs=sv, rows=int(x.shape[0]), cols=int(x.shape[1]))


def intra_pairs(weights: Iterable[tuple[str, Any]], *, sparsify: bool = True, seed: int = 0) -> list[IntraPair]:
    """The products of consecutive 2-D weights of ``(name, tensor or array)`` in order.

    Args:
        weights: the chain, in order.
        sparsify: WeightWatcher's default random 0/1 mask between the two (see :func:`intra_matrix`).
        seed: seed of the masks.

    Returns:
        One :class:`IntraPair` per chaining pair; pairs that share no side are left out (as
        WeightWatcher skips them).
    """
    pairs: list[IntraPair] = []
    rng = np.random.RandomState(seed) if sparsify else None
    previous: Optional[tuple[str, np.ndarray]] = None
    for name, tensor in weights:
        w = to_numpy(tensor).astype(np.float64)
        if w.ndim != 2:
            previous = None
            continue
        if previous is not None:
            x = intra_matrix(previous[1], w, rng=rng)
            if x is not None:
                pairs.append(IntraPair(f"{previous[0]} X {name}", previous[0], name,
                                       intra_spectrum(x, min(w.shape))))
        previous = (name, w)
    return pairs
