"""Other libraries' messages (transformers, Ray) during a command: held back and shown once each with
``--verbose``, counted in one line otherwise, and not mentioned under ``--quiet``
(:mod:`wbfe.render.diagnostics`)."""

from __future__ import annotations

import contextlib
from typing import Iterator

import typer

__all__ = ["third_party_notes"]


@contextlib.contextmanager
def third_party_notes(*, verbose: bool, quiet: bool) -> Iterator[None]:
    from wbfe.errors import InvalidOptionError
    from wbfe.render.diagnostics import captured

    if quiet and verbose:  # one of them would be dropped without a word
        raise InvalidOptionError("--quiet and --verbose contradict each other: give one of them")

    with captured() as notes:
        yield
    if quiet:
        return
    if verbose:
        for note in notes.notes:
            typer.echo(f"wbfe: note from {note.line()}", err=True)
    elif (line := notes.summary()) is not None:
        typer.echo(f"wbfe: {line}", err=True)
