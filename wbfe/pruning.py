"""Layer-wise sparsity from the spectra (AlphaPruning, Lu et al., NeurIPS 2024), and magnitude pruning
to it: ``wbfe sparsity`` and ``wbfe prune``. The allocation, the matrices pruned and the file written:
docs/pruning.md.
"""

from __future__ import annotations

import csv
import io
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional, Union

import numpy as np

from wbfe import __version__
from wbfe._deps import require
from wbfe.errors import InvalidOptionError, NoUsableMatrixError
from wbfe.options import PRUNE_METRICS, READ_BY, PruneOptions, field_defaults, refuse_keywords
from wbfe.render.files import local_files, local_reads, refuse_overlap
from wbfe.render.text import ToJson, as_float, json_ready, shape_text

if TYPE_CHECKING:
    import torch

    from wbfe.engine import ModelScore

__all__ = ["Allocation", "PruneReport", "MetricNotComputedError", "allocate", "sparsity", "prune",
           "magnitude_prune", "METRIC_GROUPS", "METADATA_KEY"]

METRIC_GROUPS = PRUNE_METRICS  # the metric group that computes each ``by`` column
METADATA_KEY = "wbfe_pruning"  # the safetensors metadata key of ``wbfe prune``'s allocation (JSON)

# The keywords' defaults are the options' own, but for target, which has none: it is given or in options.
_DEFAULTS = field_defaults(PruneOptions) | {"target": None}
_PRUNABLE_NDIM = (2, 4)
_PRUNABLE_DTYPES = ("float64", "float32", "float16", "bfloat16")  # what wbfe.editing writes back exactly


class MetricNotComputedError(InvalidOptionError):
    """The column to allocate by is missing from the score, or NaN on every prunable matrix."""


class _Rows(ToJson):
    """A result of one dict per matrix (``rows``), shown as a table with shapes as ``AxB``."""

    rows: list[dict[str, Any]]

    def to_pandas(self) -> Any:
        pandas = require("pandas", "to_pandas() needs pandas (pip install pandas)")
        return pandas.DataFrame([_flat(r) for r in self.rows])


@dataclass(frozen=True)
class Allocation(_Rows):
    """The per-matrix sparsity that reaches a target overall.

    Attributes:
        rows: one dict per prunable matrix: ``name``, ``role``, ``shape``, ``params`` (weights),
            ``metric`` (the ``by`` column's value, NaN for ``uniform``), ``sparsity`` (in [0, 1)),
            ``zeros`` (round(sparsity·params)) and ``note`` (why a value was filled in, else empty).
        excluded: ``{"name", "role", "reason"}`` for every scored matrix left unpruned.
        skipped: the score's skipped tensors with their reasons (biases, all-zero matrices, ...): left as they are.
    """

    options: PruneOptions
    rows: list[dict[str, Any]]
    excluded: list[dict[str, Any]] = field(default_factory=list)
    source: str = ""
    skipped: list[dict[str, Any]] = field(default_factory=list)

    @property
    def overall(self) -> float:
        """The sparsity the counts reach together, Σ zeros / Σ params."""
        return sum(r["zeros"] for r in self.rows) / sum(r["params"] for r in self.rows)

    def as_dict(self) -> dict[str, float]:
        """``{tensor name: sparsity}``: what a pruner that takes per-layer ratios is handed."""
        return {r["name"]: r["sparsity"] for r in self.rows}

    def to_dict(self) -> dict[str, Any]:
        """The JSON shape; non-finite numbers become None."""
        return json_ready({"source": self.source, "options": self.options.to_dict(), "overall": self.overall,
                           "rows": self.rows, "excluded": self.excluded, "skipped": self.skipped})

    def to_csv(self) -> str:
        """One CSV row per prunable matrix (shape as ``AxB``, NaN as an empty cell)."""
        buffer = io.StringIO()
        if self.rows:
            writer = csv.DictWriter(buffer, fieldnames=list(self.rows[0]), lineterminator="\n")
            writer.writeheader()
            writer.writerows({k: "" if isinstance(v, float) and not math.isfinite(v) else v for k, v in _flat(row).items()}
                             for row in self.rows)
        return buffer.getvalue()


@dataclass(frozen=True)
class PruneReport(_Rows):
    """What ``prune`` wrote (``output``) and how each matrix changed.

    Attributes:
        rows: one dict per pruned matrix: ``name``, ``params``, ``sparsity`` (allocated), ``zeros``
            (set to zero), ``reached`` (fraction of zero weights after pruning), ``dead_rows`` /
            ``dead_cols`` (rows and columns of the out × rest matrix left all zero), then
            ``<metric>_before`` / ``<metric>_after`` for ``bfe``, ``alpha``, ``stable_rank`` (and ``h``).
    """

    output: Path
    allocation: Allocation
    rows: list[dict[str, Any]]

    @property
    def overall(self) -> float:
        """The fraction of zero weights in the pruned matrices together."""
        return sum(r["reached"] * r["params"] for r in self.rows) / sum(r["params"] for r in self.rows)

    def to_dict(self) -> dict[str, Any]:
        """The JSON shape; non-finite numbers become None."""
        return json_ready({"output": str(self.output), "overall": self.overall,
                           "allocation": self.allocation.to_dict(), "rows": self.rows})


def allocate(values: np.ndarray, params: np.ndarray, target: float, *, spread: float,
             mapping: str = _DEFAULTS["mapping"], reverse: bool = _DEFAULTS["reverse"]) -> np.ndarray:
    """Per-matrix sparsities whose ``params``-weighted mean is ``target``, from the finite ``values``
    mapped onto [target − spread, target + spread] (docs/pruning.md, "The allocation").

    Raises:
        InvalidOptionError: a target no allocation can reach (the smallest matrix keeps one weight, and a matrix
            mapped at or below 0 is not pruned).
    """
    values = np.asarray(values, dtype=np.float64)
    params = np.asarray(params, dtype=np.float64)
    cap = 1.0 - 1.0 / float(params.min())
    if target >= cap:
        raise InvalidOptionError(f"target {target:g} leaves less than one weight in the smallest matrix "
                                 f"({int(params.min())} weights); the largest reachable is below {cap:g}")
    if mapping == "rank":  # average ranks for ties, so equal values get equal sparsities
        from scipy.stats import rankdata

        values = rankdata(values)
    if reverse:
        values = -values
    low, high = float(values.min()), float(values.max())
    unit = (values - low) / (high - low) if high > low else np.full_like(values, 0.5)
    base = target - spread + 2.0 * spread * unit
    # every matrix mapped above 0 at the cap (the others unpruned): the most any scale reaches
    reachable = float(np.sum(params[base > 0.0]) * cap / np.sum(params))
    if target > reachable:
        raise InvalidOptionError(f"target {target:g} cannot be reached with spread {spread:g}: the matrices mapped "
                                 f"to a sparsity at or below 0 stay unpruned, and the others reach at most "
                                 f"{reachable:.4g} overall; narrow --spread (below {target:g})")

    def overall(c: float) -> float:
        return float(np.sum(params * np.clip(c * base, 0.0, cap)) / np.sum(params))

    lo, hi = 0.0, 1.0
    while overall(hi) < target:  # base's largest entry is ≥ target > 0, so this ends
        hi *= 2.0
    # bisection to the last bit: overall(c) is continuous and non-decreasing; c near target/spread takes up to ~1100
    # halvings from 1 (200 stopped at 2^-200: a target of 1e-100 was allocated 3e-62 overall)
    for _ in range(2200):
        mid = 0.5 * (lo + hi)
        if mid in (lo, hi):
            break
        lo, hi = (mid, hi) if overall(mid) < target else (lo, mid)
    return np.clip(hi * base, 0.0, cap)


def magnitude_prune(w: np.ndarray, zeros: int) -> np.ndarray:
    """``w`` with its ``zeros`` smallest |w| set to zero (ties: the earlier position in storage order first)."""
    flat = np.array(w, copy=True).reshape(-1)
    flat[np.argsort(np.abs(flat), kind="stable")[:max(zeros, 0)]] = 0
    return flat.reshape(np.shape(w))


def sparsity(ref: Any, target: Optional[float] = _DEFAULTS["target"], *, by: str = _DEFAULTS["by"],
             spread: float = _DEFAULTS["spread"], mapping: str = _DEFAULTS["mapping"],
             reverse: bool = _DEFAULTS["reverse"], exclude: Any = _DEFAULTS["exclude"],
             layers: Optional[str] = _DEFAULTS["layers"], head: Optional[str] = _DEFAULTS["head"],
             device: str = _DEFAULTS["device"], min_eigs: int = _DEFAULTS["min_eigs"],
             options: Optional[PruneOptions] = None) -> Allocation:
    """The per-matrix sparsity that reaches ``target`` overall, from the spectra (docs/pruning.md).

    Args:
        ref: any checkpoint :func:`wbfe.score` reads, or a :class:`~wbfe.engine.ModelScore` already
            computed (then ``layers``, ``head``, ``device`` and ``min_eigs`` are the score's, and left unset).
        target, by, spread, mapping, reverse, exclude (``""`` prunes every role), layers, head, device,
            min_eigs: as :class:`~wbfe.options.PruneOptions`' attributes.
        options: every setting as one :class:`~wbfe.options.PruneOptions` (the keywords then at their defaults).

    Raises:
        InvalidOptionError: a bad option, or ``spread``, ``mapping`` or ``reverse`` set with ``by="uniform"``
            (which maps no metric); MetricNotComputedError: ``by`` is not in the score or NaN on
            every matrix; NoUsableMatrixError: nothing left to prune; the errors of :func:`wbfe.score`.
    """
    options = _options(options, target=target, by=by, spread=spread, mapping=mapping, reverse=reverse,
                       exclude=exclude, layers=layers, head=head, device=device, min_eigs=min_eigs)
    return _allocation(_score(ref, options), options)


def prune(ref: Any, out: Union[str, Path], *, target: Optional[float] = _DEFAULTS["target"], by: str = _DEFAULTS["by"],
          spread: float = _DEFAULTS["spread"], mapping: str = _DEFAULTS["mapping"],
          reverse: bool = _DEFAULTS["reverse"], exclude: Any = _DEFAULTS["exclude"],
          layers: Optional[str] = _DEFAULTS["layers"], head: Optional[str] = _DEFAULTS["head"],
          method: str = _DEFAULTS["method"], device: str = _DEFAULTS["device"], min_eigs: int = _DEFAULTS["min_eigs"],
          options: Optional[PruneOptions] = None) -> PruneReport:
    """Write ``ref`` pruned to its :func:`sparsity` allocation as the safetensors file ``out`` (replaced
    atomically); ``method="magnitude"`` sets each matrix's smallest |w| to zero. Other settings: as for
    :func:`sparsity`.

    Raises:
        OutputError: ``out`` cannot be written (OverwriteError: it is, or lies in, what is read);
            UnsupportedDtypeError: a tensor that cannot be copied exactly; CorruptCheckpointError: a shard holds a
            second copy of a tensor its index gives to another shard; the errors of :func:`sparsity`.
    """
    from wbfe.editing import check_editable, edit_checkpoint, edited_output

    options = _options(options, target=target, by=by, spread=spread, mapping=mapping, reverse=reverse,
                       exclude=exclude, layers=layers, head=head, method=method, device=device, min_eigs=min_eigs)
    written = edited_output(out, local_reads(ref), "pruned")  # never over or into the input, before any work
    stored = check_editable(ref)  # what the edit would refuse, refused before the score (minutes on a large model)
    groups = sorted({METRIC_GROUPS[options.by], "bfe", "htsr"})
    before = _score(ref, options, groups)
    refuse_overlap(written, local_files(before.model.get("files")))  # the files the reader resolved
    allocation = _allocation(before, options)
    plan = {r["name"]: r for r in allocation.rows}
    for name, row in plan.items():  # every allocated matrix stored with the scored shape, or nothing is written
        if stored.get(name) != row["shape"]:
            raise InvalidOptionError(f"{name}: scored as {row['shape']} but stored as {stored.get(name, 'no tensor')}; "
                                     "it cannot be pruned in place (exclude it with --layers)", name=name)
    counts: dict[str, tuple[int, int, int]] = {}

    def editor(name: str, tensor: "torch.Tensor") -> tuple[Optional[np.ndarray], int, str]:
        row = plan[name]  # only=frozenset(plan): called for the allocated matrices alone
        pruned = magnitude_prune(np.asarray(tensor.detach().cpu().double().numpy()), row["zeros"])
        live = pruned.reshape(pruned.shape[0], -1) != 0  # dead rows and columns of out × everything else
        counts[name] = (int(np.count_nonzero(pruned == 0)), int(np.sum(~live.any(axis=1))), int(np.sum(~live.any(axis=0))))
        return pruned, row["zeros"], ""

    summary = edit_checkpoint(ref, written, editor=editor, only=frozenset(plan),
                              extra_metadata={METADATA_KEY: json.dumps(_record(allocation), allow_nan=False)})
    after = {r["name"]: r for r in _score(written, options, groups).layers}
    first = {r["name"]: r for r in before.layers}
    return PruneReport(output=summary.output, allocation=allocation,
                       rows=[_report_row(r, counts[r["name"]], first[r["name"]], after.get(r["name"], {}), options)
                             for r in allocation.rows])


def _options(options: Optional[PruneOptions], **given: Any) -> PruneOptions:
    """Built from the keywords, or the one given (the keywords then at their defaults)."""
    if options is None:
        return PruneOptions(**given)
    refuse_keywords(PruneOptions, given, defaults=_DEFAULTS)
    return options


def _score(ref: Any, options: PruneOptions, groups: Optional[list[str]] = None) -> "ModelScore":
    from wbfe.engine import ModelScore
    from wbfe.scoring import score

    if isinstance(ref, ModelScore):
        refuse_keywords(PruneOptions, {k: getattr(options, k) for k in ("layers", "head", "device", "min_eigs")},
                        why="the ModelScore given was scored with its own; leave them unset, or pass the checkpoint")
        return ref
    metrics = groups or [METRIC_GROUPS[options.by]]
    if not set(metrics) & set(READ_BY["min_eigs"]) and options.min_eigs != _DEFAULTS["min_eigs"]:
        # the score's own refusal would say --metrics, which sparsity has not
        raise InvalidOptionError(f"--min-eigs {options.min_eigs} gates the tail fits, none of which --by {options.by} "
                                 "reads: drop --min-eigs or allocate by alpha, stable_rank or h")
    return score(ref, metrics=",".join(metrics), layers=options.layers, head=options.head,
                 device=options.device, min_eigs=options.min_eigs)


def _allocation(result: "ModelScore", options: PruneOptions) -> Allocation:
    rows, excluded = [], []
    for layer in result.layers:
        role, shape, dtype = layer.get("role", ""), tuple(layer.get("shape") or ()), str(layer.get("dtype", ""))
        why = (f"role {role} excluded" if role in options.exclude
               else f"{len(shape)}-D tensor: only 2-D and 4-D weights are pruned" if len(shape) not in _PRUNABLE_NDIM
               else f"stored as {dtype}: only float64, float32, float16 and bfloat16 weights are pruned"
               if dtype not in _PRUNABLE_DTYPES or layer.get("quant") else "")
        if why:
            excluded.append({"name": layer["name"], "role": role, "reason": why})
            continue
        if options.by != "uniform" and options.by not in layer:
            raise MetricNotComputedError(f"the score has no {options.by!r} column; score it with --metrics "
                                         f"{METRIC_GROUPS[options.by]}", name=options.by)
        value = math.nan if options.by == "uniform" else as_float(layer[options.by])
        rows.append({"name": layer["name"], "role": role, "shape": list(shape), "params": int(np.prod(shape)),
                     "metric": value, "sparsity": options.target, "zeros": 0, "note": ""})
    if not rows:
        reasons = sorted({e["reason"] for e in excluded})
        raise NoUsableMatrixError(f"{result.model.get('source')}: no matrix left to prune: all {len(excluded)} scored "
                                  f"are left out ({'; '.join(reasons)}); --exclude '' prunes every role",
                                  ref=str(result.model.get("source")))
    shares = (np.full(len(rows), options.target) if options.by == "uniform"
              else allocate(_filled(rows, options.by), np.array([r["params"] for r in rows]), options.target,
                            spread=options.spread, mapping=options.mapping, reverse=options.reverse))
    for row, s in zip(rows, shares):
        row.update(sparsity=float(s), zeros=int(round(float(s) * row["params"])))
    return Allocation(options=options, rows=rows, excluded=excluded, source=str(result.model.get("source", "")),
                      skipped=[{"name": s.get("name"), "reason": s.get("reason")} for s in result.skipped])


def _filled(rows: list[dict[str, Any]], by: str) -> np.ndarray:
    """The rows' values, a NaN (or infinite) one replaced by the median of the finite ones (its row says so)."""
    finite = [r["metric"] for r in rows if math.isfinite(r["metric"])]
    if not finite:
        raise MetricNotComputedError(f"{by} is NaN on every prunable matrix (too few eigenvalues for the fit?); "
                                     "allocate by another metric (--by bfe) or --by uniform", name=by)
    median = float(np.median(finite))
    for row in rows:
        if not math.isfinite(row["metric"]):
            row["note"] = f"{by} not finite: the median {median:.6g} used"
    return np.array([r["metric"] if math.isfinite(r["metric"]) else median for r in rows])



def _record(allocation: Allocation) -> dict[str, Any]:
    """What the pruned file's metadata says about its pruning."""
    o = allocation.options
    return {"wbfe": __version__, "method": o.method, "target": o.target, "by": o.by, "spread": o.spread,
            "mapping": o.mapping, "reverse": o.reverse, "exclude": list(o.exclude), "overall": allocation.overall,
            "sparsity": {r["name"]: r["sparsity"] for r in allocation.rows},
            "zeros": {r["name"]: r["zeros"] for r in allocation.rows}}


def _report_row(row: dict[str, Any], counted: tuple[int, int, int], before: dict[str, Any], after: dict[str, Any],
                options: PruneOptions) -> dict[str, Any]:
    zeros_after, dead_rows, dead_cols = counted
    out = {"name": row["name"], "params": row["params"], "sparsity": row["sparsity"], "zeros": row["zeros"],
           "reached": zeros_after / row["params"], "dead_rows": dead_rows, "dead_cols": dead_cols}
    for metric in ["bfe", "alpha", "stable_rank"] + (["h"] if options.by == "h" else []):
        out[f"{metric}_before"], out[f"{metric}_after"] = as_float(before.get(metric)), as_float(after.get(metric))
    return out


def _flat(row: dict[str, Any]) -> dict[str, Any]:
    """A row with its list values (shape) as ``AxB`` strings, for a table."""
    return {k: (shape_text(v) if isinstance(v, list) else v) for k, v in row.items()}
