"""One checkpoint scored in this process, from an open source to its :class:`ModelScore`: the engine's whole path, which
the local executor runs and the other features call; and the parts of it that answer one question about a checkpoint:
one matrix's spectrum, some matrices' eigenvalues, the products of consecutive layers alone (:func:`score_intra`)."""

from __future__ import annotations

import math
from typing import Any, Callable, Iterable, Optional, Union

import numpy as np

from wbfe._provenance import installed_versions
from wbfe.engine.context import Context
from wbfe.engine.jobs import planned_spectrum
from wbfe.engine.matrices import ConvView, MatrixPlan, Skip
from wbfe.engine.pipeline import Pipeline
from wbfe.engine.plan import PlannedEntry, entries, matrices_of, plan_entry, stream
from wbfe.engine.products import IntraChain
from wbfe.engine.result import ModelScore, finish
from wbfe.engine.run import run
from wbfe.engine.ties import SeenContent
from wbfe.errors import InvalidOptionError, NoUsableMatrixError, name_hint
from wbfe.linalg.spectra import DegenerateMatrixError, resolve_device
from wbfe.metrics import resolve_groups
from wbfe.options import ScoreOptions, check_conv
from wbfe.sources import TensorEntry, open_source

__all__ = ["Progress", "DESCRIBING", "score_source", "provenance_of", "layer_spectrum", "eigenvalues_of", "score_intra"]

# progress(done, total, tensor name); total may be None when unknown.
Progress = Callable[[int, Optional[int], str], None]
# What progress is told while the model's description is read, before any matrix.
DESCRIBING = "reading the model's description"


def provenance_of(source_provenance: dict[str, Any], context: Context) -> dict[str, Any]:
    """A score's ``model`` field: the source's provenance, the device, library versions, options."""
    return {**source_provenance, "device": str(context.device), "versions": installed_versions(),
            "options": context.options.to_dict()}


def score_source(source: Any, options: ScoreOptions, *, progress: Optional[Progress] = None,
                 allow_empty: bool = False) -> ModelScore:
    """Score every matrix of an open :class:`~wbfe.sources.TensorSource` in this process.

    ``progress`` is called with (0, None, :data:`DESCRIBING`) where a ``config.json`` describes the checkpoint, with (0,
    total, "") before the first matrix, then with (done, total, name) as each matrix's spectrum (or skip) is finished.
    The total counts every matrix where the source reads headers only, else is None. Raises NoUsableMatrixError when
    every weight matrix was skipped, unless ``allow_empty`` (an adapter's tensors saved whole, beside its modules)."""
    context = Context.of(options)
    progress = progress or (lambda done, total, name: None)
    layers: list[dict[str, Any]] = []
    skipped: list[dict[str, Any]] = []
    planned: Iterable[PlannedEntry] = stream(source, options)
    if source.config is not None:
        # Building the description (importing its framework) can take seconds: a bar says so.
        progress(0, None, DESCRIBING)
    total: Optional[int] = None
    if source.headers_only:  # nothing is read to list them: the total is known up front
        planned = list(planned)
        total = sum(isinstance(p.plan, MatrixPlan) for p in planned)
    count = 0

    def record(entry: TensorEntry, item: Union[Skip, dict[str, Any]]) -> None:
        if isinstance(item, Skip):
            skipped.append(item.to_dict())
        else:
            layers.append(item)

    def done(entry: TensorEntry) -> None:
        nonlocal count
        count += 1
        progress(count, None if total is None else max(total, count), entry.name)

    description = source.description  # records which description was used in the provenance
    chain = None
    if options.intra and isinstance(planned, list):  # every plan known: the chain in the model's order
        chain = IntraChain.in_order(options.seed, [p.plan for p in planned if isinstance(p.plan, MatrixPlan)],
                                    description, ww_slices=options.conventions.ww_slices)
    progress(0, total, "")  # the total at once, before the first spectrum (a bar reads 0/N, not 0/?)
    with Pipeline(context.device) as pipeline:
        run(pipeline, planned, context, SeenContent(), record, done, chain)
    model = provenance_of(source.provenance.to_dict(), context)
    return finish(model, layers, skipped, context.groups, head=options.head, head_hint=source.head_hint,
                  config=source.config, description=description, allow_empty=allow_empty)


def layer_spectrum(ref: Any, layer: str, *, conv: ConvView = "flatten", device: str = "auto") -> tuple[MatrixPlan, Any]:
    """The plan and :class:`~wbfe.metrics.Spectrum` of one named matrix (or module name) of a checkpoint.

    Raises:
        InvalidOptionError: no such tensor (close names are suggested), or it is not a matrix.
        DegenerateMatrixError: the matrix is non-finite or all zero.
    """
    check_conv(conv)
    torch_device = resolve_device(device)
    names: list[str] = []
    with open_source(ref) as source:
        for entry, consumed in entries(source):
            names.append(entry.name)
            if entry.name not in (layer, f"{layer}.weight"):
                continue
            plan = plan_entry(entry, consumed, conv=conv)
            if isinstance(plan, Skip):
                raise InvalidOptionError(f"{entry.name} is not a weight matrix ({plan.reason})")
            return plan, planned_spectrum(matrices_of(entry.load(), plan), plan, torch_device)
        where = source.provenance.source  # an in-memory state dict's name, not its every value
    raise InvalidOptionError(f"no tensor named {layer!r} in {where}{name_hint(layer, names, where)}")


def eigenvalues_of(ref: Any, names: Iterable[str], options: ScoreOptions) -> dict[str, tuple[np.ndarray, int]]:
    """The eigenvalues of each named matrix of ``ref``, computed as a score under ``options`` did
    (conv view, WeightWatcher mode, device): one pass over the stream, only the wanted
    tensors loaded. A name the checkpoint lacks, or that is not a matrix, is absent.

    Returns:
        ``{name: (eigs, k)}``: the true eigenvalues × 2^k, as the score stored them (k ≠ 0 only for a matrix whose
        Gram matrix would leave float64's range; its true eigenvalues may too, so they are not multiplied back).
    """
    wanted = set(names)
    device = resolve_device(options.device)
    out: dict[str, tuple[np.ndarray, int]] = {}
    with open_source(ref) as source:
        for entry, plan in stream(source, options):
            if entry.name not in wanted or isinstance(plan, Skip):
                continue
            spec = planned_spectrum(matrices_of(entry.load(), plan, ww_slices=options.conventions.ww_slices), plan, device)
            assert spec.eigs is not None  # asked for
            # log_scale is −k·ln 2 exactly for the power of two the matrix was scaled by (wbfe.linalg.spectra)
            out[entry.name] = np.asarray(spec.eigs, dtype=float), round(-spec.log_scale / math.log(2.0))
            if len(out) == len(wanted):
                break
    return out


def score_intra(
    ref: Any, *, metrics: Union[str, Iterable[str]] = "htsr", ww_compatible: bool = False,
    layers: Optional[str] = None, sparsify: bool = True, seed: int = 0,
) -> list[dict[str, Any]]:
    """Score the products of consecutive layers of ``ref`` (anything :func:`wbfe.sources.open_source` reads) alone, one
    row per pair, as ``wbfe score --intra`` makes them (WeightWatcher 0.7.7's ``intra=True``; ``sparsify``: its random
    0/1 mask, seeded by ``seed``), with the ``metrics`` groups, which must need only a spectrum; ``layers`` is a regular
    expression selecting the chain's weights, and only those that form a product are read. Under ``ww_compatible``
    matrices too small for WeightWatcher leave the chain, as it leaves them out of its layers.

    Returns:
        Rows ``{"name", "first", "second", "rows", "cols", "n_eigs", <columns>..., "reasons"}``; a pair with a
        non-finite or all-zero factor has no columns, and says so in ``reasons["spectrum"]``.

    Raises:
        InvalidOptionError: a group that needs the matrices themselves (``vectors``, ``rand``).
        NoUsableMatrixError: no two consecutive weight matrices share a side.
    """
    groups = resolve_groups(metrics)
    # The products' spectra are float64 on the CPU whatever the device (wbfe.metrics.intra).
    settings = ScoreOptions(metrics=tuple(g.name for g in groups), layers=layers, ww_compatible=ww_compatible,
                            seed=seed, intra=True, device="cpu")
    context = Context.of(settings)
    pairs: dict[str, tuple[str, str]] = {}
    rows: list[dict[str, Any]] = []

    def collect(pipeline: Pipeline, wait: bool = False) -> None:
        for _, plan, spec in pipeline.finished(wait=wait):
            assert isinstance(plan, MatrixPlan)
            first, second = pairs[plan.name]
            row: dict[str, Any] = {"name": plan.name, "first": first, "second": second, "rows": plan.rows,
                                   "cols": plan.cols}
            if isinstance(spec, DegenerateMatrixError):
                rows.append({**row, "n_eigs": 0, "reasons": {"spectrum": str(spec)}})
                continue
            outs = [group.compute(spec, context.metric_options) for group in context.groups]
            rows.append({**row, "n_eigs": spec.n_eigs, **{k: v for out in outs for k, v in out.values.items()},
                         "reasons": {k: v for out in outs for k, v in out.reasons.items()}})

    with open_source(ref) as source, Pipeline(context.device) as pipeline:
        planned = [(entry, plan) for entry, plan in stream(source, settings) if isinstance(plan, MatrixPlan)]
        chain = IntraChain.in_order(seed, [plan for _, plan in planned], source.description, sparsify=sparsify,
                                    ww_slices=settings.conventions.ww_slices)
        for entry, plan in planned:
            if not chain.needs(plan.name):
                continue
            for product in chain.follow(plan, matrices_of(entry.load(), plan, ww_slices=settings.conventions.ww_slices)):
                pairs[product.plan.name] = (product.first, product.second)
                pipeline.compute(product.entry, product.plan, product.job)
            collect(pipeline)
        collect(pipeline, wait=True)
    if not rows:
        raise NoUsableMatrixError("no two consecutive weight matrices share a side: nothing to multiply")
    return rows
