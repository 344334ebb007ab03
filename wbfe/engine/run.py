"""The engine's loop: planned entries are read, checked for ties, turned into matrices and handed to the pipeline's
workers; finished spectra become rows, recorded in stream order. A local score and each Ray part run this one loop, so
their rows agree exactly. With ``options.intra`` the products of consecutive matrices
(:mod:`wbfe.engine.products`) are scored in the same loop, each right after its second matrix."""

from __future__ import annotations

import functools
from typing import Any, Callable, Iterable, Optional, Protocol, Union

from wbfe.engine.context import Context
from wbfe.engine.jobs import spectrum_of
from wbfe.engine.products import IntraChain
from wbfe.engine.matrices import MatrixPlan, Plan, Skip
from wbfe.engine.pipeline import Pipeline
from wbfe.engine.plan import PlannedEntry, matrices_of
from wbfe.engine.rows import Record, RowMaker
from wbfe.engine.ties import shared_storage
from wbfe.linalg.spectra import DegenerateMatrixError
from wbfe.sources import TensorEntry

__all__ = ["run", "Ties", "Done"]

# done(entry): called in stream order as each matrix's spectrum (or skip) is finished.
Done = Callable[[TensorEntry], None]


class Ties(Protocol):
    """Finds a tensor whose bytes equal an earlier one's (see :class:`wbfe.engine.ties.SeenContent`)."""

    def earlier_copy(self, entry: TensorEntry, tensor: Any) -> Optional[str]: ...


def run(pipeline: Pipeline, planned: Iterable[PlannedEntry], context: Context, ties: Ties, record: Record,
        done: Optional[Done] = None, chain: Optional[IntraChain] = None) -> None:
    """Score every planned entry (the stream, or a part of it) on an entered ``pipeline``, calling ``record(entry,
    skip_or_row)`` in stream order as rows are made, and ``done(entry)`` per matrix as soon as its spectrum is finished
    (rows may be held back to fit equal-shaped spectra together). ``ties`` finds byte-identical earlier tensors;
    ``chain`` (with ``options.intra``) is :meth:`IntraChain.in_order` when the stream is planned up front, else the
    stream's order."""
    storage: dict[Any, str] = {}
    rows = RowMaker(context, record)
    if chain is None and context.options.intra:
        chain = IntraChain(context.options.seed, ww_slices=context.options.conventions.ww_slices)

    def collect(wait: bool = False) -> None:
        for entry, plan, outcome in pipeline.finished(wait=wait):
            if done is not None and isinstance(plan, MatrixPlan):
                done(entry)
            rows.add(entry, plan, outcome)

    for entry, plan in planned:
        prepared = _prepare(entry, plan, context, storage, ties)
        products = (chain.follow(plan, None if isinstance(prepared, Skip) else prepared)
                    if chain is not None and isinstance(plan, MatrixPlan) else [])
        if isinstance(prepared, Skip):
            pipeline.put(entry, prepared)
        else:
            assert isinstance(plan, MatrixPlan)
            pipeline.compute(entry, plan, functools.partial(spectrum_of, prepared, context, entry.name, plan=plan))
        for product in products:  # their rows follow this entry's
            pipeline.compute(product.entry, product.plan, product.job)
        del prepared  # the job holds the tensor now, and frees it when done
        collect()
    collect(wait=True)
    rows.flush()


def _prepare(
    entry: TensorEntry, plan: Plan, context: Context, storage: dict[Any, str], ties: Ties,
) -> Union[Skip, list[Any]]:
    """The entry's matrices, or why it is skipped before any linear algebra."""
    if isinstance(plan, Skip):
        return plan
    if (shared := shared_storage(entry, storage)) is not None:
        return shared
    tensor = entry.load()
    if (earlier := ties.earlier_copy(entry, tensor)) is not None:
        return Skip(entry.name, f"tied: identical to {earlier}", entry.shape, entry.dtype)
    try:
        return matrices_of(tensor, plan, ww_slices=context.options.conventions.ww_slices)
    except DegenerateMatrixError as exc:  # WeightWatcher's float32 view of a finite tensor: skipped with why
        return Skip(entry.name, str(exc), entry.shape, entry.dtype)
