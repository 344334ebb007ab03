"""``wbfe compare A B``: what changed between two checkpoints, matrix by matrix."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from ._options import ScoreFormat
from .main import app

_TABLE = ("name", "shape", "rel_frobenius", "w1_log_eigs", "stable_rank_delta", "overlap_in", "overlap_out",
          "d_bfe", "d_alpha", "d_h")


@app.command("compare")
def compare_command(
    a: str = typer.Argument(..., help="Checkpoint A (the reference: base, full precision, step t)."),
    b: str = typer.Argument(..., help="Checkpoint B (fine-tuned, quantised, step t+1)."),
    fmt: ScoreFormat = typer.Option(ScoreFormat.table, "--format", "-f", help="What to print."),
    output: Optional[Path] = typer.Option(None, "--output", "-o",
                                          help="Folder: compare.json, compare.csv, change_along_depth.png and report.html."),
    metrics: Optional[str] = typer.Option(None, "--metrics", help="Metric groups whose change is reported. Default: bfe,htsr."),
    name_map: Optional[list[str]] = typer.Option(None, "--map", help="REGEX=REPL applied to A's names before matching (repeatable)."),
    top_k: int = typer.Option(10, "--top-k", help="Size of the singular subspaces whose overlap is reported."),
    layers: Optional[str] = typer.Option(None, "--layers", help="Only tensors whose name (in A) matches this regular expression."),
    lam: str = typer.Option("opt", "--lambda", help="Prior precision: 'opt' or a number."),
    device: str = typer.Option("auto", "--device", help="auto, cpu or cuda."),
    min_eigs: int = typer.Option(10, "--min-eigs", help="Skip matrices with fewer eigenvalues."),
    seed: int = typer.Option(0, "--seed", help="Seed of the random steps (the rand group's shuffles)."),
) -> None:
    """Compare checkpoint B against A: relative change, metric changes, spectrum distance, subspace overlap."""
    import wbfe
    from wbfe.output import check_output_dir, write_atomic
    from wbfe.report import score_csv

    folder = check_output_dir(output) if output is not None else None  # before any work
    result = wbfe.compare(a, b, metrics=metrics, name_map=name_map, top_k=top_k, layers=layers, lam=lam,
                          device=device, min_eigs=min_eigs, seed=seed)
    render = {ScoreFormat.json: lambda: result.to_json() + "\n", ScoreFormat.csv: lambda: score_csv(result),
              ScoreFormat.table: lambda: compare_table(result)}
    if folder is not None:
        from wbfe.plots.compare import plot_change_along_depth
        from wbfe.reporting import compare_report, write_report

        write_atomic(folder / "compare.json", render[ScoreFormat.json]())
        write_atomic(folder / "compare.csv", render[ScoreFormat.csv]())
        plot_change_along_depth(result, folder / "change_along_depth.png")
        write_report(compare_report(result), folder / "report.html")
        typer.echo(f"wrote {output}/compare.json, compare.csv, change_along_depth.png, report.html", err=True)
    typer.echo(render[fmt](), nl=False)


def compare_table(result: object) -> str:
    """One line per matched matrix, then the most-changed matrices and what was left out."""
    from wbfe.report import text_table

    layers = result.layers  # type: ignore[attr-defined]
    summary = result.summary  # type: ignore[attr-defined]
    columns = [c for c in _TABLE if any(c in row for row in layers)]
    parts = [f"B: {result.model_b.get('source')}  vs  A: {result.model_a.get('source')}", "",  # type: ignore[attr-defined]
             text_table(layers, columns), "",
             "most changed (‖B − A‖/‖A‖): " + ", ".join(f"{m['name']} {m['rel_frobenius']:.3g}" for m in summary["most_changed"]),
             "most changed spectrum (W1): " + ", ".join(f"{m['name']} {m['w1_log_eigs']:.3g}"
                                                       for m in summary["most_changed_spectrum"])]
    rest = [row for row in summary.items() if not isinstance(row[1], list)]
    parts += ["", text_table([{"metric": k, "value": v} for k, v in rest], ("metric", "value"))]
    unmatched = result.unmatched  # type: ignore[attr-defined]
    skipped = result.skipped  # type: ignore[attr-defined]
    if unmatched or skipped:
        parts += ["", f"{len(unmatched)} unmatched, {len(skipped)} skipped (see --format json for each, with its reason)"]
    return "\n".join(parts) + "\n"
