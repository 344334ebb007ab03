"""One answer per option value, whatever the entry point: an empty ``--layers`` and the ``fix_fingers`` / ``fit``
choices are refused with the same one line by :func:`wbfe.score`, :func:`wbfe.compare`, :func:`wbfe.describe`, the
options classes, the tail fit itself and the CLI (exit 2)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest
import torch
from typer.testing import CliRunner
from wbfe_cli.main import app

import wbfe
from wbfe.errors import InvalidOptionError
from wbfe.metrics._group import MetricOptions
from wbfe.metrics.fingers import fit_tail
from wbfe.options import CompareOptions, ScoreOptions, check_tail_options

STATE = {"fc.weight": torch.eye(12) * 2.0}
EMPTY_LAYERS = "--layers is empty: leave --layers out for every tensor"


def refused(call: Callable[[], Any]) -> str:
    """The one line ``call`` is refused with."""
    with pytest.raises(InvalidOptionError) as caught:
        call()
    message = str(caught.value)
    assert "\n" not in message
    return message


def cli_line(*argv: str) -> str:
    """The one error line of ``wbfe ARGV``, which must exit 2 without a traceback."""
    result = CliRunner().invoke(app, list(argv))
    assert result.exit_code == 2, (result.exit_code, result.output, result.stderr)
    assert result.stderr.startswith("wbfe: error: ") and result.stderr.count("\n") == 1, result.stderr
    return result.stderr.removeprefix("wbfe: error: ").rstrip("\n")


@pytest.mark.parametrize("entry", ["score", "compare", "describe", "ScoreOptions", "CompareOptions"])
def test_an_empty_layers_pattern_is_refused_by_every_entry_point(entry: str) -> None:
    """score and compare read "" as "every tensor" and scored; describe and ScoreOptions refused it."""
    calls: dict[str, Callable[[], Any]] = {
        "score": lambda: wbfe.score(STATE, metrics="bfe", layers=""),
        "compare": lambda: wbfe.compare(STATE, STATE, metrics="bfe", layers=""),
        "describe": lambda: wbfe.describe(STATE, layers=""),
        "ScoreOptions": lambda: ScoreOptions(layers=""),
        "CompareOptions": lambda: CompareOptions(layers=""),
    }
    assert refused(calls[entry]) == EMPTY_LAYERS


@pytest.mark.parametrize("command", [("score", "X"), ("compare", "A", "B"), ("describe", "X")])
def test_an_empty_layers_pattern_is_refused_by_the_cli(command: tuple[str, ...], tmp_path: Path) -> None:
    paths = [str(tmp_path / name) for name in command[1:]]  # never read: the options are checked first
    assert cli_line(command[0], *paths, "--layers", "") == EMPTY_LAYERS


def test_leaving_layers_out_still_selects_every_tensor() -> None:
    assert [row["name"] for row in wbfe.score(STATE, metrics="bfe").layers] == ["fc.weight"]


BAD_TAIL = [  # (keywords, the library's line, the command line's: its flags named)
    ({"fix_fingers": "peak"}, "fix_fingers must be 'xmin_peak' or 'clip_xmax', not 'peak'",
     "--fix-fingers must be 'xmin_peak' or 'clip_xmax', not 'peak'"),
    ({"fit": "TPL"}, "fit must be one of 'pl', 'tpl', 'e_tpl', not 'TPL'",
     "--fit must be one of 'pl', 'tpl', 'e_tpl', not 'TPL'"),
    ({"fix_fingers": "clip_xmax", "fit": "tpl"},
     "fit=tpl cannot be combined with fix_fingers=clip_xmax (it clips power-law fits only)",
     "--fit tpl cannot be combined with --fix-fingers clip_xmax (it clips power-law fits only)"),
]


@pytest.mark.parametrize(("given", "line", "cli"), BAD_TAIL, ids=["fix_fingers", "fit", "clip with tpl"])
def test_every_entry_point_refuses_a_tail_choice_with_the_same_line(given: dict[str, Any], line: str, cli: str) -> None:
    """MetricOptions and fit_tail each worded their own (``fix_fingers must be xmin_peak or clip_xmax``)."""
    tail = {"fix_fingers": None, "fit": "pl", **given}
    x = np.arange(1.0, 40.0)
    assert refused(lambda: wbfe.score(STATE, metrics="bfe", **given)) == line
    assert refused(lambda: ScoreOptions(**given)) == line
    assert refused(lambda: MetricOptions(**given)) == line
    assert refused(lambda: fit_tail(x, **given)) == line
    assert refused(lambda: check_tail_options(tail["fix_fingers"], tail["fit"])) == line
    argv = [arg for name, value in given.items() for arg in (f"--{name.replace('_', '-')}", value)]
    assert cli_line("score", "not-there.safetensors", *argv) == cli


def test_the_cli_choices_are_the_librarys() -> None:
    """typer needs an Enum per choice option; each must list what the options class accepts, no more, no less."""
    from typing import get_args

    from wbfe.options import CONV_VIEWS, EditOptions, PageFormat, ReportOptions
    from wbfe.options.constraints import Choice
    from wbfe_cli._options import Conv, ReportFormat, SmoothMethod

    fmt, method = ReportOptions.CONSTRAINTS["fmt"], EditOptions.CONSTRAINTS["method"]
    assert isinstance(fmt, Choice) and isinstance(method, Choice)
    assert tuple(c.value for c in Conv) == CONV_VIEWS == ("flatten", "slices", "fft")
    assert tuple(f.value for f in ReportFormat) == get_args(PageFormat) == fmt.values == ("html", "md")
    assert tuple(m.value for m in SmoothMethod) == method.values == ("svd", "detx")


@pytest.mark.parametrize("options", [ScoreOptions, CompareOptions])
def test_a_layers_pattern_that_is_no_string_is_refused(options: type) -> None:
    assert refused(lambda: options(layers=3)) == "--layers must be a regular expression, not 3"


UNREAD = [
    ({"metrics": "bfe", "fit": "tpl"},
     "--fit tpl is read by the htsr, fingers, vectors and detx metrics, which --metrics bfe leaves out: add htsr to "
     "--metrics or drop --fit"),
    ({"metrics": "bfe", "fix_fingers": "clip_xmax"},
     "--fix-fingers clip_xmax is read by the htsr, fingers, vectors and detx metrics, which --metrics bfe leaves "
     "out: add htsr to --metrics or drop --fix-fingers"),
    ({"metrics": "htsr", "lam": 3.0},
     "--lambda 3 is read by the bfe and htmp metrics, which --metrics htsr leaves out: add bfe to --metrics or drop "
     "--lambda"),
]
UNREAD_SEED = ("--seed 5 is read by the rand metrics and --intra, which --metrics bfe,htsr leaves out: add rand to "
               "--metrics (or give --intra) or drop --seed")
UNREAD_COMPARE_SEED = ("--seed 5 is read by the rand metrics, which --metrics bfe,htsr leaves out: add rand to "
                       "--metrics or drop --seed")


def _argv(given: dict[str, Any]) -> list[str]:
    flags = {"lam": "--lambda", "fix_fingers": "--fix-fingers"}
    named = [(flags.get(name, f"--{name}"), value) for name, value in given.items()]
    return [arg for flag, value in named for arg in ((flag,) if value is True else (flag, str(value)))]


@pytest.mark.parametrize(("given", "line"), UNREAD, ids=["fit", "fix_fingers", "lambda"])
def test_an_option_no_asked_metric_reads_is_refused(given: dict[str, Any], line: str) -> None:
    """These scored with the option silently dropped (the probe's ``--metrics bfe --fit tpl`` exited 0)."""
    assert refused(lambda: ScoreOptions(**given)) == line
    assert refused(lambda: wbfe.score(STATE, **given)) == line
    assert cli_line("score", "not-there.safetensors", *_argv(given)) == line  # refused before anything is read
    assert cli_line("rank", "not-there.csv", *_argv(given)) == line
    if "lam" in given:  # compare takes --lambda, not the tail fit's options
        assert refused(lambda: CompareOptions(**given)) == line
        assert cli_line("compare", "a.safetensors", "b.safetensors", *_argv(given)) == line


def test_a_seed_nothing_random_reads_is_refused() -> None:
    assert refused(lambda: ScoreOptions(seed=5)) == UNREAD_SEED
    assert refused(lambda: wbfe.score(STATE, seed=5)) == UNREAD_SEED
    assert cli_line("score", "not-there.safetensors", "--seed", "5") == UNREAD_SEED
    assert cli_line("report", "not-there.safetensors", "-o", "page.html", "--seed", "5") == UNREAD_SEED
    assert refused(lambda: CompareOptions(seed=5)) == UNREAD_COMPARE_SEED
    assert refused(lambda: wbfe.compare(STATE, STATE, seed=5)) == UNREAD_COMPARE_SEED
    assert cli_line("compare", "a.safetensors", "b.safetensors", "--seed", "5") == UNREAD_COMPARE_SEED


UNREAD_MIN_EIGS = ("--min-eigs 5 is read by the htsr, htmp, fingers and vectors metrics and --ww-compatible, which "
                   "--metrics {} leaves out: add htsr to --metrics (or give --ww-compatible) or drop --min-eigs")


def test_a_min_eigs_no_tail_fit_reads_is_refused() -> None:
    """min_eigs gates the tail fits (and, with --ww-compatible, which matrices are analysed): with bfe alone the
    score, the comparison and the description came out the same whatever it was, saying nothing."""
    line = UNREAD_MIN_EIGS.format("bfe")
    assert refused(lambda: ScoreOptions(metrics="bfe", min_eigs=5)) == line
    assert refused(lambda: wbfe.score(STATE, metrics="bfe", min_eigs=5)) == line
    assert cli_line("score", "not-there.safetensors", "--metrics", "bfe", "--min-eigs", "5") == line
    assert refused(lambda: wbfe.compare(STATE, STATE, metrics="bfe,rand", min_eigs=5)) == (
        "--min-eigs 5 is read by the htsr, htmp, fingers and vectors metrics, which --metrics bfe,rand leaves out: "
        "add htsr to --metrics or drop --min-eigs")
    described = ("--min-eigs 5 decides a description only with --ww-compatible (which skips smaller matrices): give "
                 "--ww-compatible or drop --min-eigs")
    assert refused(lambda: wbfe.describe(STATE, min_eigs=5)) == described
    assert cli_line("describe", "not-there.safetensors", "--min-eigs", "5") == described
    for kept in (ScoreOptions(metrics="bfe", min_eigs=5, ww_compatible=True), ScoreOptions(metrics="htmp", min_eigs=5)):
        assert kept.min_eigs == 5 and ScoreOptions.from_dict(kept.to_dict()) == kept
    assert len(wbfe.describe(STATE, min_eigs=5, ww_compatible=True).matrices) >= 1


@pytest.mark.parametrize("given", [
    {"metrics": "htsr", "fit": "tpl"}, {"metrics": "fingers", "fix_fingers": "clip_xmax"},
    {"metrics": "vectors", "fit": "e_tpl"}, {"metrics": "vectors", "fix_fingers": "xmin_peak"},
    {"metrics": "detx", "fit": "tpl"}, {"metrics": "detx", "fix_fingers": "clip_xmax"},  # its ERG gap's tail fit
    {"metrics": "htmp", "lam": 3.0}, {"metrics": "bfe", "lam": 3.0}, {"metrics": "rand", "seed": 5},
    {"metrics": "bfe", "intra": True, "seed": 5}, {"metrics": "bfe", "ww_compatible": True},
    {"metrics": "htsr", "fit": "pl", "lam": "opt", "seed": 0},  # the defaults, given: nothing is dropped
])
def test_an_option_an_asked_metric_reads_is_kept(given: dict[str, Any]) -> None:
    options = ScoreOptions(**given)
    assert all(getattr(options, name) == value for name, value in given.items() if name != "metrics")
    assert ScoreOptions.from_dict(options.to_dict()) == options


@pytest.mark.parametrize(("given", "words"), [
    ({"spread": 0.3}, "--spread 0.3"), ({"mapping": "rank"}, "--mapping rank"), ({"reverse": True}, "--reverse"),
    ({"spread": 0.3, "reverse": True}, "--spread 0.3, --reverse"),
])
def test_an_allocation_setting_with_by_uniform_is_refused(given: dict[str, Any], words: str, tmp_path: Path) -> None:
    """--by uniform gives every matrix the target: spread, mapping and reverse were read by nothing."""
    from wbfe.options import PruneOptions
    from wbfe.pruning import prune, sparsity

    line = (f"{words}: --by uniform prunes every matrix to the target, mapping no metric: drop them or allocate by "
            "a metric (e.g. --by stable_rank)")
    assert refused(lambda: PruneOptions(by="uniform", **given)) == line
    assert refused(lambda: sparsity(STATE, 0.5, by="uniform", **given)) == line
    assert refused(lambda: prune(STATE, tmp_path / "out.safetensors", target=0.5, by="uniform", **given)) == line
    for command in (("sparsity", "X"), ("prune", "X", str(tmp_path / "out.safetensors"))):
        assert cli_line(*command, "--target", "0.5", "--by", "uniform", *_argv(given)) == line
    assert not (tmp_path / "out.safetensors").exists()


def test_uniform_keeps_its_defaults_and_a_metric_keeps_its_settings() -> None:
    from wbfe.options import PruneOptions

    assert PruneOptions(by="uniform", spread=0.2, mapping="value", reverse=False).by == "uniform"
    assert PruneOptions(by="alpha", spread=0.3, mapping="rank", reverse=True).spread == 0.3


SMOOTH_DETX = ("--percent 0.3 is read by --method svd only (detx keeps the det X = 1 tail, whatever its size): "
               "drop --percent or use --method svd")


def test_a_percent_with_detx_smoothing_is_refused(tmp_path: Path) -> None:
    """detx keeps as many components as its tail has: --percent was read by nothing."""
    from wbfe.editing import smooth_checkpoint
    from wbfe.options import EditOptions

    out = tmp_path / "out.safetensors"
    assert refused(lambda: EditOptions(method="detx", percent=0.3)) == SMOOTH_DETX
    assert refused(lambda: smooth_checkpoint(STATE, out, method="detx", percent=0.3)) == SMOOTH_DETX
    assert cli_line("smooth", "X", str(out), "--method", "detx", "--percent", "0.3") == SMOOTH_DETX
    assert not out.exists()
    assert EditOptions(method="detx", percent=0.8).method == "detx"  # the default percent, given: kept
    assert EditOptions(method="svd", percent=0.3).percent == 0.3


def _help(command: str) -> str:
    result = CliRunner().invoke(app, [command, "--help"], env={"COLUMNS": "200", "NO_COLOR": "1"})
    assert result.exit_code == 0, result.output
    return " ".join(result.output.replace("│", " ").split())


def test_the_conv_help_names_ww_compatible_only_where_the_command_takes_it() -> None:
    """esd's --conv help said "slices with --ww-compatible", an option esd does not have."""
    for command in ("esd", "score", "describe", "rank", "report"):
        text = _help(command)
        takes = "--ww-compatible " in text.replace("slices with --ww-compatible.", "")
        assert takes == (command != "esd"), command
        assert ("Default: flatten; slices with --ww-compatible." in text) == takes, command
        assert "Default: flatten" in text, command
