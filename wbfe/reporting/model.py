"""The audit page of one scored checkpoint: provenance, summary, per-layer table, metrics along
depth, ESD thumbnails of the head and the most unusual layers, and every skipped tensor."""

from __future__ import annotations

from collections import Counter
from typing import Any, Iterable, Mapping, Optional, Sequence

import numpy as np

from wbfe.options import CONV_VIEWS, ReportOptions, ScoreOptions
from wbfe.render.text import applicability_line, finite_or_none, number_text, shape_text
from wbfe.reporting.content import Block, Column, FigureBlock, FigureGrid, KeyValues, Paragraph, Report, Section, Table
from wbfe.reporting.figures import ESD_COLOURS, depth_figure, esd_figure, short_name
from wbfe.reporting.metrics_info import HEAD_SOURCES, colour, meaning, sign_text

__all__ = ["score_report", "unusual_layers", "reasons_note", "read_eigenvalues", "provenance_items"]

# Columns of the layer table shown before "all columns" is ticked (the rest stay in the page).
_IDENTITY = ("name", "role", "shape", "dtype", "quant", "n_eigs", "gamma")
_LATE = ("diagnosis",)
_HIDDEN = ("reasons",)


def unusual_layers(layers: Sequence[Mapping[str, Any]], metrics: Sequence[str], k: int) -> list[tuple[str, str]]:
    """The ``k`` layers farthest from the others: the largest robust z-score |x - median| / (1.4826 MAD)
    over ``metrics`` (a metric with fewer than 4 finite values or no spread is left out). Returns
    ``(name, why)`` pairs, most unusual first."""
    best: dict[str, tuple[float, str]] = {}
    for metric in metrics:
        values = [(v, layer["name"]) for layer in layers if (v := finite_or_none(layer.get(metric))) is not None]
        finite = np.array([v for v, _ in values])
        if finite.size < 4:
            continue
        median = float(np.median(finite))
        spread = 1.4826 * float(np.median(np.abs(finite - median))) or float(np.std(finite))
        if not spread > 0:
            continue
        for value, name in values:
            z = abs(value - median) / spread
            if z > best.get(name, (-1.0, ""))[0]:
                best[name] = (z, f"{metric} = {value:.4g} (median {median:.4g}, robust z = {z:.1f})")
    ranked = sorted(best.items(), key=lambda item: (-item[1][0], item[0]))
    return [(name, why) for name, (_, why) in ranked[:k]]


def provenance_items(model: Mapping[str, Any], first: Sequence[str], last: Sequence[str] = ()) -> list[tuple[str, Any]]:
    """The fields of a result's ``model`` block: ``first``, the others, then ``last`` (``metadata`` left out)."""
    rest = [(k, v) for k, v in model.items() if k not in (*first, *last, "metadata")]
    return [(k, model.get(k)) for k in first] + rest + [(k, model.get(k)) for k in last]


def _provenance(model: Mapping[str, Any]) -> list[Any]:
    blocks: list[Any] = [KeyValues(provenance_items(model, ("source", "format", "files", "sha256", "device"),
                                                    ("options", "versions")))]
    metadata = model.get("metadata")
    if isinstance(metadata, Mapping) and metadata:
        blocks.append(KeyValues(sorted(metadata.items()),
                                collapsed_title=f"checkpoint metadata ({len(metadata)} keys)"))
    return blocks


def _summary(summary: Mapping[str, Any], metrics: Sequence[str], n_skipped: int) -> list[Any]:
    head, source = summary.get("head"), summary.get("head_source")
    blocks: list[Any] = []
    if head:
        how = HEAD_SOURCES.get(str(source))  # a source without its sentence is named once, not twice
        blocks.append(Paragraph(f"Head: {head} — {how} (head_source: {source})." if how else
                                f"Head: {head} (head_source: {source})."))
    else:
        blocks.append(Paragraph(f"No head: {summary.get('head_note') or 'no classifier head found'}.", kind="note"))
    blocks.append(Paragraph(f"{summary.get('n_layers')} matrices scored, {n_skipped} tensors skipped (listed below)."))
    verdict = summary.get("bfe_applicability")
    if isinstance(verdict, dict):
        # The paper's conditions for BFE-W, from the architecture: a reader sees them beside the numbers.
        blocks.append(Paragraph(applicability_line(verdict) + ".",
                                kind="" if verdict.get("status") == "holds" else "note"))
    rows = [{"metric": m, "_colour": colour(m), "head": summary.get(f"{m}_head"), "mean": summary.get(f"{m}_mean"),
             "n": summary.get(f"{m}_n"), "sign": sign_text(m), "meaning": meaning(m)} for m in metrics]
    columns = [Column("metric", "metric"), Column("head", "head", "the head's value"),
               Column("mean", "mean", "mean over the matrices with a finite value"),
               Column("n", "n", "matrices with a finite value"),
               Column("sign", "expected sign", "which direction predicts a better model (wbfe.ranking.expected_sign)"),
               Column("meaning", "meaning")]
    blocks.append(Table("summary", columns, rows, sortable=False))
    # Whatever else the score summarised (per role, per component, notes): shown as it is.
    shown = {"head", "head_source", "n_layers", "head_note", "bfe_applicability"}
    shown |= {f"{m}_{s}" for m in metrics for s in ("head", "mean", "n")}
    if rest := [(k, v) for k, v in summary.items() if k not in shown]:
        blocks.append(KeyValues(rest, collapsed_title=f"other summary fields ({len(rest)})"))
    return blocks


def _layer_table(layers: Sequence[Mapping[str, Any]], metrics: Sequence[str]) -> Table:
    keys = list(dict.fromkeys(k for layer in layers for k in layer if k not in _HIDDEN))
    main = [k for k in _IDENTITY if k in keys and (k != "quant" or any(layer.get("quant") for layer in layers))]
    main += [m for m in metrics if m in keys] + [k for k in _LATE if k in keys]
    columns = [Column("#", "#", "position in the checkpoint (the x axis of the depth plots)")]
    columns += [Column(k, k, meaning(k), colour(k) if k in metrics else None) for k in main]
    columns += [Column(k, k, meaning(k), extra=True) for k in keys if k not in main]
    rows: list[dict[str, Any]] = [{**{k: layer.get(k) for k in keys}, "#": i} for i, layer in enumerate(layers, 1)]
    for row in (r for r in rows if isinstance(r.get("shape"), (list, tuple))):
        row["shape"] = shape_text(row["shape"])
    notes = [reasons_note(layer.get("reasons") or {}) for layer in layers]
    return Table("layers", columns, rows, filterable=True, notes=notes,
                 caption="Click a header to sort; type in the box to filter by name, role or note. "
                         "An empty cell is a null value: its reason is in the row's note.")


def reasons_note(reasons: Mapping[str, str]) -> Optional[str]:
    """``reasons`` with the columns that share a reason named together (a failed fit nulls a dozen)."""
    by_reason: dict[str, list[str]] = {}
    for column, reason in reasons.items():
        by_reason.setdefault(str(reason), []).append(column)
    return "; ".join(f"{', '.join(columns)}: {reason}" for reason, columns in by_reason.items()) or None


def _esd_section(layers: Sequence[Mapping[str, Any]], head: Optional[str], unusual: Sequence[tuple[str, str]],
                 eigs: Optional[Mapping[str, tuple[np.ndarray, int]]], unavailable: Optional[str]) -> list[Any]:
    blocks: list[Any] = [Paragraph(
        "Empirical spectral density of the smaller Gram matrix (log-log, grey points) with the fits whose "
        f"parameters are in the table: {', '.join(ESD_COLOURS)} (each in the colour of its column: alpha, "
        "tpl_alpha, htmp_kappa). Shown: the head, then the layers whose metrics lie farthest from the model's "
        "median (robust z-score).")]
    if eigs is None:
        return blocks + [Paragraph(f"ESDs unavailable: {unavailable}", kind="note")]
    index = {layer["name"]: (i, layer) for i, layer in enumerate(layers, start=1)}
    chosen: list[tuple[str, str]] = ([(head, "the head")] if head is not None and head in index else [])
    chosen += [(name, why) for name, why in unusual if name != head]
    figures, missing = [], []
    for name, why in chosen:
        i, row = index[name]
        values, k = eigs.get(name, (None, 0))
        if values is None or values.size != row.get("n_eigs"):
            found = "not found" if values is None else f"{values.size} eigenvalues, the score had {row.get('n_eigs')}"
            missing.append(f"{name} ({found})")
            continue
        shape = shape_text(row.get("shape", []))
        fig = esd_figure(values, _stored_units(row, k), title=f"#{i} {short_name(name)}  {shape}", scale_exp2=k)
        figures.append(FigureBlock(f"esd-{i}", fig, caption=f"#{i} {name}: {why}. {_fit_text(row)}",
                                   alt=f"ESD of {name}"))
    if figures:
        blocks.append(FigureGrid(figures))
    if missing:
        blocks.append(Paragraph("Not drawn, the checkpoint read differs from the one scored: " + "; ".join(missing),
                                kind="note"))
    return blocks


# The fit columns in the units of the eigenvalues (the power of an eigenvalue each scales like), which the table holds
# true and the re-read eigenvalues are stored × 2^k in.
_FIT_UNITS = {"xmin": 1, "htmp_tau": 1, "tpl_lambda": -1, "htmp_beta": -1}


def _stored_units(row: Mapping[str, Any], k: int) -> Mapping[str, Any]:
    """``row`` with its fit columns × 2^(power·k), for eigenvalues stored as the true ones × 2^k (exact: a power of
    two). A column the score could not hold in float64 (null) stays null, and its fit is not drawn."""
    if not k:
        return row
    values = {c: (finite_or_none(row.get(c)), p) for c, p in _FIT_UNITS.items()}
    return {**row, **{c: float(np.ldexp(v, p * k)) for c, (v, p) in values.items() if v is not None}}


def _fit_text(row: Mapping[str, Any]) -> str:
    def fmt(key: str) -> str:
        return number_text(row.get(key), ".4g", "null")

    parts = [f"power law α = {fmt('alpha')}, xmin = {fmt('xmin')}",
             f"truncated PL α = {fmt('tpl_alpha')}, Λ = {fmt('tpl_lambda')}",
             f"HTMP κ = {fmt('htmp_kappa')}, β = {fmt('htmp_beta')}, τ = {fmt('htmp_tau')}, KS = {fmt('htmp_ks')}"]
    reasons = row.get("reasons") or {}
    failed = [f"{k}: {reasons[k]}" for k in ("alpha", "tpl_alpha", "htmp_kappa") if k in reasons]
    return "; ".join(parts) + (". " + "; ".join(failed) if failed else "")


def read_eigenvalues(ref: Any, names: Iterable[str], options: Mapping[str, Any]) -> dict[str, tuple[np.ndarray, int]]:
    """The eigenvalues of each matrix in ``names`` of checkpoint ``ref``, computed as the score with ``model.options``
    ``options`` did, each with the power of two k they are stored at (:func:`wbfe.engine.eigenvalues_of`). A name the
    checkpoint lacks is absent from the result."""
    from wbfe.engine import eigenvalues_of

    conv = options.get("conv")
    return eigenvalues_of(ref, names, ScoreOptions(conv=conv if conv in CONV_VIEWS else "flatten",
                                                   ww_compatible=bool(options.get("ww_compatible")),
                                                   device=str(options.get("device") or "auto")))


def score_report(score: Any, *, spectra_from: Any = None, esd_unavailable: Optional[str] = None,
                 n_unusual: int = 5) -> Report:
    """The report of one :class:`~wbfe.ModelScore` (or its JSON dict).

    Args:
        score: the score, or ``json.load`` of a saved ``wbfe score --format json``.
        spectra_from: a checkpoint reference to re-read the ESD matrices from (None: no ESDs,
            ``esd_unavailable`` says why).
        n_unusual: how many unusual layers get an ESD thumbnail besides the head (≥ 0).

    Raises:
        InvalidOptionError: ``n_unusual`` is not a non-negative integer.
    """
    ReportOptions(n_unusual=n_unusual)  # checks only
    data = score.to_dict() if hasattr(score, "to_dict") else dict(score)
    model, layers, skipped, summary = data["model"], data["layers"], data["skipped"], data["summary"]
    # The summarised layer columns (bfe_mean -> bfe), in the order the score lists them.
    metrics = [m for m in (k.removesuffix("_mean") for k in summary if k.endswith("_mean"))
               if any(m in row for row in layers)]
    head = summary.get("head")
    # The head is always shown: the unusual ones are chosen among the other layers (against all of them).
    unusual = [item for item in unusual_layers(layers, metrics, n_unusual + 1) if item[0] != head][:n_unusual]
    wanted = ([head] if head else []) + [name for name, _ in unusual]
    eigs = None if spectra_from is None else read_eigenvalues(spectra_from, wanted, model.get("options") or {})
    headline = ""
    if head:
        values = [(m, summary.get(f"{m}_head")) for m in metrics[:2]]
        headline = f"; head {head}: " + ", ".join(f"{m} = {v:.4g}" for m, v in values if isinstance(v, (int, float)))
    depth: list[Block] = [FigureBlock(
        "depth", depth_figure(layers, metrics, head=head, marked=[n for n, _ in unusual]), alt="metrics along depth",
        caption="Each metric along depth (x = the layer's # in the table). "
                "Star: the head; ring: a layer whose ESD is shown below.")] if metrics and layers else []
    return Report(title=f"wbfe audit: {model.get('source')}",
                  subtitle=f"{len(layers)} matrices, {len(skipped)} skipped tensors{headline}; "
                           f"sha256 {str(model.get('sha256'))[:16]}…",
                  sections=[Section("provenance", "Provenance", _provenance(model)),
                            Section("summary", "Summary", _summary(summary, metrics, len(skipped))),
                            Section("depth", "Metrics along depth", depth),
                            Section("esd", "Spectra of the head and the most unusual layers",
                                    _esd_section(layers, head, unusual, eigs, esd_unavailable)),
                            Section("layers", f"Layers ({len(layers)})", [_layer_table(layers, metrics)]),
                            Section("skipped", f"Skipped tensors ({len(skipped)})", _skipped(skipped))])


def _skipped(skipped: Sequence[Mapping[str, Any]]) -> list[Any]:
    if not skipped:
        return [Paragraph("No tensor was skipped.")]
    counts = Counter(str(item.get("reason", "")).split(":")[0] for item in skipped)
    text = "; ".join(f"{n} × {r}" for r, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))
    rows = [{"name": s.get("name"), "reason": s.get("reason"),
             "shape": shape_text(s.get("shape") or []), "dtype": s.get("dtype")} for s in skipped]
    columns = [Column("name", "name"), Column("reason", "reason"), Column("shape", "shape"), Column("dtype", "dtype")]
    return [Paragraph(text), Table("skipped", columns, rows, filterable=True)]
