"""Entry module: builds the ``wbfe`` app from one file per command group, maps errors in one place."""

from __future__ import annotations

import sys
from typing import Any

import typer
from typer.core import TyperGroup

from wbfe.errors import WbfeError

EXIT_BAD_INPUT = 2


class _WbfeGroup(TyperGroup):
    """Turns every :class:`WbfeError` into one line on stderr and exit code 2, with no traceback."""

    # ctx is click's Context, which typer vendors since 0.2x (typer.Context subclasses it).
    def invoke(self, ctx: Any) -> Any:
        try:
            return super().invoke(ctx)
        except WbfeError as exc:
            typer.echo(f"wbfe: error: {exc}", err=True)
            raise typer.Exit(EXIT_BAD_INPUT) from None


app = typer.Typer(
    name="wbfe",
    cls=_WbfeGroup,
    help="Data-free model-quality auditing from the weights alone.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _version(value: bool) -> None:
    if value:
        from wbfe import __version__

        typer.echo(f"wbfe {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                 help="Print the version and exit."),
) -> None:
    """Data-free model-quality auditing from the weights alone."""


def _register() -> None:
    # Each command group lives in its own module and attaches itself to `app` on import.
    from . import compare, esd, rank, report, score, watch  # noqa: F401
    from .theory import app as theory_app

    app.add_typer(theory_app, name="theory", help="Solvers and simulations of the theory models.")


_register()


def main() -> None:
    """Console-script entry point."""
    try:
        app()
    except KeyboardInterrupt:  # pragma: no cover - interactive only
        typer.echo("wbfe: interrupted", err=True)
        sys.exit(130)
