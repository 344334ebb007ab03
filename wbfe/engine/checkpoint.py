"""One checkpoint scored in this process, from an open source to its :class:`ModelScore`: the
engine's whole path, which the local executor runs and the other features call."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Iterable, Optional, Union

from wbfe._provenance import installed_versions
from wbfe.engine.context import Context
from wbfe.engine.jobs import planned_spectrum
from wbfe.engine.matrices import ConvConvention, MatrixPlan, Skip
from wbfe.engine.pipeline import Pipeline
from wbfe.engine.plan import Planned, entries, matrices_of, plan_entry, stream
from wbfe.engine.products import IntraChain
from wbfe.engine.result import ModelScore, finish
from wbfe.engine.run import run
from wbfe.engine.ties import SeenContent
from wbfe.errors import InvalidOptionError, name_hint
from wbfe.linalg.spectra import resolve_device
from wbfe.options import ScoreOptions, check_conv
from wbfe.sources import TensorEntry, open_source

if TYPE_CHECKING:
    import numpy as np

__all__ = ["Progress", "DESCRIBING", "score_source", "provenance_of", "layer_spectrum", "eigenvalues_of"]

# progress(done, total, tensor name); total may be None when unknown.
Progress = Callable[[int, Optional[int], str], None]
# What progress is told while the model's description is read, before any matrix.
DESCRIBING = "reading the model's description"


def provenance_of(source_provenance: dict[str, Any], context: Context) -> dict[str, Any]:
    """A score's ``model`` field: the source's provenance, the device, library versions, options."""
    return {**source_provenance, "device": str(context.device), "versions": installed_versions(),
            "options": context.options.to_dict()}


def score_source(source: Any, options: ScoreOptions, *, progress: Optional[Progress] = None) -> ModelScore:
    """Score every matrix of an open :class:`~wbfe.sources.TensorSource` in this process.

    Args:
        source: an open source (see :func:`wbfe.sources.open_source`).
        options: validated options.
        progress: called once with (0, total, "") before the first matrix, then as each entry's
            spectrum (or skip) is finished, with (done, total, name); first with (0, None,
            :data:`DESCRIBING`) where the checkpoint has a ``config.json`` to describe it.
            Where the source reads headers only, the total is every entry, fused experts split,
            counted before the first is scored; otherwise the stored tensors' count, raised to the
            count done where expert stacks split into more.

    Raises:
        NoUsableMatrixError: every weight matrix was skipped.
    """
    context = Context.of(options)
    layers: list[dict[str, Any]] = []
    skipped: list[dict[str, Any]] = []
    planned: Iterable[Planned] = stream(source, options)
    if progress is not None and source.config is not None:
        # Building the description from config.json can take seconds (importing its framework) before
        # the first matrix: a bar says so rather than sit at 0/? without a word.
        progress(0, None, DESCRIBING)
    if source.headers_only:  # nothing is read to list them: the total is known up front
        planned = list(planned)
        total: Optional[int] = len(planned)
    else:
        total = len(source)
    count = 0

    def record(entry: TensorEntry, item: Union[Skip, dict[str, Any]]) -> None:
        if isinstance(item, Skip):
            skipped.append(item.to_dict())
        else:
            layers.append(item)

    def done(entry: TensorEntry) -> None:
        nonlocal count
        count += 1
        if progress is not None:
            progress(count, None if total is None else max(total, count), entry.name)

    description = source.description  # records which description was used in the provenance
    chain = None
    if options.intra and isinstance(planned, list):  # every plan known: the chain in the model's order
        chain = IntraChain.in_order(options.seed, [p.plan for p in planned if isinstance(p.plan, MatrixPlan)],
                                    description.order if description is not None else None,
                                    description.aliases if description is not None else None,
                                    ww_compatible=options.ww_compatible)
    if progress is not None:  # the total at once, before the first spectrum (a bar reads 0/N, not 0/?)
        progress(0, total, "")
    with Pipeline(context.device) as pipeline:
        run(pipeline, planned, context, SeenContent(), record, done, chain)
    model = provenance_of(source.provenance.to_dict(), context)
    return finish(model, layers, skipped, context.groups, head=options.head, head_hint=source.head_hint,
                  config=source.config, description=description)


def layer_spectrum(
    ref: Any, layer: str, *, conv: ConvConvention = "flatten", device: str = "auto"
) -> tuple[MatrixPlan, Any]:
    """The plan and :class:`~wbfe.metrics.Spectrum` of one named matrix of a checkpoint.

    Args:
        ref: any reference :func:`wbfe.score` accepts.
        layer: the tensor name as stored (or its module name without ``.weight``).

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
    raise InvalidOptionError(f"no tensor named {layer!r} in {ref}{name_hint(layer, names, ref)}")


def eigenvalues_of(ref: Any, names: Iterable[str], options: ScoreOptions) -> dict[str, "np.ndarray"]:
    """The eigenvalues of each named matrix of ``ref``, computed as a score under ``options`` did
    (conv convention, WeightWatcher mode, device): one pass over the stream, only the wanted
    tensors loaded. A name the checkpoint lacks, or that is not a matrix, is absent."""
    import numpy as np

    wanted = set(names)
    device = resolve_device(options.device)
    out: dict[str, np.ndarray] = {}
    with open_source(ref) as source:
        for entry, plan in stream(source, options):
            if entry.name not in wanted or isinstance(plan, Skip):
                continue
            matrices = matrices_of(entry.load(), plan, ww_compatible=options.ww_compatible)
            spec = planned_spectrum(matrices, plan, device)
            assert spec.eigs is not None  # asked for
            # in true units (a matrix whose Gram matrix left float64's range was scaled by a power of two)
            out[entry.name] = np.asarray(spec.eigs, dtype=float) * np.exp(spec.log_scale)
            if len(out) == len(wanted):
                break
    return out
