"""Entry module: registers the commands of one module per command group (which import nothing from here, nor
anything heavy, so that ``wbfe --help`` stays fast), and maps every :class:`~wbfe.errors.WbfeError` and usage
error to one ``wbfe: error: ...`` line on stderr and exit code 2.
"""

from __future__ import annotations

import functools
import sys
from typing import Any, Callable

import typer

from wbfe.errors import WbfeError

from ._group import Group, click_errors
from . import cache, compare, describe, esd, prune, rank, report, score, smooth, theory, watch

# Abort (an interrupted prompt or output) is in typer.exceptions in the typers that vendor click.
_Abort: type[BaseException]
try:
    from typer.exceptions import Abort as _TyperAbort

    _Abort = _TyperAbort
except ImportError:  # pragma: no cover - typer < 0.20
    _Abort = click_errors.Abort

EXIT_BAD_INPUT = 2


def _error_line(message: str) -> str:
    return "wbfe: error: " + " ".join(str(message).split())


def _hint(exc: WbfeError) -> str:
    """A bare hub name (``gpt2``) that is no file: say how to name the model (unless the library did). Not for a
    path that is there (an empty folder, a symbolic link loop): it names no hub model."""
    import os

    from wbfe.errors import SourceNotFoundError, hub_name_hint

    path = getattr(exc, "path", "")
    if not isinstance(exc, SourceNotFoundError) or "Hugging Face" in str(exc) or os.path.lexists(path):
        return ""
    return hub_name_hint(path)


def _integers_only(command: Any) -> None:
    """Every int option of ``command`` and of its sub-commands is refused unless written as Python's int() reads
    it ("7", "-1", "1_000"), before typer reads it: typer's int, pydantic's, took "3.0" as 3 (``--seed 3.0`` ran
    with seed 3), where the library refuses 3.0. "3.0", "1e3", "0x10" are refused in one line naming the option."""
    for sub in getattr(command, "commands", {}).values():
        _integers_only(sub)
    for param in command.params:
        descriptor = getattr(param, "type_descriptor", None)  # typer's parameters: their annotation
        if descriptor is not None and descriptor.annotation is int:
            param.process_value = functools.partial(_integer_text, param.process_value, param)


def _integer_text(process: Callable[[Any, Any], Any], param: Any, ctx: Any, value: Any) -> Any:
    if isinstance(value, str):  # not a default (already an int) nor an option left out (None)
        try:
            int(value)
        except ValueError:
            raise click_errors.BadParameter(f"must be an integer, not {value!r}", ctx=ctx, param=param) from None
    return process(ctx, value)


class _WbfeGroup(Group):
    """Turns every :class:`WbfeError` and usage error into one line on stderr and exit code 2; its commands' int
    options take integers only (:func:`_integers_only`)."""

    def __init__(self, **attrs: Any) -> None:
        super().__init__(**attrs)
        _integers_only(self)

    def invoke(self, ctx: Any) -> Any:
        try:
            return super().invoke(ctx)
        except WbfeError as exc:
            typer.echo(_error_line(str(exc) + _hint(exc)), err=True)
            raise typer.Exit(EXIT_BAD_INPUT) from None

    def main(self, *args: Any, **kwargs: Any) -> Any:
        # Click prints a usage error in six lines with rich; wbfe's contract is one line and exit 2.
        standalone_mode = kwargs.get("standalone_mode", True)
        kwargs["standalone_mode"] = False
        try:
            code = super().main(*args, **kwargs)
        except click_errors.NoArgsIsHelpError as exc:  # bare `wbfe` / `wbfe theory`: the help
            typer.echo(exc.ctx.get_help() if exc.ctx is not None else str(exc), err=True)
            code = EXIT_BAD_INPUT
        except click_errors.UsageError as exc:
            where = f" (see '{exc.ctx.command_path} --help')" if exc.ctx is not None else ""
            typer.echo(_error_line(exc.format_message().replace("Value error, ", "")) + where, err=True)
            code = EXIT_BAD_INPUT
        except _Abort:
            typer.echo("wbfe: interrupted", err=True)
            code = 130
        if not standalone_mode:
            return code
        sys.exit(code if isinstance(code, int) else 0)


app = typer.Typer(
    name="wbfe",
    cls=_WbfeGroup,
    help="Data-free model-quality auditing from the weights alone.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    # Plain help: rich markup would eat square brackets (pip install 'wbfe[ray]', org/name[@rev]).
    rich_markup_mode=None,
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


app.command("score")(score.score_command)
app.command("compare")(compare.compare_command)
app.command("rank")(rank.rank_command)
app.command("report")(report.report_command)
app.command("esd")(esd.esd_command)
app.command("describe")(describe.describe_command)
app.command("watch")(watch.watch_command)
app.command("smooth")(smooth.smooth_command)
app.command("sharpen")(smooth.sharpen_command)
app.command("sparsity")(prune.sparsity_command)
app.command("prune")(prune.prune_command)
app.add_typer(theory.theory_app, name="theory", help="Solvers and simulations of the theory models.")
app.add_typer(cache.app, name="cache", help="Inspect and prune wbfe's cache (score entries, object-store copies).")


def main() -> None:
    """Console-script entry point."""
    try:
        app()
    except KeyboardInterrupt:  # pragma: no cover - interactive only
        typer.echo("wbfe: interrupted", err=True)
        sys.exit(130)


if __name__ == "__main__":  # python -m wbfe_cli.main
    main()
