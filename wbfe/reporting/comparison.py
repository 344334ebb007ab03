"""The audit page of a comparison (``wbfe compare A B``): both provenances, what changed most, the
change along depth, the matched matrices, and every unmatched or skipped tensor with its reason."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from wbfe.render.text import shape_text
from wbfe.reporting.content import Block, Column, FigureBlock, KeyValues, Paragraph, Report, Section, Table
from wbfe.reporting.figures import depth_figure
from wbfe.reporting.metrics_info import colour, meaning
from wbfe.reporting.model import provenance_items, reasons_note

__all__ = ["compare_report"]

# Columns of the change itself (docs/compare.md), then the metric changes d_<col>.
_CHANGE = {
    "rel_frobenius": "‖B − A‖_F / ‖A‖_F",
    "rel_frobenius_rowscaled": "‖A − diag(s) B‖_F / ‖A‖_F, each output row of B rescaled onto A by least squares: "
                               "the change a per-channel factor (BatchNorm folded by a converter) does not explain",
    "w1_log_eigs": "Wasserstein-1 distance between the distributions of log eigenvalue of A and of B",
    "stable_rank_delta": "‖B − A‖_F² / ‖B − A‖₂²: how many directions the change spreads over",
    "overlap_in": "overlap of the top-k right (input-side) singular vectors: 1 = same directions, ≈ k/n = random",
    "overlap_out": "overlap of the top-k left (output-side) singular vectors",
}
_IDENTITY = ("name", "role", "shape", "dtype_a", "dtype_b", "n_eigs")
_FIRST = ("source", "format", "files", "sha256")  # each side's provenance, then its other fields


def _table(id: str, rows: Sequence[Mapping[str, Any]], first: Sequence[str]) -> Table:
    keys = list(dict.fromkeys(k for row in rows for k in row if k != "reasons"))
    main = [k for k in first if k in keys]
    columns = [Column(k, k) for k in main] + [Column(k, k, extra=True) for k in keys if k not in main]
    data = [{**row, "shape": shape_text(row["shape"]) if isinstance(row.get("shape"), list) else row.get("shape")}
            for row in rows]
    return Table(id, columns, data, filterable=True)


def compare_report(result: Any) -> Report:
    """The report of a :class:`~wbfe.Comparison` (or the JSON of ``wbfe compare --format json``)."""
    data = result.to_dict() if hasattr(result, "to_dict") else dict(result)
    a, b, layers, summary = data["model_a"], data["model_b"], data["layers"], data["summary"]
    report = Report(title=f"wbfe comparison: {b.get('source')} against {a.get('source')}",
                    subtitle=f"{summary.get('n_matched', len(layers))} matrices matched, "
                             f"{len(data['unmatched'])} unmatched, {len(data['skipped'])} skipped")
    report.sections.append(Section("provenance", "Provenance", [
        Paragraph("A (the reference):"), KeyValues(provenance_items(a, _FIRST)),
        Paragraph("B (compared against A):"), KeyValues(provenance_items(b, _FIRST)),
        KeyValues([("options", data.get("options"))])]))

    changes = [c for c in _CHANGE if any(c in row for row in layers)]
    delta_columns = [k[: -len("_mean")] for k in summary if k.startswith("d_") and k.endswith("_mean")]
    rows = [{"quantity": k, "_colour": colour(k), "mean": summary.get(f"{k}_mean"), "max": summary.get(f"{k}_max"),
             "meaning": _CHANGE.get(k) or f"change B − A of {k[2:]}: {meaning(k[2:])}"}
            for k in changes + delta_columns]
    blocks: list[Any] = [Table("summary", [Column("quantity", "quantity"), Column("mean", "mean over matrices"),
                                           Column("max", "max"), Column("meaning", "meaning")], rows, sortable=False),
                         KeyValues([(k, v) for k, v in summary.items()
                                    if not isinstance(v, (list, dict)) and not k.endswith(("_mean", "_max"))])]
    for key, value in summary.items():
        if isinstance(value, list) and value and isinstance(value[0], dict):
            column = next((c for c in value[0] if c != "name"), "")
            blocks.append(Table(f"summary-{key}", [Column("name", "name"), Column(column, column)], value,
                                caption=f"{key.replace('_', ' ')} (by {column})", sortable=False))
    report.sections.append(Section("summary", "What changed most", blocks))

    plotted = changes + [c for c in delta_columns if any(c in row for row in layers)]
    depth: list[Block] = [FigureBlock(
        "depth", depth_figure(layers, plotted, head=summary.get("head")), alt="change along depth",
        caption="Each change along depth (x = the matrix's # in the table; star: the head).")
    ] if plotted and layers else []
    report.sections.append(Section("depth", "Change along depth", depth))
    table = _table("layers", layers, list(_IDENTITY) + changes + delta_columns)
    table = Table("layers", [Column("#", "#")] + list(table.columns),
                  [{"#": i, **row} for i, row in enumerate(table.rows, start=1)], filterable=True,
                  notes=[reasons_note(row.get("reasons") or {}) for row in layers],
                  caption="Click a header to sort; type to filter; 'all columns' shows each metric on A and B.")
    report.sections.append(Section("layers", f"Matched matrices ({len(layers)})", [table]))
    report.sections.append(Section("unmatched", f"Unmatched tensors ({len(data['unmatched'])})",
                                   [_table("unmatched", data["unmatched"], ("name", "side", "reason"))]
                                   if data["unmatched"] else [Paragraph("Every tensor has its counterpart.")]))
    report.sections.append(Section("skipped", f"Skipped tensors ({len(data['skipped'])})",
                                   [_table("skipped", data["skipped"], ("name", "name_b", "reason", "shape"))]
                                   if data["skipped"] else [Paragraph("No tensor was skipped.")]))
    return report

