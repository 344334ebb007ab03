"""``intra``: the spectra of products of consecutive layers' matrices (WeightWatcher 0.7.7's
``intra=True``), scored with the metric groups that need only a spectrum. The products and their
spectra are :mod:`wbfe.metrics.intra`'s; this module walks a checkpoint with the engine."""

from __future__ import annotations

from typing import Any, Iterable, Optional, Union

from wbfe import engine
from wbfe.errors import InvalidOptionError, NoUsableMatrixError
from wbfe.metrics import MetricOptions, resolve_groups
from wbfe.metrics.intra import intra_pairs
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
        ww_compatible: WeightWatcher's fitting choices (see :class:`MetricOptions`).
        layers: a regular expression selecting the weights that form the chain.
        sparsify, seed: see :func:`intra_pairs`.

    Returns:
        Rows ``{"name", "first", "second", "rows", "cols", "n_eigs", <columns>..., "reasons"}``.

    Raises:
        InvalidOptionError: a group that needs the matrices themselves (``vectors``, ``rand``).
        NoUsableMatrixError: fewer than two chaining weights.
    """
    groups = resolve_groups(metrics)
    for group in groups:
        if group.from_matrices is not None and group.name != "htsr":
            raise InvalidOptionError(f"metric group {group.name} needs the matrices themselves, not a product's spectrum")
    settings = ScoreOptions(metrics=tuple(g.name for g in groups), layers=layers, ww_compatible=ww_compatible,
                            seed=seed)
    pattern = settings.pattern
    options = MetricOptions.from_score_options(settings)
    with open_source(ref) as source:
        # The tensors as a score reads them (quantised weights dequantised, fused experts split).
        chain = ((e.name, e.load()) for e, consumed in engine.entries(source)
                 if consumed is None and e.skip is None and len(e.shape) >= 2
                 and e.dtype.startswith(("float", "bfloat")) and (pattern is None or pattern.search(e.name)))
        pairs = intra_pairs(chain, sparsify=sparsify, seed=seed)
    if not pairs:
        raise NoUsableMatrixError("no two consecutive weight matrices share a side: nothing to multiply")
    rows = []
    for pair in pairs:
        row: dict[str, Any] = {"name": pair.name, "first": pair.first, "second": pair.second,
                               "rows": pair.spectrum.rows, "cols": pair.spectrum.cols, "n_eigs": pair.spectrum.n_eigs}
        reasons: dict[str, str] = {}
        for group in groups:
            result = group.compute(pair.spectrum, options)
            row.update(result.values)
            reasons.update(result.reasons)
        row["reasons"] = reasons
        rows.append(row)
    return rows

