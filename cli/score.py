"""``wbfe score``: score one checkpoint (the embedded Fashion-MNIST CNN when no reference is given)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Optional

import typer

from ._notes import third_party_notes
from ._output import emit, output_format
from ._options import REF_HELP, ScoreFormat, executor_group, score_group, with_groups
from ._progress import progress_bar

if TYPE_CHECKING:
    from pathlib import Path

    from wbfe.engine import ModelScore
    from wbfe.executors import ExecutorOptions
    from wbfe.options import ScoreOptions


def score_command(
    ref: Annotated[Optional[str], typer.Argument(help=REF_HELP)] = None,
    fmt: Annotated[Optional[ScoreFormat], typer.Option(
        "--format", "-f", help="Output format. Default: the one --output's suffix names (.json, .csv), else "
                               "table.")] = None,
    output: Annotated[Optional[str], typer.Option(
        "--output", "-o", help="Write the result to this file instead of stdout ('-': stdout).")] = None,
    base: Annotated[Optional[str], typer.Option(
        "--base", help="For a PEFT LoRA adapter: its base model; also score each merged W0 + dW.")] = None,
    verbose: Annotated[bool, typer.Option(
        "--verbose", "-v", help="The table's BFE-W applicability line with its full reasons, and each message "
                                "other libraries (transformers, Ray) gave, once.")] = False,
    quiet: Annotated[bool, typer.Option(
        "--quiet", "-q", help="Nothing on stderr but errors: no progress, no 'wrote FILE', no other libraries' "
                              "messages.")] = False,
    *,
    score: "ScoreOptions",
    where: "ExecutorOptions",
) -> None:
    """Score every weight matrix of a checkpoint with BFE-W (and the other metric groups)."""
    import wbfe
    from wbfe.render.files import check_output, local_reads

    target = ref if ref is not None else wbfe.default_checkpoint()
    reads = [*local_reads(target), *local_reads(base)]
    written = check_output(output, reads=reads) if output is not None else None  # before any work
    chosen = ScoreFormat(output_format(fmt.value if fmt is not None else None, output, [f.value for f in ScoreFormat]))
    with third_party_notes(verbose=verbose, quiet=quiet):
        result = _scored(target, base, score, where, quiet)
        _write(result, chosen, output, written, reads, verbose, quiet)


def _scored(target: object, base: Optional[str], score: "ScoreOptions", where: "ExecutorOptions", quiet: bool) -> "ModelScore":
    import wbfe

    if where.is_ray:  # one line per finished shard on stderr: node, shards done/total, ETA
        return wbfe.score(target, options=score, base=base, executor="ray", ray_address=where.address,
                          progress=None if quiet else lambda _done, _total, line: typer.echo(line, err=True))
    with progress_bar(enabled=not quiet) as update:
        return wbfe.score(target, options=score, base=base, progress=update)


def _write(result: "ModelScore", fmt: ScoreFormat, output: Optional[str], written: "Optional[Path]",
           reads: "list[Path]", verbose: bool, quiet: bool) -> None:
    from wbfe.render.text import score_csv, score_table

    text = {ScoreFormat.json: lambda: result.to_json() + "\n", ScoreFormat.csv: lambda: score_csv(result),
            ScoreFormat.table: lambda: score_table(result, verbose=verbose, width=_terminal_width(written, output))}[fmt]()
    emit(text, output, written, reads, result.model.get("files"), quiet=quiet)


def _terminal_width(written: object, output: Optional[str]) -> Optional[int]:
    """The terminal's width where the table goes to one (long names are then shortened to fit it)."""
    import shutil
    import sys

    if written is not None or output not in (None, "-") or not sys.stdout.isatty():
        return None
    return shutil.get_terminal_size().columns


score_command = with_groups(score_group(), executor_group())(score_command)
