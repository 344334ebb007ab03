"""``wbfe sparsity`` and ``wbfe prune``: a per-matrix sparsity from the spectra, and a checkpoint pruned to it
(:mod:`wbfe.pruning`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

import typer

from ._output import check_suffix, shown
from ._options import REF_HELP, prune_group, with_groups

if TYPE_CHECKING:
    from wbfe.options import PruneOptions

__all__ = ["sparsity_command", "prune_command"]

# The checkpoint is required here: the shared help's "Default: the embedded demo CNN" is not true of these commands.
CHECKPOINT_HELP = REF_HELP.split(" Default:")[0]


def sparsity_command(
    ref: str = typer.Argument(..., help=CHECKPOINT_HELP),
    json_out: Optional[str] = typer.Option(None, "--json", help="Also write the allocation as JSON to this file."),
    csv_out: Optional[str] = typer.Option(None, "--csv", help="Also write the allocation as CSV to this file."),
    *,
    prune: "PruneOptions",
) -> None:
    """Print (and write as JSON / CSV) the per-matrix sparsity that reaches --target overall."""
    from wbfe.pruning import sparsity
    from wbfe.render.text import text_table
    from wbfe.render.files import write_output

    _check_side_files(ref, [("--json", "json", json_out), ("--csv", "csv", csv_out)])
    allocation = sparsity(ref, options=prune)
    typer.echo(text_table(allocation.rows, ["name", "role", "shape", "params", "metric", "sparsity", "zeros", "note"]))
    typer.echo(f"overall {allocation.overall:.6f} of {sum(r['params'] for r in allocation.rows)} weights in "
               f"{len(allocation.rows)} matrices ({len(allocation.excluded)} excluded)", err=True)
    for path, text in ((json_out, lambda: allocation.to_json() + "\n"), (csv_out, allocation.to_csv)):
        if path is not None:
            write_output(path, text())
            typer.echo(f"wrote {shown(path)}", err=True)


def _check_side_files(ref: str, files: list[tuple[str, str, Optional[str]]], checkpoint: Optional[str] = None) -> None:
    """Check the files ``--json`` / ``--csv`` write (option, format, path), before any work: never over the input,
    never standard output (the table goes there: ``--json -`` mixed JSON into it), named for their format (``--json
    x.csv`` wrote JSON into x.csv), and no two the same file, nor the pruned ``checkpoint`` (``--json OUT``
    replaced the pruned checkpoint with its report)."""
    import os

    from wbfe.errors import OutputError
    from wbfe.render.files import check_output, local_reads

    # by the file each lands in, as check_output finds it (~ expanded: '~/o.safetensors' twice was not caught)
    pruned = None if checkpoint is None else check_output(checkpoint, reads=local_reads(ref))
    seen = {} if pruned is None else {os.path.realpath(pruned): "the pruned checkpoint is written to"}
    for option, fmt, path in files:
        if path is None:
            continue
        target = check_output(path, reads=local_reads(ref))
        if target is None:
            raise OutputError(f"{option} writes a file, and the table goes to standard output: give {option} a file "
                              f"name, not {shown(path)}")
        check_suffix(path, fmt, option)
        key = os.path.realpath(target)
        if key == os.devnull:
            continue
        if key in seen:
            raise OutputError(f"{option} {shown(path)} is the file {seen[key]}: name another file")
        seen[key] = f"{option} writes"


sparsity_command = with_groups(prune_group("target", "by", "spread", "mapping", "reverse", "exclude", "layers",
                                           "head"))(sparsity_command)


def prune_command(
    ref: str = typer.Argument(..., help=CHECKPOINT_HELP),
    out: str = typer.Argument(..., help="The safetensors file to write (replaced atomically; never the input)."),
    json_out: Optional[str] = typer.Option(None, "--json", help="Also write the per-matrix report as JSON."),
    *,
    prune: "PruneOptions",
) -> None:
    """Write a magnitude-pruned copy of a checkpoint at the spectra's per-matrix sparsity, and report each matrix."""
    from wbfe import pruning
    from wbfe.render.text import text_table
    from wbfe.render.files import write_output

    _check_side_files(ref, [("--json", "json", json_out)], checkpoint=out)
    report = pruning.prune(ref, out, options=prune)
    columns = ["name", "params", "sparsity", "reached", "dead_rows", "dead_cols"]
    columns += [k for k in report.rows[0] if k.endswith(("_before", "_after"))] if report.rows else []
    typer.echo(text_table(report.rows, columns))
    typer.echo(f"wrote {shown(report.output)}: {len(report.rows)} matrices pruned, overall {report.overall:.6f}",
               err=True)
    if json_out is not None:
        write_output(json_out, report.to_json() + "\n")
        typer.echo(f"wrote {shown(json_out)}", err=True)


prune_command = with_groups(prune_group("target", "by", "method", "spread", "mapping", "reverse", "exclude", "layers",
                                        "head"))(prune_command)
