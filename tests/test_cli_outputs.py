"""What the commands print about what they wrote, and the outputs they refuse (wave 8's command-line probe):
names from the user or a checkpoint are printed escaped, never obeyed by the terminal."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import save_file
from typer.testing import CliRunner

from wbfe_cli.main import app

ESC = "\x1b[1m"  # an escape sequence in a name: a terminal would obey it (bold, or worse: \x1b[2J clears)


def cli(*args: str) -> Any:
    # color=True: click's echo keeps escape sequences as a terminal would get them (a pipe strips them)
    return CliRunner().invoke(app, list(args), color=True)


def assert_one_line(result: Any, text: str) -> None:
    assert result.exit_code == 2, (result.exit_code, result.output, result.stderr)
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("wbfe: error: "), result.stderr
    assert text in result.stderr, result.stderr


@pytest.fixture
def escaped_names(tmp_path: Path) -> Path:
    """A checkpoint whose file name and one tensor name hold an escape sequence."""
    g = torch.Generator().manual_seed(0)
    path = tmp_path / f"m{ESC}.safetensors"
    save_file({f"bad{ESC}name.weight": torch.randn(20, 30, generator=g),
               "ok.weight": torch.randn(30, 20, generator=g)}, str(path))
    return path


def test_wrote_lines_print_an_escape_sequence_escaped(escaped_names: Path, tmp_path: Path) -> None:
    out = tmp_path / f"o{ESC}.txt"
    result = cli("score", str(escaped_names), "--metrics", "bfe", "-o", str(out))
    assert result.exit_code == 0 and out.exists()
    assert ESC not in result.stderr and "o\\x1b[1m.txt" in result.stderr

    result = cli("sharpen", str(escaped_names), str(tmp_path / f"s{ESC}.safetensors"))
    assert result.exit_code == 0, result.output
    assert ESC not in result.stderr
    assert "s\\x1b[1m.safetensors" in result.stderr and "unchanged bad\\x1b[1mname.weight" in result.stderr

    result = cli("prune", str(escaped_names), str(tmp_path / "p.safetensors"), "--target", "0.5",
                 "--json", str(tmp_path / f"p{ESC}.json"))
    assert result.exit_code == 0, result.output
    assert ESC not in result.stderr and "wrote " + str(tmp_path / "p\\x1b[1m.json") in result.stderr


def test_compare_table_prints_the_names_escaped(escaped_names: Path) -> None:
    result = cli("compare", str(escaped_names), str(escaped_names), "--metrics", "bfe", "-q")
    assert result.exit_code == 0, result.output
    assert ESC not in result.stdout
    assert "m\\x1b[1m.safetensors" in result.stdout.splitlines()[0]
    assert "most changed (‖B − A‖/‖A‖): bad\\x1b[1mname.weight" in result.stdout
