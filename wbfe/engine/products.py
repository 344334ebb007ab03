"""The products of consecutive weight matrices that WeightWatcher 0.7.7 analyses with ``intra=True``, each scored as one
more row (role and convention ``intra``, named ``"<first> X <second>"``) right after its second matrix's
(docs/metrics.md, Products of consecutive layers). A matrix is held (as float64) only until its products are made."""

from __future__ import annotations

import copy
from typing import Any, Callable, NamedTuple, Optional, Sequence

import numpy as np

from wbfe.engine.matrices import MatrixPlan
from wbfe.framework import order_rows
from wbfe.linalg.arrays import to_numpy
from wbfe.linalg.spectra import DegenerateMatrixError
from wbfe.metrics.intra import aligned_shapes, intra_mask, intra_matrix, intra_spectrum
from wbfe.metrics.ww_compat import ww_intra_member, ww_intra_member_shape
from wbfe.sources import TensorEntry

__all__ = ["Product", "IntraChain", "INTRA"]

INTRA = "intra"
"""The role and the convention of a product's row."""


class Product(NamedTuple):
    """One product to score: a stand-in entry (its ``load`` multiplies), its plan, its spectrum job
    (a :class:`~wbfe.linalg.spectra.Spectrum`, or the :class:`DegenerateMatrixError` saying why none), and
    the names of its two matrices."""

    entry: TensorEntry
    plan: MatrixPlan
    job: Callable[[], Any]
    first: str
    second: str


class _Member(NamedTuple):
    """One matrix of the chain: what enters the product, how many values a product with it second
    keeps, and the factor such a product is scaled by."""

    matrix: np.ndarray
    n_comp: int
    scale: float


class _Pair(NamedTuple):
    first: str
    second: str
    rng: Optional[np.random.RandomState]  # the generator as this pair's mask draws from it (None: no mask)


class IntraChain:
    """Follows the stream's matrices and makes the products of consecutive ones.

    Built with :meth:`in_order` when every plan is known before the first tensor is read (the
    chain in the model's order); otherwise the chain is the stream's order, found as it goes."""

    def __init__(self, seed: int, *, sparsify: bool = True, ww_slices: bool = False) -> None:
        self.rng = np.random.RandomState(seed) if sparsify else None
        self.ww_slices = ww_slices  # Conventions.ww_slices: WeightWatcher's conv slices join the chain
        self.previous: Optional[str] = None
        self.pairs: Optional[dict[str, list[_Pair]]] = None  # by member, when planned up front
        self.held: dict[str, _Member] = {}

    @classmethod
    def in_order(cls, seed: int, plans: Sequence[MatrixPlan], description: Any = None, *, sparsify: bool = True,
                 ww_slices: bool = False) -> "IntraChain":
        """The chain of ``plans`` (the stream's matrices) in the order of the model's ``description`` (stream order
        where None), its pairs and their masks' generator states fixed here, in chain order."""
        chain = cls(seed, sparsify=sparsify, ww_slices=ww_slices)
        order, aliases = (description.order, description.aliases) if description is not None else (None, None)
        pairs: dict[str, list[_Pair]] = {}
        previous: Optional[tuple[int, int]] = None
        previous_name = ""
        for row in order_rows([{"name": plan.name, "plan": plan} for plan in plans], order, aliases):
            plan = row["plan"]
            if (shape := chain.member_shape(plan)) is None:
                previous = None
                continue
            if previous is not None and (aligned := aligned_shapes(previous, shape)) is not None:
                pair = _Pair(previous_name, plan.name, copy.deepcopy(chain.rng))
                if chain.rng is not None:
                    intra_mask(chain.rng, aligned[2])  # advance as WeightWatcher's draw does
                pairs.setdefault(pair.first, []).append(pair)
                pairs.setdefault(pair.second, []).append(pair)
            previous, previous_name = shape, plan.name
        chain.pairs = pairs
        return chain

    def member_shape(self, plan: MatrixPlan) -> Optional[tuple[int, int]]:
        """The shape of the matrix ``plan`` enters the chain with; None: it ends the chain."""
        if plan.convention == "dense":
            return plan.rows, plan.cols
        if self.ww_slices and plan.convention == "slices" and len(plan.shape) == 4:
            return ww_intra_member_shape(plan.shape)
        return None

    def _member(self, plan: MatrixPlan, matrices: list[Any]) -> _Member:
        if plan.convention == "dense":
            w = to_numpy(matrices[0]).astype(np.float64)
            return _Member(w, min(w.shape), 1.0)
        return _Member(*ww_intra_member(plan.shape, matrices))

    def needs(self, name: str) -> bool:
        """Whether a matrix is part of a product still to make (always True before :meth:`in_order`'s
        chain is known: the stream's order finds it as it goes)."""
        return self.pairs is None or bool(self.pairs.get(name))

    def follow(self, plan: MatrixPlan, matrices: Optional[list[Any]]) -> list[Product]:
        """The products this entry completes; ``matrices`` None for a planned matrix that has
        none after all (a tied copy): its products are not made."""
        if self.pairs is None:
            return self._follow_stream(plan, matrices)
        mine = self.pairs.get(plan.name, [])
        if matrices is None or not mine:
            for pair in mine:  # a tied copy's partners need not wait for it
                self._release(pair)
            return []
        self.held[plan.name] = self._member(plan, matrices)
        out = []
        for pair in mine:
            if pair.first in self.held and pair.second in self.held:
                out.append(_product(pair.first, self.held[pair.first], pair.second, self.held[pair.second], pair.rng))
                self._release(pair)
        return out

    def _release(self, pair: _Pair) -> None:
        """``pair`` is done (made, or abandoned): a member with no pair left is no longer held."""
        assert self.pairs is not None
        for name in (pair.first, pair.second):
            left = [p for p in self.pairs.get(name, []) if p is not pair]
            self.pairs[name] = left
            if not left:
                self.held.pop(name, None)

    def _follow_stream(self, plan: MatrixPlan, matrices: Optional[list[Any]]) -> list[Product]:
        if matrices is None:
            return []
        if self.member_shape(plan) is None or (plan.convention == "dense" and len(matrices) != 1):
            self.previous = None
            self.held.clear()
            return []
        w = self._member(plan, matrices)
        previous, self.previous = self.previous, plan.name
        before = self.held.pop(previous) if previous is not None else None
        self.held = {plan.name: w}
        if previous is None or before is None or aligned_shapes(before.matrix.shape, w.matrix.shape) is None:
            return []
        return [_product(previous, before, plan.name, w, self.rng)]


def _product(first: str, m0: _Member, second: str, m1: _Member, rng: Optional[np.random.RandomState]) -> Product:
    """The product of ``m0`` and ``m1`` (aligned, with its mask drawn from ``rng`` unless None) as a stand-in entry,
    its plan and its spectrum job."""
    flips = aligned_shapes(m0.matrix.shape, m1.matrix.shape)
    assert flips is not None
    a, b = (m0.matrix.T if flips[0] else m0.matrix), (m1.matrix.T if flips[1] else m1.matrix)
    mask = intra_mask(rng, flips[2]) if rng is not None else None
    shape = (int(a.shape[0]), int(b.shape[1]))
    # WeightWatcher keeps the second's count, capped here at what the product has
    name, n_comp, scale = f"{first} X {second}", min(m1.n_comp, *shape), m1.scale

    def product() -> Optional[np.ndarray]:
        x = intra_matrix(a, b, mask=mask)
        return x if x is None or scale == 1.0 else x * scale

    def job() -> Any:
        if not (np.isfinite(a).all() and np.isfinite(b).all()):
            return DegenerateMatrixError("non-finite values (NaN or Inf) in a factor")
        if not (a.any() and b.any()):
            return DegenerateMatrixError("an all-zero factor")
        try:
            x = product()
        except DegenerateMatrixError as exc:  # a sparsify product below float64's range
            return exc
        assert x is not None  # aligned above
        return intra_spectrum(x, n_comp)

    plan = MatrixPlan(name, INTRA, shape, "float64", INTRA, *shape, 1, kept=n_comp)
    return Product(TensorEntry(name, shape, "float64", product), plan, job, first, second)
