"""What the CLI says (issue 35 §5, §7; issue 28 §4): help text, usage errors, hints, option wiring."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

import wbfe
from wbfe.errors import InvalidOptionError, WbfeError, hub_name_hint
from wbfe_cli.main import app

CLI_DIR = Path(__file__).resolve().parents[1] / "cli"


def cli(*args: str) -> Any:
    return CliRunner().invoke(app, list(args))


def assert_one_line(result: Any, text: str) -> None:
    assert result.exit_code == 2, (result.exit_code, result.output, result.stderr)
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("wbfe: error: "), result.stderr
    assert text in result.stderr, result.stderr


@pytest.mark.parametrize("command,text", [
    ("score", "pip install 'wbfe[ray]'"), ("score", "org/name[@rev]"), ("rank", "pip install 'wbfe[ray]'"),
])
def test_help_keeps_square_brackets(command: str, text: str) -> None:
    result = cli(command, "--help")
    assert result.exit_code == 0
    assert text in " ".join(result.stdout.split())  # help wraps lines


@pytest.mark.parametrize("argv,text", [
    (("score", "--format", "xml"), "Invalid value for '--format' / '-f': 'xml' is not one of 'table', 'json', 'csv'"),
    (("score", "--conv", "rows"), "Invalid value for '--conv': 'rows' is not one of 'flatten', 'slices'"),
    (("score", "--min-eigs", "abc"), "Invalid value for '--min-eigs'"),
    (("rank", "--nope"), "No such option: --nope"),
    (("esd", "--bins", "1"), "Invalid value for '--bins'"),
])
def test_usage_errors_are_one_line(argv: tuple[str, ...], text: str) -> None:
    result = cli(*argv)
    assert_one_line(result, text)
    assert f"(see 'wbfe {argv[0]} --help')" in result.stderr or "--help" in result.stderr


@pytest.mark.parametrize("ref,full", [("gpt2", "openai-community/gpt2"),
                                      ("bert-base-uncased", "google-bert/bert-base-uncased")])
def test_bare_hub_name_gets_its_full_id(ref: str, full: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # no file of that name here
    assert_one_line(cli("score", ref), f"no such file or folder: {ref}; it looks like a Hugging Face model name: "
                                       f"use its full id, {full} (or a local path)")


def test_hub_name_hint_only_for_bare_names() -> None:
    assert hub_name_hint("my-model") == ("; if it is a Hugging Face model, give its full id org/name "
                                         "(e.g. openai-community/gpt2), or a local path")
    assert hub_name_hint("model.safetensors") == "" and hub_name_hint("./a/b") == ""
    assert hub_name_hint("GPT2").endswith("openai-community/gpt2 (or a local path)")


def test_close_names_are_suggested() -> None:
    assert_one_line(cli("esd", "--layer", "classifier.weigth", "-o", "/dev/null"),
                    "did you mean 'classifier.weight'")
    assert_one_line(cli("score", "--head", "classifer.weight", "--metrics", "bfe"),
                    "--head 'classifer.weight' is not an analysed matrix; did you mean 'classifier.weight'")


# ----------------------------------------------------------------------------- seeds


def test_seed_help_says_which_seed() -> None:
    text = " ".join(cli("rank", "--help").stdout.split())
    assert "--seed <int> Seed of the scoring's random steps (the rand group's shuffles)" in text
    assert "--stats-seed <int> Seed of the ranking's bootstrap and permutation draws" in text


class _Stop(WbfeError):
    pass


def _capture_rank(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    import wbfe.ranking

    seen: dict[str, Any] = {}

    def fake_rank(zoo: Any, quality: Any = None, **kw: Any) -> Any:
        seen.update(kw, zoo=zoo, quality=quality)
        raise _Stop("stopped after the options were handed over")

    monkeypatch.setattr(wbfe.ranking, "rank", fake_rank)
    return seen


def test_rank_seeds_reach_their_own_options(monkeypatch: pytest.MonkeyPatch) -> None:
    seen = _capture_rank(monkeypatch)
    cli("rank", "fmnist", "--metrics", "bfe,htsr,rand", "--seed", "3", "--stats-seed", "7", "--layers", "fc",
        "--min-eigs", "4")
    assert seen["score"].seed == 3 and seen["stats"].seed == 7
    assert seen["score"].layers == "fc" and seen["score"].min_eigs == 4


def test_report_on_a_zoo_applies_layers_and_min_eigs(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    seen = _capture_rank(monkeypatch)
    result = cli("report", "fmnist", "--layers", r"classifier\.", "--min-eigs", "3", "--metrics", "htsr,rand",
                 "--seed", "2", "--stats-seed", "5", "-o", str(tmp_path / "page.html"))
    assert "stopped after the options were handed over" in result.stderr
    assert seen["score"].layers == r"classifier\." and seen["score"].min_eigs == 3
    assert seen["score"].seed == 2 and seen["stats"].seed == 5


def test_library_rank_refuses_a_bare_seed(tmp_path: Path) -> None:
    with pytest.raises(InvalidOptionError, match="seed is ambiguous here: pass stats_seed="):
        wbfe.rank(tmp_path / "zoo.csv", seed=1)


@pytest.mark.parametrize("argv,text", [
    (("--workers", "2"), "apply to a zoo only"),
    (("--stats-seed", "3"), "apply to a zoo only"),
    (("--weights", "x.safetensors"), "--weights goes with a saved score JSON"),
])
def test_report_refuses_options_that_do_not_apply(argv: tuple[str, ...], text: str, tmp_path: Path) -> None:
    out = tmp_path / "page.html"
    assert_one_line(cli("report", *argv, "-o", str(out)), text)
    assert not out.exists()


def test_report_of_a_saved_json_refuses_scoring_options(tmp_path: Path) -> None:
    saved = tmp_path / "score.json"
    saved.write_text(wbfe.score({"fc.weight": __import__("torch").eye(12)}, metrics="bfe").to_json())
    assert_one_line(cli("report", str(saved), "--layers", "fc", "-o", str(tmp_path / "p.html")),
                    "a saved JSON is drawn as it was scored")


def test_report_of_two_checkpoints_refuses_head(tmp_path: Path) -> None:
    assert_one_line(cli("report", "a.safetensors", "b.safetensors", "--head", "fc", "-o", str(tmp_path / "p.html")),
                    "a comparison of two checkpoints flattens conv kernels and has no head rule")


# ----------------------------------------------------------------------------- structure


def _imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            names.add("." * node.level + (node.module or ""))
            names.update("." * node.level + alias.name for alias in node.names if node.module is None)
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
    return names


@pytest.mark.parametrize("module", sorted(p.name for p in CLI_DIR.glob("*.py")))
def test_command_modules_do_not_import_the_entry_module(module: str) -> None:
    imported = _imports(CLI_DIR / module)
    assert not imported & {".main", "wbfe_cli.main", "cli.main"}
    if module in ("theory_ts.py", "theory_hier.py"):
        assert ".theory" not in imported and "wbfe_cli.theory" not in imported


@pytest.mark.parametrize("argv", [(), ("theory",)], ids=["wbfe", "wbfe theory"])
def test_a_bare_group_prints_its_help_and_exits_2(argv: tuple[str, ...]) -> None:
    result = cli(*argv)
    assert result.exit_code == 2
    assert "Usage:" in result.stderr and "Commands:" in result.stderr and "wbfe: error" not in result.stderr


def test_output_cut_short_by_the_reader_is_no_traceback() -> None:
    """`wbfe describe | head -1`: the pipe closes under the command; it stops without a traceback
    (the interrupt handler once named an exception class this typer does not have).

    The reader's end is closed before the command starts, so that its every write meets a closed
    pipe: reading a line first and then closing raced the command, which could write its few
    hundred bytes whole into the pipe's buffer and exit 0 before the close."""
    import os
    import subprocess
    import sys

    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        proc = subprocess.run([sys.executable, "-m", "wbfe_cli.main", "describe"], stdout=write_end,
                              stderr=subprocess.PIPE, timeout=120)
    finally:
        os.close(write_end)
    err = proc.stderr.decode()
    assert "Traceback" not in err and "Error" not in err and proc.returncode != 0


def test_an_abort_is_one_line_and_exit_130() -> None:
    """An interrupted prompt or output (typer's Abort) ends as `wbfe: interrupted`, code 130."""
    import typer

    from wbfe_cli.main import _WbfeGroup

    probe = typer.Typer(cls=_WbfeGroup)

    @probe.command()
    def stop() -> None:
        raise typer.Abort()

    @probe.command()
    def other() -> None:  # two commands, so that `stop` is a subcommand as in wbfe
        pass

    result = CliRunner().invoke(probe, ["stop"])
    assert result.exit_code == 130 and result.stderr.strip() == "wbfe: interrupted"
