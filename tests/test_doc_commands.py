"""Every fenced ``wbfe …`` command of README.md and docs/*.md runs as the doc shows it (issue #44 §4).

A command is a line starting ``wbfe `` or ``$ wbfe `` in a ```` ```bash ````, ```` ```console ```` or
bare ```` ``` ```` block (with its ``\\`` continuation lines; a trailing ``# comment`` is the doc's,
not the command's). Each one is either run here, against the fixtures, or its block is marked in the
doc with an HTML comment on the line before the block, ``<!-- not run: REASON -->`` (the network, a
GPU, placeholder names such as ``model.safetensors`` or ``org/name``, a synopsis), and is skipped with
that reason. Nothing is passed over silently: an unmarked command is run, and fails the test when it
does not exit 0.

How a command runs: in-process through the CLI (typer's CliRunner, as the CLI tests do: no process
start per command), in a fresh working folder holding a link ``fixtures`` to the repository's
fixtures (so a doc names ``fixtures/fmnist-cnn/model.safetensors`` as a user in a clone would, and a
command that writes ``--output out/`` writes there), with ``$WBFE_CACHE_DIR`` in that folder and
``HF_HUB_OFFLINE=1``. The commands of one block run in order in the same folder, so a block can
write a file and read it back.

Where a ```` ```console ```` block shows a command's output (the lines after ``$ wbfe …`` up to the
next ``$`` line or the block's end), the output must match it line for line after normalising: the
absolute path of the repository's ``fixtures/`` folder is written ``.../fixtures/`` (the README
shortens it so), trailing blanks are dropped, and a doc line ``...`` stands for any number of lines.
SHA-256 digests and metric values are compared exactly (the fixtures are fixed files, and the scores
are deterministic); no command shown with output prints a timing.

Commands that take more than a few seconds (:data:`SLOW`) run under ``@pytest.mark.slow``.
"""

from __future__ import annotations

import os
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from typer.testing import CliRunner

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCES = {"bash", "console", "", "sh", "shell"}
MARK = re.compile(r"^<!--\s*not run:\s*(?P<reason>.+?)\s*-->$")
# Run under @pytest.mark.slow: each takes more than a few seconds on two cores (scoring a zoo of
# 33 models, the theory sweeps), so the default run of this file stays under a minute. A block whose
# commands take many minutes is marked not run in its doc instead, naming the test that covers it.
SLOW = {"wbfe rank", "wbfe theory scaling",
        "wbfe theory curve --beta 1.0 --r-min 0.1 --r-max 100 --points 60 --output out/"}


@dataclass
class Command:
    doc: str  # README.md or docs/x.md
    line: int  # 1-based line of the command in the doc
    text: str  # the command, continuation lines joined, the doc's comment dropped
    output: list[str] | None  # the lines a console block shows after it, None where it shows none


@dataclass
class Block:
    doc: str
    line: int  # the line of the opening fence
    skip: str | None  # the reason of its <!-- not run: ... --> mark
    commands: list[Command] = field(default_factory=list)


def _command_text(raw: str) -> str:
    """The command of a doc line: the doc's trailing ``# comment`` dropped (shlex reads ``#`` only
    at the start of a word, so a ``#`` inside quotes or a word stays)."""
    lexer = shlex.shlex(raw, posix=True, punctuation_chars=False)
    lexer.whitespace_split = True
    lexer.commenters = "#"
    return shlex.join(list(lexer))


def blocks(path: Path) -> list[Block]:
    """The fenced blocks of ``path`` that hold ``wbfe`` commands, with their marks."""
    lines = path.read_text(encoding="utf-8").splitlines()
    doc = path.relative_to(ROOT).as_posix()
    found: list[Block] = []
    i = 0
    while i < len(lines):
        opening = re.match(r"^```(\w*)\s*$", lines[i])
        if not opening:
            i += 1
            continue
        end = next((j for j in range(i + 1, len(lines)) if lines[j].startswith("```")), len(lines))
        if opening.group(1) in FENCES:
            before = next((lines[j].strip() for j in range(i - 1, -1, -1) if lines[j].strip()), "")
            mark = MARK.match(before)
            block = Block(doc, i + 1, mark.group("reason") if mark else None)
            body = lines[i + 1:end]
            k = 0
            while k < len(body):
                stripped = body[k].strip()
                prompt = stripped.startswith("$ ")
                if stripped.removeprefix("$ ").startswith("wbfe ") or stripped in ("wbfe", "$ wbfe"):
                    first = k
                    raw = stripped.removeprefix("$ ")
                    while raw.endswith("\\") and k + 1 < len(body):  # continuation lines
                        k += 1
                        raw = raw[:-1] + " " + body[k].strip()
                    output = None
                    if opening.group(1) == "console" and prompt:
                        shown = []
                        while k + 1 < len(body) and not body[k + 1].startswith("$ "):
                            k += 1
                            shown.append(body[k])
                        output = shown
                    block.commands.append(Command(doc, i + 2 + first, _command_text(raw), output))
                k += 1
            if block.commands:
                found.append(block)
        i = end + 1
    return found


ALL_BLOCKS = [block for path in DOCS for block in blocks(path)]


def _normalise(text: str) -> list[str]:
    fixtures = str(ROOT / "fixtures") + os.sep
    return [line.rstrip() for line in text.replace(fixtures, ".../fixtures/").splitlines()]


def _matches(got: list[str], shown: list[str]) -> bool:
    """Whether ``got`` is ``shown`` line for line, a shown ``...`` line standing for any lines."""
    if not shown:
        return not got
    if shown[0].strip() == "...":
        return any(_matches(got[k:], shown[1:]) for k in range(len(got) + 1))
    return bool(got) and got[0] == shown[0] and _matches(got[1:], shown[1:])


def _params() -> list[object]:
    params = []
    for block in ALL_BLOCKS:
        marks = [pytest.mark.slow] if any(c.text in SLOW for c in block.commands) else []
        params.append(pytest.param(block, id=f"{block.doc}:{block.line}", marks=marks))
    return params


@pytest.mark.parametrize("block", _params())
def test_doc_command_runs_as_shown(block: Block, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if block.skip is not None:
        pytest.skip(f"{block.doc}:{block.line}: {block.skip}")
    from wbfe_cli.main import app

    (tmp_path / "fixtures").symlink_to(ROOT / "fixtures", target_is_directory=True)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WBFE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    runner = CliRunner()
    for command in block.commands:
        where = f"{command.doc}:{command.line}: {command.text}"
        result = runner.invoke(app, shlex.split(command.text)[1:])
        assert result.exit_code == 0, f"{where} exited {result.exit_code}: {result.output[-2000:]}"
        if command.output is not None:
            got, shown = _normalise(result.stdout), [line.rstrip() for line in command.output]
            while got and not got[-1]:
                got.pop()
            while shown and not shown[-1]:
                shown.pop()
            assert _matches(got, shown), f"{where}: the output differs from the doc's\n" + "\n".join(got)


def test_every_doc_command_is_found_and_either_run_or_marked() -> None:
    commands = [c for block in ALL_BLOCKS for c in block.commands]
    assert len(commands) >= 60  # README.md and docs/*.md held 62 when this test was written
    readme = [c for c in commands if c.doc == "README.md" and c.text == "wbfe score"]
    assert len(readme) == 1 and readme[0].output is not None and len(readme[0].output) > 20
    assert {block.skip for block in ALL_BLOCKS} - {None}  # some are marked, each with its reason
    assert all(block.skip.strip() for block in ALL_BLOCKS if block.skip is not None)
    run = [c for block in ALL_BLOCKS if block.skip is None for c in block.commands]
    assert len(run) >= 5


def test_the_reader_finds_commands_continuations_output_and_marks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    doc = tmp_path / "docs" / "x.md"
    doc.parent.mkdir()
    doc.write_text("\n".join([
        "```bash", "wbfe score a.safetensors   # a comment", "wbfe theory x --d 3 \\", "    --k 2", "```",
        "<!-- not run: needs the network -->", "", "```", "wbfe score org/name", "```",
        "```console", "$ wbfe rank --list", "fmnist", "...", "$ wbfe score", "model: x", "```",
        "```python", "wbfe score not.a.command", "```",
    ]))
    monkeypatch.setitem(globals(), "ROOT", tmp_path)
    found = blocks(doc)
    assert [(b.line, b.skip) for b in found] == [(1, None), (8, "needs the network"), (11, None)]
    assert [(c.line, c.text, c.output) for c in found[0].commands] == [
        (2, "wbfe score a.safetensors", None), (3, "wbfe theory x --d 3 --k 2", None)]
    assert [(c.text, c.output) for c in found[2].commands] == [("wbfe rank --list", ["fmnist", "..."]),
                                                                ("wbfe score", ["model: x"])]
    assert _matches(["fmnist", "cifar", "end"], ["fmnist", "...", "end"])
    assert not _matches(["fmnist", "cifar"], ["fmnist"]) and not _matches(["other"], ["fmnist", "..."])
