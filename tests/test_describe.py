"""wbfe.describe (what a score would analyse, from the headers) and wbfe.esd (one matrix's
eigenvalues), against a score of the same checkpoint and against numpy and WeightWatcher."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

import wbfe


def _checkpoint(path: Path) -> Path:
    g = torch.Generator().manual_seed(1)
    save_file({"features.0.weight": torch.randn(8, 3, 3, 3, generator=g), "features.0.bias": torch.zeros(8),
               "fc1.weight": torch.randn(64, 72, generator=g), "classifier.weight": torch.randn(10, 64, generator=g),
               "tiny.weight": torch.randn(1, 5, generator=g)}, str(path))
    return path


def test_describe_lists_what_score_analyses(tmp_path: Path) -> None:
    path = _checkpoint(tmp_path / "m.safetensors")
    d = wbfe.describe(path)
    s = wbfe.score(path, metrics="bfe")
    assert [m["name"] for m in d.matrices] == [row["name"] for row in s.layers]
    assert [x["name"] for x in d.skipped] == [x["name"] for x in s.skipped]
    assert [x["reason"] for x in d.skipped] == [x["reason"] for x in s.skipped]
    assert (d.head, d.head_source) == (s.summary["head"], s.summary["head_source"]) == ("classifier.weight", "name")
    for m, row in zip(d.matrices, s.layers):
        assert (m["role"], m["form"], m["n_eigs"]) == (row["role"], row["form"], row["n_eigs"])
        assert (m["N"], m["M"]) == (max(row["rows"], row["cols"]), min(row["rows"], row["cols"]))
    assert "sha256" not in d.model  # nothing is hashed


def test_a_layers_pattern_that_selects_nothing_is_refused_as_score_refuses_it(tmp_path: Path) -> None:
    # describe printed an empty table and "head: None (None)" with exit 0, where a score is refused
    from typer.testing import CliRunner

    from wbfe_cli.main import app

    path = _checkpoint(tmp_path / "m.safetensors")
    with pytest.raises(wbfe.NoUsableMatrixError, match="no usable weight matrix"):
        wbfe.score(path, layers="nothing")
    message = f"{path}: --layers 'nothing' selects no weight matrix of its 5 tensors: leave --layers out to list them all"
    with pytest.raises(wbfe.NoUsableMatrixError) as info:
        wbfe.describe(path, layers="nothing")
    assert str(info.value) == message
    result = CliRunner().invoke(app, ["describe", str(path), "--layers", "nothing"])
    assert result.exit_code == 2 and result.stderr.strip() == f"wbfe: error: {message}"
    assert [m["name"] for m in wbfe.describe(path, layers="fc1").matrices] == ["fc1.weight"]


def test_describe_skips_a_tied_head_as_score_does(tmp_path: Path) -> None:
    # lm_head.weight sharing the embedding's storage (torch.save of a tied model) was listed as a matrix and named the
    # head ("name"), where a score skips it as tied and names the embedding the head ("tied")
    g = torch.Generator().manual_seed(2)
    embed = torch.randn(100, 32, generator=g)
    torch.save({"embed.weight": embed, "fc.weight": torch.randn(64, 32, generator=g), "lm_head.weight": embed},
               tmp_path / "tied.pt")
    d = wbfe.describe(tmp_path / "tied.pt")
    s = wbfe.score(tmp_path / "tied.pt", metrics="bfe")
    assert [m["name"] for m in d.matrices] == [row["name"] for row in s.layers] == ["embed.weight", "fc.weight"]
    assert d.skipped == s.skipped == [{"name": "lm_head.weight", "reason": "tied: shares storage with embed.weight",
                                       "shape": [100, 32], "dtype": "float32"}]
    assert (d.head, d.head_source) == (s.summary["head"], s.summary["head_source"]) == ("embed.weight", "tied")


def test_describe_reads_no_tensor(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Nothing but the header: every entry's load() would raise, and describe never calls it."""
    from wbfe.sources.safetensors_files import SafetensorsSource

    path = _checkpoint(tmp_path / "m.safetensors")
    original = SafetensorsSource.entries

    def entries(self: SafetensorsSource):  # type: ignore[no-untyped-def]
        for entry in original(self):
            def fail() -> None:
                raise AssertionError(f"{entry.name} was read")
            yield type(entry)(name=entry.name, shape=entry.shape, dtype=entry.dtype, load=fail)  # type: ignore[arg-type]

    monkeypatch.setattr(SafetensorsSource, "entries", entries)
    d = wbfe.describe(path, conv="slices")
    assert [m["n_slices"] for m in d.matrices if m["name"] == "features.0.weight"] == [9]


def test_describe_hashes_no_byte(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The files' digest is computed only when asked for, on the calling thread, and describe never asks: nothing
    is hashed, without cancelling anything."""
    from wbfe.sources import _base

    def fail(path: Path, *_: object) -> None:
        raise AssertionError(f"{path} was hashed")

    monkeypatch.setattr(_base, "file_sha256", fail)
    d = wbfe.describe(_checkpoint(tmp_path / "m.safetensors"))
    assert "sha256" not in d.model and d.head == "classifier.weight"


def test_esd_against_numpy_and_weightwatcher(tmp_path: Path) -> None:
    path = _checkpoint(tmp_path / "m.safetensors")
    from safetensors.torch import load_file

    fc1 = load_file(str(path))["fc1.weight"].double().numpy()
    ours = wbfe.esd(path, "fc1")
    np.testing.assert_allclose(ours, np.sort(np.linalg.eigvalsh(fc1 @ fc1.T)), rtol=1e-10)
    ww = pytest.importorskip("weightwatcher")
    model = torch.nn.Sequential(torch.nn.Linear(72, 64, bias=False))
    with torch.no_grad():
        model[0].weight.copy_(torch.from_numpy(fc1).float())
    reference = np.sort(np.asarray(ww.WeightWatcher(model=model).get_ESD()))
    # WeightWatcher's SVD runs in float64 on the float32 weights, as ours does: they agree to ~1e-13
    np.testing.assert_allclose(ours, reference, rtol=1e-9)


def test_esd_suggests_names(tmp_path: Path) -> None:
    path = _checkpoint(tmp_path / "m.safetensors")
    with pytest.raises(wbfe.InvalidOptionError, match="did you mean 'fc1.weight'"):
        wbfe.esd(path, "fc1.weights")


def test_esd_of_an_in_memory_state_dict_names_it_in_one_line() -> None:
    # The message held the state dict's repr, every value of every tensor, twice.
    state = {"fc1.weight": torch.randn(64, 72, generator=torch.Generator().manual_seed(0))}
    with pytest.raises(wbfe.InvalidOptionError) as caught:
        wbfe.esd(state, "fc2")
    assert str(caught.value) == ("no tensor named 'fc2' in <dict>; nothing close: known names include 'fc1.weight' "
                                 "(wbfe describe <dict> lists them)")


def test_a_description_shows_in_one_line() -> None:
    d = wbfe.describe({"fc.weight": torch.zeros(10, 64), "fc.bias": torch.zeros(10)})
    assert repr(d) == "Description(source='<dict>', matrices=1, skipped=1, head='fc.weight')"


@pytest.mark.parametrize("exponent", [-600, -490, -300, 300, 490, 600])
def test_esd_far_from_one_is_exact_or_refused(exponent: int) -> None:
    # At 2^±600 the eigenvalues (2^±1200·λ) leave float64: math.exp raised OverflowError, or they all became 0.
    # At 2^±490 they are solved scaled (log_scale ≠ 0) and scaled back; at 2^±300 they need no scaling.
    from wbfe.linalg.spectra import DegenerateMatrixError

    w = np.random.default_rng(0).standard_normal((20, 30))
    state = {"fc.weight": torch.from_numpy(w * 2.0**exponent)}
    if abs(exponent) > 500:
        with pytest.raises(DegenerateMatrixError, match="^fc.weight: its eigenvalues leave float64's range"):
            wbfe.esd(state, "fc")
    else:
        want = np.sort(np.linalg.eigvalsh(w @ w.T)) * 2.0 ** (2 * exponent)
        np.testing.assert_allclose(wbfe.esd(state, "fc"), want, rtol=1e-10)


def test_describe_imports_no_torch(tmp_path: Path) -> None:
    """Planning reads headers: a fresh process describing a safetensors checkpoint never imports torch."""
    import subprocess
    import sys

    path = _checkpoint(tmp_path / "m.safetensors")
    code = ("import sys, wbfe; d = wbfe.describe(sys.argv[1]); "
            "print(len(d.matrices), 'torch' in sys.modules)")
    run = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, check=True)
    assert run.stdout.split() == ["3", "False"]  # tiny.weight (1 eigenvalue) is skipped


def test_describe_command(tmp_path: Path) -> None:
    import json

    from typer.testing import CliRunner

    from wbfe_cli.main import app

    path = _checkpoint(tmp_path / "m.safetensors")
    out = CliRunner().invoke(app, ["describe", str(path), "--format", "json"])
    assert out.exit_code == 0, out.output
    assert json.loads(out.stdout) == json.loads(wbfe.describe(path).to_json())
    table = CliRunner().invoke(app, ["describe", str(path)])
    assert table.exit_code == 0
    assert table.stdout.endswith("head: classifier.weight (name); 3 matrices\nskipped 2 tensors: 1 1-D tensor (bias, "
                                 "norm scale or buffer), 1 too small (see --format json for each)\n")
    bad = CliRunner().invoke(app, ["describe", str(path), "--layers", "(a+)+$"])
    assert bad.exit_code == 2 and bad.stderr.startswith("wbfe: error: --layers")


def test_describe_writes_to_a_file_as_score_does(tmp_path: Path) -> None:
    import json

    from typer.testing import CliRunner

    from wbfe_cli.main import app

    path = _checkpoint(tmp_path / "m.safetensors")
    for fmt, name in (("json", "d.json"), ("table", "d.txt")):
        shown = CliRunner().invoke(app, ["describe", str(path), "--format", fmt])
        written = CliRunner().invoke(app, ["describe", str(path), "--format", fmt, "-o", str(tmp_path / name)])
        assert written.exit_code == 0, written.output
        assert written.stdout == "" and written.stderr == f"wrote {tmp_path / name}\n"
        assert (tmp_path / name).read_text() == shown.stdout
    assert json.loads((tmp_path / "d.json").read_text())["head"] == "classifier.weight"
    before = path.read_bytes()
    refused = CliRunner().invoke(app, ["describe", str(path), "-o", str(path)])  # never over what it reads
    assert refused.exit_code == 2 and refused.stderr.startswith("wbfe: error: ") and path.read_bytes() == before


def test_describe_refuses_options_and_keywords_together() -> None:
    # The keywords were silently ignored when options was given: layers="fc2" described fc1 too.
    state = {"fc1.weight": torch.ones(64, 72), "fc2.weight": torch.ones(10, 64)}
    with pytest.raises(wbfe.InvalidOptionError, match="either as options=ScoreOptions"):
        wbfe.describe(state, layers="fc2", options=wbfe.ScoreOptions())
    kept = wbfe.describe(state, options=wbfe.ScoreOptions(layers="fc2"))
    assert [m["name"] for m in kept.matrices] == ["fc2.weight"]
