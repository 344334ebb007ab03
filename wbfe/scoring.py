"""Score one checkpoint: sources -> matrices -> spectra -> metrics -> :class:`ModelScore`.

(Named `scoring` so that the module never shadows the function `wbfe.score`.)
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Literal, Optional, Union

from wbfe._provenance import installed_versions
from wbfe.errors import InvalidOptionError, NoUsableMatrixError, did_you_mean
from wbfe.executors import ExecutorOptions
from wbfe.framework import order_rows
from wbfe.heads import choose_head
from wbfe.matrices import MIN_BFE_EIGS, MatrixPlan, Skip, as_matrices, component_of, plan_matrix
from wbfe.metrics import MetricOptions, resolve_groups
from wbfe.options import ScoreOptions, check_conv
from wbfe.pipeline import Pipeline, Reading
from wbfe.quant import dequantised
from wbfe.experts import expand_experts
from wbfe.report import as_float, json_ready
from wbfe.sources import TensorEntry, open_source
from wbfe.sources.peft_adapter import AdapterSource
from wbfe.spectra import DegenerateMatrixError, batch_size, batchable, resolve_device, spectra_batch, spectrum
from wbfe.ties import SeenContent

__all__ = ["ScoreOptions", "ModelScore", "score", "Progress"]

# progress(done, total, tensor name); total may be None when unknown.
Progress = Callable[[int, Optional[int], str], None]


@dataclass
class ModelScore:
    """The scores of one checkpoint.

    Attributes:
        model: provenance: source, format, files, sha256, versions, options.
        layers: one dict per analysed matrix: name, role, shape, dtype, convention, rows, cols,
            n_slices, n_eigs, gamma, form, then each metric group's columns, and ``reasons`` for NaNs.
        skipped: ``{"name", "reason", "shape", "dtype"}`` for every tensor not analysed.
        summary: head, head and mean values of the main columns (``bfe_head``, ``bfe_mean``, ...).
    """

    model: dict[str, Any]
    layers: list[dict[str, Any]] = field(default_factory=list)
    skipped: list[dict[str, Any]] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """Plain-data form (the JSON shape); non-finite numbers become None."""
        return json_ready({"model": self.model, "layers": self.layers, "skipped": self.skipped, "summary": self.summary})

    def to_json(self, indent: int | None = 2) -> str:
        """Standard JSON (no NaN/Infinity tokens: they are written as null, with a reason beside them)."""
        return json.dumps(self.to_dict(), indent=indent, allow_nan=False)

    def to_pandas(self) -> Any:
        """One row per analysed matrix (requires pandas)."""
        try:
            import pandas as pd
        except ImportError:
            from wbfe.errors import MissingDependencyError

            raise MissingDependencyError("to_pandas() needs pandas (pip install pandas)") from None
        rows = [{k: (v if not isinstance(v, (list, dict)) else json.dumps(v)) for k, v in layer.items()}
                for layer in self.layers]
        return pd.DataFrame(rows)


def score(
    ref: Any,
    *,
    metrics: Union[str, Iterable[str], None] = None,
    lam: Union[str, float] = "opt",
    conv: Literal["flatten", "slices"] = "flatten",
    layers: Optional[str] = None,
    device: str = "auto",
    head: Optional[str] = None,
    min_eigs: int = 10,
    ww_compatible: bool = False,
    seed: int = 0,
    base: Any = None,
    progress: Optional[Progress] = None,
    options: Optional[ScoreOptions] = None,
    executor: Literal["local", "ray"] = "local",
    ray_address: Optional[str] = None,
) -> ModelScore:
    """Score every weight matrix of a checkpoint.

    While it runs, the process's BLAS, OpenMP and torch thread counts are changed (matrices are
    scored on one thread each, side by side) and restored at the end; numeric work on other
    threads of the process meanwhile runs with those counts.

    Args:
        ref: a path, ``org/name[@rev]``, ``timm:<name>``, ``torchvision:<weights>``, an ``nn.Module``
            or a state dict (see :mod:`wbfe.sources`).
        metrics: metric groups (``"bfe,htsr,htmp"`` or an iterable); None for the default, ``bfe,htsr``.
        lam: ``"opt"`` (λ* per matrix) or a fixed prior precision.
        conv: conv-kernel convention, ``flatten`` (out × in·k…) or ``slices`` (pooled k positions).
        layers: a regular expression; only tensors whose name it matches (``re.search``) are analysed.
        device: ``auto``, ``cpu`` or ``cuda`` for the eigen-solves.
        head: tensor (or module) name of the classifier / LM head, overriding the built-in rule.
        min_eigs: the tail fits (HT-SR, HTMP) of matrices with fewer eigenvalues are NaN, with the
            reason; BFE-W is computed for any matrix with at least 2 (WeightWatcher-compatible
            mode skips such matrices altogether, as WeightWatcher does).
        ww_compatible: reproduce WeightWatcher 0.7.7's choices (conv slicing, fitting).
        seed: seed of the random steps (the ``rand`` group's permutations); recorded in the options.
        base: for a PEFT LoRA adapter folder, its base model (any reference): every adapted module
            is also scored merged, W₀ + ΔW, with its change against W₀ (see :mod:`wbfe.adapters`).
        progress: called after each tensor with (done, total, name).
        options: every setting above as one :class:`~wbfe.options.ScoreOptions`; when given, the
            other setting keywords must keep their defaults.
        executor: ``local``, or ``ray``: one Ray task per shard (see :mod:`wbfe.executors.ray_score`),
            the same result (its provenance adds ``executor``); ``progress`` is then called per shard.
        ray_address: with ``executor="ray"``: ``auto``, ``ray://host:port`` or ``host:port``.

    Returns:
        A :class:`ModelScore`.

    Raises:
        InvalidOptionError: a bad option value. The errors of :func:`wbfe.sources.open_source`.
        NoUsableMatrixError: every weight matrix was skipped.

    Example:
        >>> import torch, wbfe
        >>> s = wbfe.score({"fc.weight": torch.eye(12) * 2.0}, metrics="bfe")
        >>> round(s.summary["bfe_head"], 6)  # identity spectrum: F* = ½·log(2πe)
        1.418939
    """
    given = dict(metrics=() if metrics is None else metrics, lam=lam, conv=conv, layers=layers or None,
                 device=device, head=head, min_eigs=min_eigs, ww_compatible=ww_compatible, seed=seed)
    if options is None:
        options = ScoreOptions(**given)  # type: ignore[arg-type]
    elif given != _DEFAULT_KEYWORDS:
        raise InvalidOptionError("score(): pass the settings either as options=ScoreOptions(...) or as keywords, not both")
    where = ExecutorOptions(executor, ray_address)
    if where.is_ray:
        if base is not None:
            raise InvalidOptionError("--base (a LoRA adapter) is scored locally; drop --executor ray")
        from wbfe.executors.ray_score import score_on_ray

        return score_on_ray(ref, options, where, progress=progress)
    groups = resolve_groups(options.metrics)
    head = options.head
    torch_device = resolve_device(options.device)
    metric_options = MetricOptions(lam=options.lam, ww_compatible=options.ww_compatible, seed=options.seed)
    result = ModelScore(model={})
    seen_storage: dict[Any, str] = {}
    seen_content = SeenContent()
    done = 0

    def record(entry: TensorEntry, item: Union[Skip, dict[str, Any]]) -> None:
        nonlocal done
        if isinstance(item, Skip):
            result.skipped.append(item.to_dict())
        else:
            result.layers.append(item)
        done += 1
        if progress is not None:
            # Fused expert stacks become several entries: the stored count is then a lower bound.
            progress(done, None if total is None else max(total, done), entry.name)

    with open_source(ref) as source, Pipeline(torch_device) as pipeline:
        if isinstance(source, AdapterSource) or base is not None:  # a PEFT LoRA adapter: ΔW = s·B·A per module
            from wbfe.adapters import score_adapter

            return score_adapter(source, options, metric_options, groups, base=base)
        total = len(source)
        _run_stream(pipeline, _stream(source), options, torch_device, groups, metric_options,
                    seen_storage, seen_content, record)
        description = source.description  # the checkpoint's own: model order, head (wbfe.framework)
        provenance = source.provenance.to_dict()
        head_hint = source.head_hint
        config = source.config
    provenance.update({"device": str(torch_device), "versions": installed_versions(), "options": options.to_dict()})
    result.model = provenance
    if not result.layers:
        reasons = "; ".join(f"{s['name']}: {s['reason']}" for s in result.skipped[:3])
        raise NoUsableMatrixError(
            f"{provenance['source']}: no usable weight matrix ({len(result.skipped)} tensors skipped"
            + (f" — {reasons}" if reasons else "") + ")",
            ref=provenance["source"],
        )
    if description is not None:  # rows in the model's order
        result.layers = order_rows(result.layers, description.order, description.aliases)
        result.skipped = order_rows(result.skipped, description.order, description.aliases)
    result.summary = _summarise(result.layers, groups, head, head_hint, result.skipped, config, description)
    return result


_DEFAULT_KEYWORDS = dict(metrics=(), lam="opt", conv="flatten", layers=None, device="auto", head=None,
                         min_eigs=10, ww_compatible=False, seed=0)


def _run_stream(
    pipeline: Pipeline,
    stream: Iterable[tuple[TensorEntry, Optional[str]]],
    options: ScoreOptions,
    device: Any,
    groups: tuple[Any, ...],
    metric_options: MetricOptions,
    seen_storage: dict[Any, str],
    seen_content: Any,
    record: Callable[[TensorEntry, Union[Skip, dict[str, Any]]], None],
) -> None:
    """Plan, read, tie-check and schedule every entry of ``stream`` on ``pipeline``, calling
    ``record(entry, skip_or_row)`` in stream order as results finish. score() and the Ray
    executor's per-shard task both run this one loop, so their rows agree exactly."""
    need_eigs = any(g.needs_eigenvalues for g in groups)
    planned = ((entry, _plan(entry, options, options.pattern, consumed)) for entry, consumed in stream)
    # Consecutive small matrices of one shape and dtype (an MoE's experts) whose eigenvalues are
    # needed, held until a batch is full or the stream moves on: one batched eigen-solve.
    batch: list[tuple[TensorEntry, MatrixPlan, Any]] = []

    def flush() -> None:
        if len(batch) == 1:  # a matrix without equal-shaped neighbours: on its own, as any other
            (entry, plan, matrices), = batch
            pipeline.compute(entry, plan, _spectrum_job(matrices, device, need_eigs, groups, metric_options, entry.name))
        elif batch:
            pipeline.compute_batch([(e, p) for e, p, _ in batch], _batch_job(batch, device, groups, metric_options))
        batch.clear()

    rows = _RowMaker(groups, metric_options, options.min_eigs, record)
    for entry, plan, reading in pipeline.read_ahead(planned):
        prepared = _prepare(entry, plan, reading, options, seen_storage, seen_content)
        key = _batch_key(plan, prepared, device) if need_eigs else None
        if batch and (key != _batch_key(batch[0][1], batch[0][2], device)
                      or len(batch) >= batch_size(plan.rows, plan.cols)  # type: ignore[union-attr]
                      or not pipeline.batch_fits([(e, p) for e, p, _ in batch] + [(entry, plan)])):  # type: ignore[list-item]
            flush()
        if key is not None:
            batch.append((entry, plan, prepared))  # type: ignore[arg-type]
        elif isinstance(prepared, Skip):
            pipeline.put(entry, prepared)
        else:
            assert isinstance(plan, MatrixPlan)
            pipeline.compute(entry, plan, _spectrum_job(prepared, device, need_eigs, groups, metric_options, entry.name))
        del prepared  # the job holds the tensor now, and frees it when done
        for item in pipeline.finished():
            rows.add(*item)
    flush()
    for item in pipeline.finished(wait=True):
        rows.add(*item)
    rows.flush()


class _RowMaker:
    """Turns finished spectra into layer rows and hands each row (or skip) to ``record``, in stream
    order. Where a group has ``compute_many``, up to ``_ROW_BATCH`` spectra are held back (skips
    between them too, to keep the order) and those of one shape are fitted together: an MoE layer's
    experts, stored interleaved (w1, w2, w3 of each expert) or with biases between them."""

    def __init__(self, groups: tuple[Any, ...], metric_options: MetricOptions, min_eigs: int,
                 record: Callable[[TensorEntry, Union[Skip, dict[str, Any]]], None]) -> None:
        self.groups, self.metric_options, self.min_eigs, self.record = groups, metric_options, min_eigs, record
        self.batching = any(g.compute_many is not None for g in groups)
        self.pending: list[tuple[TensorEntry, Union[Skip, MatrixPlan], Any]] = []
        self.held = 0  # spectra among the pending entries

    def add(self, entry: TensorEntry, plan: Union[Skip, MatrixPlan], outcome: Any) -> None:
        if isinstance(outcome, DegenerateMatrixError):
            outcome = Skip(entry.name, str(outcome), entry.shape, entry.dtype)
        self.pending.append((entry, plan, outcome))
        if not isinstance(outcome, Skip):
            self.held += 1
        if not self.batching or self.held >= _ROW_BATCH:
            self.flush()

    def flush(self) -> None:
        runs: dict[tuple[int, int, int, int], list[int]] = {}
        for k, (_, plan, outcome) in enumerate(self.pending):
            if not isinstance(outcome, Skip):
                runs.setdefault(_row_key(plan, outcome), []).append(k)  # type: ignore[arg-type]
        done: dict[int, dict[str, Any]] = {}
        for members in runs.values():
            specs = [self.pending[k][2] for k in members]
            for group in self.groups:
                if group.compute_many is not None and len(specs) > 1 and not _too_few(group, specs[0], self.min_eigs):
                    for k, out in zip(members, group.compute_many(specs, self.metric_options)):
                        done.setdefault(k, {})[group.name] = out
        for k, (entry, plan, outcome) in enumerate(self.pending):
            if isinstance(outcome, Skip):
                self.record(entry, outcome)
            else:
                assert isinstance(plan, MatrixPlan)
                self.record(entry, _layer_row(plan, outcome, self.groups, self.metric_options, entry.quant,
                                              self.min_eigs, done.get(k)))
        self.pending.clear()
        self.held = 0


# The most rows held back for one compute_many call: the spectra are small next to their matrices.
_ROW_BATCH = 256


def _row_key(plan: MatrixPlan, spec: Any) -> tuple[int, int, int, int]:
    return plan.rows, plan.cols, plan.n_slices, spec.n_eigs


def _too_few(group: Any, spec: Any, min_eigs: int) -> bool:
    """Whether ``group`` fits a spectrum's tail and this one has too few eigenvalues for it."""
    return group.name in _TAIL_FIT_GROUPS and spec.n_eigs < min_eigs


def _stream(source: Any) -> Iterable[tuple[TensorEntry, Optional[str]]]:
    """The source's entries as matrices to plan: quantized weights dequantised, fused expert stacks
    split per expert; with each, the reason it is consumed by another (a scale), or None."""
    return expand_experts(dequantised(source.entries(), source.config), source.config)


def _plan(
    entry: TensorEntry, options: ScoreOptions, pattern: Optional[re.Pattern[str]], consumed: Optional[str] = None
) -> Union[Skip, MatrixPlan]:
    if entry.skip is not None:  # the reader could not give it as a dense tensor
        return Skip(entry.name, entry.skip, entry.shape, entry.dtype)
    if pattern is not None and not pattern.search(entry.name):
        return Skip(entry.name, "not selected by --layers", entry.shape, entry.dtype)
    if consumed is not None:  # a quantized weight's scale, zeros or packed data (see wbfe.quant)
        return Skip(entry.name, consumed, entry.shape, entry.dtype)
    # WeightWatcher skips small matrices; otherwise only the tail fits need --min-eigs (see _layer_row).
    min_eigs = options.min_eigs if options.ww_compatible else MIN_BFE_EIGS
    return plan_matrix(entry.name, entry.shape, entry.dtype, conv=options.conv, min_eigs=min_eigs, layout=entry.layout)


def _prepare(
    entry: TensorEntry,
    plan: Union[Skip, MatrixPlan],
    reading: Optional[Reading],
    options: ScoreOptions,
    seen_storage: dict[Any, str],
    seen_content: SeenContent,
) -> Union[Skip, list[Any]]:
    """The entry's matrices, or why it is skipped before any linear algebra."""
    if isinstance(plan, Skip):
        return plan
    if entry.storage_key is not None:
        if entry.storage_key in seen_storage:
            return Skip(entry.name, f"tied: shares storage with {seen_storage[entry.storage_key]}", entry.shape, entry.dtype)
        seen_storage[entry.storage_key] = entry.name
    tensor = reading.take() if reading is not None else entry.load()
    earlier = seen_content.earlier_copy(entry, tensor)
    if earlier is not None:
        return Skip(entry.name, f"tied: identical to {earlier}", entry.shape, entry.dtype)
    return (_ww_matrices(tensor, plan) if options.ww_compatible and plan.convention == "slices"
            else as_matrices(tensor, plan))


def _spectrum_job(
    matrices: list[Any], device: Any, need_eigs: bool, groups: tuple[Any, ...], metric_options: MetricOptions, name: str,
) -> Callable[[], Any]:
    """The spectrum of ``matrices``, with what each group's ``from_matrices`` hook computes beside it."""
    def job() -> Any:
        try:
            return _with_hooks(spectrum(matrices, device, need_eigs=need_eigs), matrices, device, groups,
                               metric_options, name)
        except DegenerateMatrixError as exc:
            return exc
    return job


def _with_hooks(spec: Any, matrices: list[Any], device: Any, groups: tuple[Any, ...], metric_options: MetricOptions,
                name: str) -> Any:
    """``spec`` with what each group's ``from_matrices`` hook computes from the matrices themselves."""
    hooks = [g for g in groups if g.from_matrices is not None]
    if not hooks:
        return spec
    return dataclasses.replace(spec, extra={g.name: g.from_matrices(matrices, device, metric_options, name) for g in hooks})


def _batch_key(plan: Union[Skip, MatrixPlan], prepared: Any, device: Any) -> Optional[tuple[int, int, Any]]:
    """``(rows, cols, dtype)`` of an entry that is one small matrix scored in a batch with its
    equal-shaped neighbours (see :func:`wbfe.spectra.spectra_batch`); None for any other entry."""
    if (isinstance(prepared, Skip) or not isinstance(plan, MatrixPlan) or len(prepared) != 1
            or not batchable(plan.rows, plan.cols, device)):
        return None
    return plan.rows, plan.cols, prepared[0].dtype


def _batch_job(
    batch: list[tuple[TensorEntry, MatrixPlan, Any]], device: Any, groups: tuple[Any, ...], metric_options: MetricOptions,
) -> Callable[[], list[Any]]:
    """:func:`_spectrum_job` of each entry of ``batch``, the spectra computed together."""
    matrices = [prepared[0] for _, _, prepared in batch]
    names = [entry.name for entry, _, _ in batch]

    def job() -> list[Any]:
        out = spectra_batch(matrices, device)
        for k, spec in enumerate(out):
            if not isinstance(spec, DegenerateMatrixError):
                try:
                    out[k] = _with_hooks(spec, [matrices[k]], device, groups, metric_options, names[k])
                except DegenerateMatrixError as exc:
                    out[k] = exc
        return out
    return job


def _ww_matrices(tensor: Any, plan: MatrixPlan) -> list[Any]:
    from wbfe._ww_compat import ww_conv2d_matrices
    import torch

    if len(plan.shape) != 4:
        return as_matrices(tensor, plan)
    return [torch.from_numpy(m) for m in ww_conv2d_matrices(tensor.detach().float().cpu().numpy())]


# Metric groups that fit the spectrum's tail: below --min-eigs eigenvalues they report NaN.
_TAIL_FIT_GROUPS = ("htsr", "htmp")


def _layer_row(
    plan: MatrixPlan,
    spec: Any,
    groups: tuple[Any, ...],
    metric_options: MetricOptions,
    quant: Optional[str] = None,
    min_eigs: int = 1,
    computed: Optional[dict[str, Any]] = None,
) -> dict[str, Any]:
    """One layer's row; ``computed`` holds group results already computed (by ``compute_many``)."""
    row: dict[str, Any] = {
        "name": plan.name,
        "role": plan.role,
        "component": component_of(plan.name),
        "shape": list(plan.shape),
        "dtype": plan.dtype,
        "quant": quant,
        "convention": plan.convention,
        "rows": spec.rows,
        "cols": spec.cols,
        "n_slices": spec.n_slices,
        "n_eigs": spec.n_eigs,
        "gamma": spec.gamma,
        "form": spec.form,
    }
    reasons: dict[str, str] = {}
    for group in groups:
        if _too_few(group, spec, min_eigs):
            why = f"too few eigenvalues for a tail fit: {spec.n_eigs} < min_eigs={min_eigs}"
            row.update({column: math.nan for column in group.columns})
            reasons.update({column: why for column in group.columns})
            continue
        out = computed[group.name] if computed and group.name in computed else group.compute(spec, metric_options)
        row.update(out.values)
        reasons.update(out.reasons)
    row["reasons"] = reasons
    return row


def _summarise(
    layers: list[dict[str, Any]],
    groups: tuple[Any, ...],
    head_override: Optional[str],
    head_hint: Optional[str] = None,
    skipped: Optional[list[dict[str, Any]]] = None,
    config: Optional[dict[str, Any]] = None,
    description: Optional[Any] = None,
) -> dict[str, Any]:
    import numpy as np

    by_name = {layer["name"]: layer for layer in layers}
    choice = choose_head(layers, skipped or [], override=head_override, hint=head_hint, config=config,
                         description=description)
    head, head_source = choice.name, choice.source
    if head is not None:
        by_name[head]["role"] = "head"
    summary: dict[str, Any] = {"head": head, "head_source": head_source, "n_layers": len(layers)}
    for group in groups:
        for column in group.summary_columns:
            values = np.array([as_float(layer.get(column)) for layer in layers], dtype=float)
            finite = values[np.isfinite(values)]
            summary[f"{column}_head"] = as_float(by_name[head].get(column)) if head else math.nan
            summary[f"{column}_mean"] = float(finite.mean()) if finite.size else math.nan
            summary[f"{column}_n"] = int(finite.size)
    columns = [column for group in groups for column in group.summary_columns]
    summary["by_role"] = _means_by(layers, "role", columns)
    if any(layer.get("component") for layer in layers):
        summary["by_component"] = _means_by(layers, "component", columns)
    unsplit = [layer["name"] for layer in layers if _UNSPLIT.search(layer["name"])]
    if unsplit:
        summary["experts_note"] = (f"{len(unsplit)} fused gate_up expert matrices of a model type without a known "
                                   "gate/up layout are scored unsplit (gate and up as one matrix)")
    if choice.note is not None:
        summary["head_note"] = choice.note
    elif head is None:
        summary["head_note"] = "no head found by config, name or structure; pass --head NAME"
    return summary


_UNSPLIT = re.compile(r"(gate_up|input_linear|w13|w1_w3)[^.]*\[\d+\]$")


def _means_by(layers: list[dict[str, Any]], key: str, columns: list[str]) -> dict[str, dict[str, Any]]:
    """Per value of ``key`` (each role, or each component), ``n`` and the mean of each column over
    its matrices with a finite value: thousands of expert rows do not drown the attention's mean."""
    import numpy as np

    out: dict[str, dict[str, Any]] = {}
    for value in dict.fromkeys(str(layer.get(key)) for layer in layers if layer.get(key)):
        members = [layer for layer in layers if str(layer.get(key)) == value]
        entry: dict[str, Any] = {"n": len(members)}
        for column in columns:
            values = np.array([as_float(layer.get(column)) for layer in members], dtype=float)
            finite = values[np.isfinite(values)]
            entry[f"{column}_mean"] = float(finite.mean()) if finite.size else math.nan
        out[value] = entry
    return out


def layer_spectrum(
    ref: Any, layer: str, *, conv: Literal["flatten", "slices"] = "flatten", device: str = "auto"
) -> tuple[MatrixPlan, Any]:
    """The plan and :class:`~wbfe.metrics.Spectrum` of one named matrix of a checkpoint.

    Args:
        ref: any reference :func:`score` accepts.
        layer: the tensor name as stored (or its module name without ``.weight``).

    Raises:
        InvalidOptionError: no such tensor (close names are suggested), or it is not a matrix.
        DegenerateMatrixError: the matrix is non-finite or all zero.
    """
    check_conv(conv)
    torch_device = resolve_device(device)
    names: list[str] = []
    with open_source(ref) as source:
        for entry, consumed in _stream(source):
            names.append(entry.name)
            if entry.name not in (layer, f"{layer}.weight"):
                continue
            plan = plan_matrix(entry.name, entry.shape, entry.dtype, conv=conv)
            if entry.skip is not None or consumed is not None:  # as score() does (see _plan)
                plan = Skip(entry.name, entry.skip or consumed or "")
            if isinstance(plan, Skip):
                raise InvalidOptionError(f"{entry.name} is not a weight matrix ({plan.reason})")
            return plan, spectrum(as_matrices(entry.load(), plan), torch_device)
    raise InvalidOptionError(f"no tensor named {layer!r} in {ref}{did_you_mean(layer, names)}")
