"""``wbfe.compare``: two checkpoints matrix by matrix, paired by name (after ``--map`` renames) or by graph order,
through the engine's pipeline as a score's matrices are. docs/compare.md lists the columns, the summary, the folding
rule and the pairing. (Named `comparison` so as not to shadow ``wbfe.compare``.)"""

from __future__ import annotations

import collections
import dataclasses
import functools
import heapq
import html
import math
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator, Optional, Sequence, Union

import numpy as np

from wbfe import engine
from wbfe._provenance import installed_versions
from wbfe.engine.change import matrix_change
from wbfe.engine.heads import UNSELECTED, choose_head
from wbfe.engine.matrices import MatrixPlan, Skip, as_matrices
from wbfe.engine.pipeline import Pipeline
from wbfe.engine.result import column_mean
from wbfe.errors import InvalidOptionError, NoUsableMatrixError
from wbfe.framework import FrameworkDescription, out_in
from wbfe.linalg.arrays import is_torch
from wbfe.linalg.spectra import DegenerateMatrixError, pin_threads
from wbfe.metrics import resolve_groups
from wbfe.options import CompareOptions, ScoreOptions, field_defaults
from wbfe.render.text import ToJson, as_float, is_number, json_ready, short_value
from wbfe.sources import TensorEntry, open_source, stream_each
from wbfe.sources.peft_adapter import AdapterSource

__all__ = ["Comparison", "compare"]

_MOST_CHANGED = 5  # the most-changed matrices the summary names
# The folding rule (docs/compare.md): a row scale explains a pair's change when it leaves at most this fraction,
# and the fitted scales must spread (a scale shared by every row is a rescaled matrix, not a fold).
ROWSCALE_EXPLAINED = 0.25
FOLDING_MIN_CV = 0.01
_Pair = tuple[Optional[TensorEntry], Optional[TensorEntry], str]
_Renames = Sequence[tuple[re.Pattern[str], str]]


@dataclass
class Comparison(ToJson):
    """The comparison of checkpoint B against checkpoint A.

    Attributes:
        model_a, model_b: provenance of each (source, format, files, sha256).
        options: the settings used; ``versions`` of the packages.
        layers: one dict per matched matrix (docs/compare.md lists the columns).
        unmatched: ``{"name", "side", "reason"}`` for every tensor with no counterpart.
        skipped: ``{"name", "name_b", "reason", ...}`` for matched tensors that are not matrices or
            cannot be compared (1-D, integer, all zero, ...).
        summary: counts, means, and the names of the matrices that changed most.
    """

    model_a: dict[str, Any]
    model_b: dict[str, Any]
    options: dict[str, Any]
    layers: list[dict[str, Any]] = field(default_factory=list)
    unmatched: list[dict[str, Any]] = field(default_factory=list)
    skipped: list[dict[str, Any]] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """Plain data (the JSON shape); non-finite numbers become None."""
        return json_ready(vars(self))  # the fields, in order

    def to_pandas(self) -> Any:
        """One row per matched matrix (requires pandas), as :meth:`wbfe.ModelScore.to_pandas` builds it."""
        return engine.ModelScore(model={}, layers=self.layers).to_pandas()

    def _headline(self) -> list[tuple[str, Any]]:
        keys = ("n_matched", "n_skipped", "n_unmatched_a", "n_unmatched_b", "rel_frobenius_mean",
                "w1_log_eigs_mean", "d_bfe_mean", "d_alpha_mean")
        return [(k, self.summary[k]) for k in keys if k in self.summary]

    def __repr__(self) -> str:
        fields = ", ".join(f"{k}={short_value(v)}" for k, v in self._headline())
        return (f"Comparison(a={self.model_a.get('source')!r}, b={self.model_b.get('source')!r}, "
                f"pairs={len(self.layers)}" + (f", {fields}" if fields else "") + ")")

    def _repr_html_(self) -> str:
        rows = [("A", self.model_a.get("source")), ("B", self.model_b.get("source")), ("pairs", len(self.layers)),
                *self._headline()]
        cells = "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(short_value(v))}</td></tr>" for k, v in rows)
        changed = "".join(f"<tr><td>{html.escape(str(r['name']))}</td><td>{short_value(r['rel_frobenius'])}</td></tr>"
                          for r in self.summary.get("most_changed") or [])
        table = (f"<table><caption>most changed (relative Frobenius)</caption>{changed}</table>" if changed else "")
        return f"<table><caption>Comparison</caption>{cells}</table>{table}"


_DEFAULTS = field_defaults(CompareOptions)  # the keywords' defaults are the options' own


def compare(
    a: Any,
    b: Any,
    *,
    metrics: Union[str, Iterable[str], None] = _DEFAULTS["metrics"],
    name_map: Union[None, str, Iterable[Union[str, tuple[str, str]]]] = _DEFAULTS["name_map"],
    top_k: int = _DEFAULTS["top_k"],
    layers: Optional[str] = _DEFAULTS["layers"],
    lam: Union[str, float] = _DEFAULTS["lam"],
    device: str = _DEFAULTS["device"],
    min_eigs: int = _DEFAULTS["min_eigs"],
    seed: int = _DEFAULTS["seed"],
    stream: Optional[bool] = _DEFAULTS["stream"],
    progress: Optional[engine.Progress] = None,
) -> Comparison:
    """Compare checkpoint ``b`` against checkpoint ``a``, matrix by matrix.

    Args:
        a, b: any references :func:`wbfe.score` accepts (paths, hub ids, modules, state dicts).
        metrics: metric groups whose change is reported (default ``bfe,htsr``).
        name_map: renames ``REGEX=REPL`` (or ``(regex, repl)``) applied in order to A's names
            before matching them with B's.
        top_k: size of the singular subspaces whose overlap is reported.
        layers: only tensors whose (A) name matches this regular expression.
        lam, device, min_eigs, seed: as for :func:`wbfe.score`.
        stream: as for :func:`wbfe.score`, for each checkpoint that is remote (a hub id, URL or object-store
            URI); a local one is read where it is (True with two local checkpoints is refused).
        progress: called with (0, total, "") before the first pair, then (done, total, name) after each;
            the total is A's stored tensors, raised to the count done where fused experts are split.

    Raises:
        InvalidOptionError: a bad option value, ``lam`` or ``seed`` with no asked group that reads it (as for
            :func:`wbfe.score`), or a LoRA adapter folder (its tensors are factors).
            The errors of :func:`wbfe.sources.open_source`.
        NoUsableMatrixError: no matrix of A has a comparable counterpart in B.

    Example:
        >>> import torch, wbfe
        >>> w = torch.eye(12)
        >>> c = wbfe.compare({"fc.weight": w}, {"fc.weight": 2 * w}, metrics="bfe")
        >>> c.layers[0]["rel_frobenius"], c.layers[0]["d_bfe"]
        (1.0, 0.0)
    """
    given = CompareOptions(metrics=() if metrics is None else metrics, name_map=name_map, top_k=top_k,  # type: ignore[arg-type]
                           layers=layers, lam=lam, device=device, min_eigs=min_eigs,  # type: ignore[arg-type]
                           seed=seed, stream=stream)
    groups = resolve_groups(given.metrics)
    renames, pattern = given.renames, given.pattern
    # Each side's spectrum and columns as a score under the same settings computes them.
    settings = ScoreOptions(metrics=tuple(g.name for g in groups), lam=given.lam, device=given.device,
                            min_eigs=given.min_eigs, seed=given.seed)
    context = engine.Context.of(settings)
    # What a score analyses: min_eigs gates the tail fits only (engine.layer_row), not the pairing.
    plan_eigs = engine.planning_min_eigs(settings)
    result = Comparison(model_a={}, model_b={}, options=given.to_dict())

    # Each matched pair is one entry of the engine's pipeline, its load reading both sides:
    # id(entry) -> (the bytes it reads, its row's first columns, its change of the tensors read).
    jobs: dict[int, tuple[int, dict[str, Any], Callable[[tuple[Any, Any]], Union[dict[str, Any], str]]]] = {}

    def planned(matched: Iterable[_Pair]) -> Iterator[tuple[TensorEntry, MatrixPlan]]:
        for entry_a, entry_b, why in matched:
            if entry_a is None or entry_b is None:
                only = entry_a or entry_b
                assert only is not None
                result.unmatched.append({"name": only.name, "side": "a" if entry_b is None else "b", "reason": why})
                continue
            entry_b = _held_as(entry_a, entry_b)  # a Conv1D's [in, out] against a Linear's [out, in] was W against Wᵀ
            base: dict[str, Any] = {"name": entry_a.name, "name_b": entry_b.name, "shape": list(entry_a.shape),
                                    "dtype_a": entry_a.dtype, "dtype_b": entry_b.dtype}
            if why:
                result.skipped.append({**base, "reason": why})
                continue
            if entry_a.shape != entry_b.shape:
                result.skipped.append({**base, "shape_b": list(entry_b.shape),
                                       "reason": f"shape differs: A {list(entry_a.shape)}, B {list(entry_b.shape)}"})
                continue
            plan_a, plan_b = (engine.plan_entry(entry, min_eigs=plan_eigs) for entry in (entry_a, entry_b))
            if isinstance(plan_a, Skip) or isinstance(plan_b, Skip):
                reason = "; ".join(f"{lab}: {p.reason}" for lab, p in (("A", plan_a), ("B", plan_b)) if isinstance(p, Skip))
                result.skipped.append({**base, "reason": reason})
                continue
            base.update({"quant_a": entry_a.quant, "quant_b": entry_b.quant, "role": plan_a.role,
                         "rows": plan_a.rows, "cols": plan_a.cols,  # depth: the block index, the name's first integer
                         "depth": next((int(part) for part in entry_a.name.split(".") if part.isdigit()), None)})
            both = dataclasses.replace(entry_a, load=functools.partial(lambda a, b: (a(), b()), entry_a.load, entry_b.load),
                                       storage_key=None)
            jobs[id(both)] = (entry_a.nbytes + entry_b.nbytes, base, functools.partial(
                pair_change, plans=(plan_a, plan_b), names=(entry_a.name, entry_b.name), context=context, top_k=top_k))
            yield both, plan_a

    done = 0

    def collect(pipeline: Pipeline, wait: bool = False) -> None:
        nonlocal done
        for entry, _, change in pipeline.finished(wait=wait):
            base = jobs.pop(id(entry))[1]
            if isinstance(change, str):
                result.skipped.append({**base, "reason": change})
            else:
                result.layers.append({**base, **change})
            done += 1
            if progress is not None:
                progress(done, max(total, done), entry.name)

    # Every BLAS pool at one thread throughout: the change's subset eigen-solves are outside the spectra's
    # per-matrix thread choice, and run far slower on two threads on a busy machine.
    streamed_a, streamed_b = stream_each([a, b], given.stream)  # --stream: the remote side streamed, a local one read
    with open_source(a, stream=streamed_a) as source_a, open_source(b, stream=streamed_b) as source_b, \
            pin_threads(), Pipeline(context.device, loaded_bytes=lambda entry: jobs[id(entry)][0],
                                    job_bytes=_change_bytes) as pipeline:
        for source in (source_a, source_b):
            if isinstance(source, AdapterSource):  # its tensors are factors, not the matrices they change
                raise InvalidOptionError(f"{source.provenance.source} is a LoRA adapter: compare full checkpoints, "
                                         "or score the adapter with --base to see its change against the base")
        total = len(source_a)  # stored tensors of A: raised to the count done when experts are split
        if progress is not None:  # the total at once, before the first pair
            progress(0, total, "")
        stream_a = _dense_entries(source_a, "a", result.skipped)
        stream_b = _dense_entries(source_b, "b", result.skipped)
        note, pairs = None, None
        orders = _orders(source_a, source_b, renames)
        if orders is not None:  # the names differ and both sides know their model's order
            listed_a, listed_b = list(stream_a), list(stream_b)
            pairs, note = _by_order(listed_a, listed_b, orders, plan_eigs, pattern, result.skipped)
            stream_a, stream_b = iter(listed_a), iter(listed_b)
        used: set[int] = set()  # the renames that matched a name of A
        matched = pairs if pairs is not None else _pairs(stream_a, stream_b, renames, pattern, used)
        for entry, plan in planned(matched):
            assert isinstance(plan, MatrixPlan)
            tensors = entry.load()
            pipeline.compute(entry, plan, functools.partial(jobs[id(entry)][2], tensors))
            del tensors  # the job holds them now, and frees them when done
            collect(pipeline)
        collect(pipeline, wait=True)
        description = source_a.description  # A's own, as a score of A finds its head (recorded in its provenance)
        result.model_a, result.model_b = source_a.provenance.to_dict(), source_b.provenance.to_dict()
        # a mistyped rename changed nothing, which only the unmatched names showed
        unused = [f"{p}={r}" for i, (p, r) in enumerate(given.name_map) if i not in used]
        map_note = f"--map {', '.join(map(repr, unused))} renamed no tensor of A" if pairs is None and unused else ""
        if not result.layers:
            raise NoUsableMatrixError(f"no matrix of {result.model_a.get('source')} has a comparable counterpart in "
                                      f"{result.model_b.get('source')} ({len(result.unmatched)} unmatched, "
                                      f"{len(result.skipped)} skipped)"
                                      + (f"; not paired by graph order: {note}" if note else "")
                                      + (f"; {map_note}" if map_note else ""))
        result.summary = _summarise(result, groups, hint=source_a.head_hint, config=source_a.config,
                                    description=description)
    result.options.update(versions=installed_versions(), device=str(context.device))
    result.summary["pairing"] = "name" if pairs is None else "graph order"
    result.summary.update({key: text for key, text in (("pairing_note", note), ("map_note", map_note)) if text})
    return result


def pair_change(tensors: tuple[Any, Any], plans: tuple[MatrixPlan, MatrixPlan], names: tuple[str, str], context: Any,
                top_k: int, labels: tuple[str, str] = ("A", "B")) -> Union[dict[str, Any], str]:
    """The change columns from the first tensor to the second (:func:`wbfe.engine.change.matrix_change`), or why
    either has no spectrum (``"A: ...; B: ..."``, with ``labels``)."""
    got = [engine.spectrum_of(as_matrices(t, p), context, n, need_eigs=True) for t, p, n in zip(tensors, plans, names)]
    bad = [f"{label}: {g}" for label, g in zip(labels, got) if isinstance(g, DegenerateMatrixError)]
    return "; ".join(bad) if bad else matrix_change(*tensors, plans[0], got[0], got[1], context, top_k)


def _change_bytes(plan: MatrixPlan) -> int:
    """What comparing one pair holds besides its tensors: float64 A, B and the Gram matrix of B − A."""
    return 8 * (2 * plan.rows * plan.cols + min(plan.rows, plan.cols) ** 2)


# Descriptions listed in the order the model computes in; a transformers or torch order is the modules'
# registration order and GGUF's the converter's, where equal shapes could pair a query with a key projection.
_GRAPH_ORDERED = ("keras", "tflite")


def _orders(source_a: Any, source_b: Any,
            renames: _Renames) -> Optional[tuple[FrameworkDescription, FrameworkDescription]]:
    """Both sides' own descriptions when both are graph-ordered and no renamed name of A is a name of B."""
    da, db = source_a.own_description, source_b.own_description
    if not all(d is not None and d.order and d.framework in _GRAPH_ORDERED for d in (da, db)):
        return None
    names_b = set(db.order) | set(db.aliases)
    return None if any(_renamed(name, renames) in names_b for name in da.order) else (da, db)


def _renamed(name: str, renames: _Renames, used: Optional[set[int]] = None) -> str:
    """``name`` after every ``--map`` rename, in order; the index of each rename that matched is added to ``used``."""
    for i, (pattern, repl) in enumerate(renames):
        if used is not None and pattern.search(name):
            used.add(i)
        name = pattern.sub(repl, name)
    return name


def _by_order(
    entries_a: list[TensorEntry], entries_b: list[TensorEntry], orders: tuple[FrameworkDescription, FrameworkDescription],
    min_eigs: int, pattern: Optional[re.Pattern[str]], skipped: list[dict[str, Any]],
) -> tuple[Optional[list[_Pair]], Optional[str]]:
    """The matrices paired by their place in each side's model order (other tensors listed in ``skipped``);
    ``(None, why not)`` when they do not correspond one to one."""
    sides = []
    others: list[dict[str, Any]] = []
    for label, entries, description in (("a", entries_a, orders[0]), ("b", entries_b, orders[1])):
        position = {name: i for i, name in enumerate(description.order)}
        matrices = []
        for k, entry in enumerate(entries):
            plan = engine.plan_entry(entry, min_eigs=min_eigs)
            if isinstance(plan, Skip):
                others.append({"name": entry.name, "side": label, "shape": list(entry.shape), "reason": plan.reason})
                continue
            where = position.get(description.resolve(entry.name))
            if where is None:
                return None, f"matrix {entry.name!r} of {label.upper()} is not in its model's order"
            matrices.append((where, k, entry))
        sides.append([entry for _, _, entry in sorted(matrices, key=lambda m: (m[0], m[1]))])
    found_a, found_b = sides
    if len(found_a) != len(found_b):
        return None, f"A has {len(found_a)} matrices, B {len(found_b)}"
    pairs: list[_Pair] = []
    for a, b in zip(found_a, found_b):
        shape_a, shape_b = ((*out_in(e.shape, e.layout), *e.shape[2:]) for e in (a, b))
        if shape_a != shape_b:
            return None, (f"matrix {len(pairs) + 1} in order differs in shape: {a.name!r} {list(shape_a)}, "
                          f"{b.name!r} {list(shape_b)} (out x in x k...)")
        pairs.append(_selected(a, _held_as(a, b), pattern))
    skipped += others
    return pairs, None


def _held_as(a: TensorEntry, b: TensorEntry) -> TensorEntry:
    """``b`` as ``a`` holds it: its first two axes swapped where the two layouts differ (``in_out`` against
    ``out_in``), so that the two line up entry by entry."""
    if a.layout == b.layout or len(b.shape) < 2:
        return b
    return dataclasses.replace(b, shape=(b.shape[1], b.shape[0], *b.shape[2:]), layout=a.layout,
                               load=functools.partial(_swapped, b.load))


def _swapped(load: Callable[[], Any]) -> Any:
    """The tensor ``load`` gives with its first two axes swapped, in memory order (a numpy array or a torch tensor)."""
    tensor = load().swapaxes(0, 1)
    return tensor.contiguous() if is_torch(tensor) else np.ascontiguousarray(tensor)


def _pairs(stream_a: Iterator[TensorEntry], stream_b: Iterator[TensorEntry], renames: _Renames,
           pattern: Optional[re.Pattern[str]], used: Optional[set[int]] = None) -> Iterator[_Pair]:
    """``(a, b, "")`` per matched pair, ``(a, None, why)`` / ``(None, b, why)`` for the others, ``(a, b, why)``
    for a pair left out by ``--layers``. The streams advance in step: an entry waits only for its counterpart.
    ``used``: the renames that matched a name of A are added to it."""
    waiting_a: dict[str, TensorEntry] = {}
    waiting_b: dict[str, TensorEntry] = {}
    claimed: dict[str, str] = {}  # B name -> the A name matched (or waiting) for it
    live = {"a": stream_a, "b": stream_b}
    while live:
        for side in list(live):  # one entry of A, then one of B
            entry = next(live[side], None)
            if entry is None:
                del live[side]
            elif side == "b":
                if entry.name in waiting_a:
                    yield _selected(waiting_a.pop(entry.name), entry, pattern)
                else:
                    waiting_b[entry.name] = entry
            elif (key := _renamed(entry.name, renames, used)) in claimed:
                yield entry, None, f"maps to {key!r}, as {claimed[key]!r} already does"
            else:
                claimed[key] = entry.name
                if key in waiting_b:
                    yield _selected(entry, waiting_b.pop(key), pattern)
                else:
                    waiting_a[key] = entry
    for key, entry in waiting_a.items():
        yield entry, None, f"no tensor {key!r} in B" + ("" if key == entry.name else " (after --map)")
    for entry in waiting_b.values():
        yield None, entry, "no tensor of A maps to this name"


def _dense_entries(source: Any, side: str, skipped: list[dict[str, Any]]) -> Iterator[TensorEntry]:
    """The source's tensors as ``wbfe score`` sees them; what a quantised weight consumes goes to ``skipped``."""
    for entry, consumed in engine.entries(source):
        if consumed is None:
            yield entry
        else:
            skipped.append({"name": entry.name, "side": side, "shape": list(entry.shape), "reason": consumed})


def _selected(a: TensorEntry, b: TensorEntry, pattern: Optional[re.Pattern[str]]) -> tuple[TensorEntry, TensorEntry, str]:
    return a, b, "" if pattern is None or pattern.search(a.name) else UNSELECTED


def _summarise(result: Comparison, groups: tuple[Any, ...], *, hint: Optional[str] = None,
               config: Optional[dict[str, Any]] = None, description: Optional[FrameworkDescription] = None) -> dict[str, Any]:
    rows = result.layers
    skipped_a = [row for row in result.skipped if row.get("side", "a") == "a"]
    choice = choose_head(rows, skipped_a, hint=hint, config=config, description=description)
    head = choice.name
    head_row = next((row for row in rows if row["name"] == head), {})

    def finite(column: str) -> list[tuple[float, str]]:
        return [(as_float(row.get(column)), row["name"]) for row in rows if math.isfinite(as_float(row.get(column)))]

    def ranked(column: str) -> list[dict[str, Any]]:
        top = heapq.nlargest(_MOST_CHANGED, finite(column), key=lambda x: x[0])
        return [{"name": name, column: value} for value, name in top]

    sides = collections.Counter(u["side"] for u in result.unmatched)
    summary: dict[str, Any] = {"n_matched": len(rows), "n_skipped": len(result.skipped), "n_unmatched_a": sides["a"],
                               "n_unmatched_b": sides["b"], "head": head, "head_source": choice.source}
    if choice.note:
        summary["head_note"] = choice.note
    for column in ("rel_frobenius", "rel_frobenius_rowscaled", "w1_log_eigs", "overlap_in", "overlap_out"):
        summary[f"{column}_mean"] = column_mean(rows, column)[0]
        summary[f"{column}_max"] = max((value for value, _ in finite(column)), default=math.nan)
    for group in groups:
        for column in group.summary_columns:
            summary[f"d_{column}_mean"] = column_mean(rows, f"d_{column}")[0]
            summary[f"d_{column}_head"] = head_row.get(f"d_{column}", math.nan)
    summary.update(_folding(rows))
    summary.update(most_changed=ranked("rel_frobenius"), most_changed_spectrum=ranked("w1_log_eigs"))
    return summary


def _folding(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """How many changed pairs a per-output-row scale explains, and whether that is folding (with a note)."""
    changed = [row for row in rows if is_number(row.get("rel_frobenius")) and row["rel_frobenius"] > 0.0]
    scaled = [row for row in changed if is_number(row.get("rel_frobenius_rowscaled"))
              and row["rel_frobenius_rowscaled"] <= ROWSCALE_EXPLAINED * row["rel_frobenius"]]
    cvs = [row["row_scale_cv"] for row in scaled if is_number(row.get("row_scale_cv")) and math.isfinite(row["row_scale_cv"])]
    spread = float(np.median(cvs)) if cvs else math.nan
    folding = 2 * len(scaled) > len(changed) and spread >= FOLDING_MIN_CV
    out: dict[str, Any] = {"n_rowscale_explained": len(scaled), "folding_detected": folding}
    if folding:
        residual = float(np.median([row["rel_frobenius_rowscaled"] for row in scaled]))
        out["folding_note"] = (
            f"{len(scaled)} of {len(changed)} changed pairs are a per-output-row rescaling of A (median row_scale_cv "
            f"{spread:.3g}): a per-channel factor, such as BatchNorm folded into the kernels by a converter, not "
            f"drift; the change left after it is rel_frobenius_rowscaled (median {residual:.3g}), e.g. the rounding")
    return out
