"""The scoring pipeline: summaries, options, result conversions, determinism."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

import wbfe
from tests.conftest import small_state_dict
from wbfe.errors import InvalidOptionError, NoUsableMatrixError
from wbfe.metrics.bfe import bfe


def test_summary_is_head_and_mean_of_layers(st_file: Path) -> None:
    result = wbfe.score(st_file, metrics="bfe")
    values = [layer["bfe"] for layer in result.layers]
    assert result.summary["bfe_mean"] == pytest.approx(float(np.mean(values)), rel=1e-15)
    assert result.summary["bfe_n"] == len(values)
    head = next(layer for layer in result.layers if layer["name"] == "classifier.weight")
    assert head["role"] == "head" and result.summary["bfe_head"] == head["bfe"]


def test_layer_values_equal_direct_computation(state_dict: dict, st_file: Path) -> None:
    result = wbfe.score(st_file, metrics="bfe", lam=2.0)
    for layer in result.layers:
        w = state_dict[layer["name"]].to(torch.float64)
        w = w.reshape(w.shape[0], -1)
        e = np.linalg.svd(w.numpy(), compute_uv=False) ** 2
        assert layer["bfe"] == pytest.approx(bfe(e, 2.0)[0], rel=1e-10)
        assert layer["gamma"] == min(w.shape) / max(w.shape)
        assert layer["form"] == ("primal" if w.shape[0] <= w.shape[1] else "dual")


def test_rank_deficient_is_infinite_with_reason_and_left_out_of_the_mean() -> None:
    g = torch.Generator().manual_seed(0)
    # float64: a float32 product of rank-4 factors is full rank as stored (its rounding leaves
    # singular values ~1e-7·σ_max, which the zero rule σ <= σ_max·P·eps keeps).
    low_rank = torch.randn(20, 4, generator=g, dtype=torch.float64) @ torch.randn(4, 40, generator=g, dtype=torch.float64)
    result = wbfe.score({"a.weight": low_rank, "fc.weight": torch.randn(12, 30, generator=g)}, metrics="bfe")
    layer = result.layers[0]
    assert layer["bfe"] == math.inf
    assert layer["reasons"]["bfe"] == "rank-deficient: 16 zero eigenvalue(s), BFE-W = +inf"
    assert result.summary["bfe_mean"] == result.layers[1]["bfe"] and result.summary["bfe_n"] == 1
    data = json.loads(result.to_json())
    assert data["layers"][0]["bfe"] is None and data["layers"][0]["reasons"]["bfe"].startswith("rank-deficient")


def test_conversions(st_file: Path) -> None:
    pd = pytest.importorskip("pandas")
    result = wbfe.score(st_file, metrics="bfe")
    frame = result.to_pandas()
    assert isinstance(frame, pd.DataFrame)
    assert list(frame["name"]) == [layer["name"] for layer in result.layers]
    assert list(frame["bfe"]) == [layer["bfe"] for layer in result.layers]
    assert json.loads(result.to_json()) == result.to_dict()


def test_numpy_arrays_in_a_state_dict_are_scored_as_the_tensors_they_hold() -> None:
    # A numpy array beside torch tensors was left out without a word; a dict of numpy arrays alone was refused.
    w = np.random.default_rng(0).standard_normal((30, 40))
    v = torch.randn(20, 30, generator=torch.Generator().manual_seed(1))
    mixed = wbfe.score({"n.weight": w, "t.weight": v}, metrics="bfe")
    alone = wbfe.score({"n.weight": torch.from_numpy(w), "t.weight": v}, metrics="bfe")
    assert [(r["name"], r["dtype"], r["bfe"]) for r in mixed.layers] == [
        (r["name"], r["dtype"], r["bfe"]) for r in alone.layers]
    assert [r["name"] for r in mixed.layers] == ["n.weight", "t.weight"] and not mixed.skipped
    w.flags.writeable = False  # read-only arrays too (torch.from_numpy warns on them: copied instead)
    assert wbfe.score({"n.weight": w}, metrics="bfe").layers[0]["bfe"] == mixed.layers[0]["bfe"]


def test_deterministic(st_file: Path) -> None:
    a = wbfe.score(st_file).to_dict()
    b = wbfe.score(st_file).to_dict()
    assert a["layers"] == b["layers"] and a["summary"] == b["summary"]


def test_no_usable_matrix() -> None:
    with pytest.raises(NoUsableMatrixError, match=r"<dict>: no usable weight matrix \(2 tensors skipped — b: 1-D tensor"):
        wbfe.score({"b": torch.ones(5), "w": torch.full((12, 12), math.nan)}, metrics="bfe")


def test_no_usable_matrix_counts_its_skips_in_words(tmp_path: Path) -> None:
    from safetensors.torch import save_file

    with pytest.raises(NoUsableMatrixError, match=r"<dict>: no usable weight matrix \(1 tensor skipped — b: 1-D"):
        wbfe.score({"b": torch.ones(5)}, metrics="bfe")
    empty = tmp_path / "empty.safetensors"
    save_file({}, str(empty))
    with pytest.raises(NoUsableMatrixError) as caught:
        wbfe.score(empty, metrics="bfe")
    assert str(caught.value) == f"{empty}: no usable weight matrix (no weight tensor at all)"


def test_uninitialised_lazy_layers_are_skipped_and_the_rest_scored() -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.LazyLinear(4), torch.nn.Linear(30, 50))
    result = wbfe.score(model, metrics="bfe")
    lazy = "uninitialised lazy parameter: run the model once before scoring"
    assert [(s["name"], s["reason"]) for s in result.skipped][:2] == [("0.weight", lazy), ("0.bias", lazy)]
    w = model[1].weight.detach().to(torch.float64).numpy()
    assert [r["name"] for r in result.layers] == ["1.weight"]
    assert result.layers[0]["bfe"] == pytest.approx(bfe(np.linalg.svd(w, compute_uv=False) ** 2, "opt")[0], rel=1e-9)
    with pytest.raises(NoUsableMatrixError, match=r"\(2 tensors skipped — 0.weight: uninitialised lazy parameter"):
        wbfe.score(torch.nn.Sequential(torch.nn.LazyLinear(4)), metrics="bfe")


@pytest.mark.parametrize(
    "kwargs,message",
    [
        ({"min_eigs": 0}, "min_eigs must be a positive integer"),
        ({"conv": "rows"}, "conv convention must be 'flatten', 'slices' or 'fft'"),
        ({"lam": "best"}, "lambda must be 'opt' or a positive number"),
        ({"metrics": ""}, "no metric group given"),
        ({"device": "tpu"}, "device must be auto, cpu or cuda"),
    ],
)
def test_invalid_options_fail_before_reading(kwargs: dict, message: str) -> None:
    with pytest.raises(InvalidOptionError, match=message):
        wbfe.score("/does/not/matter", **kwargs)


def test_progress_callback(st_file: Path) -> None:
    calls: list[tuple[int, int | None, str]] = []
    wbfe.score(st_file, metrics="bfe", progress=lambda done, total, name: calls.append((done, total, name)))
    # (0, total) first, before any matrix, so a bar shows the total at once; then each count in order.
    # The total and the ticks count matrices (6 of the 10 tensors), not biases, norms or counters.
    matrices = sorted(name for name, tensor in small_state_dict().items() if tensor.ndim >= 2)
    assert calls[0] == (0, len(matrices), "") and len(matrices) == 6
    assert [c[0] for c in calls] == list(range(0, 7)) and all(c[1] == 6 for c in calls)
    assert sorted(c[2] for c in calls[1:]) == matrices  # each matrix once


def test_scores_across_shards_are_the_in_memory_scores(tmp_path: Path) -> None:
    """Matrices of a sharded checkpoint, a tie across shards included, score as the same tensors in memory."""
    from tests.conftest import write_sharded

    g = torch.Generator().manual_seed(11)
    state = {f"l{i}.weight": torch.randn(600, 500, generator=g) for i in range(5)}
    state["l2.bias"] = torch.randn(600, generator=g)
    state["l5.weight"] = state["l1.weight"].clone()  # a tie across shards, found by l1's digest
    index = write_sharded(tmp_path, state, n_shards=3)
    on_disk = wbfe.score(index, metrics="bfe")
    in_memory = wbfe.score({k: v.clone() for k, v in state.items()}, metrics="bfe")
    # Shard 1 holds l0, l3, l5; l1 comes later, in shard 2, when shard 1's handle is closed.
    assert {s["name"]: s["reason"] for s in on_disk.skipped}["l1.weight"] == "tied: identical to l5.weight"
    assert {s["name"]: s["reason"] for s in in_memory.skipped}["l5.weight"] == "tied: identical to l1.weight"
    disk = {x["name"].replace("l5", "l1"): x["bfe"] for x in on_disk.layers}
    assert disk == {x["name"]: x["bfe"] for x in in_memory.layers}
    assert sorted(disk) == [f"l{i}.weight" for i in range(5)]


def _assert_scores_agree(st_file: Path, device: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every layer's BFE-W on ``device`` within 1e-8 relative of the numpy/LAPACK path's, BFE-only
    and with the eigenvalues; ``cpu`` runs the torch code path that serves CUDA."""
    from wbfe.linalg import spectra

    cpu = {m: wbfe.score(st_file, metrics=m, device="cpu") for m in ("bfe", "bfe,htsr")}
    if device == "cpu":
        monkeypatch.setattr(spectra, "_TORCH_ON_CPU", True)
    for metrics, reference in cpu.items():
        other = wbfe.score(st_file, metrics=metrics, device=device)
        assert other.model["device"].startswith(device)
        assert [x["name"] for x in other.layers] == [x["name"] for x in reference.layers]
        for x, y in zip(other.layers, reference.layers):
            assert x["bfe"] == pytest.approx(y["bfe"], rel=1e-8), x["name"]
            if metrics != "bfe":
                assert x["log_norm"] == pytest.approx(y["log_norm"], rel=1e-10), x["name"]


def test_torch_code_path_scores_as_the_cpu_path(st_file: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _assert_scores_agree(st_file, "cpu", monkeypatch)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_score_equals_cpu_score(st_file: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _assert_scores_agree(st_file, "cuda", monkeypatch)


def test_source_head_hint_and_quant_scheme_reach_the_output(monkeypatch: pytest.MonkeyPatch) -> None:
    """A source that declares its head (a format or config that says so) and a dequantised tensor:
    the head is the declared one, even against the name rules, and each row carries its scheme."""
    from wbfe import scoring
    from wbfe.sources import MemorySource
    from wbfe.sources._base import TensorEntry

    g = torch.Generator().manual_seed(0)
    state = {"classifier.weight": torch.randn(10, 30, generator=g), "tok.weight": torch.randn(40, 30, generator=g)}

    class Declared(MemorySource):
        head_hint = "tok.weight"

        def entries(self):  # type: ignore[no-untyped-def]
            for entry in super().entries():
                yield TensorEntry(entry.name, entry.shape, entry.dtype, entry.load,
                                  quant="fp8-e4m3-block128" if entry.name == "tok.weight" else None)

    monkeypatch.setattr(scoring, "open_source", lambda ref, **_: Declared(ref))
    result = wbfe.score(state, metrics="bfe")
    assert result.summary["head"] == "tok.weight" and result.summary["head_source"] == "config"
    assert {row["name"]: row["quant"] for row in result.layers} == {"classifier.weight": None, "tok.weight": "fp8-e4m3-block128"}
    overridden = wbfe.score(state, metrics="bfe", head="classifier")
    assert overridden.summary["head"] == "classifier.weight" and overridden.summary["head_source"] == "option"
    monkeypatch.undo()
    by_name = wbfe.score(state, metrics="bfe")
    assert by_name.summary["head"] == "classifier.weight" and by_name.summary["head_source"] == "name"


def test_compute_many_gets_runs_of_equal_shapes_and_rows_equal_compute(tmp_path, monkeypatch) -> None:
    # Equal-shaped matrices (an MoE layer's experts) reach a group's compute_many together, though
    # stored interleaved with another shape and with a skipped tensor between them; a lone matrix
    # goes through compute; rows come in stream order.
    import dataclasses

    import torch
    from safetensors.torch import save_file

    from wbfe.metrics import htsr

    g = torch.Generator().manual_seed(5)
    tensors = {f"model.layers.0.mlp.experts.{e}.gate_proj.weight": torch.randn(32, 64, generator=g) for e in range(10)}
    tensors.update({f"model.layers.0.mlp.experts.{e}.down_proj.weight": torch.randn(64, 32, generator=g) / 3
                    for e in range(10)})  # stored before each expert's gate_proj: the shapes alternate
    tensors["model.layers.0.mlp.experts.6.gate_proj.weight"] = torch.zeros(32, 64)  # skipped: all zero
    tensors["model.layers.0.self_attn.q_proj.weight"] = torch.randn(64, 64, generator=g)
    save_file(tensors, str(tmp_path / "model.safetensors"))
    plain = wbfe.score(tmp_path, metrics=("bfe", "htsr"))

    calls: list[int] = []

    def many(specs, options):
        calls.append(len(specs))
        return [htsr.GROUP.compute(spec, options) for spec in specs]

    monkeypatch.setattr(htsr, "GROUP", dataclasses.replace(htsr.GROUP, compute_many=many))
    batched = wbfe.score(tmp_path, metrics=("bfe", "htsr"))
    assert calls == [10, 9]  # the down projections, then the gates but the all-zero one
    assert [s["name"] for s in batched.skipped] == ["model.layers.0.mlp.experts.6.gate_proj.weight"]
    assert [layer["name"] for layer in batched.layers] == [layer["name"] for layer in plain.layers]
    # json writes NaN as NaN, so equal dumps mean equal rows, NaN columns included.
    assert json.dumps(batched.layers, sort_keys=True) == json.dumps(plain.layers, sort_keys=True)


def test_norms_of_a_small_matrix_are_computed_and_only_the_fits_need_min_eigs() -> None:
    """A 7-class head has 7 eigenvalues, fewer than --min-eigs: its norms, ranks and entropy are
    computed (they are no tail fits, and WeightWatcher reports them), its fits are NaN with the reason."""
    import math

    import numpy as np
    import torch

    import wbfe

    w = torch.randn(7, 40, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    row = wbfe.score({"classifier.weight": w}).layers[0]
    e = np.linalg.eigvalsh((w @ w.T).numpy())
    assert row["n_eigs"] == 7
    assert row["log_norm"] == pytest.approx(math.log10(e.sum()), rel=1e-12)
    assert row["log_spectral_norm"] == pytest.approx(math.log10(e.max()), rel=1e-12)
    assert row["stable_rank"] == pytest.approx(e.sum() / e.max(), rel=1e-12)
    p = e / e.sum()
    assert row["entropy"] == pytest.approx(-(p * np.log(p)).sum() / math.log(7), rel=1e-10)
    fits = {"alpha", "sigma", "xmin", "num_pl_spikes", "alpha_weighted", "log_alpha_norm", "tpl_alpha", "tpl_lambda",
            "bulk_max", "num_spikes", "mp_softrank"}
    assert set(row["reasons"]) == fits
    assert all(why == "too few eigenvalues for a tail fit: 7 < min_eigs=10" for why in row["reasons"].values())
    # With --min-eigs 5 the fits run, and fail for their own reason (a tail needs 10 values).
    small = wbfe.score({"classifier.weight": w}, min_eigs=5).layers[0]
    assert small["reasons"]["alpha"].startswith("power-law fit: only 7 positive value(s)")


def test_repr_is_one_line_and_html_a_table() -> None:
    """A notebook shows repr(result): the source, the counts and the headline numbers, not every row."""
    import torch

    import wbfe

    state = {f"layers.{k}.weight": torch.randn(64, 48, generator=torch.Generator().manual_seed(k)) for k in range(40)}
    result = wbfe.score(state)
    text = repr(result)
    assert "\n" not in text and len(text) < 400, text
    assert text.startswith("ModelScore(source='<dict>', layers=40, skipped=0, head=")
    assert f"bfe_mean={result.summary['bfe_mean']:.6g}" in text
    page = result._repr_html_()
    assert page.startswith("<table>") and "<th>layers</th><td>40</td>" in page
    assert len(result.to_json()) > 20 * len(text)  # the rows are still all there
