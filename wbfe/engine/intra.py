"""``intra``: the spectra of products of consecutive layers' matrices (WeightWatcher 0.7.7's
``intra=True``) alone, scored with the metric groups that need only a spectrum. The chain and the
products are the engine's (:class:`wbfe.engine.IntraChain`, as ``wbfe score --intra`` makes them);
only the matrices that form a product are read, and the matrices' own rows are not made."""

from __future__ import annotations

from typing import Any, Iterable, Optional, Union

from wbfe import engine
from wbfe.engine.matrices import MatrixPlan
from wbfe.errors import NoUsableMatrixError
from wbfe.linalg.spectra import DegenerateMatrixError
from wbfe.metrics import MetricOptions, resolve_groups
from wbfe.options import ScoreOptions
from wbfe.sources import open_source

__all__ = ["score_intra"]


def score_intra(
    ref: Any, *, metrics: Union[str, Iterable[str]] = "htsr", ww_compatible: bool = False,
    layers: Optional[str] = None, sparsify: bool = True, seed: int = 0,
) -> list[dict[str, Any]]:
    """Score the products of consecutive layers of a checkpoint, one row per pair.

    Args:
        ref: anything :func:`wbfe.sources.open_source` reads (an ``nn.Module`` included).
        metrics: groups that need only the spectrum (``htsr``, ``detx``, ``fingers``, ``htmp``, ``bfe``).
        ww_compatible: WeightWatcher's fitting choices (see :class:`MetricOptions`); matrices too
            small for it leave the chain, as WeightWatcher leaves them out of its layers.
        layers: a regular expression selecting the weights that form the chain.
        sparsify: WeightWatcher's default random 0/1 mask between the two (see
            :func:`wbfe.metrics.intra.intra_matrix`); seed: the masks' seed.

    Returns:
        Rows ``{"name", "first", "second", "rows", "cols", "n_eigs", <columns>..., "reasons"}``; a
        pair with a non-finite or all-zero factor has no columns, and says so in
        ``reasons["spectrum"]``.

    Raises:
        InvalidOptionError: a group that needs the matrices themselves (``vectors``, ``rand``).
        NoUsableMatrixError: no two consecutive weight matrices share a side.
    """
    groups = resolve_groups(metrics)
    settings = ScoreOptions(metrics=tuple(g.name for g in groups), layers=layers, ww_compatible=ww_compatible,
                            seed=seed, intra=True)
    options = MetricOptions.from_score_options(settings)
    products: list[engine.Product] = []
    with open_source(ref) as source:
        planned = [(entry, plan) for entry, plan in engine.stream(source, settings) if isinstance(plan, MatrixPlan)]
        description = source.description
        chain = engine.IntraChain.in_order(seed, [plan for _, plan in planned],
                                           description.order if description is not None else None,
                                           description.aliases if description is not None else None, sparsify=sparsify,
                                           ww_compatible=ww_compatible)
        for entry, plan in planned:
            if chain.needs(plan.name):
                products += chain.follow(plan, engine.matrices_of(entry.load(), plan, ww_compatible=ww_compatible))
    if not products:
        raise NoUsableMatrixError("no two consecutive weight matrices share a side: nothing to multiply")
    rows = []
    for product in products:
        spec = product.job()
        row: dict[str, Any] = {"name": product.plan.name, "first": product.first, "second": product.second,
                               "rows": product.plan.rows, "cols": product.plan.cols}
        if isinstance(spec, DegenerateMatrixError):
            rows.append({**row, "n_eigs": 0, "reasons": {"spectrum": str(spec)}})
            continue
        row["n_eigs"] = spec.n_eigs
        reasons: dict[str, str] = {}
        for group in groups:
            result = group.compute(spec, options)
            row.update(result.values)
            reasons.update(result.reasons)
        row["reasons"] = reasons
        rows.append(row)
    return rows
