"""An option error from the command line names the option's flag (``--top-k``), not the library field behind it
(``top_k``): one rewrite where the command line builds its options objects (cli._options.with_groups)."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from wbfe_cli.main import app

A = "missing-a.safetensors"  # options are checked before anything is read


@pytest.mark.parametrize(("argv", "line"), [
    (["compare", A, A, "--top-k", "0"], "--top-k must be a positive integer, not 0"),
    (["compare", A, A, "--min-eigs", "0"], "--min-eigs must be a positive integer, not 0"),
    (["compare", A, A, "--seed", "-1"], "--seed must be a non-negative integer below 2**32, not -1"),
    (["compare", A, A, "--lambda", "-1"], "--lambda must be 'opt' or a positive number, not '-1'"),
    (["compare", A, A, "--device", "tpu"], "--device must be auto, cpu or cuda (cuda:N for the N-th GPU), not 'tpu'"),
    (["score", A, "--min-eigs", "0"], "--min-eigs must be a positive integer, not 0"),
    (["score", A, "--seed", "4294967296", "--metrics", "rand"],
     "--seed must be a non-negative integer below 2**32, not 4294967296"),
    (["score", A, "--lambda", "inf"], "--lambda must be 'opt' or a positive number, not 'inf'"),
    (["score", A, "--device", "tpu"], "--device must be auto, cpu or cuda (cuda:N for the N-th GPU), not 'tpu'"),
    (["score", A, "--fit", "tpl", "--fix-fingers", "clip_xmax"],
     "--fit tpl cannot be combined with --fix-fingers clip_xmax (it clips power-law fits only)"),
    (["rank", "fmnist", "--stats-seed", "-1"], "--stats-seed must be a non-negative integer, not -1"),
    (["rank", "fmnist", "--n-boot", "0"], "--n-boot must be a positive integer of at most 10,000,000 (each draw's ρ is "
                                          "kept), not 0"),
    (["rank", "fmnist", "--workers", "0"], "--workers must be at least 1, not 0"),
])
def test_an_option_error_names_the_flag(argv: list[str], line: str) -> None:
    result = CliRunner().invoke(app, argv)
    assert result.exit_code == 2, (result.exit_code, result.output)
    assert result.stderr == f"wbfe: error: {line}\n"
