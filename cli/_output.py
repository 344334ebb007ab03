"""Where a command's text goes: the file or stream ``--output`` names, or standard output."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional, Sequence

import typer

__all__ = ["emit"]


def emit(text: str, output: Optional[str], written: Optional[Path], reads: Sequence[Path], files: Any, *,
         quiet: bool) -> None:
    """Write ``text`` to ``written`` (the checked ``output``, never over ``reads`` or the result's ``files``
    the reader resolved), to the stream ``output`` names (-, /dev/stdout, /dev/fd/N), else to standard output."""
    from wbfe.render.files import local_files, write_output

    if written is not None:
        write_output(written, text, reads=[*reads, *local_files(files)])
        if not quiet:
            typer.echo(f"wrote {output}", err=True)
    elif output is not None:
        write_output(output, text)
    else:
        typer.echo(text, nl=False)
