"""wbfe.ranking (zoo, stats, ranker) refusals and edge cases reachable from public input that no other test reached
(found by coverage): each asserts its one-line message or its value."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

from wbfe.errors import InvalidOptionError, MissingDependencyError, SourceNotFoundError, UnknownNameError
from wbfe.ranking import stats
from wbfe.ranking import zoo as zoo_mod
from wbfe.ranking.zoo import load_zoo, read_zoo_file

from tests.bad_inputs.test_options import Counting, fake_hash, fake_scorer, make_zoo


def _refused(call, message: str, error: type = InvalidOptionError) -> None:  # noqa: ANN001
    with pytest.raises(error) as info:
        call()
    assert str(info.value) == message


# --- zoo specs --------------------------------------------------------------------------------------------------

def test_absolute_and_unresolvable_references(tmp_path: Path) -> None:
    """An absolute path is kept as written; a symbolic-link loop, which cannot be resolved, stays joined."""
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    absolute = tmp_path / "elsewhere" / "m.safetensors"
    spec = tmp_path / "zoo.csv"
    spec.write_text(f"model,acc\n{absolute},1\nloop/m.pt,2\n")
    assert [e.ref for e in read_zoo_file(spec).entries] == [str(absolute), str(tmp_path / "loop" / "m.pt")]


def test_yaml_zoo_refusals(tmp_path: Path) -> None:
    spec = tmp_path / "zoo.yaml"
    models = "models: [{model: org/a, acc: 1}]\n"
    spec.write_text("name: 3\n" + models)
    _refused(lambda: read_zoo_file(spec), f"{spec}: 'name' must be text, not int")
    spec.write_text("lower_is_better: 3\n" + models)
    _refused(lambda: read_zoo_file(spec), f"{spec}: 'lower_is_better' must be a column name or a list of them")
    spec.write_text("[" * 5000 + "]" * 5000)
    _refused(lambda: read_zoo_file(spec), f"{spec}: YAML nested too deeply to be a zoo")
    spec.write_text("lower_is_better: ppl\nmodels: [{model: org/a, ppl: 9}]\n")  # one name, not a list
    assert read_zoo_file(spec).lower_is_better == frozenset({"ppl"})


def test_a_zoo_or_cache_named_too_long_for_the_file_system(tmp_path: Path) -> None:
    """Path.exists raised OSError (File name too long): a traceback and exit 1 from wbfe rank and wbfe cache."""
    from wbfe.ranking.cache_admin import cache_info, prune_cache

    name = "a" * 5000
    _refused(lambda: load_zoo(name + ".csv"), f"zoo spec not found: {name}.csv", SourceNotFoundError)
    with pytest.raises(UnknownNameError, match=r"^unknown zoo 'a+' \(known: "):
        load_zoo(name)
    assert not cache_info(tmp_path / name).exists
    _refused(lambda: prune_cache(tmp_path / name), f"no such cache folder: {tmp_path / name}: give the folder wbfe "
                                                   "caches into (wbfe cache info shows the default)")


def test_a_yaml_row_naming_a_column_twice_is_refused(tmp_path: Path) -> None:
    """'acc' and ' acc' in one YAML row: the first was read and the other dropped (a CSV header refuses it)."""
    spec = tmp_path / "zoo.yaml"
    spec.write_text("models:\n  - {model: org/a, ' acc': 1, acc: 3}\n  - {model: org/b, acc: 2}\n")
    _refused(lambda: read_zoo_file(spec, name="z"), "zoo 'z': row 1 names column 'acc' twice")


def test_an_infinite_quality_is_refused(tmp_path: Path) -> None:
    spec = tmp_path / "zoo.csv"
    spec.write_text("model,acc\na,1\nb,inf\n")
    _refused(lambda: read_zoo_file(spec, name="z"), "zoo 'z': model 'b' has acc = 'inf', not a finite number")


def test_a_zoo_object_takes_extra_lower_is_better_columns(tmp_path: Path) -> None:
    spec = tmp_path / "zoo.csv"
    spec.write_text("model,acc,loss\na,1,3\nb,2,4\n")
    zoo = read_zoo_file(spec)
    assert load_zoo(zoo) is zoo
    assert load_zoo(zoo, lower_is_better=["loss"]).lower_is_better == frozenset({"loss"})
    with pytest.raises(UnknownNameError, match=r"unknown quality column 'los'; did you mean 'loss'\?"):
        load_zoo(zoo, lower_is_better=["los"])


def test_builtin_zoos_whose_files_or_library_are_missing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torchvision", None)
    _refused(zoo_mod.torchvision_imagenet_rows, "reading torchvision's weight metadata needs torchvision",
             MissingDependencyError)
    monkeypatch.setattr(zoo_mod, "fixtures_dir", lambda: tmp_path)
    _refused(lambda: load_zoo("fmnist"), f"the Fashion-MNIST zoo is not built yet (expected {tmp_path}/fmnist-zoo/"
                                         "zoo.csv; see benchmarks/zoo/)", SourceNotFoundError)


def test_the_torchvision_zoo_reads_torchvisions_metadata_when_its_weights_can_be_had(
        monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("torchvision")
    monkeypatch.setattr(zoo_mod, "hf_offline", lambda: False)
    live = zoo_mod.torchvision_imagenet_rows()
    zoo = load_zoo("torchvision-imagenet")
    assert [e.name for e in zoo.entries] == [row["model"] for row in live]
    assert zoo.entries[0].source == live[0]["source"]  # the live rows, not the shipped table's


# --- statistics -------------------------------------------------------------------------------------------------

def test_statistics_where_no_resample_or_ordering_has_a_correlation() -> None:
    assert all(math.isnan(v) for v in stats.bootstrap_ci([1.0], [2.0]))  # one pair: no ρ
    # Two pairs, one resample: seed 0 draws the same pair twice, a constant side with no ρ.
    assert all(math.isnan(v) for v in stats.bootstrap_ci([1.0, 2.0], [1.0, 2.0], n_boot=1, seed=0))
    assert stats.bootstrap_ci([1.0, 2.0], [1.0, 2.0], n_boot=1, seed=1) == (1.0, 1.0)  # both pairs drawn
    p, method = stats.permutation_p_value([1.0, 1.0, 1.0], [1.0, 2.0, 3.0])
    assert math.isnan(p) and method == "exact"


# --- the ranking's result ---------------------------------------------------------------------------------------

def test_an_unknown_metric_of_a_ranking_is_named(tmp_path: Path) -> None:
    from wbfe.ranking import rank

    result = rank(make_zoo(tmp_path / "zoo"), "acc", metrics="bfe", scorer=fake_scorer, hasher=fake_hash,
                  cache_dir=False, n_boot=50)
    assert result.metric("bfe_head").n == 5
    with pytest.raises(UnknownNameError, match=r"unknown metric 'bfe_haed'; did you mean 'bfe_head'\?"):
        result.metric("bfe_haed")


def test_a_model_another_driver_holds_is_taken_from_the_cache_once_it_is_stored(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The first model's claim is held by another driver, which stores its score meanwhile: this driver takes that
    score from the cache and never scores the model itself."""
    from wbfe.ranking import rank
    from wbfe.ranking.cache import ScoreCache

    original, held = ScoreCache.claim, []

    def claim(self: ScoreCache, key: str, **kw: float):  # noqa: ANN202
        if not held:
            held.append(key)
            self.put(key, {"summary": {"bfe_head": 7.5}})
            return None
        return original(self, key, **kw)

    monkeypatch.setattr(ScoreCache, "claim", claim)
    scorer, lines = Counting(), []
    result = rank(make_zoo(tmp_path / "zoo"), "acc", metrics="bfe", scorer=scorer, hasher=fake_hash,
                  cache_dir=tmp_path / "cache", n_boot=50, progress=lines.append)
    assert scorer.calls == ["m1.txt", "m2.txt", "m3.txt", "m4.txt"]
    first = result.models[0]
    assert (first.model, first.cached, first.scores["bfe_head"]) == ("m0.txt", True, 7.5)
    assert [line for line in lines if "another driver" in line] == ["[1/5] m0.txt: cached (scored by another driver)"]


def test_the_progress_lines_count_each_model_at_its_place_in_the_zoo(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """A model that cannot be had here shifted the count of every later one: the zoo's second model was [1/5]."""
    import torch
    from safetensors.torch import save_file

    from wbfe.ranking import rank

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    generator = torch.Generator().manual_seed(0)
    for k in range(4):
        save_file({"classifier.weight": torch.randn(10, 30 + 5 * k, generator=generator)},
                  str(tmp_path / f"m{k}.safetensors"))
    (tmp_path / "zoo.csv").write_text("model,checkpoint,acc\nhub,org/not-cached-here,1\na,m0.safetensors,2\n"
                                      "n,m1.safetensors,\nb,m2.safetensors,3\nc,m3.safetensors,4\n")
    lines: list[str] = []
    result = rank(tmp_path / "zoo.csv", "acc", metrics="bfe", cache_dir=False, n_boot=50, progress=lines.append)
    assert [line for line in lines if line.endswith(": scored")] == ["[2/5] a: scored", "[4/5] b: scored",
                                                                     "[5/5] c: scored"]
    assert [(f.model, f.reason) for f in result.failed] == [("hub", "not cached, and HF_HUB_OFFLINE is set"),
                                                            ("n", "no acc value in the zoo")]


def test_rank_keyword_defaults_are_the_rank_and_executor_options_defaults() -> None:
    """rank's keywords' defaults were written a second time in its signature; they are RankOptions' own (and
    ExecutorOptions' for where the models are scored)."""
    import inspect
    from dataclasses import fields

    from wbfe.executors import ExecutorOptions
    from wbfe.options import RankOptions
    from wbfe.ranking import rank

    params = inspect.signature(rank).parameters
    own = {f.name: f.default for f in fields(RankOptions)}
    assert {key: params[key].default for key in own} == own
    where = {f.name: f.default for f in fields(ExecutorOptions)}
    assert (params["executor"].default, params["ray_address"].default) == (where["executor"], where["address"])
