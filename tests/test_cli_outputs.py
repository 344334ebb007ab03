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


# ---------------------------------------------------------------- a format and the output's name


@pytest.mark.parametrize("argv,text", [
    (("score", "-f", "json", "-o", "x.csv"), "--format json contradicts --output x.csv (a CSV file): leave --format "
                                             "out, or name the output *.json"),
    (("score", "-f", "table", "-o", "x.JSON"), "--format table contradicts --output x.JSON (a JSON file): leave "
                                               "--format out, or name the output *.txt"),
    (("describe", "-f", "table", "-o", "x.json"), "--format table contradicts --output x.json"),
    (("describe", "-o", "x.csv"), "--output x.csv names a CSV file, which this command does not write (--format "
                                  "table or json): name the output *.txt or *.json"),
    (("esd", "--layer", "classifier.weight", "-o", "e.txt"), "wbfe esd writes a PNG file: name the output *.png, "
                                                             "not e.txt"),
    (("esd", "--layer", "classifier.weight", "-o", "/dev/stderr"), "give --output a file name, not /dev/stderr"),
    (("report", "-o", "r.md"), "--format html writes one HTML page: name the output *.html, not r.md"),
    (("report", "-f", "md", "-o", "r.html"), "--format md writes a folder (report.md and its PNGs): name a folder, "
                                             "not r.html"),
    (("report", "-f", "md", "-o", "-"), "name a folder, not -"),
    (("score", "--quiet", "--verbose"), "--quiet and --verbose contradict each other: give one of them"),
    (("describe", "-q", "-v"), "--quiet and --verbose contradict each other"),
])
def test_an_output_named_for_another_format_is_refused(argv: tuple[str, ...], text: str, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    # each of these wrote a file of one format under another's name (JSON in x.csv, a PNG in e.txt, HTML in
    # r.md), made a folder named r.html or '-', or dropped --verbose without a word
    monkeypatch.chdir(tmp_path)
    assert_one_line(cli(*argv), text)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("name,fmt,start", [("x.json", "json", "{"), ("x.CSV", "csv", "name,role,"),
                                            ("x.txt", "table", "model: ")])
def test_without_format_the_output_suffix_chooses_it(name: str, fmt: str, start: str, tmp_path: Path,
                                                     st_file: Path) -> None:
    # score -o x.json wrote a table into x.json
    out = tmp_path / name
    result = cli("score", str(st_file), "--metrics", "bfe", "-o", str(out))
    assert result.exit_code == 0, result.output
    assert out.read_text() == cli("score", str(st_file), "--metrics", "bfe", "-f", fmt).stdout
    assert out.read_text().startswith(start)
    described = tmp_path / "d.json"
    assert cli("describe", str(st_file), "-o", str(described)).exit_code == 0
    assert described.read_text() == cli("describe", str(st_file), "-f", "json").stdout


def test_the_outputs_named_for_their_format_are_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert cli("esd", "--layer", "classifier.weight", "-o", "E.PNG").exit_code == 0
    assert Path("E.PNG").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert cli("esd", "--layer", "classifier.weight", "-o", "/dev/null").exit_code == 0
    assert cli("report", "-o", "R.HTM").exit_code == 0 and Path("R.HTM").read_text().startswith("<!DOCTYPE html>")
    assert cli("report", "-o", "/dev/null").exit_code == 0
    assert cli("report", "-f", "md", "-o", "card").exit_code == 0 and Path("card/report.md").is_file()
