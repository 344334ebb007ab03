"""Every int option of every command takes an integer only: typer reads an int through pydantic, which took "3.0"
as 3 (``wbfe score --seed 3.0`` ran with seed 3) where the library refuses 3.0. One rule (cli.main), one line."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

import pytest
import typer
from typer.testing import CliRunner

from wbfe_cli.main import app


def _int_options(command: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Any]]:
    """``(command path, parameter)`` of every int option, found the way typer declares it (its annotation)."""
    for name, sub in sorted(getattr(command, "commands", {}).items()):
        yield from _int_options(sub, path + (name,))
    for param in command.params:
        if getattr(param, "param_type_name", "") == "option" and param.type_descriptor.annotation is int:
            yield path, param


# (command path, the option's longest flag, all its flags as an error names them: '--workers' / '-j')
INT_OPTIONS = [(path, max(param.opts, key=len), " / ".join(f"'{o}'" for o in param.opts))
               for path, param in _int_options(typer.main.get_command(app))]


def test_the_int_options_are_found() -> None:
    """The walk sees the int options of the scoring, ranking, report, esd and theory commands (a walk that found
    none would make the test below pass on nothing)."""
    found = {(path, flag) for path, flag, _ in INT_OPTIONS}
    for expected in [(("score",), "--seed"), (("score",), "--min-eigs"), (("compare",), "--top-k"),
                     (("rank",), "--n-boot"), (("rank",), "--workers"), (("rank",), "--stats-seed"),
                     (("esd",), "--bins"), (("report",), "--unusual"), (("sharpen",), "--seed"),
                     (("theory", "hierarchical"), "--p"), (("theory", "student"), "--epochs")]:
        assert expected in found, expected
    assert len(found) > 30


@pytest.mark.parametrize(("path", "flag", "named"), INT_OPTIONS, ids=[" ".join(p) + " " + f for p, f, _ in INT_OPTIONS])
def test_every_int_option_refuses_a_non_integer_in_one_line(path: tuple[str, ...], flag: str, named: str) -> None:
    """"3.0" was read as 3 (the library refuses 3.0); "1e3" and "0x10" were refused in pydantic's words."""
    for bad in ("3.0", "1e3", "0x10", "2.5"):
        # Surplus arguments, refused after the options are read: a command that took the value never runs
        result = CliRunner().invoke(app, [*path, flag, bad, *["surplus"] * 4])
        assert result.exit_code == 2, (result.exit_code, result.output)
        assert result.stderr == (f"wbfe: error: Invalid value for {named}: must be an integer, not '{bad}' "
                                 f"(see 'wbfe {' '.join(path)} --help')\n")


def test_an_int_option_still_takes_an_integer(tmp_path: Path) -> None:
    """Each int option reads "7" and " +12 " as typer did; on the command line the error is then the next one."""
    group = typer.main.get_command(app)
    for path, param in _int_options(group):
        ctx = typer.Context(group)
        assert param.process_value(ctx, "7") == 7, (path, param.name)
        if param.name != "bins":  # esd's --bins has no upper bound either, but starts at 2
            assert param.process_value(ctx, " +12 ") == 12, (path, param.name)
    missing = tmp_path / "missing.safetensors"
    result = CliRunner().invoke(app, ["score", str(missing), "--seed", "7", "--metrics", "rand"])
    assert result.exit_code == 2 and result.stderr.startswith(f"wbfe: error: no such file or folder: {missing}")
