"""``wbfe compare A B``: what changed between two checkpoints, matrix by matrix."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer

from ._output import shown
from ._options import Quiet, ScoreFormat, compare_group, path_option, with_groups
from ._progress import progress_bar

if TYPE_CHECKING:
    from wbfe.options import CompareOptions

_TABLE = ("name", "shape", "rel_frobenius", "rel_frobenius_rowscaled", "w1_log_eigs", "stable_rank_delta", "overlap_in", "overlap_out",
          "d_bfe", "d_alpha", "d_h")


def compare_command(
    a: Annotated[str, typer.Argument(help="Checkpoint A (the reference: base, full precision, step t).")],
    b: Annotated[str, typer.Argument(help="Checkpoint B (fine-tuned, quantised, step t+1).")],
    fmt: Annotated[ScoreFormat, typer.Option("--format", "-f", help="What to print.")] = ScoreFormat.table,
    output: Annotated[Optional[Path], path_option(
        "--output", "-o", help="Folder: compare.json, compare.csv, change_along_depth.png and report.html.")] = None,
    quiet: Quiet = False,
    *,
    compare: "CompareOptions",
) -> None:
    """Compare checkpoint B against A: relative change, metric changes, spectrum distance, subspace overlap."""
    import wbfe
    from wbfe.render.files import check_output_dir, local_files, local_reads, write_atomic
    from wbfe.render.text import score_csv

    reads = [*local_reads(a), *local_reads(b)]
    folder = check_output_dir(output, reads=reads) if output is not None else None  # before any work
    with progress_bar(enabled=not quiet, what="comparing", unit="pairs") as update:
        result = wbfe.compare(a, b, **compare.keywords(), progress=update)
    render = {ScoreFormat.json: lambda: result.to_json() + "\n", ScoreFormat.csv: lambda: score_csv(result),
              ScoreFormat.table: lambda: compare_table(result)}
    if folder is not None:
        from wbfe.reporting import compare_report, write_report
        from wbfe.reporting.plots.compare import plot_change_along_depth

        # and not over a file the readers resolved on the way (a hub cache's snapshot files)
        reads += [*local_files(result.model_a.get("files")), *local_files(result.model_b.get("files"))]
        write_atomic(folder / "compare.json", render[ScoreFormat.json](), reads=reads)
        write_atomic(folder / "compare.csv", render[ScoreFormat.csv](), reads=reads)
        plot_change_along_depth(result, folder / "change_along_depth.png")
        write_report(compare_report(result), folder / "report.html")
        if not quiet:
            typer.echo(f"wrote {shown(output)}/compare.json, compare.csv, change_along_depth.png, report.html",
                       err=True)
    typer.echo(render[fmt](), nl=False)


compare_command = with_groups(compare_group())(compare_command)


def compare_table(result: object) -> str:
    """One line per matched matrix, then the most-changed matrices and what was left out."""
    from wbfe.render.text import skipped_line, text_table

    layers = result.layers  # type: ignore[attr-defined]
    summary = result.summary  # type: ignore[attr-defined]
    columns = [c for c in _TABLE if any(c in row for row in layers)]
    paired = ("  (paired by graph order: the names differ)" if summary.get("pairing") == "graph order" else "")
    a, b = shown(result.model_a.get("source")), shown(result.model_b.get("source"))  # type: ignore[attr-defined]
    parts = [f"B: {b}  vs  A: {a}{paired}", "",
             text_table(layers, columns), "",
             "most changed (‖B − A‖/‖A‖): " + ", ".join(f"{shown(m['name'])} {m['rel_frobenius']:.3g}"
                                                      for m in summary["most_changed"]),
             "most changed spectrum (W1): " + ", ".join(f"{shown(m['name'])} {m['w1_log_eigs']:.3g}"
                                                       for m in summary["most_changed_spectrum"])]
    if summary.get("folding_note"):
        parts += ["", f"folding: {summary['folding_note']}"]
    rest = [row for row in summary.items() if not isinstance(row[1], list) and row[0] != "folding_note"]
    parts += ["", text_table([{"metric": k, "value": v} for k, v in rest], ("metric", "value"))]
    # Why, by reason, as a score says it: a bare count hid a transposed fc1.weight among four biases.
    unmatched = [{"reason": f"only in {u['side'].upper()}" if u["reason"].startswith("no tensor") else u["reason"]}
                 for u in result.unmatched]  # type: ignore[attr-defined]
    skipped = [{**s, "reason": _one_reason(s["reason"])} for s in result.skipped]  # type: ignore[attr-defined]
    parts += [""] if unmatched or skipped else []
    parts += [skipped_line(rows, verb, noun) for rows, verb, noun in ((unmatched, "unmatched", "tensor"),
                                                                      (skipped, "skipped", "pair")) if rows]
    return "\n".join(parts) + "\n"


def _one_reason(reason: str) -> str:
    """A pair's reason as one reason: ``A: r; B: r`` is ``r``, ``A: r`` is ``r (A)``."""
    sides = dict(part.split(": ", 1) for part in reason.split("; ")) if reason.startswith(("A: ", "B: ")) else {}
    if not sides or set(sides) - {"A", "B"}:
        return reason
    said = set(sides.values())
    return said.pop() if len(said) == 1 and len(sides) == 2 else "; ".join(f"{r} ({side})" for side, r in sides.items())
