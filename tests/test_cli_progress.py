"""The terminal progress bar (cli/_progress.py) and the engine's progress calls that feed it."""

from __future__ import annotations

import io
import re
import sys
import time
from pathlib import Path

import pytest

import wbfe
from cli._progress import progress_bar


def _terminal() -> tuple[object, io.StringIO]:
    from rich.console import Console

    out = io.StringIO()
    return Console(file=out, force_terminal=True, width=160, color_system=None), out


def _frames(text: str) -> list[str]:
    """The bar's successive drawings (rich redraws the line after cursor moves / carriage returns)."""
    plain = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "\n", text).replace("\r", "\n")
    return [line for line in plain.split("\n") if line.strip()]


def test_the_bar_shows_the_total_at_once_then_moves_per_matrix_with_a_rate_and_eta(st_file: Path) -> None:
    console, out = _terminal()
    seen: list[str] = []

    with progress_bar(enabled=True, console=console) as update:
        assert update is not None

        def slowed(done: int, total: int | None, name: str) -> None:
            update(done, total, name)
            seen.append(out.getvalue())
            time.sleep(0.02)  # a measurable rate

        wbfe.score(st_file, metrics="bfe", progress=slowed)
    first = _frames(seen[0])
    assert first and "0/6" in first[-1]  # before the first matrix: the total (6 of its 10 tensors are matrices)
    assert "?" not in first[-1]
    for k in range(1, 7):  # one step per matrix
        assert f"{k}/6" in _frames(seen[k])[-1]
    last = _frames(seen[-1])[-1]
    assert re.search(r"\d+\.\d matrices/s", last)  # the rate
    assert re.search(r"\d:\d\d:\d\d", last)  # elapsed and time left


def test_no_bar_when_stderr_is_not_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "stderr", io.StringIO())
    with progress_bar(enabled=True) as update:
        assert update is None


def test_compare_feeds_the_bar_pairs_with_the_total_first() -> None:
    import torch

    a = {f"l{k}.weight": torch.randn(16, 12, generator=torch.Generator().manual_seed(k)) for k in range(3)}
    b = {name: 2 * w for name, w in a.items()}
    console, out = _terminal()
    seen: list[str] = []
    with progress_bar(enabled=True, what="comparing", unit="pairs", console=console) as update:
        assert update is not None

        def slowed(done: int, total: int | None, name: str) -> None:
            update(done, total, name)
            seen.append(out.getvalue())
            time.sleep(0.02)

        wbfe.compare(a, b, metrics="bfe", progress=slowed)
    assert "0/3" in _frames(seen[0])[-1] and "comparing" in _frames(seen[0])[-1]
    assert "3/3" in _frames(seen[-1])[-1] and re.search(r"pairs/s", _frames(seen[-1])[-1])


def test_the_bar_says_it_reads_the_description_before_the_first_matrix(tmp_path: Path, st_file: Path) -> None:
    from wbfe.engine.checkpoint import DESCRIBING

    folder = tmp_path / "described"
    folder.mkdir()
    st_file.rename(folder / "model.safetensors")
    # A config.json: the score reads the model's description from it before the first matrix (an
    # architecture no framework builds, so that nothing is imported for it).
    (folder / "config.json").write_text('{"architectures": ["NoSuchModelForTesting"]}')
    calls: list[tuple[int, int | None, str]] = []
    console, out = _terminal()
    seen: list[str] = []
    with progress_bar(enabled=True, console=console) as update:
        assert update is not None

        def recorded(done: int, total: int | None, name: str) -> None:
            calls.append((done, total, name))
            update(done, total, name)
            seen.append(out.getvalue())

        wbfe.score(folder, metrics="bfe", progress=recorded)
    assert calls[0] == (0, None, DESCRIBING) == (0, None, "reading the model's description")
    assert calls[1] == (0, 6, "") and calls[-1][:2] == (6, 6)
    assert "scoring: reading the model's description" in _frames(seen[0])[-1]
    assert "0/6" in _frames(seen[1])[-1]
    # A checkpoint without a description to read is not said to be read.
    plain: list[tuple[int, int | None, str]] = []
    wbfe.score(folder / "model.safetensors", metrics="bfe", progress=lambda *call: plain.append(call))
    assert plain[0] == (0, 6, "") and all(name != DESCRIBING for _, _, name in plain)


def test_a_tensor_name_is_drawn_as_it_is_never_as_markup_or_terminal_codes() -> None:
    # "a[/b].weight" used to raise rich's MarkupError out of `wbfe score` on a terminal (a traceback, exit 1),
    # and an escape sequence in a name went to the terminal as it was.
    console, out = _terminal()
    with progress_bar(enabled=True, console=console) as update:
        assert update is not None
        update(0, 2, "")
        update(1, 2, "a[/b].weight")
        drawn_markup = out.getvalue()
        update(2, 2, "c\x1b[2Jd.weight")
    assert "a[/b].weight" in _frames(drawn_markup)[-1]
    assert "\x1b[2J" not in out.getvalue() and "c\\x1b[2Jd.weight" in out.getvalue()
