"""Where a command's text goes: the file or stream ``--output`` names, or standard output."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional, Sequence

import typer

__all__ = ["emit", "shown"]


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


def shown(text: Any) -> str:
    """A path or name the user or a checkpoint gave, as it goes to the terminal: its control characters
    escaped (:func:`wbfe.errors.printable`), so that an escape sequence in a file name is printed, not obeyed."""
    import os

    from wbfe.errors import printable

    return printable(os.fspath(text) if isinstance(text, os.PathLike) else str(text))
