"""wbfe.pruning (``wbfe sparsity`` / ``wbfe prune``): the allocation against its defining properties (the
parameter-weighted overall sparsity, monotone in the metric), the pruned tensors against an independent
NumPy magnitude pruning, the written file read back with the safetensors package, and the refusals."""

from __future__ import annotations

import hashlib
import json
import math
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from typer.testing import CliRunner

import wbfe
from wbfe.errors import InvalidOptionError, OutputError, OverwriteError, UnknownNameError
from wbfe.pruning import METADATA_KEY, MetricNotComputedError, allocate, magnitude_prune, prune, sparsity
from wbfe_cli.main import app

DEFAULT = Path(wbfe.default_checkpoint())


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture()
def model(tmp_path: Path) -> Path:
    """Four heavy-tailed matrices of different sizes, a conv, a head, an embedding and biases."""
    rng = np.random.default_rng(0)

    def t(shape: tuple[int, ...], df: float) -> torch.Tensor:
        return torch.from_numpy(rng.standard_t(df, size=shape).astype(np.float32))

    tensors = {"embed_tokens.weight": t((50, 24), 5.0),
               "layers.0.mlp.fc1.weight": t((64, 24), 2.5), "layers.0.mlp.fc1.bias": t((64,), 5.0),
               "layers.1.mlp.fc2.weight": t((48, 64), 4.0), "layers.2.mlp.fc3.weight": t((40, 48), 8.0),
               "conv.weight": t((16, 8, 3, 3), 3.0), "lm_head.weight": t((50, 40), 5.0)}
    path = tmp_path / "model.safetensors"
    save_file(tensors, str(path), metadata={"note": "kept"})
    return path


# ---------------------------------------------------------------- the allocation (pure)

@pytest.mark.parametrize("mapping", ["value", "rank"])
@pytest.mark.parametrize("target", [0.1, 0.5, 0.7, 0.9])
def test_allocation_reaches_the_target_and_is_monotone(mapping: str, target: float) -> None:
    rng = np.random.default_rng(1)
    values = rng.uniform(2.0, 6.0, size=12)
    params = rng.integers(100, 100_000, size=12)
    s = allocate(values, params, target, spread=0.2, mapping=mapping)
    assert np.sum(s * params) / np.sum(params) == pytest.approx(target, abs=1e-12)
    assert np.all(s >= 0) and np.all(s < 1)
    order = np.argsort(values)
    assert np.all(np.diff(s[order]) >= 0)  # a larger value is pruned at least as much
    assert np.all(np.diff(allocate(values, params, target, spread=0.2, mapping=mapping, reverse=True)[order]) <= 0)


@pytest.mark.parametrize("target", [1e-6, 1e-100, 1e-300])
def test_a_tiny_target_is_reached_to_the_last_bit(target: float) -> None:
    # the scale c of the mapped values is about target/spread: 200 halvings from 1 stopped at 2^-200, and a target of
    # 1e-100 or 1e-300 was allocated 3e-62 overall
    values, params = np.array([1.0, 2.0, 3.0, 4.0]), np.array([100.0, 200.0, 300.0, 400.0])
    s = allocate(values, params, target, spread=0.1)
    assert np.sum(s * params) / np.sum(params) == pytest.approx(target, rel=1e-12, abs=0.0)


def test_equal_sizes_keep_alphapruning_s_range() -> None:
    # Equal matrices, values spread evenly: the map is [S - e, S + e] already at mean S, nothing rescaled.
    s = allocate(np.array([1.0, 2.0, 3.0]), np.array([1000, 1000, 1000]), 0.5, spread=0.2)
    assert s == pytest.approx([0.3, 0.5, 0.7], abs=1e-12)
    assert allocate(np.array([1.0, 2.0, 4.0]), np.array([1000] * 3), 0.5, spread=0.2, mapping="rank") == \
        pytest.approx([0.3, 0.5, 0.7], abs=1e-12)
    assert allocate(np.array([1.0, 2.0, 3.0]), np.array([1000] * 3), 0.5, spread=0.0) == pytest.approx([0.5] * 3)


def test_a_target_the_unpruned_matrices_leave_out_of_reach_is_refused() -> None:
    # spread 1 maps three of four equal matrices to 0.5 - 1 < 0 (unpruned): under a quarter of the weights can be
    # zero, and the search for the scale doubled forever (wbfe sparsity --spread 1 never ended)
    params = np.array([1000, 1000, 1000, 1000])
    with pytest.raises(InvalidOptionError, match=re.escape("target 0.5 cannot be reached with spread 1: the matrices "
                                                           "mapped to a sparsity at or below 0 stay unpruned, and the "
                                                           "others reach at most 0.2497 overall")):
        allocate(np.array([0.0, 0.0, 0.0, 1.0]), params, 0.5, spread=1.0)
    s = allocate(np.array([0.0, 0.0, 0.0, 1.0]), params, 0.2, spread=1.0)  # within reach: the scale is found
    assert s == pytest.approx([0.0, 0.0, 0.0, 0.8], abs=1e-12)


def test_a_target_that_empties_the_smallest_matrix_is_refused() -> None:
    with pytest.raises(InvalidOptionError, match="leaves less than one weight in the smallest matrix"):
        allocate(np.array([1.0, 2.0]), np.array([4, 1000]), 0.8, spread=0.1)


def test_magnitude_prune_breaks_ties_by_position() -> None:
    assert magnitude_prune(np.array([1.0, -1.0, 1.0, 2.0]), 2).tolist() == [0.0, 0.0, 1.0, 2.0]
    assert magnitude_prune(np.array([[3.0, -0.5], [0.5, -3.0]]), 3).tolist() == [[0.0, 0.0], [0.0, -3.0]]
    assert magnitude_prune(np.array([1.0, 2.0]), 0).tolist() == [1.0, 2.0]


# ---------------------------------------------------------------- sparsity on a checkpoint

def test_sparsity_rows_counts_and_exclusions(model: Path) -> None:
    allocation = sparsity(model, 0.6, by="alpha")
    names = [r["name"] for r in allocation.rows]
    assert set(names) == {"layers.0.mlp.fc1.weight", "layers.1.mlp.fc2.weight", "layers.2.mlp.fc3.weight",
                          "conv.weight"}
    assert {e["name"]: e["reason"] for e in allocation.excluded} == {
        "embed_tokens.weight": "role embedding excluded", "lm_head.weight": "role head excluded"}
    n = sum(r["params"] for r in allocation.rows)
    assert abs(sum(r["zeros"] for r in allocation.rows) - 0.6 * n) <= len(allocation.rows) / 2
    for row in allocation.rows:
        assert row["params"] == math.prod(row["shape"])  # a conv counts its whole kernel
        assert row["zeros"] == round(row["sparsity"] * row["params"])
    scored = {r["name"]: r["alpha"] for r in wbfe.score(model, metrics="htsr").layers}
    assert [r["metric"] for r in allocation.rows] == [scored[n] for n in names]
    by_alpha = sorted(allocation.rows, key=lambda r: r["metric"])
    assert [r["sparsity"] for r in by_alpha] == sorted(r["sparsity"] for r in by_alpha)
    frame = allocation.to_pandas()
    assert list(frame["name"]) == names and frame["sparsity"].tolist() == [r["sparsity"] for r in allocation.rows]
    everything = sparsity(model, 0.6, by="uniform", exclude="")
    assert len(everything.rows) == 6 and all(r["sparsity"] == 0.6 for r in everything.rows)


@pytest.mark.parametrize("by", ["bfe", "stable_rank", "h"])
def test_every_metric_allocates_monotonically(model: Path, by: str) -> None:
    allocation = sparsity(model, 0.5, by=by)
    finite = [r for r in allocation.rows if math.isfinite(r["metric"])]
    ordered = sorted(finite, key=lambda r: r["metric"])
    assert [r["sparsity"] for r in ordered] == sorted(r["sparsity"] for r in ordered)
    assert len({r["sparsity"] for r in finite}) == len(finite)  # the metric does spread them


def test_a_nan_metric_takes_the_median(model: Path) -> None:
    # features.0 of the demo CNN has 9 eigenvalues: too few for a power-law tail (alpha NaN)
    allocation = sparsity(DEFAULT, 0.5, by="alpha")
    row = next(r for r in allocation.rows if r["name"] == "features.0.weight")
    finite = [r["metric"] for r in allocation.rows if math.isfinite(r["metric"])]
    assert math.isnan(row["metric"]) and row["note"] == f"alpha not finite: the median {np.median(finite):.6g} used"


# ---------------------------------------------------------------- prune

def test_prune_writes_the_allocation(model: Path, tmp_path: Path) -> None:
    before = _sha(model)
    out = tmp_path / "pruned.safetensors"
    report = prune(model, out, target=0.7, by="bfe")
    assert _sha(model) == before  # the input untouched
    original, pruned = load_file(str(model)), load_file(str(out))
    assert list(pruned) == list(original)
    rows = {r["name"]: r for r in report.allocation.rows}
    for name, tensor in original.items():
        if name not in rows:  # every other tensor byte for byte
            assert pruned[name].numpy().tobytes() == tensor.numpy().tobytes(), name
            continue
        w, k = tensor.numpy().astype(np.float64), rows[name]["zeros"]
        # an independent magnitude pruning: everything at or below the k-th smallest |w| (no ties here)
        kth = np.sort(np.abs(w), axis=None)[k - 1]
        expected = np.where(np.abs(w) <= kth, 0.0, w).astype(np.float32)
        assert np.array_equal(pruned[name].numpy(), expected), name
        assert int(np.count_nonzero(pruned[name].numpy() == 0)) == k  # the matrix's sparsity is its allocation
    n = sum(r["params"] for r in rows.values())
    zeros = sum(int(np.count_nonzero(pruned[name].numpy() == 0)) for name in rows)
    assert abs(zeros - 0.7 * n) <= len(rows)  # within one weight per matrix of the target
    assert report.overall == pytest.approx(zeros / n, abs=1e-15)
    with safe_open(str(out), framework="pt") as fh:
        meta = fh.metadata()
    assert meta["note"] == "kept"
    record = json.loads(meta[METADATA_KEY])
    assert record["target"] == 0.7 and record["by"] == "bfe" and record["zeros"] == {k: r["zeros"] for k, r in rows.items()}
    after = {r["name"]: r["bfe"] for r in wbfe.score(out, metrics="bfe").layers}
    assert all(math.isfinite(v) for v in after.values())  # exact zeros leave a full-rank matrix full rank
    assert [r["bfe_after"] for r in report.rows] == pytest.approx([after[r["name"]] for r in report.rows], rel=1e-9)
    assert [r["dead_rows"] for r in report.rows] == [0] * len(report.rows)
    data = report.to_dict()
    assert (data["output"], data["overall"]) == (str(report.output), report.overall)
    assert data["allocation"] == report.allocation.to_dict() and [r["name"] for r in data["rows"]] == list(rows)
    assert report.to_pandas()["reached"].tolist() == [r["reached"] for r in report.rows]


def test_the_demo_cnn_pruned_scores_finite_and_counts_dead_rows(tmp_path: Path) -> None:
    out = tmp_path / "cnn.safetensors"
    report = prune(DEFAULT, out, target=0.7, by="bfe")
    assert all(math.isfinite(r["bfe_after"]) for r in report.rows)
    conv = next(r for r in report.rows if r["name"] == "features.3.weight")
    assert conv["params"] == 32 * 16 * 3 * 3 and conv["zeros"] == round(conv["sparsity"] * 4608)
    pruned = load_file(str(out))
    for row in report.rows:  # dead rows counted independently: output channels with no weight left
        w = pruned[row["name"]].numpy()
        assert row["dead_rows"] == sum(not w[i].any() for i in range(w.shape[0]))
    out = tmp_path / "alpha.safetensors"
    heavy = prune(DEFAULT, out, target=0.5, by="alpha")  # empties most of the small convolutions
    dead = [r for r in heavy.rows if r["dead_rows"] > 0]
    assert dead and all(math.isfinite(r["bfe_after"]) for r in heavy.rows)  # of the live part
    scored = {r["name"]: r for r in wbfe.score(out, metrics="bfe").layers}
    pruned = load_file(str(out))
    for row in heavy.rows:
        flat = pruned[row["name"]].numpy().reshape(pruned[row["name"]].shape[0], -1)
        assert row["dead_cols"] == int((~flat.any(axis=0)).sum())
        assert (row["dead_rows"], row["dead_cols"]) == (scored[row["name"]]["dead_rows"],
                                                        scored[row["name"]]["dead_cols"])


def test_a_bfloat16_matrix_is_pruned_in_its_own_dtype(tmp_path: Path) -> None:
    g = torch.Generator().manual_seed(3)
    src = tmp_path / "bf16.safetensors"
    save_file({"a.weight": torch.randn(40, 30, generator=g).to(torch.bfloat16),
               "b.weight": torch.randn(30, 20, generator=g).to(torch.bfloat16),
               "head.weight": torch.randn(10, 20, generator=g).to(torch.bfloat16)}, str(src))
    out = tmp_path / "out.safetensors"
    report = prune(src, out, target=0.6, by="uniform", head="head.weight")
    original, pruned = load_file(str(src)), load_file(str(out))
    for row in report.rows:
        w, p = original[row["name"]], pruned[row["name"]]
        assert p.dtype == torch.bfloat16 and int((p == 0).sum()) == row["zeros"] == round(0.6 * w.numel())
        kept = p != 0
        assert torch.equal(p[kept].view(torch.int16), w[kept].view(torch.int16))  # the rest bit for bit
        assert float(w[~kept].abs().max()) <= float(w[kept].abs().min())
    assert torch.equal(pruned["head.weight"].view(torch.int16), original["head.weight"].view(torch.int16))


def test_prune_refuses_its_input(model: Path, tmp_path: Path) -> None:
    before = _sha(model)
    with pytest.raises(OverwriteError, match=f"^cannot write {model}: it is the input {model} itself; "):
        prune(model, model, target=0.5)
    folder = model.parent
    with pytest.raises(OverwriteError, match=f"^cannot write {folder / 'o.st'}: it is inside {folder}, a folder "):
        prune(folder, folder / "o.st", target=0.5)
    link = tmp_path / "link.safetensors"
    link.symlink_to(model)
    with pytest.raises(OverwriteError, match="it is the input"):
        prune(model, link, target=0.5)
    assert _sha(model) == before


@pytest.mark.parametrize(("out", "why"), [
    (None, "the output must be a file name, not None"), (3, "the output must be a file name, not 3"),
    (b"o.safetensors", "the output must be a file name, not b'o.safetensors'"), ("", "the output path is empty ('')"),
    ("-", "the pruned checkpoint needs a file path, not standard output"),
])
def test_an_output_that_is_no_file_path_is_an_output_error(model: Path, tmp_path: Path, monkeypatch, out,
                                                            why: str) -> None:
    # out=None, 3 or bytes raised TypeError from os.fspath; "-" (standard output) was a plain InvalidOptionError
    monkeypatch.chdir(tmp_path)
    with pytest.raises(OutputError, match=f"^{re.escape(why)}$"):
        prune(model, out, target=0.5)
    assert [p.name for p in tmp_path.iterdir()] == [model.name]  # nothing written


# ---------------------------------------------------------------- refusals

@pytest.mark.parametrize("target", [0, 0.0, -0.1, 1, 1.0, 1.5, math.nan])
def test_bad_targets_are_refused_before_reading(target: float, tmp_path: Path) -> None:
    with pytest.raises(InvalidOptionError, match=r"^target must be in \(0, 1\), not "):
        sparsity(tmp_path / "missing.safetensors", target)


def test_unknown_and_missing_metrics(model: Path) -> None:
    with pytest.raises(InvalidOptionError, match="^by must be one of 'alpha', 'bfe', 'h', 'stable_rank', 'uniform', "
                                                 "not 'entropy'$"):
        sparsity(model, 0.5, by="entropy")
    with pytest.raises(UnknownNameError, match="unknown role 'heads'"):
        sparsity(model, 0.5, exclude="heads")
    only_bfe = wbfe.score(model, metrics="bfe")
    with pytest.raises(MetricNotComputedError, match="^the score has no 'alpha' column; score it with --metrics htsr$"):
        sparsity(only_bfe, 0.5, by="alpha")
    tiny = model.parent / "tiny.safetensors"  # 8 eigenvalues each: no power-law tail anywhere
    save_file({f"l{i}.weight": torch.randn(8, 12, generator=torch.Generator().manual_seed(i)) for i in range(3)},
              str(tiny))
    with pytest.raises(MetricNotComputedError, match="^alpha is NaN on every prunable matrix"):
        sparsity(tiny, 0.5, by="alpha")


def test_nothing_left_to_prune_is_refused(model: Path) -> None:
    with pytest.raises(wbfe.NoUsableMatrixError, match=r"model.safetensors: no matrix left to prune: all 2 scored are "
                                                       r"left out \(role embedding excluded; role head excluded\); "
                                                       "--exclude '' prunes every role$"):
        sparsity(model, 0.5, by="bfe", layers="embed_tokens|lm_head")


def test_a_score_given_takes_no_scoring_settings(model: Path) -> None:
    # They were silently ignored: the score's own layers, head and min_eigs decided.
    scored = wbfe.score(model, metrics="bfe")
    for keywords in ({"layers": "fc"}, {"head": "fc1"}, {"min_eigs": 50}, {"device": "cpu"}):
        with pytest.raises(InvalidOptionError, match=f"^{next(iter(keywords))}: the ModelScore given was scored "
                                                     "with its own; leave them unset, or pass the checkpoint$"):
            sparsity(scored, 0.5, by="bfe", **keywords)
    assert sparsity(scored, 0.5, by="bfe").as_dict() == sparsity(model, 0.5, by="bfe").as_dict()


def test_cli(model: Path, tmp_path: Path) -> None:
    runner = CliRunner()
    tiny = tmp_path / "tiny.safetensors"  # 8 eigenvalues each: no power-law tail anywhere
    save_file({f"l{i}.weight": torch.randn(8, 12, generator=torch.Generator().manual_seed(i)) for i in range(3)},
              str(tiny))
    js, cs = tmp_path / "a.json", tmp_path / "a.csv"
    done = runner.invoke(app, ["sparsity", str(model), "--target", "0.6", "--by", "stable_rank", "--json", str(js),
                               "--csv", str(cs)])
    assert done.exit_code == 0, done.output
    expected = sparsity(model, 0.6, by="stable_rank")
    assert json.loads(js.read_text())["rows"] == json.loads(expected.to_json())["rows"]
    assert cs.read_text() == expected.to_csv()
    assert "layers.0.mlp.fc1.weight" in done.stdout
    out = tmp_path / "p.safetensors"
    done = runner.invoke(app, ["prune", str(model), str(out), "--target", "0.5", "--by", "bfe"])
    assert done.exit_code == 0, done.output
    assert load_file(str(out)).keys() == load_file(str(model)).keys()
    for args, message in [
        (["sparsity", str(model), "--target", "0"], "wbfe: error: --target must be in (0, 1), not 0.0"),
        (["sparsity", str(model), "--target", "1"], "wbfe: error: --target must be in (0, 1), not 1.0"),
        (["sparsity", str(model), "--target", "0.5", "--by", "nope"],
         "wbfe: error: --by must be one of 'alpha', 'bfe', 'h', 'stable_rank', 'uniform', not 'nope'"),
        (["sparsity", str(tiny), "--target", "0.5", "--by", "alpha"],
         "wbfe: error: alpha is NaN on every prunable matrix (too few eigenvalues for the fit?); allocate by another "
         "metric (--by bfe) or --by uniform"),
        (["prune", str(model), str(model), "--target", "0.5"],
         f"wbfe: error: cannot write {model}: it is the input {model} itself; wbfe never writes over what it "
         "reads: name another output file"),
    ]:
        done = runner.invoke(app, args)
        assert done.exit_code == 2 and done.stderr.strip() == message, (args, done.output)


# ---------------------------------------------------------------- the measured page

def _doc_generator() -> Any:
    import importlib.util

    root = Path(__file__).resolve().parents[1]
    spec = importlib.util.spec_from_file_location("make_pruning_doc", root / "benchmarks" / "make_pruning_doc.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_pruning_doc_is_the_generators_output_and_the_default_is_the_best_measured() -> None:
    gen = _doc_generator()
    assert gen.OUTPUT.read_text(encoding="utf-8") == gen.render(gen.RESULTS), (
        "docs/pruning.md is out of date: run python benchmarks/make_pruning_doc.py")
    best = json.loads(gen.RESULTS.read_text(encoding="utf-8"))["best"]["by"]
    from wbfe.options import PruneOptions

    assert PruneOptions().by == best


def test_pruning_doc_reads_its_figures_from_the_results(tmp_path: Path) -> None:
    gen = _doc_generator()
    data = json.loads(gen.RESULTS.read_text(encoding="utf-8"))
    data["summary"]["all"]["multi"]["0.7"]["bfe"]["gain_mean"] = 12.34
    data["summary"]["all"]["multi"]["0.7"]["uniform"]["mean"] = 55.55
    changed = tmp_path / "pruning.json"
    changed.write_text(json.dumps(data), encoding="utf-8")
    text = gen.render(changed)
    assert "+12.3 ±" in text and ("55.5 ± " in text or "55.6 ± " in text)
    out = tmp_path / "pruning.md"
    assert gen.main(["--check", "--results", str(changed), "--output", str(out)]) == 1
    assert gen.main(["--results", str(changed), "--output", str(out)]) == 0
    assert gen.main(["--check", "--results", str(changed), "--output", str(out)]) == 0


def test_signature_and_cli_defaults_are_the_options_defaults() -> None:
    import inspect
    from dataclasses import fields

    import typer.main

    from wbfe.options import PruneOptions

    defaults = {f.name: f.default for f in fields(PruneOptions)}
    for function in (sparsity, prune):
        for name, p in inspect.signature(function).parameters.items():
            if name in defaults and name != "target":
                assert p.default == defaults[name], (function.__name__, name)
    commands = typer.main.get_command(app).commands  # type: ignore[attr-defined]
    for name in ("sparsity", "prune"):
        for param in commands[name].params:
            if param.name in defaults and param.name != "target":
                expected = defaults[param.name]
                given = tuple(param.default.split(",")) if param.name == "exclude" else param.default
                assert given == expected, (name, param.name)


def test_the_allocation_lists_the_tensors_the_score_skipped() -> None:
    # An all-zero matrix (and a bias) appeared in neither rows nor excluded: not accounted for.
    g = torch.Generator().manual_seed(0)
    state = {"a.weight": torch.randn(64, 32, generator=g), "z.weight": torch.zeros(64, 32),
             "b.weight": torch.randn(32, 64, generator=g), "b.bias": torch.zeros(32)}
    data = sparsity(state, target=0.5).to_dict()
    assert [r["name"] for r in data["rows"]] == ["a.weight", "b.weight"] and data["excluded"] == []
    assert data["skipped"] == [{"name": "z.weight", "reason": "all-zero matrix"},
                               {"name": "b.bias", "reason": "1-D tensor (bias, norm scale or buffer)"}]


def test_the_cli_tables_are_the_score_tables_a_control_character_escaped(tmp_path: Path) -> None:
    """``wbfe sparsity``/``prune`` print with the score's table writer: a tensor name's escape sequence is shown
    escaped, never sent to the terminal, and the rows are the library's."""
    rng = np.random.default_rng(1)
    name = "layers.0.\x1b[2Jfc.weight"
    tensors = {name: torch.from_numpy(rng.standard_t(3.0, size=(64, 32)).astype(np.float32)),
               "layers.1.fc.weight": torch.from_numpy(rng.standard_t(4.0, size=(48, 64)).astype(np.float32))}
    path = tmp_path / "m.safetensors"
    save_file(tensors, str(path))
    runner = CliRunner()
    for args in (["sparsity", str(path), "--target", "0.5", "--exclude", ""],
                 ["prune", str(path), str(tmp_path / "p.safetensors"), "--target", "0.5", "--exclude", ""]):
        done = runner.invoke(app, args)
        assert done.exit_code == 0, done.output
        assert "\x1b" not in done.stdout and "layers.0.\\x1b[2Jfc.weight" in done.stdout
        header, rule = done.stdout.splitlines()[:2]
        assert header.split()[:2] == ["name", "role" if args[0] == "sparsity" else "params"]
        assert set(rule.replace(" ", "")) == {"-"}


@pytest.mark.parametrize("by", ["bfe", "uniform"])
def test_a_min_eigs_no_allocation_reads_is_refused_in_its_own_words(model: Path, by: str) -> None:
    """sparsity --by bfe/uniform scores bfe alone, which fits no tail: the score's refusal named --metrics, which
    sparsity has not; --by stable_rank (htsr) keeps it."""
    with pytest.raises(InvalidOptionError, match=f"^--min-eigs 5 gates the tail fits, none of which --by {by} reads: "
                                                 "drop --min-eigs or allocate by alpha, stable_rank or h$"):
        sparsity(model, 0.5, by=by, min_eigs=5)
    assert sparsity(model, 0.5, by="stable_rank", min_eigs=5).rows


def test_a_scored_matrix_that_is_no_stored_tensor_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    """A fused expert stack is scored per expert (``…down_proj[0]``), a matrix the file does not store: it cannot be
    pruned in place, and prune says so, naming it, before anything is written."""
    from safetensors.torch import save_file

    from wbfe.errors import InvalidOptionError

    g = torch.Generator().manual_seed(0)
    (tmp_path / "moe").mkdir()
    save_file({"model.layers.0.mlp.experts.down_proj": torch.randn(4, 64, 96, generator=g),
               "model.layers.0.self_attn.q_proj.weight": torch.randn(64, 64, generator=g)},
              str(tmp_path / "moe" / "model.safetensors"))
    out = tmp_path / "out.safetensors"
    with pytest.raises(InvalidOptionError) as info:
        wbfe.prune(tmp_path / "moe", out, target=0.5, exclude=())
    assert str(info.value) == ("model.layers.0.mlp.experts.down_proj[0]: scored as [64, 96] but stored as no tensor; "
                               "it cannot be pruned in place (exclude it with --layers)")
    assert not out.exists()


def test_a_tied_weight_is_pruned_with_its_first_copy(tmp_path: Path) -> None:
    """A score reads a tied weight (one storage under two names) once, so the allocation prunes the first name; the
    second was copied unpruned, which untied them (transformers then loads an unpruned head beside the pruned
    embedding, and the overall sparsity the report gave was not the model's). Both names now hold the pruned copy;
    a --layers that selects the second name alone is refused, as pruning it would untie them."""
    rng = np.random.default_rng(0)
    t = {name: torch.from_numpy(rng.standard_t(3.0, size=(48, 32)).astype(np.float32)) for name in ("emb", "fc")}
    torch.save({"emb.weight": t["emb"], "fc.weight": t["fc"], "head.weight": t["emb"]}, tmp_path / "model.pt")
    out = tmp_path / "pruned.safetensors"
    report = prune(tmp_path / "model.pt", out, target=0.5, exclude=(), by="uniform")
    got = load_file(str(out))
    zeros = {r["name"]: r["zeros"] for r in report.allocation.rows}
    assert zeros == {"emb.weight": 768, "fc.weight": 768}
    want = magnitude_prune(t["emb"].numpy(), 768)
    assert np.array_equal(got["emb.weight"].numpy(), want) and np.array_equal(got["head.weight"].numpy(), want)
    with pytest.raises(InvalidOptionError, match=r"^head\.weight is tied to emb\.weight"):
        prune(tmp_path / "model.pt", tmp_path / "other.safetensors", target=0.5, exclude=(), by="uniform",
              layers="head")
    assert not (tmp_path / "other.safetensors").exists()
