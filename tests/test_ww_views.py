"""``wbfe score --intra`` and ``--conv fft`` (WeightWatcher 0.7.7's ``intra=True`` and ``conv2d_fft=True``)
through the CLI and the library, against weightwatcher's ``analyze`` on the same models."""

from __future__ import annotations

import contextlib
import io
import json
import logging
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file
from typer.testing import CliRunner

import wbfe
from wbfe.errors import InvalidOptionError
from wbfe_cli.main import app

# The columns weightwatcher writes for these rows (and N, M, checked separately).
COLUMNS = ("alpha", "xmin", "num_pl_spikes", "log_norm", "log_spectral_norm", "stable_rank", "matrix_rank", "entropy",
           "lambda_max", "num_spikes", "bulk_max", "alpha_weighted", "log_alpha_norm")
INTRA_COLUMNS = COLUMNS + ("sv_min", "rank_loss", "mp_softrank")
runner = CliRunner()


def heavy(shape: tuple[int, ...], seed: int) -> torch.Tensor:
    return torch.from_numpy(np.random.default_rng(seed).standard_t(3.0, size=shape).astype(np.float32))


def _with_heavy_weights(model: torch.nn.Module) -> torch.nn.Module:
    with torch.no_grad():
        for k, (_, p) in enumerate(sorted(model.named_parameters())):
            p.copy_(heavy(tuple(p.shape), k) * (0.05 if p.ndim > 1 else 0.01))
    return model


def _mlp() -> torch.nn.Module:
    """An MLP whose module order is not its names' alphabetical order (``hidden`` < ``out`` < ``proj``)."""
    model = torch.nn.Sequential()
    model.add_module("proj", torch.nn.Linear(300, 200))
    model.add_module("hidden", torch.nn.Linear(200, 150))
    model.add_module("act", torch.nn.ReLU())
    model.add_module("out", torch.nn.Linear(150, 100))
    model.add_module("tiny", torch.nn.Linear(100, 4))  # 4 < min_evals: WeightWatcher leaves it out of the chain
    model.add_module("last", torch.nn.Linear(4, 40))
    model.add_module("head", torch.nn.Linear(100, 40))
    return _with_heavy_weights(model)


def _convnet() -> torch.nn.Module:
    model = torch.nn.Sequential(torch.nn.Conv2d(16, 32, 3), torch.nn.Conv2d(32, 24, 3), torch.nn.Conv2d(12, 8, 5),
                                torch.nn.Conv2d(2, 1, 9))  # the last: out + in < kh + kw, FFT over the channels
    return _with_heavy_weights(model)


class _FixtureCNN(torch.nn.Module):
    """The embedded Fashion-MNIST CNN's modules, in its order, to load the fixture's weights into."""

    def __init__(self) -> None:
        super().__init__()
        self.features = torch.nn.Sequential(torch.nn.Conv2d(1, 16, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
                                            torch.nn.Conv2d(16, 32, 3, padding=1))
        self.fc1 = torch.nn.Linear(1568, 128)
        self.classifier = torch.nn.Linear(128, 10)


def _analyze(model: torch.nn.Module, seed: int = 0, **options: Any) -> Any:
    ww = pytest.importorskip("weightwatcher")
    np.random.seed(seed)  # WeightWatcher's intra masks come from NumPy's global generator
    logging.disable(logging.WARNING)
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")
            return ww.WeightWatcher(model=model).analyze(randomize=False, plot=False, mp_fit=True, **options)
    finally:
        logging.disable(logging.NOTSET)


def _save(model: torch.nn.Module, path: Path) -> Path:
    save_file({k: v.detach().contiguous() for k, v in model.state_dict().items()}, str(path))
    return path


def _score_cli(*args: str) -> dict[str, Any]:
    result = runner.invoke(app, ["score", *args, "--format", "json"])
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)


def _assert_rows_equal(ours: list[dict[str, Any]], details: Any, columns: tuple[str, ...]) -> None:
    assert len(ours) == len(details)
    for row, (_, ref) in zip(ours, details.iterrows()):
        assert (max(row["rows"], row["cols"]), min(row["rows"], row["cols"])) == (ref["N"], ref["M"]), row["name"]
        assert row["n_eigs"] == ref["num_evals"], row["name"]
        for column in columns:
            want = float(ref[column])
            assert row[column] == pytest.approx(want, rel=1e-6, abs=1e-12), (row["name"], column, want)


# ---------------------------------------------------------------- --intra


def test_intra_in_memory_model_equals_weightwatcher() -> None:
    """The chain follows the module order (as WeightWatcher's layers do), not the names' order."""
    model = _mlp()
    details = _analyze(model, seed=7, intra=True)
    result = wbfe.score(model, metrics="htsr", ww_compatible=True, intra=True, seed=7)
    products = [row for row in result.layers if row["role"] == "intra"]
    assert [row["name"] for row in products] == [
        "proj.weight X hidden.weight", "hidden.weight X out.weight", "out.weight X head.weight"]
    _assert_rows_equal(products, details, INTRA_COLUMNS)


def test_intra_cli_equals_weightwatcher(tmp_path: Path) -> None:
    model = torch.nn.Sequential(torch.nn.Linear(300, 200), torch.nn.ReLU(), torch.nn.Linear(200, 150),
                                torch.nn.Linear(150, 100), torch.nn.Linear(100, 40))
    model = _with_heavy_weights(model)
    path = _save(model, tmp_path / "mlp.safetensors")
    details = _analyze(model, seed=5, intra=True)
    data = _score_cli(str(path), "--intra", "--ww-compatible", "--metrics", "htsr", "--seed", "5")
    products = [row for row in data["layers"] if row["role"] == "intra"]
    assert [row["name"] for row in products] == ["0.weight X 2.weight", "2.weight X 3.weight", "3.weight X 4.weight"]
    _assert_rows_equal(products, details, INTRA_COLUMNS)
    # each product's row follows its second matrix's, with the same columns as every other row
    names = [row["name"] for row in data["layers"]]
    assert names == ["0.weight", "2.weight", "0.weight X 2.weight", "3.weight", "2.weight X 3.weight", "4.weight",
                     "3.weight X 4.weight"]
    assert all(set(row) == set(data["layers"][0]) for row in data["layers"])
    assert all(row["convention"] == "intra" and row["dtype"] == "float64" for row in products)
    assert data["model"]["options"]["intra"] is True
    # the summary says they are there, and leaves them out of the model's own numbers
    plain = _score_cli(str(path), "--ww-compatible", "--metrics", "htsr")  # no product: nothing drawn from a seed
    assert data["summary"]["intra"]["n"] == 3 and "intra" not in plain["summary"]
    assert data["summary"]["alpha_mean"] == plain["summary"]["alpha_mean"]
    assert data["summary"]["head"] == plain["summary"]["head"] == "4.weight"
    assert data["summary"]["by_role"]["intra"]["alpha_mean"] == pytest.approx(
        np.mean([row["alpha"] for row in products]), rel=1e-12)
    assert [row for row in data["layers"] if row["role"] != "intra"] == plain["layers"]


def test_intra_without_sparsify_definition() -> None:
    """The default (non-WeightWatcher) mode scores the same product matrices: its BFE-W is of their
    singular values, written out with numpy (sparsify mask drawn from the legacy generator)."""
    w0, w1 = heavy((60, 80), 1), heavy((50, 60), 2)
    result = wbfe.score({"a.weight": w0, "b.weight": w1}, metrics="htsr", intra=True, seed=3)
    (row,) = [r for r in result.layers if r["role"] == "intra"]
    a, b = w0.double().numpy().T, w1.double().numpy().T  # shared side 60
    s = np.random.RandomState(3).randint(2, size=60 * 60).reshape(60, 60)
    x = a @ s @ b / (np.linalg.norm(a) * np.linalg.norm(b) + np.sqrt(np.linalg.norm(s)))
    sv = np.linalg.svd(x, compute_uv=False)
    assert row["name"] == "a.weight X b.weight" and (row["rows"], row["cols"]) == (80, 50)
    assert row["lambda_max"] == pytest.approx(sv.max(), rel=1e-10)  # singular values, not their squares
    assert row["log_norm"] == pytest.approx(np.log10(np.sum(sv)), rel=1e-10)


# ---------------------------------------------------------------- --conv fft


def test_the_fft_view_refuses_a_weight_that_is_not_a_conv_kernel() -> None:
    from wbfe.linalg.conv_fft import conv2d_fft_eigenvalues

    with pytest.raises(ValueError, match=r"^expected a 4-D conv weight \(out, in, kh, kw\), got shape \(3, 3\)$"):
        conv2d_fft_eigenvalues(np.ones((3, 3)))


def test_conv_fft_cli_equals_weightwatcher(tmp_path: Path) -> None:
    model = _convnet()
    path = _save(model, tmp_path / "conv.safetensors")
    details = _analyze(model, conv2d_fft=True)
    data = _score_cli(str(path), "--conv", "fft", "--ww-compatible", "--metrics", "htsr")
    assert [row["convention"] for row in data["layers"]] == ["fft"] * 4
    assert data["model"]["options"]["conv"] == "fft"
    _assert_rows_equal(data["layers"], details, COLUMNS)


def test_conv_fft_on_the_fixture_equals_weightwatcher() -> None:
    model = _FixtureCNN()
    model.load_state_dict(load_file(str(wbfe.default_checkpoint())))
    details = _analyze(model, conv2d_fft=True)
    data = _score_cli(str(wbfe.default_checkpoint()), "--conv", "fft", "--ww-compatible", "--metrics", "htsr")
    ours = {row["name"].removesuffix(".weight").split(".")[-1]: row for row in data["layers"]}  # WW: "0", "fc1"
    assert sorted(ours) == sorted(details["name"])
    for name in details["name"]:
        _assert_rows_equal([ours[name]], details[details["name"] == name], COLUMNS)
    assert ours["3"]["convention"] == "fft" and ours["fc1"]["convention"] == "dense"


def test_conv_fft_library_keyword_and_default_mode() -> None:
    model = _convnet()
    fft = wbfe.score(model, metrics="bfe,htsr", conv="fft")
    assert [row["convention"] for row in fft.layers] == ["fft"] * 4
    # WeightWatcher mode changes the fits, not the view: the same eigenvalues, the same log_norm
    compat = wbfe.score(model, metrics="htsr", conv="fft", ww_compatible=True)
    for a, b in zip(fft.layers, compat.layers):
        assert a["log_norm"] == pytest.approx(b["log_norm"], rel=1e-12) and a["n_eigs"] == b["n_eigs"]


# ---------------------------------------------------------------- refusals


@pytest.mark.parametrize(("args", "message"), [
    (["--intra", "--metrics", "htsr,vectors"], "--intra: metric group vectors needs the matrices themselves"),
    (["--conv", "fft", "--metrics", "rand"], "--conv fft: metric group rand needs the matrices themselves"),
])
def test_bad_combination_is_one_line_exit_2(args: list[str], message: str, tmp_path: Path) -> None:
    out_file = tmp_path / "never.json"
    result = runner.invoke(app, ["score", *args, "--output", str(out_file)])
    assert result.exit_code == 2, result.stdout
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("wbfe: error: ")
    assert message in result.stderr and not out_file.exists()
    with pytest.raises(InvalidOptionError, match="needs the matrices themselves"):
        wbfe.score(_convnet(), intra=True, metrics="vectors")


def test_report_and_compare_refuse(tmp_path: Path) -> None:
    result = runner.invoke(app, ["report", "--intra", "--output", str(tmp_path / "r.html")])
    assert result.exit_code == 2 and result.stderr.startswith("wbfe: error: ")
    assert "--intra and --conv fft do not apply" in result.stderr and result.stderr.count("\n") == 1
    result = runner.invoke(app, ["report", "--conv", "fft", "--output", str(tmp_path / "r.html")])
    assert result.exit_code == 2 and "--intra and --conv fft do not apply" in result.stderr
    assert not (tmp_path / "r.html").exists()
    result = runner.invoke(app, ["compare", str(wbfe.default_checkpoint()), str(wbfe.default_checkpoint()), "--intra"])
    assert result.exit_code == 2 and "--intra" in result.stderr  # compare has no such option


def test_options_round_trip() -> None:
    from wbfe.options import ScoreOptions

    options = ScoreOptions(intra=True, conv="fft", ww_compatible=True)
    assert options.conv == "fft"  # WeightWatcher mode keeps the FFT view (it turns only flatten into slices)
    assert options.to_dict()["intra"] is True and "intra" not in ScoreOptions().to_dict()
    with pytest.raises(InvalidOptionError, match="'flatten', 'slices' or 'fft'"):
        ScoreOptions(conv="fourier")


@pytest.mark.parametrize("conv", ["slices", "fft"])
@pytest.mark.parametrize("exponent, what", [(200, "entries up to {:.1e} overflow it"),
                                             (-160, "entries of at most {:.1e} are 0 in it")])
def test_weightwatchers_float32_conv_views_say_when_the_cast_breaks_a_finite_tensor(conv: str, exponent: int,
                                                                                     what: str) -> None:
    # WeightWatcher takes a conv weight in float32. A finite float64 kernel beyond float32's range was skipped as
    # "non-finite values (NaN or Inf)", one below it as an "all-zero matrix": neither is true of the tensor.
    kernel = torch.tensor(np.random.default_rng(3).standard_t(3, (16, 8, 3, 3))) * 2.0**exponent
    state = {"c.weight": kernel, "z.weight": torch.randn(10, 80, dtype=torch.float64)}
    ww = wbfe.score(state, metrics="bfe", ww_compatible=True, conv=conv)
    view = "conv2d slice view" if conv == "slices" else "conv2d_fft view"
    top = float(kernel.abs().max())
    assert 3.5e38 < top or top < 1e-45
    assert [(s["name"], s["reason"]) for s in ww.skipped] == [
        ("c.weight", f"WeightWatcher's {view} is float32: {what.format(top)}")]
    # wbfe's slices work in float64 and score the kernel; fft is WeightWatcher's float32 view in either mode
    plain = wbfe.score(state, metrics="bfe", conv=conv)
    if conv == "slices":
        assert "c.weight" in [layer["name"] for layer in plain.layers]
    else:
        assert plain.skipped == ww.skipped
