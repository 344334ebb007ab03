"""A wrong --layer or --head name: close names are suggested; where none is close, a few known
names, their count and ``wbfe describe`` are named (issue 35 §7)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

import wbfe
from wbfe.errors import InvalidOptionError
from wbfe.scoring import layer_spectrum
from wbfe_cli.main import app
from tests.conftest import small_state_dict


def _cli(*argv: str) -> Any:
    return CliRunner().invoke(app, list(argv))


def test_layer_close_name_is_suggested(st_file: Path) -> None:
    with pytest.raises(InvalidOptionError, match=r"did you mean 'blocks\.0\.mlp\.fc1\.weight'"):
        layer_spectrum(st_file, "blocks.0.mlp.fc1.weigth")


def test_layer_with_nothing_close_lists_names_and_points_to_describe(st_file: Path) -> None:
    with pytest.raises(InvalidOptionError) as caught:
        layer_spectrum(st_file, "nope")
    text = str(caught.value)
    assert "did you mean" not in text
    listed = re.search(r"known names include (.*) of 10 \(", text)  # a few stored names, and how many
    assert listed is not None, text
    shown = re.findall(r"'([^']+)'", listed.group(1))
    assert len(shown) == 3 and set(shown) <= set(small_state_dict())
    assert f"wbfe describe {st_file}" in text


def test_head_close_and_not_close(st_file: Path) -> None:
    with pytest.raises(InvalidOptionError, match=r"did you mean 'classifier\.weight'"):
        wbfe.score(st_file, metrics="bfe", head="classifer")
    with pytest.raises(InvalidOptionError) as caught:
        wbfe.score(st_file, metrics="bfe", head="nosuchhead")
    text = str(caught.value)
    assert "did you mean" not in text and "known names include" in text and "wbfe describe" in text


def test_cli_lines(st_file: Path) -> None:
    for argv, want in ((["esd", str(st_file), "--layer", "nope"], "wbfe describe"),
                       (["esd", str(st_file), "--layer", "classifier.weigt"], "did you mean 'classifier.weight'"),
                       (["score", str(st_file), "--metrics", "bfe", "--head", "nosuchhead"], "known names include"),
                       (["score", str(st_file), "--metrics", "bfe", "--head", "classifer"],
                        "did you mean 'classifier.weight'")):
        done = _cli(*argv)
        assert done.exit_code == 2, done.stderr
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("wbfe: error: ") and want in lines[0], done.stderr
