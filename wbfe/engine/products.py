"""Extra matrices made from consecutive entries of the stream: the products of consecutive weight
matrices that WeightWatcher 0.7.7 analyses with ``intra=True`` (:mod:`wbfe.metrics.intra`), each
scored as one more row (role and convention ``intra``, named ``"<first> X <second>"``) right after
the row of its second matrix.

The chain is the stream's 2-D matrices in order, as :func:`wbfe.metrics.intra.intra_pairs` walks
them: an entry that is skipped (a bias, a norm, one not selected by ``--layers``, one too small in
WeightWatcher-compatible mode, which WeightWatcher leaves out of its layers too) is passed over; a
conv kernel ends the chain. The ``sparsify`` masks are drawn here, in stream order, from NumPy's
legacy generator seeded with ``options.seed``, so the products do not depend on which worker
multiplies them; ``np.random.seed(seed)`` before WeightWatcher's ``analyze`` draws the same masks.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple, Optional

import numpy as np

from wbfe.matrices import MatrixPlan
from wbfe.metrics.intra import align_pair, intra_mask, intra_matrix, intra_spectrum
from wbfe.sources import TensorEntry
from wbfe.spectra import DegenerateMatrixError

__all__ = ["Product", "IntraChain", "INTRA"]

INTRA = "intra"
"""The role and the convention of a product's row."""


class Product(NamedTuple):
    """One product to score: a stand-in entry (its ``load`` multiplies), its plan, its spectrum job."""

    entry: TensorEntry
    plan: MatrixPlan
    job: Callable[[], Any]


class IntraChain:
    """Follows the stream's matrices and makes the product of each with the one before it."""

    def __init__(self, seed: int, *, sparsify: bool = True) -> None:
        self.rng = np.random.RandomState(seed) if sparsify else None
        self.previous: Optional[tuple[str, np.ndarray]] = None

    def follow(self, plan: MatrixPlan, matrices: list[Any]) -> Optional[Product]:
        """The product of this entry's matrix with the previous one's, or None (the first of a
        chain, a pair without a shared side, or a conv kernel, which ends the chain)."""
        if plan.convention != "dense" or len(matrices) != 1:
            self.previous = None
            return None
        w = matrices[0].detach().cpu().double().numpy()
        previous, self.previous = self.previous, (plan.name, w)
        if previous is None:
            return None
        aligned = align_pair(previous[1], w)
        if aligned is None:
            return None
        a, b = aligned
        mask = intra_mask(self.rng, b.shape[0]) if self.rng is not None else None
        name, n_comp = f"{previous[0]} X {plan.name}", min(w.shape)
        shape = (int(a.shape[0]), int(b.shape[1]))

        def job() -> Any:
            if not (np.isfinite(a).all() and np.isfinite(b).all()):
                return DegenerateMatrixError("non-finite values (NaN or Inf) in a factor")
            if not (a.any() and b.any()):
                return DegenerateMatrixError("an all-zero factor")
            x = intra_matrix(a, b, mask=mask)
            assert x is not None  # aligned above
            return intra_spectrum(x, n_comp)

        def load() -> Any:
            import torch

            return torch.from_numpy(intra_matrix(a, b, mask=mask))

        entry = TensorEntry(name, shape, "float64", load)
        return Product(entry, MatrixPlan(name, INTRA, shape, "float64", INTRA, *shape, 1, kept=n_comp), job)
