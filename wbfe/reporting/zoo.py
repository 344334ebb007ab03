"""The audit page of a ranked zoo: the correlation table with its intervals, a scatter per metric,
every model's values and the models that failed."""

from __future__ import annotations

from typing import Any, Mapping, Optional

from wbfe.render.text import finite_or_none
from wbfe.reporting.content import Column, FigureBlock, FigureGrid, KeyValues, Paragraph, Report, Section, Table
from wbfe.reporting.figures import correlation_figure, scatter_figure
from wbfe.reporting.metrics_info import colour, meaning, sign_text
from wbfe.reporting.plots.ranking import p_text, rho_text

__all__ = ["rank_report"]

_MAIN_METRICS = 8  # model-table columns shown before "all columns" is ticked: the best-correlated


def _agrees(row: Mapping[str, Any]) -> Optional[str]:
    sign, rho = row.get("expected_sign"), finite_or_none(row.get("rho"))
    if sign is None or not rho:
        return None
    return "yes" if rho * sign > 0 else "no (opposite sign)"


def rank_report(result: Any) -> Report:
    """The report of a :class:`~wbfe.RankResult` (or the JSON dict of ``wbfe rank --format json``)."""
    data = result.to_dict() if hasattr(result, "to_dict") else dict(result)
    metrics, models, failed = data["metrics"], data["models"], data["failed"]
    quality, lower = data["quality"], bool(data.get("lower_is_better"))
    report = Report(title=f"wbfe zoo audit: {data['zoo']} by {quality}",
                    subtitle=f"{len(models)} models ranked, {len(failed)} failed; "
                             f"{'lower' if lower else 'higher'} {quality} is better")
    options = dict(data.get("options") or {})
    versions = options.pop("versions", None)
    items = [("zoo", data["zoo"]), ("quality", quality), ("lower is better", lower), ("models ranked", len(models)),
             ("failed", len(failed)), ("scored in this run", data.get("n_scored")),
             ("from the score cache", data.get("n_cached")), ("options", options)]
    items += [("versions", versions)] if versions is not None else []
    report.sections.append(Section("provenance", "Provenance", [KeyValues(items)]))

    top = next((m for m in metrics if isinstance(m.get("rho"), (int, float))), None)
    summary: list[Any] = [Paragraph(
        "ρ is Spearman's rank correlation of each summary metric with the quality, oriented so that higher "
        "quality is better; a metric whose expected sign is −1 agrees when ρ < 0. The interval is a 95 % "
        "bootstrap interval, p a permutation p-value.")]
    if top is not None:
        summary.append(Paragraph(f"Strongest: {top['metric']} {rho_text(top['rho'], top['ci_low'], top['ci_high'])}, "
                                 f"p = {p_text(top['p_value'])}, n = {top['n']}; "
                                 f"expected sign: {sign_text(top['metric'])}."))
    if metrics:
        summary.append(FigureBlock("correlations", correlation_figure(metrics),
                                   caption="ρ and its 95 % interval per metric, strongest first.",
                                   alt="correlation of each metric with quality"))
    stats = ("rho", "ci_low", "ci_high", "p_value", "p_method", "kendall_tau", "pearson_r", "n")
    rows = [{"metric": m["metric"], "_colour": colour(m["metric"]), **{k: m.get(k) for k in stats},
             "expected": sign_text(m["metric"]), "agrees": _agrees(m), "meaning": meaning(m["metric"])}
            for m in metrics]
    columns = [Column("metric", "metric"), Column("rho", "ρ", "Spearman"), Column("ci_low", "CI low", "95 % bootstrap"),
               Column("ci_high", "CI high", "95 % bootstrap"), Column("p_value", "p", "permutation p-value"),
               Column("p_method", "p method"), Column("kendall_tau", "τ", "Kendall"),
               Column("pearson_r", "r", "Pearson"), Column("n", "n"), Column("expected", "expected sign"),
               Column("agrees", "agrees"), Column("meaning", "meaning")]
    summary.append(Table("correlations", columns, rows,
                         notes=[m.get("reason") for m in metrics], caption="Click a header to sort."))
    report.sections.append(Section("correlations", "Correlation with quality", summary))

    ys, labels, axis = [s["quality"] for s in models], [str(s["model"]) for s in models], quality + (
        " (lower is better)" if lower else "")
    scatters = []
    for i, m in enumerate(metrics, start=1):
        title = f"{rho_text(m.get('rho'), m.get('ci_low'), m.get('ci_high'))}, n = {m.get('n')}"
        fig = scatter_figure([s["scores"].get(m["metric"]) for s in models], ys, labels, metric=m["metric"],
                             quality=axis, title=title)
        scatters.append(FigureBlock(f"scatter-{i}", fig, alt=f"{m['metric']} against {quality}",
                                    caption=f"{m['metric']}: {title}, p = {p_text(m.get('p_value'))}"))
    report.sections.append(Section("scatter", "Each metric against quality",
                                   [FigureGrid(scatters)] if scatters else [Paragraph("No metric.", kind="note")]))

    names = [m["metric"] for m in metrics]
    model_columns = [Column("model", "model"), Column("quality", quality)]
    model_columns += [Column(n, n, meaning(n), colour(n), extra=i >= _MAIN_METRICS) for i, n in enumerate(names)]
    model_columns += [Column(k, k, extra=True) for k in ("ref", "sha256", "cached")]
    model_rows = [{"model": s["model"], "quality": s["quality"], **{n: s["scores"].get(n) for n in names},
                   "ref": s.get("ref"), "sha256": s.get("sha256"), "cached": s.get("cached")} for s in models]
    report.sections.append(Section("models", f"Models ({len(models)})", [Table(
        "models", model_columns, model_rows, filterable=True,
        caption="Click a header to sort; type in the box to filter.")]))
    report.sections.append(Section("failed", f"Failed models ({len(failed)})", [
        Table("failed", [Column("model", "model"), Column("reason", "reason")],
              [{"model": f["model"], "reason": f["reason"]} for f in failed])] if failed else [
        Paragraph("No model failed.")]))
    return report
