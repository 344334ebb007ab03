"""Other libraries' messages go through wbfe's diagnostics (wbfe.render.diagnostics): held back while a command
runs, each distinct one shown once with --verbose, counted in one line otherwise, absent under --quiet;
outside a command (wbfe as a library) the library prints as it always did."""

from __future__ import annotations

import io
import json
import logging
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from wbfe.render.diagnostics import Note, captured, route_logger


def test_a_routed_logger_is_held_back_once_each_and_only_inside_captured() -> None:
    stream = io.StringIO()
    logger = logging.getLogger("wbfe_test_fakelib")
    handler = logging.StreamHandler(stream)
    logger.addHandler(handler)
    logger.propagate = False
    try:
        route_logger("wbfe_test_fakelib")
        with captured() as notes:
            logging.getLogger("wbfe_test_fakelib.sub").warning("RoPE scaling %s ignored", "yarn")
            logger.warning("RoPE scaling %s ignored", "yarn")
            logger.warning("falling back to the eager kernel")
        assert stream.getvalue() == ""
        assert notes.notes == [Note("wbfe_test_fakelib", "RoPE scaling yarn ignored"),
                               Note("wbfe_test_fakelib", "falling back to the eager kernel")]
        assert notes.repeats == 1
        assert notes.summary() == "2 messages from wbfe_test_fakelib held back (--verbose shows them)"
        logger.warning("outside")  # a library user sees the library's own output
        assert stream.getvalue() == "outside\n"
    finally:
        logger.removeHandler(handler)


def test_another_librarys_python_warning_is_held_back() -> None:
    with captured() as notes:
        warnings.warn_explicit("deprecated thing", FutureWarning, "/x/site-packages/fakelib/mod.py", 3)
    assert notes.notes == [Note("fakelib", "deprecated thing")]
    with captured() as empty:
        pass
    assert empty.summary() is None



def test_wbfes_own_warnings_and_a_scripts_pass_as_they_are_named() -> None:
    """wbfe's own warning is shown as Python would (it is not another library's); a warning from a file outside any
    installed package is held back under its category's name."""
    shown: list[str] = []
    previous = warnings.showwarning
    warnings.showwarning = lambda message, *args, **kwargs: shown.append(str(message))
    try:
        with captured() as notes:
            warnings.warn_explicit("a wbfe warning", UserWarning, "/x/wbfe/metrics/mod.py", 3)
            warnings.warn_explicit("a   script's\nwarning", RuntimeWarning, "/home/me/run.py", 7)
    finally:
        warnings.showwarning = previous
    assert shown == ["a wbfe warning"]
    assert notes.notes == [Note("RuntimeWarning", "a   script's\nwarning")]
    assert notes.notes[0].line() == "RuntimeWarning: a script's warning"  # one line, as --verbose prints it


def test_a_malformed_record_is_passed_to_the_librarys_handler() -> None:
    """A record whose message cannot be formatted (more %s than arguments) is left to the library's own handler,
    as logging would (which reports it), rather than raising inside wbfe."""
    records: list[logging.LogRecord] = []
    logger = logging.getLogger("wbfe_test_badlib")
    handler = logging.Handler()
    handler.emit = records.append  # type: ignore[method-assign]
    logger.addHandler(handler)
    logger.propagate = False
    try:
        route_logger("wbfe_test_badlib")
        with captured() as notes:
            logger.warning("two %s %s", "one")  # noqa: PLE1206 - the malformed record under test
        assert notes.notes == [] and [r.msg for r in records] == ["two %s %s"]
    finally:
        logger.removeHandler(handler)


@pytest.fixture(scope="module")
def gpt2_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A GPT-2 folder whose config transformers checks noisily (bos/eos ids outside its 96-token vocabulary)."""
    transformers = pytest.importorskip("transformers")
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("gpt2")
    config = transformers.GPT2Config(n_embd=32, n_layer=1, n_head=4, n_positions=32, vocab_size=96)
    transformers.GPT2LMHeadModel(config).save_pretrained(folder)
    return folder


@pytest.mark.parametrize("flag", ["", "--verbose", "--quiet"])
def test_the_command_line_shows_them_with_verbose_only(gpt2_folder: Path, tmp_path: Path, flag: str) -> None:
    out = tmp_path / "s.json"
    argv = ["score", str(gpt2_folder), "--metrics", "bfe", "--format", "json", "-o", str(out), *([flag] if flag else [])]
    code = "import json, sys\nsys.argv = ['wbfe', *json.loads(sys.argv[1])]\nfrom wbfe_cli.main import main\nmain()\n"
    done = subprocess.run([sys.executable, "-c", code, json.dumps(argv)], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "WBFE_CACHE_DIR": str(tmp_path / "cache")})  # a fresh cache: a build
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stderr.splitlines()
    assert not any(line.startswith("[transformers]") for line in lines), lines
    if flag == "--quiet":
        assert lines == []
    elif flag == "--verbose":
        assert lines[0] == f"wrote {out}"
        notes = lines[1:]
        assert len(notes) == 2 and all(n.startswith("wbfe: note from transformers: Model config: ") for n in notes)
        assert len(set(notes)) == 2
    else:
        assert lines == [f"wrote {out}", "wbfe: 2 messages from transformers held back (--verbose shows them)"]
    assert json.loads(out.read_text())["model"]["framework"]["used"] == "transformers"
