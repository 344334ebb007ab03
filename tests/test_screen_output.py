"""Output that fits a screen: the score table's lines a person reads stay within LINE_LIMIT, skip
reasons group without their operator positions, long names are shortened in the middle only for a
terminal, the applicability line is one sentence unless asked for the reasons, and a message quoting
another library is never cut mid-word."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file
from typer.testing import CliRunner

import wbfe
from wbfe.errors import clip
from wbfe.render.text import LINE_LIMIT, applicability_line, score_table, skipped_line
from wbfe_cli.main import app


def test_skip_reasons_group_without_positions_and_fit_a_line() -> None:
    ops = ["CONV_2D", "DEPTHWISE_CONV_2D", "FULLY_CONNECTED", "ADD", "MUL", "MEAN", "PAD", "RESHAPE"]
    skipped = [{"name": f"t{k}", "reason": f"bias (consumed by {ops[k % 3]} #{k} input 2)"} for k in range(60)]
    skipped += [{"name": f"s{k}", "reason": f"not a weight input (consumed by {op} #{k} input 1)"}
                for k, op in enumerate(ops * 4)]
    skipped += [{"name": f"v{k}", "reason": f"reason number {k} that is long enough to need its own words " * 2}
                for k in range(30)]
    line = skipped_line(skipped)
    assert len(line) <= LINE_LIMIT
    assert line.startswith("skipped 122 tensors: 60 bias, 32 not a weight input, 1 reason number")
    assert line.endswith(" other reasons (see --format json for each)")
    assert "#" not in line


def _long_named(tmp_path: Path) -> Path:
    rng = np.random.default_rng(0)
    name = "model/" + "/".join(f"block_{k}/depthwise_conv2d_fused_batchnorm_relu6" for k in range(3)) + "/kernel"
    path = tmp_path / "long.safetensors"
    save_file({name: rng.standard_normal((32, 64)).astype(np.float32),
               "dense.weight": rng.standard_normal((16, 32)).astype(np.float32)}, str(path))
    return path


def test_long_names_are_shortened_in_the_middle_for_a_terminal_only(tmp_path: Path) -> None:
    result = wbfe.score(_long_named(tmp_path))
    long = max((r["name"] for r in result.layers), key=len)
    assert len(long) > 140
    whole = score_table(result)
    assert long in whole
    narrow = score_table(result, width=140)
    assert long not in narrow
    shortened = next(line.split()[0] for line in narrow.splitlines() if line.startswith("model/"))
    assert "…" in shortened and long.startswith(shortened.split("…")[0]) and long.endswith(shortened.split("…")[1])
    table = narrow.split("\n\n")[1].splitlines()
    assert max(len(line) for line in table) <= 140


def test_every_line_of_the_table_fits(tmp_path: Path) -> None:
    result = wbfe.score(_long_named(tmp_path))
    assert max(len(line) for line in score_table(result).splitlines()) <= LINE_LIMIT


def test_the_applicability_line_is_one_sentence_unless_verbose() -> None:
    verdict = wbfe.score(wbfe.default_checkpoint(), metrics="bfe").summary["bfe_applicability"]
    short = applicability_line(verdict, verbose=False)
    assert short == ("bfe applicability: unknown — no description of the model: add its config.json beside the "
                     "weights, or score the framework's own file, to decide (--verbose: the reasons)")
    assert applicability_line(verdict) == "bfe applicability: unknown — " + "; ".join(verdict["reasons"])
    runner = CliRunner()
    assert short in runner.invoke(app, ["score"]).stdout
    assert verdict["reasons"][0] in runner.invoke(app, ["score", "--verbose"]).stdout


@pytest.mark.parametrize(("text", "limit", "expected"), [
    ("unpack_from requires a buffer of at least 4 bytes for unpacking 4 bytes at offset 0 (actual buffer size is 2)",
     100, "unpack_from requires a buffer of at least 4 bytes for unpacking 4 bytes at offset 0 (actual buffer…"),
    ("short", 100, "short"),
    ("one\ntwo  three", 100, "one two three"),
])
def test_clip_never_cuts_a_word(text: str, limit: int, expected: str) -> None:
    assert clip(text, limit) == expected
    assert len(clip(text, limit)) <= limit
