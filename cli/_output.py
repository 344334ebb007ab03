"""Where a command's text goes: the file ``--output`` names (checked before any work, and again here
against the files the reader resolved on the way, an index's shards), a stream named as a path, or
standard output."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional, Sequence

import typer

__all__ = ["emit"]


def emit(text: str, output: Optional[str], written: Optional[Path], reads: Sequence[Path], files: Any, *,
         quiet: bool) -> None:
    """Write ``text`` to ``written`` (the checked ``output``) without landing on ``reads`` or the
    result's ``files``; to the stream ``output`` names (-, /dev/stdout, /dev/stderr, /dev/fd/N); else
    to standard output."""
    from wbfe.render.files import local_files, write_output

    if written is not None:
        write_output(written, text, reads=[*reads, *local_files(files)])
        if not quiet:
            typer.echo(f"wrote {output}", err=True)
    elif output is not None:
        write_output(output, text)
    else:
        typer.echo(text, nl=False)
