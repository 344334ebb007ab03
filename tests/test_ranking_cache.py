"""The score cache and the ranking pipeline around it: re-runs score nothing, corrupt entries are
recomputed, interrupted runs resume, failing models are listed and the rest is ranked."""

from __future__ import annotations

import hashlib
import importlib
import json
import math
import re
from pathlib import Path
from typing import Any, Mapping

import numpy as np
import pytest
from scipy import stats as sps

from wbfe._provenance import installed_versions, source_digest
from wbfe.errors import InvalidOptionError
from wbfe.ranking import rank
from wbfe.ranking.cache import ScoreCache, cache_key
from wbfe.ranking.ranker import _named_like_lower

# ----------------------------------------------------------------------------- helpers

QUALITY = [0.91, 0.85, 0.88, 0.70, 0.95, 0.60]
METRIC = [1.20, 1.50, 1.31, 1.90, 1.10, 2.40]  # "bfe_head" of each model


def fake_scorer(ref: str, options: Mapping[str, Any]) -> dict[str, Any]:
    """Reads the metric value written in the file: a scorer that needs no tensors."""
    value = float(Path(ref).read_text(encoding="utf-8"))
    return {"summary": {"bfe_head": value, "bfe_mean": -value, "alpha_head": None, "bfe_n": 3,
                        "head_note": "text"},
            "model": {"sha256": hashlib.sha256(Path(ref).read_bytes()).hexdigest()}}


def fake_hash(ref: str) -> str:
    return hashlib.sha256(Path(ref).read_bytes()).hexdigest()


class Counting:
    def __init__(self, fail_on: tuple[str, ...] = (), interrupt_on: str | None = None) -> None:
        self.calls: list[str] = []
        self.fail_on = fail_on
        self.interrupt_on = interrupt_on

    def __call__(self, ref: str, options: Mapping[str, Any]) -> dict[str, Any]:
        self.calls.append(Path(ref).name)
        if Path(ref).name == self.interrupt_on:
            raise KeyboardInterrupt
        if Path(ref).name in self.fail_on:
            raise ValueError("the weights are broken")
        return fake_scorer(ref, options)


def make_zoo(folder: Path, metric: list[float] = METRIC, quality: list[float] = QUALITY) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    lines = ["model,test_accuracy,test_loss,source"]
    for i, (m, q) in enumerate(zip(metric, quality)):
        (folder / f"m{i}.txt").write_text(repr(m), encoding="utf-8")
        lines.append(f"m{i}.txt,{q},{1 - q},synthetic")
    spec = folder / "zoo.csv"
    spec.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return spec


def run(spec: Path, cache: Path | bool, scorer: Any, **kw: Any):  # noqa: ANN201
    return rank(spec, quality=kw.pop("quality", "test_accuracy"), metrics="bfe",
                cache_dir=cache, scorer=scorer, hasher=fake_hash, n_boot=300, **kw)


# ----------------------------------------------------------------------------- the cache itself


def test_put_get_roundtrip_and_keys(tmp_path: Path) -> None:
    cache = ScoreCache(tmp_path)
    key = cache_key("abc", {"metrics": ["bfe"], "lam": "opt"})
    assert key == cache_key("abc", {"lam": "opt", "metrics": ["bfe"]})  # order-free
    assert key != cache_key("abc", {"metrics": ["bfe"], "lam": 0.5})
    assert key != cache_key("abd", {"metrics": ["bfe"], "lam": "opt"})
    assert cache.get(key) is None
    payload = {"summary": {"bfe_head": 1.25, "alpha_head": None}}
    path = cache.put(key, payload)
    assert cache.get(key) == payload
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temporary file left


@pytest.mark.parametrize("damage", ["truncate", "edit_value", "not_json", "wrong_key"])
def test_corrupted_entry_is_detected_and_removed(tmp_path: Path, damage: str) -> None:
    cache = ScoreCache(tmp_path)
    key = cache_key("abc", {})
    path = cache.put(key, {"summary": {"bfe_head": 1.25}})
    text = path.read_text()
    if damage == "truncate":
        path.write_text(text[: len(text) // 2])
    elif damage == "edit_value":  # still valid JSON: only the checksum can tell
        path.write_text(text.replace("1.25", "1.35"))
    elif damage == "not_json":
        path.write_bytes(b"\x00\x01garbage")
    else:
        entry = json.loads(text)
        entry["key"] = "0" * 64
        path.write_text(json.dumps(entry))
    assert cache.get(key) is None
    assert cache.corrupted == [key]
    assert not path.exists()


def test_content_hash_is_remembered_until_the_file_changes(tmp_path: Path) -> None:
    cache = ScoreCache(tmp_path / "cache")
    model = tmp_path / "m.bin"
    model.write_bytes(b"first")
    calls: list[str] = []

    def compute(ref: str) -> str:
        calls.append(ref)
        return fake_hash(ref)

    a = cache.content_hash(str(model), compute)
    b = cache.content_hash(str(model), compute)
    assert a == b == hashlib.sha256(b"first").hexdigest() and len(calls) == 1
    model.write_bytes(b"second, longer")
    assert cache.content_hash(str(model), compute) == hashlib.sha256(b"second, longer").hexdigest()
    assert len(calls) == 2
    assert cache.content_hash("org/name", lambda ref: "hub") == "hub"  # not a local file: not memoised


# ----------------------------------------------------------------------------- rank() with the cache


def test_second_run_performs_no_scoring(tmp_path: Path) -> None:
    spec = make_zoo(tmp_path / "zoo")
    scorer = Counting()
    first = run(spec, tmp_path / "cache", scorer)
    assert len(scorer.calls) == 6 and (first.n_scored, first.n_cached) == (6, 0)
    second = run(spec, tmp_path / "cache", scorer)
    assert len(scorer.calls) == 6  # measured: not one more call
    assert (second.n_scored, second.n_cached) == (0, 6)
    assert second.metrics == first.metrics
    assert all(m.cached for m in second.models)


def test_changed_options_or_contents_are_rescored(tmp_path: Path) -> None:
    spec = make_zoo(tmp_path / "zoo")
    scorer = Counting()
    run(spec, tmp_path / "cache", scorer)
    run(spec, tmp_path / "cache", scorer, lam=0.5)
    assert len(scorer.calls) == 12
    (tmp_path / "zoo" / "m2.txt").write_text("1.3100001")
    run(spec, tmp_path / "cache", scorer)
    assert scorer.calls[12:] == ["m2.txt"]


def test_other_code_or_libraries_are_rescored(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The key holds wbfe's source digest and the library versions: an edit of a development
    install, whose version string stays the same, does not reuse the scores of the old code."""
    rank_module = importlib.import_module("wbfe.ranking.ranker")
    spec = make_zoo(tmp_path / "zoo")
    scorer = Counting()
    first = run(spec, tmp_path / "cache", scorer)
    assert first.options["versions"] == {**installed_versions(), "wbfe_source": source_digest()}
    monkeypatch.setattr(rank_module, "source_digest", lambda: "0" * 16)  # the code was edited
    run(spec, tmp_path / "cache", scorer)
    monkeypatch.setattr(rank_module, "installed_versions", lambda: {**installed_versions(), "numpy": "0.0"})
    run(spec, tmp_path / "cache", scorer)
    assert len(scorer.calls) == 18
    monkeypatch.undo()
    run(spec, tmp_path / "cache", scorer)  # the first code's entries are still there
    assert len(scorer.calls) == 18


def test_corrupted_entry_is_recomputed_by_rank(tmp_path: Path) -> None:
    spec = make_zoo(tmp_path / "zoo")
    scorer = Counting()
    first = run(spec, tmp_path / "cache", scorer)
    entries = sorted((tmp_path / "cache" / "entries").rglob("*.json"))
    assert len(entries) == 6
    victim = entries[3]
    victim.write_text(victim.read_text()[:-20])
    second = run(spec, tmp_path / "cache", scorer)
    assert len(scorer.calls) == 7
    assert (second.n_scored, second.n_cached) == (1, 5)
    assert second.metrics == first.metrics
    assert victim.exists()  # rewritten


def test_interrupted_run_resumes(tmp_path: Path) -> None:
    spec = make_zoo(tmp_path / "zoo")
    with pytest.raises(KeyboardInterrupt):
        run(spec, tmp_path / "cache", Counting(interrupt_on="m3.txt"))
    scorer = Counting()
    result = run(spec, tmp_path / "cache", scorer)
    assert scorer.calls == ["m3.txt", "m4.txt", "m5.txt"]
    assert (result.n_scored, result.n_cached) == (3, 3)


def test_no_cache_scores_every_time(tmp_path: Path) -> None:
    spec = make_zoo(tmp_path / "zoo")
    scorer = Counting()
    run(spec, False, scorer)
    run(spec, False, scorer)
    assert len(scorer.calls) == 12
    assert not (tmp_path / "cache").exists()


# ----------------------------------------------------------------------------- what rank() reports


def test_rank_correlations_match_scipy(tmp_path: Path) -> None:
    result = run(make_zoo(tmp_path / "zoo"), False, fake_scorer)
    assert [m.metric for m in result.metrics] == ["bfe_head", "bfe_mean", "alpha_head"]
    head = result.metric("bfe_head")
    assert head.rho == pytest.approx(sps.spearmanr(METRIC, QUALITY).statistic, abs=1e-12)
    assert head.kendall_tau == pytest.approx(sps.kendalltau(METRIC, QUALITY).statistic, abs=1e-12)
    assert head.pearson_r == pytest.approx(sps.pearsonr(METRIC, QUALITY).statistic, abs=1e-12)
    assert head.n == 6 and head.p_method == "exact" and head.expected_sign == -1
    assert head.ci_low <= head.rho <= head.ci_high
    assert result.metric("bfe_mean").rho == pytest.approx(-head.rho)
    alpha = result.metric("alpha_head")
    assert math.isnan(alpha.rho) and alpha.n == 0
    assert alpha.reason == "needs at least 3 models with a finite value, has 0"


def test_lower_is_better_quality_is_negated(tmp_path: Path) -> None:
    spec = make_zoo(tmp_path / "zoo")
    acc = run(spec, False, fake_scorer)
    loss = run(spec, False, fake_scorer, quality="test_loss", lower_is_better=["test_loss"])
    assert loss.lower_is_better
    # test_loss = 1 - accuracy, oriented (negated) it ranks exactly like accuracy.
    assert loss.metric("bfe_head").rho == pytest.approx(acc.metric("bfe_head").rho)
    # undeclared, a loss was ranked as if higher were better: every rho flipped, said only in the table's header
    for column in ("test_loss", "valLoss", "TOP1_ERR", "lambada_ppl"):
        with pytest.raises(InvalidOptionError, match=re.escape(f"quality {column!r} is named like a loss or an error, "
                                                               f"for which lower is better: declare it (--lower-is-"
                                                               f"better {column};")):
            spec = make_zoo(tmp_path / column)
            spec.write_text(spec.read_text().replace("test_loss", column, 1))
            run(spec, False, fake_scorer, quality=column)
    for column in ("test_accuracy", "errands", "glossary", "params"):  # words, not parts of words
        assert not _named_like_lower(column)


def test_failing_model_is_listed_and_ranking_continues(tmp_path: Path) -> None:
    spec = make_zoo(tmp_path / "zoo")
    with spec.open("a") as handle:
        handle.write("gone.safetensors,0.5,0.5,synthetic\n")
        handle.write("m_noq.txt,,0.1,synthetic\n")
    (tmp_path / "zoo" / "m_noq.txt").write_text("1.0")
    result = run(spec, tmp_path / "cache", Counting(fail_on=("m1.txt",)))
    reasons = {f.model: f.reason for f in result.failed}
    assert reasons["m1.txt"] == "ValueError: the weights are broken"
    assert reasons["gone.safetensors"].startswith("FileNotFoundError")
    assert reasons["m_noq.txt"] == "no test_accuracy value in the zoo"
    assert [f.model for f in result.failed] == ["m1.txt", "gone.safetensors", "m_noq.txt"]
    keep = [i for i in range(6) if i != 1]
    head = result.metric("bfe_head")
    assert head.n == 5
    assert head.rho == pytest.approx(
        sps.spearmanr(np.array(METRIC)[keep], np.array(QUALITY)[keep]).statistic, abs=1e-12)
    data = json.loads(result.to_json())
    assert set(data) >= {"zoo", "quality", "metrics", "models", "failed"}
    assert {"model": "m1.txt", "reason": "ValueError: the weights are broken"} in data["failed"]


def test_workers_in_processes_match_sequential(tmp_path: Path) -> None:
    spec = make_zoo(tmp_path / "zoo")
    sequential = run(spec, False, fake_scorer)
    parallel = run(spec, False, fake_scorer, workers=2)
    assert parallel.metrics == sequential.metrics
    assert [m.model for m in parallel.models] == [m.model for m in sequential.models]


def test_rank_rejects_bad_workers(tmp_path: Path) -> None:
    with pytest.raises(InvalidOptionError, match="workers must be at least 1, not 0"):
        run(make_zoo(tmp_path / "zoo"), False, fake_scorer, workers=0)


def test_to_pandas_rows_follow_metrics(tmp_path: Path) -> None:
    pytest.importorskip("pandas")
    result = run(make_zoo(tmp_path / "zoo"), False, fake_scorer)
    frame = result.to_pandas()
    assert list(frame["metric"]) == [m.metric for m in result.metrics]
    assert list(frame.columns[:8]) == ["metric", "rho", "ci_low", "ci_high", "p_value", "kendall_tau",
                                       "pearson_r", "n"]


def test_end_to_end_with_real_scoring(tmp_path: Path) -> None:
    """Real wbfe.score on tiny checkpoints whose head spectra give BFE-W in closed form."""
    torch = pytest.importorskip("torch")
    from safetensors.torch import save_file

    torch.manual_seed(0)
    folder = tmp_path / "zoo"
    folder.mkdir()
    rows = ["model,test_accuracy"]
    spreads = [0.1, 0.4, 0.8, 1.5, 2.5]
    expected = []
    for i, spread in enumerate(spreads):
        singular = torch.exp(torch.linspace(-spread, spread, 16, dtype=torch.float64))
        q1, _ = torch.linalg.qr(torch.randn(16, 16, dtype=torch.float64))
        q2, _ = torch.linalg.qr(torch.randn(32, 16, dtype=torch.float64))
        head = (q1 @ torch.diag(singular) @ q2.T).to(torch.float32).contiguous()
        save_file({"fc.weight": head}, str(folder / f"net{i}.safetensors"))
        e = (singular ** 2).numpy()
        expected.append(0.5 * (math.log(2 * math.pi) + 1) + 0.5 * (math.log(e.mean()) - np.log(e).mean()))
        rows.append(f"net{i}.safetensors,{0.9 - 0.1 * i}")
    (folder / "zoo.csv").write_text("\n".join(rows) + "\n")
    result = rank(folder / "zoo.csv", metrics="bfe", cache_dir=tmp_path / "cache", n_boot=200, device="cpu")
    assert not result.failed
    got = [m.scores["bfe_head"] for m in result.models]
    assert got == pytest.approx(expected, rel=1e-5)
    assert result.metric("bfe_head").rho == pytest.approx(-1.0)
    again = rank(folder / "zoo.csv", metrics="bfe", cache_dir=tmp_path / "cache", n_boot=200, device="cpu")
    assert (again.n_scored, again.n_cached) == (0, 5)
    assert [m.sha256 for m in again.models] == [m.sha256 for m in result.models]


def _thread_counts(ref: str, options: Any) -> dict[str, Any]:
    from threadpoolctl import threadpool_info

    return {"threads": sorted({pool["num_threads"] for pool in threadpool_info() if pool["user_api"] == "blas"})}


def test_worker_job_limits_the_loaded_blas_pools() -> None:
    """NumPy's BLAS is loaded before a worker's job runs: setting OMP/OPENBLAS_NUM_THREADS then has no
    effect, so the job limits the pools through threadpoolctl, and restores them afterwards."""
    from wbfe.options import ScoreOptions
    from wbfe.executors.local import run_with_threads

    np.ones(4) @ np.ones(4)  # make sure the BLAS is loaded, as it is in a real worker
    before = _thread_counts("", None)["threads"]
    if before == [1]:
        pytest.skip("the BLAS already runs one thread here: nothing to limit")
    assert run_with_threads(1, _thread_counts, ("unused", ScoreOptions(metrics="bfe"))) == {"threads": [1]}
    assert _thread_counts("", None)["threads"] == before  # torch's own pool stays at the worker's share


def test_a_ww_compatible_setting_over_given_score_options_keeps_the_filled_conv(tmp_path: Path) -> None:
    """rank(score=ScoreOptions(), ww_compatible=True) scores with WeightWatcher's slices, as the CLI does:
    the default conv was filled, not chosen, so the setting changes it (dataclasses.replace flattened)."""
    from wbfe.options import ScoreOptions

    seen: list[Mapping[str, Any]] = []

    def scorer(ref: str, options: Mapping[str, Any]) -> dict[str, Any]:
        seen.append(options.to_dict())  # type: ignore[attr-defined]
        return fake_scorer(ref, options)

    spec = make_zoo(tmp_path / "zoo")
    rank(spec, quality="test_accuracy", cache_dir=False, scorer=scorer, hasher=fake_hash, n_boot=300,
         score=ScoreOptions(metrics=("bfe",)), ww_compatible=True)
    assert {o["conv"] for o in seen} == {"slices"} and all(o["filled"] == ["conv"] for o in seen)
    seen.clear()
    rank(spec, quality="test_accuracy", cache_dir=False, scorer=scorer, hasher=fake_hash, n_boot=300,
         score=ScoreOptions(metrics=("bfe",), conv="flatten"), ww_compatible=True)
    assert {o["conv"] for o in seen} == {"flatten"} and not any("filled" in o for o in seen)


@pytest.mark.parametrize("quality, message", [
    ([0.5, 0.6, math.nan, math.nan], "2 of 4 models have a value of 'test_accuracy'; a ranking needs at least 3"),
    ([0.7, 0.7, 0.7], "every model has test_accuracy = 0.7, which ranks nothing; choose another column"),
])
def test_a_zoo_that_cannot_rank_is_refused_before_scoring(tmp_path: Path, quality: list[float], message: str) -> None:
    """Once every model was scored (hours for LLMs) and then each metric said "needs at least 3 models"."""
    spec = make_zoo(tmp_path / "zoo", metric=[1.0, 2.0, 3.0, 4.0][:len(quality)], quality=quality)
    scorer = Counting()
    with pytest.raises(InvalidOptionError, match=message):
        run(spec, False, scorer)
    assert scorer.calls == []



def test_n_scored_counts_models_scored_not_models_tried(tmp_path: Path) -> None:
    """n_scored is documented as the models scored in this run; it counted failures too, and the CLI printed
    "6 scored" beside "failed (2)"."""
    from wbfe_cli.rank import rank_table

    result = run(make_zoo(tmp_path / "zoo"), False, Counting(fail_on=("m1.txt", "m4.txt")))
    assert (result.n_scored, result.n_cached, len(result.failed)) == (4, 0, 2)
    table = rank_table(result)
    assert "4 models ranked by test_accuracy (higher is better); 4 scored, 0 from cache" in table
    assert "\nfailed (2):\n" in table
