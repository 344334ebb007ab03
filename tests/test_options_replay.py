"""Options defined once, replayable, never rewritten (issue 43 §4).

- every default of ``wbfe.score``, ``wbfe.compare`` and the CLI's options is the options dataclass's own;
- ``from_dict(to_dict(o)) == o`` for every valid options object (hypothesis), and a score's recorded
  ``model["options"]`` replays the run;
- an option the caller gave is never rewritten by the WeightWatcher conventions, which fill only what
  was left unset and record it;
- every options class is checked by a constraints table whose keys are exactly its settable fields.
"""

from __future__ import annotations

import dataclasses
import enum
import inspect
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import typer
from hypothesis import HealthCheck, given, reject, settings
from hypothesis import strategies as st
from wbfe_cli.main import app

import wbfe
from wbfe.errors import InvalidOptionError
from wbfe.executors import ExecutorOptions
from wbfe.metrics import MetricOptions
from wbfe.options.conventions import WBFE, WEIGHTWATCHER, Conventions
from wbfe.options.constraints import Validated
from wbfe.theory.hierarchical import HierarchicalSettings
from wbfe.theory.settings import CurveSettings, HmcSettings, StudentSettings
from wbfe.options import (
    DEFAULT_GROUPS,
    MATRIX_GROUPS,
    METRIC_GROUPS,
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

# ----------------------------------------------------------------------------- defaults written once


def _field_defaults(cls: type) -> dict[str, Any]:
    return {f.name: f.default for f in dataclasses.fields(cls) if f.init}


def _editing(name: str) -> Any:
    import wbfe.editing

    return getattr(wbfe.editing, name)


@pytest.mark.parametrize("func,cls,names", [
    (wbfe.score, ScoreOptions, None), (wbfe.compare, CompareOptions, None),
    (wbfe.score, ExecutorOptions, {"executor": "executor", "address": "ray_address"}),
    (_editing("smooth_checkpoint"), EditOptions, {n: n for n in ("percent", "method", "layers", "ww_compatible")}),
    (_editing("sharpen_checkpoint"), EditOptions, {n: n for n in ("layers", "seed", "ww_compatible")}),
])
def test_keyword_defaults_are_the_dataclass_defaults(func: Any, cls: type, names: Any) -> None:
    """Every field (or the ones a function takes, field -> keyword) has the dataclass's default."""
    params = inspect.signature(func).parameters
    defaults = _field_defaults(cls)
    for name, keyword in (names or {n: n for n in defaults}).items():
        assert params[keyword].default == defaults[name], (func.__name__, name)


# The CLI's own options with no library counterpart, or a default the command line decides.
CLI_ONLY = {("run", "no_cache"), ("options", "layers"), ("prune", "target")}
GROUP_CLASSES = {"score": ScoreOptions, "compare": CompareOptions, "stats": StatsOptions, "run": RankOptions,
                 "options": WatchOptions, "page": ReportOptions, "where": ExecutorOptions, "prune": PruneOptions,
                 "edit": EditOptions}
FIELD_OF = {"stats_seed": "seed"}


def _as_cli(value: Any) -> Any:
    """A field's default as a command-line default: () is the option left out, names a comma list."""
    if value == ():
        return None
    return ",".join(value) if isinstance(value, tuple) else value


def _click_defaults() -> dict[tuple[str, str], Any]:
    """(command, parameter) -> the default typer gives the parameter."""
    group = typer.main.get_command(app)
    out = {}
    for name, command in group.commands.items():  # type: ignore[attr-defined]
        for param in command.params:
            default = param.default
            out[(name, param.name)] = default.value if isinstance(default, enum.Enum) else default
    return out


def test_cli_defaults_are_the_dataclass_defaults() -> None:
    click = _click_defaults()
    seen_groups, only = set(), set()
    for info in app.registered_commands:
        for group in getattr(info.callback, "option_groups", ()):
            cls = GROUP_CLASSES[group.name]
            defaults = _field_defaults(cls)
            seen_groups.add(group.name)
            for param in group.params:
                if (group.name, param) in CLI_ONLY:
                    only.add((group.name, param))
                    continue
                expected = _as_cli(defaults[FIELD_OF.get(param, param)])
                assert click[(info.name, param)] == expected, (info.name, param)
    assert only == CLI_ONLY and seen_groups == set(GROUP_CLASSES)


def test_cli_defaults_build_the_default_objects() -> None:
    """Built as the CLI builds it, an options object from every default is the dataclass's default one."""
    for info in app.registered_commands:
        for group in getattr(info.callback, "option_groups", ()):
            values = {n: d.value if isinstance(d, enum.Enum) else d for n, (_, d) in group.params.items()}
            if group.name in ("options", "prune"):
                continue  # watch's --layers auto and prune's required --target are the CLI's own
            built = group.build(**values)
            default = GROUP_CLASSES[group.name]()
            if info.name == "describe":
                default = ScoreOptions(metrics=("bfe",))
            assert built == default and built.to_dict() == default.to_dict(), (info.name, group.name)


# ----------------------------------------------------------------------------- replayable

LAMBDAS = st.one_of(st.just("opt"), st.floats(1e-3, 1e3))
LAYERS = st.sampled_from([None, "fc", r"\d+\.weight$", "conv|linear"])
HEADS = st.sampled_from([None, "fc.weight", "lm_head"])
DEVICES = st.sampled_from(["auto", "cpu"])
SEEDS = st.integers(0, 2**32)
METRICS = st.sampled_from([(), ("bfe",), ("bfe", "htsr"), ("htmp",), ("bfe", "htsr", "htmp", "rand"), ("vectors",),
                           ("detx", "fingers")])
UNIT_OPEN = st.floats(1e-6, 1 - 1e-6)
UNIT_CLOSED = st.floats(0.0, 1.0)

STRATEGIES: dict[type, Any] = {
    ScoreOptions: st.fixed_dictionaries({
        "metrics": METRICS, "lam": LAMBDAS, "conv": st.sampled_from([None, "flatten", "slices", "fft"]),
        "layers": LAYERS, "device": DEVICES, "head": HEADS, "min_eigs": st.integers(1, 200),
        "ww_compatible": st.booleans(), "seed": SEEDS, "fix_fingers": st.sampled_from([None, "xmin_peak", "clip_xmax"]),
        "fit": st.sampled_from(["pl", "tpl", "e_tpl"]), "intra": st.booleans(),
        "stream": st.sampled_from([None, True, False])}),
    StatsOptions: st.fixed_dictionaries({
        "n_boot": st.integers(1, 10**5), "level": UNIT_OPEN, "n_perm": st.integers(1, 10**6),
        "exact_max_n": st.integers(0, 10), "seed": SEEDS}),
    CompareOptions: st.fixed_dictionaries({
        "metrics": METRICS, "name_map": st.lists(st.tuples(st.sampled_from(["a", r"^x\.", "blocks"]),
                                                           st.sampled_from(["", "b", "layers"])), max_size=3),
        "top_k": st.integers(1, 100), "layers": LAYERS, "lam": LAMBDAS, "device": DEVICES,
        "min_eigs": st.integers(1, 200), "seed": SEEDS, "stream": st.sampled_from([None, True, False])}),
    RankOptions: st.fixed_dictionaries({
        "quality": st.sampled_from([None, "acc", "loss"]), "workers": st.integers(1, 64),
        "cache_dir": st.sampled_from([None, False, Path("/tmp/wbfe-cache"), "relative/cache"]),
        "lower_is_better": st.lists(st.sampled_from(["loss", "ppl", "err"]), max_size=3).map(tuple)}),
    ReportOptions: st.fixed_dictionaries({"fmt": st.sampled_from(["html", "md"]), "n_unusual": st.integers(0, 50)}),
    WatchOptions: st.fixed_dictionaries({
        "layers": st.sampled_from(["head", "all", "fittable", "fc|proj"]),
        "lam": st.one_of(st.none(), st.just("calibrated"), st.floats(1e-3, 1e3)), "head": HEADS, "device": DEVICES}),
    EditOptions: st.fixed_dictionaries({
        "percent": UNIT_CLOSED, "method": st.sampled_from(["svd", "detx"]), "layers": LAYERS, "seed": SEEDS,
        "ww_compatible": st.booleans()}),
    PruneOptions: st.fixed_dictionaries({
        "target": UNIT_OPEN, "by": st.sampled_from(["alpha", "bfe", "h", "stable_rank", "uniform"]),
        "spread": UNIT_CLOSED, "mapping": st.sampled_from(["value", "rank"]), "reverse": st.booleans(),
        "exclude": st.lists(st.sampled_from(["head", "embedding", "router", "conv"]), max_size=3, unique=True).map(tuple),
        "layers": LAYERS, "head": HEADS, "method": st.just("magnitude"), "device": DEVICES,
        "min_eigs": st.integers(1, 200)}),
    MetricOptions: st.fixed_dictionaries({
        "lam": LAMBDAS, "conventions": st.sampled_from([WBFE, WEIGHTWATCHER, "wbfe", "weightwatcher"]),
        "min_tail": st.integers(2, 200), "seed": SEEDS, "fix_fingers": st.sampled_from([None, "xmin_peak", "clip_xmax"]),
        "fit": st.sampled_from(["pl", "tpl", "e_tpl"])}),
    ExecutorOptions: st.fixed_dictionaries({"executor": st.just("local"), "max_retries": st.integers(0, 20),
                                            "workers": st.integers(1, 64)}),
    CurveSettings: st.fixed_dictionaries({
        "beta": st.floats(0.0, 3.0), "delta": st.floats(1e-3, 1.0), "d": st.integers(1, 500), "k": st.integers(3, 200),
        "r_min": st.floats(1e-3, 1.0), "r_max": st.floats(2.0, 1e3), "points": st.integers(2, 200),
        "activation": st.sampled_from(["tanh2", "tanh", "erf", "relu"]), "readout": st.sampled_from(["power", "dense", "exp", "sparse"]),
        "rate": st.floats(1e-3, 2.0), "nonzeros": st.integers(1, 3)}),
    HmcSettings: st.fixed_dictionaries({
        "r_values": st.lists(st.floats(0.1, 10.0), min_size=1, max_size=4).map(tuple), "d": st.integers(20, 60),
        "k": st.integers(1, 20), "delta": st.floats(1e-3, 1.0), "beta": st.floats(0.0, 2.0),
        "activation": st.sampled_from(["tanh2", "erf"]), "seeds": st.lists(st.integers(0, 99), min_size=1).map(tuple),
        "warmup": st.integers(0, 1000), "samples": st.integers(10, 1000), "device": st.sampled_from(["cpu", "cuda"])}),
    StudentSettings: st.fixed_dictionaries({
        "widths": st.lists(st.integers(1, 64), min_size=1).map(tuple), "n": st.integers(1, 10**4),
        "d": st.integers(1, 50), "k": st.integers(1, 50), "delta": st.floats(1e-3, 1.0), "beta": st.floats(0.0, 2.0),
        "activation": st.just("tanh2"), "seeds": st.lists(st.integers(0, 99), min_size=1).map(tuple),
        "epochs": st.integers(1, 10**4), "lr": st.floats(1e-5, 1.0), "device": st.just("cpu")}),
    HierarchicalSettings: st.fixed_dictionaries({
        "d": st.integers(2, 40), "p": st.one_of(st.none(), st.integers(1, 3)), "gamma": st.floats(0.51, 3.0),
        "alpha_min": st.floats(1.0, 1.9), "alpha_max": st.floats(2.0, 2.5), "points": st.integers(2, 12),
        "seeds": st.integers(1, 5), "eps": st.floats(0.1, 0.9), "activation": st.sampled_from(["identity", "tanh"]),
        "features": st.sampled_from(["hermite", "gaussian"]), "n_test": st.integers(10, 5000),
        "kernel_max_n": st.integers(0, 5000), "q_level": UNIT_OPEN, "solver": st.sampled_from(["auto", "eigsh", "dense"]),
        "seed": SEEDS}),
}
THEORY = (CurveSettings, HmcSettings, StudentSettings, HierarchicalSettings)


def test_every_options_class_has_a_strategy() -> None:
    assert set(STRATEGIES) == set(OPTIONS_CLASSES) | {MetricOptions, ExecutorOptions, *THEORY}
    assert all(issubclass(cls, Validated) for cls in STRATEGIES)  # one constraints machinery for all


@pytest.mark.parametrize("cls", list(STRATEGIES), ids=lambda c: c.__name__)
def test_from_dict_replays_to_dict(cls: type) -> None:
    @settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
    @given(STRATEGIES[cls])
    def check(kwargs: dict[str, Any]) -> None:
        try:
            options = cls(**kwargs)
        except InvalidOptionError:
            reject()  # a combination the cross-checks refuse (e.g. --intra with the rand group)
        recorded = options.to_dict()  # type: ignore[attr-defined]
        again = cls.from_dict(recorded)  # type: ignore[attr-defined]
        assert again == options
        assert again.to_dict() == recorded
        for f in dataclasses.fields(cls):  # every setting, also those == leaves out (stream: how bytes travel)
            if f.compare:
                assert getattr(again, f.name) == getattr(options, f.name), f.name

    check()


@pytest.mark.parametrize("cls,data,words", [
    (ScoreOptions, {"nope": 1}, "unknown ScoreOptions option 'nope'"),
    (ScoreOptions, {"lam": 0.5}, "unknown ScoreOptions option 'lam'"),  # recorded as "lambda"
    (ScoreOptions, {"min_eigs": 0}, "min_eigs must be a positive integer, not 0"),
    (ScoreOptions, {"conv": "rows"}, "conv convention must be"),
    (ScoreOptions, {"filled": ["head"]}, "options.filled must list"),
    (ScoreOptions, {"filled": [["conv"]]}, "options.filled must list"),  # was TypeError: unhashable type: 'list'
    (ScoreOptions, {"ww_compatible": True, "conv": "flatten", "filled": ["conv"]}, "options.filled says conv"),
    (ScoreOptions, ["conv"], "needs a dict"),
    (CompareOptions, {"conv": "slices"}, "CompareOptions option conv is always 'flatten'"),
    (StatsOptions, {"level": 1.5}, "level must be in (0, 1), not 1.5"),
    (RankOptions, {"workers": 0}, "workers must be at least 1"),
    (ExecutorOptions, {"executor": "dask"}, "executor must be 'local' or 'ray'"),
    (MetricOptions, {"conventions": "ww"}, "conventions must be 'wbfe' or 'weightwatcher', not 'ww'"),
    (MetricOptions, {"min_tail": 1}, "min_tail must be an integer of at least 2, not 1"),
    (PruneOptions, {"exclude": ["nope"]}, "nope"),
    (CurveSettings, {"delta": 0.0}, "delta must be positive and finite, got 0.0"),
    (HmcSettings, {"seeds": [0, -1]}, "seeds must be an integer in [0, 2**32) (the seeds every random "
                                     "generator in wbfe takes), not -1"),
    (HierarchicalSettings, {"d": 10, "D": 11}, "D = 11 is not the feature dimension of d = 10"),
    (HierarchicalSettings, {"d": 10, "q": 1}, "unknown HierarchicalSettings option 'q'"),
])
def test_from_dict_refuses_with_one_line(cls: type, data: Any, words: str) -> None:
    with pytest.raises(InvalidOptionError) as caught:
        cls.from_dict(data)  # type: ignore[attr-defined]
    assert words in str(caught.value) and "\n" not in str(caught.value)


def _checkpoint() -> dict[str, Any]:
    import torch

    g = torch.Generator().manual_seed(0)
    return {"conv.weight": torch.randn(16, 8, 3, 3, generator=g), "fc.weight": torch.randn(10, 40, generator=g)}


@pytest.mark.parametrize("kwargs", [{}, {"ww_compatible": True}, {"ww_compatible": True, "conv": "flatten"},
                                    {"fit": "tpl", "lam": 0.5, "min_eigs": 4}, {"conv": "fft"}])
def test_provenance_replays_the_run(kwargs: dict[str, Any]) -> None:
    state = _checkpoint()
    first = wbfe.score(state, metrics="bfe,htsr", **kwargs)
    options = ScoreOptions.from_dict(first.model["options"])
    assert options == ScoreOptions(metrics="bfe,htsr", **kwargs)
    again = wbfe.score(state, options=options)
    assert again.model["options"] == first.model["options"]
    assert [row["name"] for row in again.layers] == [row["name"] for row in first.layers]
    for a, b in zip(first.layers, again.layers):
        assert np.allclose([a.get("bfe", np.nan), a.get("alpha", np.nan)], [b.get("bfe", np.nan), b.get("alpha", np.nan)],
                           equal_nan=True, rtol=0, atol=0)


def test_a_comparisons_and_an_adapters_records_replay() -> None:
    state = _checkpoint()
    # (a comparison records the device it ran on: "cpu", not "auto")
    given = CompareOptions(metrics=("bfe", "htsr", "rand"), name_map=("fc=fc",), top_k=3, lam=0.5, device="cpu",
                           min_eigs=4, seed=7)
    result = wbfe.compare(state, state, **given.keywords())
    assert CompareOptions.from_dict(result.options) == given
    # an adapter's score records its base beside its options: not an option, left out
    assert ScoreOptions.from_dict({**ScoreOptions(fit="tpl").to_dict(), "base": "org/base"}) == ScoreOptions(fit="tpl")


# ----------------------------------------------------------------------------- never rewritten


def test_an_explicit_conv_is_never_rewritten() -> None:
    assert ScoreOptions(ww_compatible=True, conv="flatten").conv == "flatten"
    assert ScoreOptions(ww_compatible=True, conv="flatten").filled == ()
    assert ScoreOptions(ww_compatible=True, conv="fft").conv == "fft"
    # left unset: WeightWatcher's slices, and the record of what was filled
    ww = ScoreOptions(ww_compatible=True)
    assert (ww.conv, ww.filled, ww.to_dict()["filled"]) == ("slices", ("conv",), ["conv"])
    plain = ScoreOptions()
    assert plain.conv == "flatten" and "filled" not in plain.to_dict()  # plain runs' provenance unchanged


def _copy_routes() -> dict[str, Any]:
    import json
    import pickle

    return {
        "dataclasses.replace": dataclasses.replace,
        "options.replace": lambda o, **changes: o.replace(**changes),
        "from_dict(to_dict())": lambda o, **changes: ScoreOptions.from_dict(
            json.loads(json.dumps(o.to_dict()))).replace(**changes),
        "pickle": lambda o, **changes: dataclasses.replace(pickle.loads(pickle.dumps(o)), **changes),
    }


@pytest.mark.parametrize("route", list(_copy_routes()))
def test_every_copy_refills_a_filled_conv_and_keeps_a_given_one(route: str) -> None:
    """A filled conv is filled again under the copy's conventions; a conv the caller gave (to the original or
    to the copy) is kept. dataclasses.replace once passed the filled "slices" on as if the caller chose it."""
    copy = _copy_routes()[route]
    filled = copy(ScoreOptions(ww_compatible=True), ww_compatible=False)
    assert (filled.conv, filled.filled, "filled" in filled.to_dict()) == ("flatten", ("conv",), False)
    back = copy(filled, ww_compatible=True)
    if route == "from_dict(to_dict())":
        # wbfe's conventions record no "filled" (plain runs' provenance unchanged): their recorded conv replays
        # as given, and is kept, never rewritten
        assert (back.conv, back.filled, "filled" in back.to_dict()) == ("flatten", (), False)
    else:
        assert (back.conv, back.filled, back.to_dict().get("filled")) == ("slices", ("conv",), ["conv"])
    given = copy(ScoreOptions(ww_compatible=True, conv="slices"), ww_compatible=False)
    assert (given.conv, given.filled) == ("slices", ())
    chosen = copy(ScoreOptions(ww_compatible=True), ww_compatible=False, conv="fft")
    assert (chosen.conv, chosen.filled) == ("fft", ())
    unchanged = copy(ScoreOptions(ww_compatible=True), min_eigs=3)
    assert (unchanged.conv, unchanged.filled, unchanged.to_dict()["filled"]) == ("slices", ("conv",), ["conv"])
    assert type(filled.to_dict()["conv"]) is str  # the provenance records a plain string


def test_ww_compatible_flatten_scores_flattened() -> None:
    """--ww-compatible --conv flatten analyses each conv kernel as one out x in*k*k matrix, as asked."""
    state = _checkpoint()
    flat = wbfe.score(state, metrics="bfe", ww_compatible=True, conv="flatten")
    sliced = wbfe.score(state, metrics="bfe", ww_compatible=True)
    conv = {s.model["options"]["conv"]: next(r for r in s.layers if r["name"] == "conv.weight") for s in (flat, sliced)}
    assert conv["flatten"]["n_slices"] == 1 and conv["slices"]["n_slices"] == 9
    assert "filled" not in flat.model["options"] and sliced.model["options"]["filled"] == ["conv"]


def test_cli_ww_compatible_alone_slices_and_with_conv_flattens(tmp_path: Path) -> None:
    import json

    from safetensors.torch import save_file
    from typer.testing import CliRunner

    ref = tmp_path / "m.safetensors"
    save_file(_checkpoint(), str(ref))
    runner = CliRunner()
    out = {}
    for extra in ([], ["--conv", "flatten"]):
        result = runner.invoke(app, ["score", str(ref), "-f", "json", "-q", "--metrics", "bfe", "--ww-compatible", *extra])
        assert result.exit_code == 0, result.output
        out[tuple(extra)] = json.loads(result.stdout)["model"]["options"]
    assert out[()]["conv"] == "slices" and out[()]["filled"] == ["conv"]
    assert out[("--conv", "flatten")]["conv"] == "flatten" and "filled" not in out[("--conv", "flatten")]


# ----------------------------------------------------------------------------- one conventions object


def test_conventions_name_every_difference() -> None:
    assert ScoreOptions().conventions is WBFE and ScoreOptions(ww_compatible=True).conventions is WEIGHTWATCHER
    assert EditOptions(ww_compatible=True).conventions is WEIGHTWATCHER
    differ = [f.name for f in dataclasses.fields(Conventions) if getattr(WBFE, f.name) != getattr(WEIGHTWATCHER, f.name)]
    assert differ == [f.name for f in dataclasses.fields(Conventions)]  # a field on which both agree names nothing
    assert MetricOptions(conventions="weightwatcher").conventions is WEIGHTWATCHER
    assert MetricOptions(conventions=dataclasses.replace(WEIGHTWATCHER)).conventions is WEIGHTWATCHER


def test_the_options_group_names_are_the_metrics_registry() -> None:
    """wbfe.options checks metric group names without importing the groups: its names are the registry's."""
    import wbfe.metrics

    assert METRIC_GROUPS == tuple(wbfe.metrics._REGISTRY) and set(DEFAULT_GROUPS) <= set(METRIC_GROUPS)
    # htsr reads the matrices only for WeightWatcher's per-slice SVDs, and does without them
    assert MATRIX_GROUPS == tuple(name for name in METRIC_GROUPS
                                  if wbfe.metrics.get_group(name).from_matrices is not None and name != "htsr")


# ----------------------------------------------------------------------------- one constraints table


@pytest.mark.parametrize("cls", [*OPTIONS_CLASSES, MetricOptions, ExecutorOptions, *THEORY], ids=lambda c: c.__name__)
def test_constraints_cover_exactly_the_settable_fields(cls: type) -> None:
    assert set(cls.CONSTRAINTS) == set(_field_defaults(cls))  # type: ignore[attr-defined]


@pytest.mark.parametrize("cls,name,bad", [
    pytest.param(cls, name, bad, id=f"{cls.__name__}.{name}={bad!r}")
    for cls in (MetricOptions, ExecutorOptions, *THEORY) for name, c in cls.CONSTRAINTS.items() for bad in c.invalid
])
def test_the_newly_tabled_classes_refuse_each_bad_value(cls: type, name: str, bad: Any) -> None:
    base = {"d": 10} if cls is HierarchicalSettings else {}
    with pytest.raises(InvalidOptionError) as caught:
        cls(**{**base, name: bad})
    assert "\n" not in str(caught.value)


# ----------------------------------------------------------------------------- common CLI options


def test_compare_and_report_take_quiet(tmp_path: Path) -> None:
    """--quiet leaves stderr empty (no progress bar, no 'wrote') and changes nothing else."""
    from safetensors.torch import save_file
    from typer.testing import CliRunner

    a, b = tmp_path / "a.safetensors", tmp_path / "b.safetensors"
    state = _checkpoint()
    save_file(state, str(a))
    save_file({k: 2 * v for k, v in state.items()}, str(b))
    runner = CliRunner()
    loud = runner.invoke(app, ["compare", str(a), str(b), "-f", "json", "--metrics", "bfe", "-o", str(tmp_path / "c1")])
    quiet = runner.invoke(app, ["compare", str(a), str(b), "-f", "json", "--metrics", "bfe", "-q",
                                "-o", str(tmp_path / "c2")])
    assert loud.exit_code == quiet.exit_code == 0, (loud.output, quiet.output)
    assert "wrote" in loud.stderr and quiet.stderr == ""
    assert quiet.stdout == loud.stdout
    page = runner.invoke(app, ["report", str(a), "--metrics", "bfe", "--quiet", "-o", str(tmp_path / "p.html")])
    assert page.exit_code == 0 and page.stderr == "" and (tmp_path / "p.html").exists(), page.output


def _parsed(value: Any) -> Any:
    """A theory option's default as its setting: a comma list as a tuple of numbers, an enum as its value."""
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, str) and "," in value or isinstance(value, str) and value.replace(".", "").isdigit():
        return tuple(float(x) for x in value.split(","))
    return value


@pytest.mark.parametrize("command,cls,least", [("solve", CurveSettings, 8), ("curve", CurveSettings, 9),
                                               ("hmc", HmcSettings, 9), ("student", StudentSettings, 10),
                                               ("hierarchical", HierarchicalSettings, 13)])
def test_theory_cli_defaults_are_the_settings_defaults(command: str, cls: type, least: int) -> None:
    theory = typer.main.get_command(app).commands["theory"]  # type: ignore[attr-defined]
    params = {p.name: p.default for p in theory.commands[command].params}
    compared = 0
    for name, default in _field_defaults(cls).items():
        if name in params and default is not dataclasses.MISSING:
            expected = tuple(float(v) for v in default) if isinstance(default, tuple) else default
            assert _parsed(params[name]) == expected, (command, name)
            compared += 1
    assert compared == least


def test_numpy_numbers_are_numbers() -> None:
    """np.int64(5) was refused as "not a positive integer" and np.float32(0.5) as "not in (0, 1)"; each is kept as
    the plain Python number, so the options replay and compare equal."""
    stats = StatsOptions(n_boot=np.int64(500), level=np.float32(0.5), seed=np.uint8(3))
    assert stats == StatsOptions(n_boot=500, level=0.5, seed=3)
    assert [type(v) for v in (stats.n_boot, stats.level, stats.seed)] == [int, float, int]
    assert PruneOptions(target=np.float64(0.25), min_eigs=np.int32(4)) == PruneOptions(target=0.25, min_eigs=4)
    for bad in (np.True_, np.float64("nan"), np.int64(0)):
        with pytest.raises(InvalidOptionError, match="n_boot must be a positive integer"):
            StatsOptions(n_boot=bad)
