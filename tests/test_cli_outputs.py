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
    (("report", "-f", "md", "-o", "r.html"), "cannot write into r.html: the results are several files; name a folder, "
                                             "not a .html file"),
    (("report", "-f", "md", "-o", "-"), "cannot write into -: the results are several files; give a folder"),
    (("compare", "a", "b", "-o", "c.json"), "cannot write into c.json: the results are several files; name a folder, "
                                           "not a .json file"),
    (("compare", "a", "b", "-f", "csv", "-o", "c.CSV"), "name a folder, not a .csv file"),
    (("rank", "zoo.csv", "-o", "r.json"), "cannot write into r.json: the results are several files; name a folder"),
    (("theory", "curve", "-o", "curve.png"), "cannot write into curve.png: the results are several files"),
    (("score", "--quiet", "--verbose"), "--quiet and --verbose contradict each other: give one of them"),
    (("describe", "-q", "-v"), "--quiet and --verbose contradict each other"),
])
def test_an_output_named_for_another_format_is_refused(argv: tuple[str, ...], text: str, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    # each of these wrote a file of one format under another's name (JSON in x.csv, a PNG in e.txt, HTML in
    # r.md), made a folder named r.html, c.json or '-', or dropped --verbose without a word
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


HUB_ID = "someone/not-cached"
ESD = ("esd", HUB_ID, "--layer", "fc.weight", "-o")


@pytest.mark.parametrize("argv,bad,good,text", [
    (ESD, "e.txt", "e.png", "wbfe esd writes a PNG file: name the output *.png, not e.txt"),
    (ESD, "missing/dir/e.txt", "missing/dir/e.png", "name the output *.png, not missing/dir/e.txt"),
    (("report", HUB_ID, "-o"), "r.txt", "r.html", "--format html writes one HTML page: name the output *.html, "
                                                  "not r.txt"),
    (("report", HUB_ID, "-o"), "missing/dir/r.txt", "missing/dir/r.html", "name the output *.html, not "
                                                                          "missing/dir/r.txt"),
    (("report", HUB_ID, HUB_ID + "-b", "-o"), "r.png", "r.html", "name the output *.html, not r.png"),
    (("report", HUB_ID, "-f", "md", "-o"), "missing/r.html", "missing/r", "cannot write into missing/r.html: the "
                                                                          "results are several files; name a folder"),
])
def test_a_misnamed_output_is_refused_before_the_hub_is_asked(argv: tuple[str, ...], bad: str, good: str, text: str,
                                                              tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # the hub id was resolved first (network and cache lookups) and its error came instead of the output's
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf-home" / "hub"))
    assert_one_line(cli(*argv, bad), text)
    assert list(tmp_path.iterdir()) == []
    # the same command with a good output reaches the hub id, which is unreachable here
    assert_one_line(cli(*argv, good), f"{HUB_ID}: no such file or folder, and no such model in the local Hugging "
                                      "Face cache")
    assert list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------- an option given twice


@pytest.mark.parametrize("argv,flags", [
    (("score", "-f", "json", "-f", "csv"), "--format / -f"),
    (("score", "--format=json", "-fcsv"), "--format / -f"),
    (("score", "--stream", "--no-stream"), "--stream / --no-stream"),
    (("describe", "--layers", "a", "--layers", "b"), "--layers"),
    (("theory", "solve", "--d", "10", "--d", "20"), "--d"),
    (("cache", "info", "-f", "json", "-f", "table"), "--format / -f"),
])
def test_an_option_given_twice_is_refused(argv: tuple[str, ...], flags: str) -> None:
    # the last one won without a word (score -f json -f csv printed CSV)
    result = cli(*argv)
    assert_one_line(result, f"{flags} is given more than once: give it once")
    assert f"(see 'wbfe {' '.join(argv[:2] if argv[0] in ('theory', 'cache') else argv[:1])} --help')" in result.stderr


def test_a_list_option_is_repeatable(tmp_path: Path) -> None:
    g = torch.Generator().manual_seed(1)
    save_file({"x.fc.weight": torch.randn(20, 30, generator=g)}, str(tmp_path / "a.safetensors"))
    save_file({"z.fc.weight": torch.randn(20, 30, generator=g)}, str(tmp_path / "b.safetensors"))
    result = cli("compare", str(tmp_path / "a.safetensors"), str(tmp_path / "b.safetensors"), "--metrics", "bfe",
                 "--map", "^x=y", "--map", "^y=z", "-f", "json", "-q")
    assert result.exit_code == 0, result.output
    assert '"name_b": "z.fc.weight"' in result.stdout  # both maps applied, in turn


# ---------------------------------------------------------------- options read by nothing, --quiet that was not


@pytest.mark.parametrize("argv,text", [
    (("rank", "--list", "fmnist"), "--list prints the built-in zoos as a table and ranks none"),
    (("rank", "--list", "-f", "json"), "ranks none: leave out --format"),
    (("rank", "--list", "fmnist", "-o", "out"), "ranks none: leave out the zoo, --output"),
    (("rank", "--list", "-q", "acc", "--metrics", "bfe", "-j", "2"), "ranks none: leave out --quality, --workers, "
                                                                     "--metrics"),
    (("theory", "solve", "--rate", "3"), "--rate shapes the exp readout only; this is the power readout: give "
                                         "--readout exp, or leave --rate out"),
    (("theory", "solve", "--readout", "exp", "--nonzeros", "2"), "--nonzeros shapes the sparse readout only"),
    (("theory", "solve", "--readout", "dense", "--beta", "0.5"), "--beta shapes the power readout only"),
    (("theory", "curve", "-o", "c", "--readout", "exp", "--beta", "1"), "--beta shapes the power readout only"),
])
def test_an_option_nothing_reads_is_refused(argv: tuple[str, ...], text: str, tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    # each was accepted and dropped: rank --list -f json printed the table, solve --rate 3 solved the power readout
    monkeypatch.chdir(tmp_path)
    assert_one_line(cli(*argv), text)
    assert list(tmp_path.iterdir()) == []


def test_a_readout_option_of_the_chosen_family_is_read() -> None:
    import json

    from wbfe.options import field_defaults
    from wbfe.theory.settings import CurveSettings
    from wbfe.theory.teacher_student import readout, solve

    result = cli("theory", "solve", "--readout", "exp", "--rate", "3", "--format", "json")
    assert result.exit_code == 0, result.output
    at = field_defaults(CurveSettings)  # solve's defaults are a curve's, at r = 0.5
    want = solve(readout("exp", at["k"], rate=3.0), delta=at["delta"], d=at["d"], r=0.5, activation=at["activation"])
    assert json.loads(result.stdout)["eps"] == pytest.approx(want.eps, rel=1e-12)
    power = json.loads(cli("theory", "solve", "--format", "json").stdout)["eps"]
    assert power != pytest.approx(want.eps, rel=1e-3)  # the rate changed the answer


def test_report_refuses_unusual_and_weights_where_nothing_draws_them(tmp_path: Path, st_file: Path) -> None:
    # --unusual on a comparison page and --weights with a saved comparison were dropped without a word
    out = tmp_path / "page.html"
    assert_one_line(cli("report", str(st_file), str(st_file), "--unusual", "2", "--metrics", "bfe", "-o", str(out)),
                    "--unusual applies to the page of one model's scores")
    saved = tmp_path / "compare.json"
    assert cli("compare", str(st_file), str(st_file), "--metrics", "bfe", "-f", "json", "-q").exit_code == 0
    saved.write_text(cli("compare", str(st_file), str(st_file), "--metrics", "bfe", "-f", "json", "-q").stdout)
    assert_one_line(cli("report", str(saved), "--weights", str(st_file), "-o", str(out)),
                    "--weights goes with a saved score JSON")
    assert_one_line(cli("report", str(saved), "--unusual", "1", "-o", str(out)), "--unusual applies to")
    assert not out.exists()
    assert cli("report", str(saved), "-o", str(out)).exit_code == 0 and out.read_text().startswith("<!DOCTYPE html>")


def test_rank_quiet_says_nothing_on_stderr(tmp_path: Path) -> None:
    # rank --quiet printed "wrote .../rank.json and N plots" (docs/cli.md: no 'wrote FILE' under --quiet)
    lines = ["model,acc"]
    for i, acc in enumerate([70.0, 80.0, 75.0]):
        g = torch.Generator().manual_seed(i)
        save_file({"fc.weight": torch.randn(30, 20, generator=g), "head.weight": torch.randn(10, 30, generator=g)},
                  str(tmp_path / f"m{i}.safetensors"))
        lines.append(f"m{i}.safetensors,{acc}")
    (tmp_path / "zoo.csv").write_text("\n".join(lines) + "\n")
    args = ("rank", str(tmp_path / "zoo.csv"), "--metrics", "bfe", "--no-cache", "--n-boot", "10")
    result = cli(*args, "-o", str(tmp_path / "quiet"), "--quiet")
    assert result.exit_code == 0, result.output
    assert result.stderr == "" and (tmp_path / "quiet" / "rank.json").is_file()
    loud = cli(*args, "-o", str(tmp_path / "loud"))
    assert f"wrote {tmp_path / 'loud' / 'rank.json'} and" in loud.stderr


# ---------------------------------------------------------------- sparsity and prune's --json / --csv


@pytest.fixture
def small(tmp_path: Path) -> Path:
    g = torch.Generator().manual_seed(2)
    path = tmp_path / "a.safetensors"
    save_file({"l1.weight": torch.randn(64, 32, generator=g), "l2.weight": torch.randn(32, 64, generator=g),
               "head.weight": torch.randn(10, 32, generator=g)}, str(path))
    return path


@pytest.mark.parametrize("argv,text", [
    (("sparsity", "--json", "s.csv"), "--json writes JSON, and s.csv names a CSV file: name it *.json"),
    (("sparsity", "--csv", "s.json"), "--csv writes CSV, and s.json names a JSON file: name it *.csv"),
    (("sparsity", "--json", "-"), "--json writes a file, and the table goes to standard output: give --json a file "
                                  "name, not -"),
    (("sparsity", "--json", "s1", "--csv", "./s1"), "--csv ./s1 is the file --json writes: name another file"),
    (("prune", "p.safetensors", "--json", "./p.safetensors"), "--json ./p.safetensors is the file the pruned "
                                                              "checkpoint is written to"),
    (("prune", "p.safetensors", "--json", "p.csv"), "--json writes JSON, and p.csv names a CSV file"),
])
def test_sparsity_and_prune_files_are_checked_before_any_work(argv: tuple[str, ...], text: str, small: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    # each was written: JSON into s.csv, JSON into the table on stdout, the CSV over the JSON, and the prune
    # report over the pruned checkpoint
    monkeypatch.chdir(small.parent)
    assert_one_line(cli(argv[0], str(small), *argv[1:], "--target", "0.5"), text)
    assert sorted(p.name for p in small.parent.iterdir()) == ["a.safetensors"]


def test_a_pruned_checkpoint_named_with_a_tilde_is_no_place_for_its_report(small: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    # '~/p.safetensors' twice: the checkpoint was written, then replaced by its JSON report
    monkeypatch.setenv("HOME", str(small.parent))
    assert_one_line(cli("prune", str(small), "~/p.safetensors", "--json", "~/p.safetensors", "--target", "0.5"),
                    "--json ~/p.safetensors is the file the pruned checkpoint is written to")
    assert sorted(p.name for p in small.parent.iterdir()) == ["a.safetensors"]


def test_sparsity_writes_both_files(small: Path, tmp_path: Path) -> None:
    result = cli("sparsity", str(small), "--target", "0.5", "--json", str(tmp_path / "s.json"),
                 "--csv", str(tmp_path / "s.csv"))
    assert result.exit_code == 0, result.output
    assert (tmp_path / "s.json").read_text().startswith("{")
    assert (tmp_path / "s.csv").read_text().startswith("name,")


def test_cache_prune_without_any_bound_says_what_it_removed(tmp_path: Path) -> None:
    # --max-size none alone is no size and no age bound: only what every prune removes (stale claims, day-old
    # partial copies) goes, and the line says what went (nothing here), not that the cache is within bounds
    result = cli("cache", "prune", "--cache-dir", str(tmp_path), "--max-size", "none")
    assert result.exit_code == 0, result.output
    assert result.stdout == f"removed nothing (0 B) from {tmp_path}; 0 B kept\n", result.stdout
    result = cli("cache", "prune", "--cache-dir", str(tmp_path), "--max-size", "none", "--older-than", "1",
                 "--dry-run")
    assert result.exit_code == 0, result.output


# ---------------------------------------------------------------- refusals the other CLI tests did not reach


@pytest.mark.parametrize("stop", [KeyboardInterrupt, EOFError])
def test_an_interrupted_command_exits_130(stop: type[BaseException], monkeypatch: pytest.MonkeyPatch) -> None:
    import wbfe

    def interrupted(*args: Any, **kwargs: Any) -> None:
        raise stop

    monkeypatch.setattr(wbfe, "describe", interrupted)
    result = cli("describe")
    assert result.exit_code == 130, (result.exit_code, result.output)
    assert "Traceback" not in result.output
    if stop is EOFError:  # click's Abort: said in one line
        assert result.stderr.endswith("wbfe: interrupted\n"), result.stderr


def test_version_and_stdout_output(st_file: Path) -> None:
    import wbfe

    assert cli("--version").stdout == f"wbfe {wbfe.__version__}\n"
    to_stdout = cli("score", str(st_file), "--metrics", "bfe", "-f", "csv", "-o", "-")
    assert to_stdout.exit_code == 0 and to_stdout.stderr == ""
    assert to_stdout.stdout == cli("score", str(st_file), "--metrics", "bfe", "-f", "csv").stdout


def test_report_refusals(tmp_path: Path, st_file: Path) -> None:
    out = tmp_path / "page.html"
    assert_one_line(cli("report", str(st_file), "--intra", "-o", str(out)),
                    "a report draws the ESDs of stored matrices: --intra and --conv fft do not apply")
    assert_one_line(cli("report", str(st_file), str(st_file), "--head", "classifier.weight", "-o", str(out)),
                    "a comparison of two checkpoints flattens conv kernels and has no head rule")
    saved = tmp_path / "score.json"
    saved.write_text(cli("score", str(st_file), "--metrics", "bfe", "-f", "json").stdout)
    other = tmp_path / "other.safetensors"
    save_file({"fc.weight": torch.randn(8, 6, generator=torch.Generator().manual_seed(3))}, str(other))
    assert_one_line(cli("report", str(saved), "--weights", str(other), "-o", str(out)),
                    "the saved score was of")
    assert_one_line(cli("report", str(saved), str(st_file), "-o", str(out)),
                    "a second reference compares two checkpoints: give both as checkpoints")
    assert not out.exists()


def test_theory_list_options_refuse_an_empty_list() -> None:
    assert_one_line(cli("theory", "hmc", "--r-values", ","), "--r-values must not be empty")
    assert_one_line(cli("theory", "student", "--widths", "1.5"), "--widths must be comma-separated integers, got '1.5'")


def test_rank_table_names_the_failed_models_and_why_a_metric_has_no_rho(tmp_path: Path) -> None:
    lines = ["model,acc"]
    for i, acc in enumerate([70.0, 80.0]):
        g = torch.Generator().manual_seed(i)
        save_file({"fc.weight": torch.randn(30, 20, generator=g), "head.weight": torch.randn(10, 30, generator=g)},
                  str(tmp_path / f"m{i}.safetensors"))
        lines.append(f"m{i}.safetensors,{acc}")
    (tmp_path / "zoo.csv").write_text("\n".join([*lines, "missing.safetensors,75.0"]) + "\n")
    result = cli("rank", str(tmp_path / "zoo.csv"), "--metrics", "bfe", "--no-cache", "--quiet")
    assert result.exit_code == 0, result.output
    assert "(needs at least 3 models with a finite value, has 2)" in result.stdout
    assert "failed (1):\n  missing.safetensors: SourceNotFoundError: no such file or folder" in result.stdout


def test_a_path_that_is_there_gets_no_hub_name_hint(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # an empty folder and a symbolic link loop were told "if it is a Hugging Face model, give its full id"
    monkeypatch.chdir(tmp_path)
    (tmp_path / "empty").mkdir()
    (tmp_path / "loop1").symlink_to("loop2")
    (tmp_path / "loop2").symlink_to("loop1")
    assert_one_line(cli("score", "empty"), "empty: no weight files")
    assert_one_line(cli("describe", "loop1"), "loop1")
    for name in ("empty", "loop1"):
        assert "Hugging Face" not in cli("score", name).stderr
    assert "if it is a Hugging Face model, give its full id" in cli("score", "no-such-model").stderr


@pytest.mark.parametrize("command", ["sparsity", "prune"])
def test_a_required_checkpoint_is_not_said_to_have_a_default(command: str) -> None:
    # the help said "Default: the embedded demo CNN.  [required]"
    text = " ".join(cli(command, "--help").stdout.split())
    assert "ref <str> Checkpoint: file, folder, org/name[@rev]" in text and "[required]" in text
    assert "Default: the embedded demo CNN" not in text
