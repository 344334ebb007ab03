"""Every declared option constraint, fed a bad value through every entry point that takes it.

In the manner of scikit-learn's ``test_public_functions``: the cases are generated from the
options classes' ``CONSTRAINTS`` tables (:data:`wbfe.options.OPTIONS_CLASSES`) and from the CLI's
option groups, so a new option is tested here without a line added. Each bad value must be refused
with a one-line :class:`~wbfe.errors.InvalidOptionError` by the library, before anything is read
(the checkpoint named does not exist, so reading it first would raise SourceNotFoundError), and
by the CLI with exit code 2 and one ``wbfe: error:`` line on stderr.
"""

from __future__ import annotations

import enum
import typing
from pathlib import Path
from typing import Any, Callable, Optional

import pytest
from typer.testing import CliRunner
from wbfe_cli.main import app

import wbfe
from wbfe.errors import InvalidOptionError, SourceNotFoundError
from wbfe.options import (
    OPTIONS_CLASSES,
    CompareOptions,
    EditOptions,
    PruneOptions,
    RankOptions,
    ReportOptions,
    ScoreOptions,
    StatsOptions,
    WatchOptions,
)
from wbfe.options.constraints import Constraint, Flag

Call = Callable[[Path, dict[str, Any]], Any]


def _rank(tmp: Path, kw: dict[str, Any]) -> Any:
    return wbfe.rank(tmp / "zoo.csv", **kw)


def _watch(name: str) -> Call:
    def call(tmp: Path, kw: dict[str, Any]) -> Any:
        import wbfe.watch as watch

        return getattr(watch, name)(tmp / "run", **kw)

    return call


def _score_report(tmp: Path, kw: dict[str, Any]) -> Any:
    from wbfe.reporting import score_report

    return score_report({}, **kw)


def _write_report(tmp: Path, kw: dict[str, Any]) -> Any:
    from wbfe.reporting import write_report

    return write_report(None, tmp / "page.html", **kw)


# (entry point, options class, fields it takes (None: all), keyword renames, call)
ENTRY_POINTS: list[tuple[str, type, Optional[tuple[str, ...]], dict[str, str], Call]] = [
    ("wbfe.score", ScoreOptions, None, {}, lambda tmp, kw: wbfe.score(tmp / "missing.safetensors", **kw)),
    ("wbfe.compare", CompareOptions, None, {},
     lambda tmp, kw: wbfe.compare(tmp / "a.safetensors", tmp / "b.safetensors", **kw)),
    ("wbfe.rank", ScoreOptions, None, {"seed": "score_seed"}, _rank),
    ("wbfe.rank", StatsOptions, None, {"seed": "stats_seed"}, _rank),
    ("wbfe.rank", RankOptions, None, {}, _rank),
    ("wbfe.watch.watch", WatchOptions, None, {}, _watch("watch")),
    ("wbfe.watch.trajectory", WatchOptions, ("layers", "head", "device"), {}, _watch("trajectory")),
    ("wbfe.watch.calibrate", WatchOptions, ("layers", "head", "device"), {}, _watch("calibrate")),
    ("wbfe.reporting.score_report", ReportOptions, ("n_unusual",), {}, _score_report),
    ("wbfe.reporting.write_report", ReportOptions, ("fmt",), {}, _write_report),
    ("wbfe.sparsity", PruneOptions, tuple(f for f in PruneOptions.CONSTRAINTS if f != "method"), {},
     lambda tmp, kw: wbfe.sparsity(tmp / "missing.safetensors", **{"target": 0.5, **kw})),
    ("wbfe.prune", PruneOptions, None, {},
     lambda tmp, kw: wbfe.prune(tmp / "missing.safetensors", tmp / "out.safetensors", **{"target": 0.5, **kw})),
]

# wbfe.compare() still checks its keywords by hand (wbfe/comparison.py is being rewritten by the
# lead, who routes it through CompareOptions); these are the values it lets through today.
def _library_cases() -> list[Any]:
    cases = []
    for entry, cls, only, renames, call in ENTRY_POINTS:
        for name, constraint in cls.CONSTRAINTS.items():  # type: ignore[attr-defined]
            if only is not None and name not in only:
                continue
            for bad in constraint.invalid:
                marks = []
                cases.append(pytest.param(call, renames.get(name, name), bad, marks=marks,
                                          id=f"{entry}-{cls.__name__}.{name}={bad!r}"))
    return cases


def test_every_options_class_declares_a_table() -> None:
    from dataclasses import fields

    from wbfe.executors import ExecutorOptions
    from wbfe.metrics import MetricOptions
    from wbfe.theory.hierarchical import HierarchicalSettings
    from wbfe.theory.settings import CurveSettings, HmcSettings, StudentSettings

    for cls in (*OPTIONS_CLASSES, MetricOptions, ExecutorOptions, CurveSettings, HmcSettings, StudentSettings, HierarchicalSettings):
        table = cls.CONSTRAINTS  # type: ignore[attr-defined]
        assert set(table) == {f.name for f in fields(cls) if f.init}, cls  # every setting, nothing else
        assert all(isinstance(c, Constraint) for c in table.values())
        # every constraint but a flag's lists values it refuses, so the cases below cover it
        assert all(c.invalid for c in table.values()), cls


@pytest.mark.parametrize("cls,name,bad", [
    pytest.param(cls, name, bad, id=f"{cls.__name__}.{name}={bad!r}")
    for cls in OPTIONS_CLASSES for name, c in cls.CONSTRAINTS.items() for bad in c.invalid  # type: ignore[attr-defined]
])
def test_options_object_refuses(cls: type, name: str, bad: Any) -> None:
    with pytest.raises(InvalidOptionError) as caught:
        cls(**{name: bad})
    assert "\n" not in str(caught.value)


def test_defaults_pass_their_own_table() -> None:
    for cls in OPTIONS_CLASSES:
        obj = cls()
        assert cls(**{f: getattr(obj, f) for f in cls.CONSTRAINTS}) == obj  # type: ignore[attr-defined]


MIXED: list[tuple[str, Call, type]] = [
    ("score", lambda tmp, kw: wbfe.score(tmp / "no.safetensors", options=ScoreOptions(), **kw), ScoreOptions),
    ("describe", lambda tmp, kw: wbfe.describe(tmp / "no.safetensors", options=ScoreOptions(), **kw), ScoreOptions),
    ("sparsity", lambda tmp, kw: wbfe.sparsity(tmp / "no.safetensors", options=PruneOptions(), **kw), PruneOptions),
    ("prune", lambda tmp, kw: wbfe.prune(tmp / "no.safetensors", tmp / "out.safetensors", options=PruneOptions(), **kw),
     PruneOptions),
]


@pytest.mark.parametrize("name,call,cls", MIXED, ids=[m[0] for m in MIXED])
def test_keywords_beside_an_options_object_are_refused_alike(name: str, call: Call, cls: type, tmp_path: Path) -> None:
    """score and describe said "not both" without naming a keyword, sparsity and prune named only those unequal to
    their defaults: min_eigs=10.0 (the default's value, not its type) was dropped silently."""
    with pytest.raises(InvalidOptionError, match=rf"^head, min_eigs: pass the settings either as options="
                                                 rf"{cls.__name__}\(\.\.\.\) or as keywords, not both$"):
        call(tmp_path, {"head": "fc", "min_eigs": 10.0})
    with pytest.raises(SourceNotFoundError):  # keywords at their defaults are no second setting
        call(tmp_path, {"head": None, "min_eigs": 10})


@pytest.mark.parametrize("name,call,cls", MIXED[2:], ids=[m[0] for m in MIXED[2:]])
def test_a_target_beside_prune_options_is_refused(name: str, call: Call, cls: type, tmp_path: Path) -> None:
    """target=0.5 beside options=PruneOptions(target=0.3) allocated 0.3 silently: 0.5 is PruneOptions' default, but
    the keyword's default is None (a target is given or in the options)."""
    with pytest.raises(InvalidOptionError, match=r"^target: pass the settings either as options=PruneOptions"):
        call(tmp_path, {"target": 0.5})


@pytest.mark.parametrize("call,keyword,bad", _library_cases())
def test_public_function_refuses_before_reading(call: Call, keyword: str, bad: Any, tmp_path: Path) -> None:
    try:
        call(tmp_path, {keyword: bad})
    except InvalidOptionError as exc:
        assert "\n" not in str(exc)
    except SourceNotFoundError as exc:  # read before the option was checked
        pytest.fail(f"{keyword}={bad!r} was not checked before reading: {exc}")
    else:
        pytest.fail(f"{keyword}={bad!r} was accepted")


# ----------------------------------------------------------------------------- the CLI

GROUP_CLASSES: dict[str, Optional[type]] = {"score": ScoreOptions, "compare": CompareOptions,
                                            "stats": StatsOptions, "run": RankOptions, "options": WatchOptions,
                                            "page": ReportOptions, "where": None, "prune": PruneOptions,
                                            "edit": EditOptions}
PARAM_FIELDS = {"stats_seed": "seed"}


def _positional(command: str, tmp: Path) -> list[str]:
    missing = str(tmp / "missing.safetensors")
    return {"score": [missing], "compare": [missing, missing], "rank": [str(tmp / "zoo.csv")],
            "report": [missing, "--output", str(tmp / "page.html")], "watch": [str(tmp / "run")],
            "describe": [missing], "sparsity": [missing, "--target", "0.5"],
            "prune": [missing, str(tmp / "out.safetensors"), "--target", "0.5"],
            "smooth": [missing, str(tmp / "out.safetensors")], "sharpen": [missing, str(tmp / "out.safetensors")]}[command]


def _coerce(alias: Any, text: str) -> Any:
    """The value typer hands the command for ``text``; raises ValueError where typer would refuse it."""
    base = typing.get_args(alias)[0]
    args = [a for a in typing.get_args(base) if a is not type(None)] or [base]
    kind = args[0]
    if typing.get_origin(kind) in (list, typing.List):
        return (text,)
    if isinstance(kind, type) and issubclass(kind, enum.Enum):
        return kind(text).value
    if kind is int:
        return int(text)
    if kind is float:
        return float(text)
    if kind is Path:
        return Path(text)
    return text


def _flag(alias: Any) -> str:
    info = typing.get_args(alias)[1]
    decls = [info.default, *(info.param_decls or ())]
    return next(d for d in decls if isinstance(d, str) and d.startswith("--"))


def _cli_cases() -> list[Any]:
    cases = []
    for info in app.registered_commands:
        for group in getattr(info.callback, "option_groups", ()):
            cls = GROUP_CLASSES[group.name]
            if cls is None:
                continue
            for param, (alias, _default) in group.params.items():
                name = PARAM_FIELDS.get(param, param)
                constraint = cls.CONSTRAINTS.get(name)  # type: ignore[attr-defined]
                if constraint is None or isinstance(constraint, Flag):
                    continue  # a switch takes no value
                for bad in constraint.invalid:
                    if isinstance(bad, (list, tuple, bool)):
                        continue
                    text = str(bad)
                    try:
                        value = _coerce(alias, text)
                    except ValueError:
                        pass  # typer refuses it: a usage error, also exit 2 with one line
                    else:
                        try:
                            constraint(name, value)
                            continue  # valid once it arrives as text (e.g. "3" for an integer)
                        except InvalidOptionError:
                            pass
                    cases.append(pytest.param(info.name, _flag(alias), text, id=f"{info.name} {_flag(alias)}={text}"))
    return cases


CLI_CASES = _cli_cases()


def test_every_command_with_options_is_covered() -> None:
    covered = {case.values[0] for case in CLI_CASES}
    assert covered == {"score", "compare", "rank", "report", "watch", "describe", "sparsity", "prune", "smooth", "sharpen"}


@pytest.mark.parametrize("command,flag,text", CLI_CASES)
def test_cli_refuses_with_one_line(command: str, flag: str, text: str, tmp_path: Path) -> None:
    result = CliRunner().invoke(app, [command, *_positional(command, tmp_path), f"{flag}={text}"])
    assert result.exit_code == 2, (result.exit_code, result.output, result.stderr)
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("wbfe: error: "), result.stderr
    assert "no such file" not in result.stderr  # refused before the checkpoint was looked for
    assert not (tmp_path / "page.html").exists()
