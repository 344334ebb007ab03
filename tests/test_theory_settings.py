"""The theory sweeps' settings: validated once, before any work; shared by the CLI, the run and its JSON."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from wbfe.errors import InvalidOptionError, UnknownNameError
from wbfe.render.text import json_ready
from wbfe.theory.json_io import dumps
from wbfe.theory.hierarchical import HierarchicalSettings, simulate_hierarchical
from wbfe.theory.settings import CurveSettings, HmcSettings, StudentSettings
from wbfe_cli.main import app

SEEDS = "seeds must be an integer in [0, 2**32) (the seeds every random generator in wbfe takes), not "


def _strict(text: str) -> object:
    """Parse JSON as a standard parser does: a bare NaN or Infinity token is an error."""

    def refuse(token: str) -> None:
        raise ValueError(f"non-standard JSON token {token}")

    return json.loads(text, parse_constant=refuse)


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: CurveSettings(r_min=5.0, r_max=1.0), "need 0 < r_min < r_max and points >= 2"),
        (lambda: CurveSettings(points=1), "need 0 < r_min < r_max and points >= 2"),
        (lambda: CurveSettings(delta=0.0), "delta must be positive and finite, got 0.0"),
        (lambda: CurveSettings(readout="sparse", k=2, nonzeros=3), "nonzeros must be in [1, k=2], got 3"),
        (lambda: HmcSettings(k=50, d=40), "need k <= d for HMC, got k=50, d=40"),
        (lambda: HmcSettings(r_values=()), "r_values must not be empty"),
        (lambda: HmcSettings(seeds=(0, -1)), SEEDS + "-1"),
        (lambda: StudentSettings(widths=(2, 0)), "widths must be a positive integer, not 0"),
        (lambda: StudentSettings(lr=math.nan), "lr must be positive and finite, got nan"),
        (lambda: HierarchicalSettings(d=10, points=1), "points must be an integer >= 2, not 1"),
        (lambda: HierarchicalSettings(d=1), "d must be an integer >= 2, not 1"),
        (lambda: HierarchicalSettings(d=10, gamma=0.5), "the sequential-recovery predictions need gamma > 1/2"),
    ],
)
def test_settings_refuse_bad_values(build, message) -> None:
    with pytest.raises(InvalidOptionError) as info:
        build()
    assert str(info.value).startswith(message)


@pytest.mark.parametrize(
    ("build", "message"),
    [
        pytest.param(lambda: CurveSettings(delta=True), "delta must be positive and finite, got True", id="Curve"),
        pytest.param(lambda: CurveSettings(k=10**19), "k must be at most 100,000,000 (the readout is held in memory)",
                     id="Curve-huge-k"),
        pytest.param(lambda: HmcSettings(k=10**9, d=10**9), "k must be at most 100,000,000", id="Hmc-huge-k"),
        pytest.param(lambda: StudentSettings(k=10**9), "k must be at most 100,000,000", id="Student-huge-k"),
        pytest.param(lambda: HmcSettings(r_values=(2**1024,)), "r_values must be positive and finite, got 1797",
                     id="Hmc"),
        pytest.param(lambda: StudentSettings(lr=True), "lr must be positive and finite, got True", id="Student"),
        pytest.param(lambda: HierarchicalSettings(d=math.inf), "d must be an integer >= 2, not inf", id="Hierarchical"),
        pytest.param(lambda: HierarchicalSettings(d=10, p=math.nan), "p must be a positive integer, not nan",
                     id="Hierarchical-nan"),
        pytest.param(lambda: HierarchicalSettings(d=1e200), "d must be an integer >= 2, not 1e+200",
                     id="Hierarchical-float-d"),
        pytest.param(lambda: HierarchicalSettings(d=10**200), "n = d^alpha_max = 1000", id="Hierarchical-huge-d"),
        pytest.param(lambda: HierarchicalSettings(d=10, gamma=2**1024), "the sequential-recovery predictions need",
                     id="Hierarchical-huge-int"),
        pytest.param(lambda: HierarchicalSettings(d=10, activation=1.5), "unknown activation '1.5'",
                     id="Hierarchical-not-a-name"),
    ],
)
def test_settings_refuse_inf_nan_bool_and_huge_numbers(build, message) -> None:
    # inf, nan, a bool for a number or a number past a float: one typed line, never OverflowError or TypeError.
    # A k past the readout's memory limit was taken by the settings and refused by the run.
    with pytest.raises(InvalidOptionError) as info:
        build()
    assert str(info.value).startswith(message) and "\n" not in str(info.value)


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: HmcSettings(seeds=(1, 1)), "seeds must not repeat a value, got (1, 1)"),  # sem 0 over one chain
        (lambda: StudentSettings(widths=(2, 2)), "widths must not repeat a value, got (2, 2)"),  # one width twice
        (lambda: HmcSettings(r_values=(2.0, 2.0)), "r_values must not repeat a value"),
        (lambda: HmcSettings(seeds=(10**300,)), SEEDS + "1000"),  # torch ValueError before
        (lambda: StudentSettings(seeds=(2**63,)), SEEDS + "9223372036854775808"),
    ],
)
def test_settings_refuse_repeated_values_and_seeds_past_64_bits(build, message) -> None:
    with pytest.raises(InvalidOptionError) as info:
        build()
    assert str(info.value).startswith(message)


def test_settings_take_numpy_numbers_and_arrays_and_record_python_ones() -> None:
    # "d must be an integer >= 1, got np.int64(50)", "beta must be a finite number, got np.float32(0.5)" and
    # "widths must not be empty" for np.array([1, 2]) before
    import numpy as np

    curve = CurveSettings(d=np.int64(50), beta=np.float32(0.5))
    assert (curve.d, curve.beta) == (50, 0.5) and type(curve.d) is int and type(curve.beta) is float
    assert StudentSettings(widths=np.array([1, 2]), seeds=range(2)).to_dict()["widths"] == [1, 2]
    hier = HierarchicalSettings(d=np.int64(10), gamma=np.float64(1.0))
    assert hier == HierarchicalSettings(d=10, gamma=1.0) and dumps(hier.to_dict()) == dumps(
        HierarchicalSettings(d=10).to_dict())
    with pytest.raises(InvalidOptionError, match="d must be a positive integer, not "):
        CurveSettings(d=np.int64(0))


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: CurveSettings(d=0), "d must be a positive integer, not 0"),
        (lambda: CurveSettings(d=50.0), "d must be a positive integer, not 50.0"),
        (lambda: HmcSettings(warmup=-1), "warmup must be a non-negative integer, not -1"),
        (lambda: HierarchicalSettings(d=30.0), "d must be an integer >= 2, not 30.0"),
        (lambda: HierarchicalSettings(d=10, seeds=2.0), "seeds must be a positive integer, not 2.0"),
        (lambda: HierarchicalSettings(d=10, n_test=9), "n_test must be an integer >= 10, not 9"),
        # the seeds too, as `wbfe score --seed` refuses 3.0 (they took whole floats, where 30.0 for d was refused)
        (lambda: HmcSettings(seeds=(0, 3.0)), SEEDS + "3.0"),
        (lambda: StudentSettings(seeds=(3.0,)), SEEDS + "3.0"),
        (lambda: HierarchicalSettings(d=10, seed=3.0), SEEDS.replace("seeds", "seed", 1) + "3.0"),
    ],
)
def test_integer_settings_take_integers_only_with_one_wording(build, message) -> None:
    # The sweeps' integer fields follow wbfe.options' Integer rule: a float, even a whole one (d=30.0, or 1e200 that
    # the sweep would have turned into an int), is refused, as min_eigs=10.0 is. The teacher-student settings said
    # "got" where every other refusal says "not"; the hierarchical ones took whole floats.
    with pytest.raises(InvalidOptionError, match=f"^{re.escape(message)}$"):
        build()


def test_settings_refuse_unknown_names() -> None:
    with pytest.raises(UnknownNameError, match="unknown activation 'tnh2'; did you mean 'tanh2'"):
        CurveSettings(activation="tnh2")
    with pytest.raises(UnknownNameError, match="unknown readout 'powr'"):
        CurveSettings(readout="powr")
    with pytest.raises(UnknownNameError, match="unknown feature kind 'gauss'"):
        HierarchicalSettings(d=10, features="gauss")


def test_cli_refuses_before_any_work(tmp_path: Path) -> None:
    # HMC would need minutes; the settings refuse in the parse step, and nothing is written.
    out = tmp_path / "hmc"
    res = CliRunner().invoke(app, ["theory", "hmc", "--d", "10", "--k", "20", "--output", str(out)])
    assert res.exit_code == 2
    assert res.stderr.strip().splitlines() == ["wbfe: error: need k <= d for HMC, got k=20, d=10"]
    assert not out.exists()
    # one sample in 10 is kept (the CLI has no --every): fewer than 10 would keep none, found only after warm-up
    res = CliRunner().invoke(app, ["theory", "hmc", "--samples", "5", "--output", str(out)])
    assert res.exit_code == 2 and not out.exists()
    assert res.stderr.strip() == ("wbfe: error: samples must be an integer of at least 10 (one sample in 10 is "
                                  "kept), not 5")


def test_hierarchical_settings_or_keywords_give_one_result() -> None:
    kw = dict(d=6, p=2, alpha_min=1.5, alpha_max=2.0, points=2, seeds=1, features="gaussian", kernel_max_n=0, n_test=50)
    settings = HierarchicalSettings(**kw)
    a, b = simulate_hierarchical(settings), simulate_hierarchical(**kw)
    assert a.to_dict() == b.to_dict()
    assert a.settings == {**settings.to_dict(p=2)} and a.settings["D"] == 21 and a.settings["p"] == 2
    both = "pass the settings either as HierarchicalSettings(...) or as keywords, not both"
    with pytest.raises(InvalidOptionError, match=re.escape(f"d: {both}")):
        simulate_hierarchical(settings, d=7)
    # a keyword equal to its default is still given beside the settings (and would be ignored): refused too
    with pytest.raises(InvalidOptionError, match=re.escape(f"p, seeds: {both}")):
        simulate_hierarchical(settings, p=None, seeds=3)


def test_json_writes_null_for_non_finite_values() -> None:
    assert json_ready({"x": [1.0, math.nan, -math.inf]}) == {"x": [1.0, None, None]}
    assert _strict(dumps({"a": float("nan")})) == {"a": None}


def test_student_json_is_standard_and_records_its_settings(tmp_path: Path) -> None:
    # One seed: the standard errors are NaN, which the file must hold as null.
    res = CliRunner().invoke(app, ["theory", "student", "--widths", "1,2", "--n", "100", "--d", "6", "--k", "6",
                                   "--epochs", "5", "--output", str(tmp_path), "--format", "json"])
    assert res.exit_code == 0, res.output
    saved = _strict((tmp_path / "student.json").read_text())
    assert saved == _strict(res.stdout)
    assert saved["sem"] == [None, None]
    assert saved["settings"] == StudentSettings(widths=(1, 2), n=100, d=6, k=6, epochs=5).to_dict()
    table = CliRunner().invoke(app, ["theory", "student", "--widths", "1", "--n", "100", "--d", "6", "--k", "6",
                                     "--epochs", "5", "--output", str(tmp_path)])
    assert table.exit_code == 0, table.output
    assert f"wrote {tmp_path / 'student.json'}" in table.stderr and "wrote" not in table.stdout


def test_hierarchical_settings_replay_their_record_and_refuse_a_wrong_D() -> None:
    settings = HierarchicalSettings(d=6, p=2, points=3, seeds=1)
    recorded = json.loads(dumps(settings.to_dict()))
    assert recorded["D"] == 21 and HierarchicalSettings.from_dict(recorded) == settings  # D = d(d+1)/2
    with pytest.raises(InvalidOptionError, match=r"^D = 20 is not the feature dimension of d = 6 \(21\)$"):
        HierarchicalSettings.from_dict({**recorded, "D": 20})
    with pytest.raises(InvalidOptionError, match="^HierarchicalSettings.from_dict needs a dict of options, not list$"):
        HierarchicalSettings.from_dict([("d", 6)])  # type: ignore[arg-type]
