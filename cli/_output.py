"""Where a command's text goes: the file or stream ``--output`` names, or standard output."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional, Sequence

import typer

__all__ = ["emit", "shown", "output_format", "check_suffix"]

# The formats an output file's suffix names.
_SUFFIX_FORMATS = {".json": "json", ".csv": "csv"}


def emit(text: str, output: Optional[str], written: Optional[Path], reads: Sequence[Path], files: Any, *,
         quiet: bool) -> None:
    """Write ``text`` to ``written`` (the checked ``output``, never over ``reads`` or the result's ``files``
    the reader resolved), to the stream ``output`` names (-, /dev/stdout, /dev/fd/N), else to standard output."""
    from wbfe.render.files import local_files, write_output

    if written is not None:
        write_output(written, text, reads=[*reads, *local_files(files)])
        if not quiet:
            typer.echo(f"wrote {shown(output)}", err=True)
    elif output is not None:
        write_output(output, text)
    else:
        typer.echo(text, nl=False)


def output_format(fmt: Optional[str], output: Optional[str], formats: Sequence[str]) -> str:
    """The format a command writes: ``--format``'s, else the one ``--output``'s suffix names (``.json``, ``.csv``),
    else ``table``.

    Raises:
        InvalidOptionError: ``--format`` and the suffix disagree (``-f json -o x.csv`` wrote JSON into x.csv), or
            the suffix names a format not among ``formats``.
    """
    from wbfe.errors import InvalidOptionError

    named = _SUFFIX_FORMATS.get(Path(output).suffix.lower()) if output is not None else None
    suffixes = {f: "*.txt" if f == "table" else f"*.{f}" for f in formats}
    if named is not None and named not in formats:
        raise InvalidOptionError(f"--output {shown(output)} names a {named.upper()} file, which this command does "
                                 f"not write (--format {' or '.join(formats)}): name the output "
                                 f"{' or '.join(suffixes.values())}")
    if fmt is not None and named is not None and fmt != named:
        raise InvalidOptionError(f"--format {fmt} contradicts --output {shown(output)} (a {named.upper()} file): "
                                 f"leave --format out, or name the output {suffixes[fmt]}")
    return fmt or named or "table"


def check_suffix(output: str, fmt: str, option: str) -> None:
    """Refuse an ``output`` that ``option`` writes in ``fmt`` but whose suffix names another format.

    Raises:
        InvalidOptionError: ``--json x.csv`` (JSON written into x.csv).
    """
    from wbfe.errors import InvalidOptionError

    named = _SUFFIX_FORMATS.get(Path(output).suffix.lower())
    if named is not None and named != fmt:
        raise InvalidOptionError(f"{option} writes {fmt.upper()}, and {shown(output)} names a {named.upper()} file: "
                                 f"name it *.{fmt}")


def shown(text: Any) -> str:
    """A path or name the user or a checkpoint gave, as it goes to the terminal: its control characters
    escaped (:func:`wbfe.errors.printable`), so that an escape sequence in a file name is printed, not obeyed."""
    import os

    from wbfe.errors import printable

    return printable(os.fspath(text) if isinstance(text, os.PathLike) else str(text))
