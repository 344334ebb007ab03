"""Malformed or unreachable remote references end in one typed error (library) and one
``wbfe: error:`` line with exit code 2 (CLI), on score, describe and compare, streamed or not:
found by a hostile-input pass, where an unclosed IPv6 host and an ftp:// store (which connects as
its filesystem is made) ended in tracebacks. Nothing here leaves the machine: the store is a
closed loopback port."""

from __future__ import annotations

import os
import re

import pytest
from typer.testing import CliRunner

import wbfe
from wbfe.errors import SourceNotFoundError
from wbfe_cli.main import app

BAD_URL = "http://[::1/model.safetensors"
CLOSED_FTP = "ftp://127.0.0.1:1/model.safetensors"


@pytest.mark.parametrize("stream", [None, True])
def test_an_invalid_url_is_a_typed_error(stream):
    with pytest.raises(SourceNotFoundError, match=r"not a valid URL \(Invalid IPv6 URL\)"):
        wbfe.describe(BAD_URL, stream=stream)


def test_a_store_that_cannot_be_reached_as_it_is_made_is_a_typed_error(tmp_path, monkeypatch):
    pytest.importorskip("fsspec")
    monkeypatch.setenv("WBFE_CACHE_DIR", str(tmp_path / "cache"))
    with pytest.raises(SourceNotFoundError, match=r"^ftp://127\.0\.0\.1:1/model\.safetensors: cannot reach the store "
                                                  r"\(ConnectionRefusedError"):
        wbfe.score(CLOSED_FTP)
    assert not (tmp_path / "cache" / "objects").exists() or not any((tmp_path / "cache" / "objects").rglob("*.part"))


@pytest.mark.parametrize("argv", [
    ["score", BAD_URL], ["describe", "--stream", BAD_URL], ["compare", "--stream", BAD_URL, BAD_URL],
    ["describe", CLOSED_FTP],
])
def test_the_cli_says_it_in_one_line(argv, tmp_path, monkeypatch):
    pytest.importorskip("fsspec")
    monkeypatch.setenv("WBFE_CACHE_DIR", str(tmp_path / "cache"))
    result = CliRunner().invoke(app, argv)
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("wbfe: error: "), result.output


def test_an_empty_reference_never_reads_the_working_folder(tmp_path, monkeypatch, st_file):
    """Path("") is ".": an empty argument (an unset shell variable) used to score, describe or watch
    whatever the working folder held."""
    import shutil

    from wbfe.watch.runs import discover_run

    shutil.copy(st_file, tmp_path / "step_3.safetensors")
    monkeypatch.chdir(tmp_path)
    for call in (wbfe.score, wbfe.describe):
        for ref in ("", "  "):
            with pytest.raises(SourceNotFoundError, match="^an empty model reference"):
                call(ref)
    with pytest.raises(SourceNotFoundError, match="^an empty run reference"):
        discover_run("")
    for argv in (["score", ""], ["describe", ""], ["watch", ""], ["compare", "", str(st_file)]):
        result = CliRunner().invoke(app, argv)
        assert result.exit_code == 2 and result.output.startswith("wbfe: error: an empty "), (argv, result.output)


def test_a_home_folder_of_an_unknown_user_is_a_missing_path(tmp_path, monkeypatch):
    """'~nouser/x' names no home folder: a SourceNotFoundError (Path.expanduser raised RuntimeError)."""
    monkeypatch.chdir(tmp_path)
    for call in (wbfe.score, wbfe.describe):
        with pytest.raises(SourceNotFoundError, match="^no such file or folder: ~wbfe-no-such-user/m.safetensors$"):
            call("~wbfe-no-such-user/m.safetensors")
    # The CLI asks which local files a command reads before it reads them: that question raised RuntimeError.
    for argv in (["score", "~wbfe-no-such-user/m.safetensors"], ["describe", "~wbfe-no-such-user/m.safetensors"]):
        result = CliRunner().invoke(app, argv)
        assert result.exit_code == 2, (argv, result.output)
        assert result.output == "wbfe: error: no such file or folder: ~wbfe-no-such-user/m.safetensors\n"
    # Every other reader of a user's path too (watch's run, rank's zoo): one rule, wbfe._config.user_path.
    for argv, said in ((["watch", "~wbfe-no-such-user/run"], "no such file or folder: ~wbfe-no-such-user/run"),
                       (["rank", "~wbfe-no-such-user/z.csv", "--no-cache"], "zoo spec not found: ~wbfe-no-such-user/z.csv")):
        result = CliRunner().invoke(app, argv)
        assert result.exit_code == 2 and result.output == f"wbfe: error: {said}\n", (argv, result.output)


def test_the_default_caches_share_one_cache_home(tmp_path, monkeypatch):
    """hub, torch and wbfe caches under $XDG_CACHE_HOME (its ~ expanded), else under ~/.cache."""
    from wbfe import _config

    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HOME", "TORCH_HOME", "WBFE_CACHE_DIR"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    for xdg, home in (("~/xdg", tmp_path / "xdg"), ("", tmp_path / ".cache")):
        monkeypatch.setenv("XDG_CACHE_HOME", xdg)
        assert (_config.hf_cache_dir(), _config.torch_hub_dir(), _config.wbfe_cache_dir()) == (
            home / "huggingface" / "hub", home / "torch" / "hub", home / "wbfe" / "scores")


@pytest.mark.parametrize("out", [None, 3, b"out.json"])
def test_an_output_that_is_not_a_path_is_a_typed_error(out):
    """check_output(None) raised TypeError from os.fspath (smooth/prune with out=None)."""
    from wbfe.errors import OutputError
    from wbfe.render.files import check_output, check_output_dir

    for check in (check_output, check_output_dir):
        with pytest.raises(OutputError, match=f"^the output must be a file name, not {out!r}$"):
            check(out)


@pytest.mark.parametrize("argv", [
    ["compare", "a.safetensors", "b.safetensors", "-o", ""], ["rank", "--cache-dir", ""],
    ["cache", "info", "--cache-dir", ""], ["cache", "prune", "--cache-dir", ""], ["watch", "run", "--calibrate", ""], ["watch", "run", "-o", ""],
    ["theory", "curve", "-o", ""], ["theory", "hmc", "-o", ""], ["theory", "student", "-o", ""],
    ["theory", "hierarchical", "-o", ""],
])
def test_an_empty_path_option_is_refused_not_read_as_the_working_folder(argv, tmp_path, monkeypatch):
    """typer turned '' into Path('.'): rank wrote its cache into the working folder, compare its report files."""
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, argv)
    assert result.exit_code == 2, (argv, result.output)
    assert "is empty: name a file or folder, or leave the option out" in result.output
    assert len(result.output.strip().splitlines()) == 1 and not list(tmp_path.iterdir())


@pytest.mark.parametrize("argv", [
    ["compare", "a.safetensors", "b.safetensors", "-o", "-"], ["theory", "curve", "-o", "-"],
    ["theory", "hmc", "-o", "/dev/stdout"], ["theory", "hierarchical", "-o", "-"],
])
def test_standard_output_is_no_folder_of_results(argv, tmp_path, monkeypatch):
    """``-o -`` where the results are several files made a folder named '-' (or was called a file)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "run").mkdir()
    result = CliRunner().invoke(app, argv)
    assert result.exit_code == 2, (argv, result.output)
    assert result.stderr.strip() == (f"wbfe: error: cannot write into {argv[-1]}: the results are several files; "
                                     "give a folder")
    assert [p.name for p in tmp_path.iterdir()] == ["run"]


def test_a_looping_or_dangling_link_is_named_as_such(tmp_path, monkeypatch):
    """A symbolic link loop and a dangling link were 'no such file or folder', which the user can see is there."""
    monkeypatch.chdir(tmp_path)
    os.symlink("l2", "l1")
    os.symlink("l1", "l2")
    os.symlink("gone.safetensors", "dangling.safetensors")
    for ref, why in [("l1", "l1: a symbolic link in a loop (it never reaches a file)"),
                     ("dangling.safetensors", "dangling.safetensors: a symbolic link to gone.safetensors, "
                                              "which does not exist")]:
        with pytest.raises(wbfe.SourceNotFoundError, match=f"^{re.escape(why)}$"):
            wbfe.score(ref)
        result = CliRunner().invoke(app, ["describe", ref])
        assert result.exit_code == 2 and result.stderr.strip() == f"wbfe: error: {why}"


def test_an_output_folder_the_file_system_cannot_name_is_one_line(tmp_path, monkeypatch):
    """check_output_dir's Path.exists raised OSError (File name too long, a loop of links): wbfe rank -o and the
    other folder outputs printed a traceback and exited 1."""
    from wbfe.errors import OutputError
    from wbfe.render.files import check_output, check_output_dir

    monkeypatch.chdir(tmp_path)
    os.symlink("l2", "l1")
    os.symlink("l1", "l2")
    long = "x" * 300
    for out, why in [(long, "File name too long"), (f"a/{long}/b", "File name too long"),
                     ("l1", "Too many levels of symbolic links")]:
        with pytest.raises(OutputError, match=f"^cannot write into {re.escape(out)}: {why}$"):
            check_output_dir(out)
    for out in (f"{long}.json", f"a/{long}.json", f"a/{long}/b.json"):  # a missing folder made only at the end
        with pytest.raises(OutputError, match=f"^cannot write {re.escape(out)}: File name too long$"):
            check_output(out)
    result = CliRunner().invoke(app, ["rank", "-o", long, "--no-cache"])
    assert result.exit_code == 2 and result.stderr.strip() == f"wbfe: error: cannot write into {long}: File name too long"
    assert sorted(os.listdir(tmp_path)) == ["l1", "l2"]


def test_a_new_results_folder_named_as_a_file_is_refused_an_existing_one_is_used(tmp_path):
    """wbfe rank/watch/theory -o x.json made a folder x.json (only compare and report refused it, each its own way);
    a folder the user already made is theirs to name."""
    from wbfe.errors import OutputError
    from wbfe.render.files import check_output_dir

    with pytest.raises(OutputError, match=re.escape("name a folder, not a .json file")):
        check_output_dir(tmp_path / "out" / "R.JSON")
    assert not (tmp_path / "out").exists()
    (tmp_path / "old.json").mkdir()
    assert check_output_dir(tmp_path / "old.json") == tmp_path / "old.json"
    assert check_output_dir(tmp_path / "results.v2") == tmp_path / "results.v2"
