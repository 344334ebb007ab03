"""``wbfe score`` through the CLI: output formats equal the library, bad input exits 2 with one line."""

from __future__ import annotations

import csv
import io
import json
import math
import os
import struct
from pathlib import Path

import torch
from safetensors.torch import save_file
from typer.testing import CliRunner

import wbfe
from tests.conftest import write_sharded
from wbfe_cli.main import app

runner = CliRunner()


def _run(*args: str) -> tuple[int, str, str]:
    result = runner.invoke(app, list(args))
    return result.exit_code, result.stdout, result.stderr


def test_json_equals_library(st_file: Path) -> None:
    code, out, _ = _run("score", str(st_file), "--format", "json", "--metrics", "bfe")
    assert code == 0
    data = json.loads(out)
    lib = wbfe.score(st_file, metrics="bfe")
    assert set(data) == {"model", "layers", "skipped", "summary"}
    assert [layer["name"] for layer in data["layers"]] == [layer["name"] for layer in lib.layers]
    for got, want in zip(data["layers"], lib.layers):
        assert got["bfe"] == want["bfe"] and got["lambda"] == want["lambda"]
        assert {"name", "role", "shape", "gamma", "form", "lambda", "bfe"} <= set(got)
    assert data["summary"]["bfe_head"] == lib.summary["bfe_head"]
    assert data["summary"]["head"] == "classifier.weight"
    assert data["model"]["sha256"] == lib.model["sha256"]
    assert data["model"]["options"]["metrics"] == ["bfe"]
    assert {"torch", "numpy", "wbfe", "python"} <= set(data["model"]["versions"])
    # every tensor accounted for
    names = {layer["name"] for layer in data["layers"]} | {s["name"] for s in data["skipped"]}
    with wbfe.sources.open_source(st_file) as source:
        assert names == {e.name for e in source.entries()}


def test_csv_and_table(st_file: Path) -> None:
    code, out, _ = _run("score", str(st_file), "--format", "csv", "--metrics", "bfe")
    assert code == 0
    rows = list(csv.DictReader(io.StringIO(out)))
    lib = wbfe.score(st_file, metrics="bfe")
    assert [float(r["bfe"]) for r in rows] == [layer["bfe"] for layer in lib.layers]
    code, out, _ = _run("score", str(st_file), "--metrics", "bfe")
    assert code == 0
    assert "classifier.weight" in out and "bfe_head" in out and "skipped" in out


def test_options_reach_the_library(st_file: Path) -> None:
    code, out, _ = _run("score", str(st_file), "--format", "json", "--metrics", "bfe", "--lambda", "0.5",
                        "--conv", "slices", "--layers", "features|classifier", "--head", "features.0")
    assert code == 0
    data = json.loads(out)
    lib = wbfe.score(st_file, metrics="bfe", lam=0.5, conv="slices", layers="features|classifier", head="features.0")
    assert [(x["name"], x["bfe"], x["lambda"]) for x in data["layers"]] == [(x["name"], x["bfe"], x["lambda"]) for x in lib.layers]
    assert all(x["lambda"] == 0.5 for x in data["layers"])
    conv = next(x for x in data["layers"] if x["name"] == "features.0.weight")
    assert conv["convention"] == "slices" and conv["n_slices"] == 9
    assert data["summary"]["head"] == "features.0.weight"
    assert any(s["reason"] == "not selected by --layers" for s in data["skipped"])


def test_output_file_is_written_atomically(st_file: Path, tmp_path: Path) -> None:
    out_file = tmp_path / "out" / "result.json"
    code, out, err = _run("score", str(st_file), "--format", "json", "--metrics", "bfe", "--output", str(out_file))
    assert code == 0 and out == "" and f"wrote {out_file}" in err
    assert json.loads(out_file.read_text())["summary"]["head"] == "classifier.weight"
    assert [p.name for p in out_file.parent.iterdir()] == ["result.json"]


def _one_line_exit_2(args: list[str], message: str, tmp_path: Path) -> None:
    out_file = tmp_path / "should-not-exist.json"
    code, out, err = _run(*args, "--output", str(out_file))
    assert code == 2, (out, err)
    assert err.count("\n") == 1 and err.startswith("wbfe: error: ")
    assert message in err
    assert "Traceback" not in err + out
    assert not out_file.exists() and not list(tmp_path.glob(".should-not-exist*"))


def test_bad_inputs_exit_2_with_one_line(tmp_path: Path, state_dict: dict) -> None:
    _one_line_exit_2(["score", str(tmp_path / "missing.safetensors")], "no such file or folder", tmp_path)
    _one_line_exit_2(["score", "nobody/nothing"], "no such model in the local Hugging Face cache", tmp_path)

    corrupt = tmp_path / "corrupt.safetensors"
    corrupt.write_bytes(struct.pack("<Q", 12) + b"{not json!!}" + b"\0" * 8)
    _one_line_exit_2(["score", str(corrupt)], "corrupt safetensors header", tmp_path)

    good = tmp_path / "good.safetensors"
    save_file(state_dict, str(good))
    truncated = tmp_path / "truncated.safetensors"
    truncated.write_bytes(good.read_bytes()[:-64])
    _one_line_exit_2(["score", str(truncated)], "truncated safetensors file", tmp_path)

    index = write_sharded(tmp_path / "sharded", state_dict)
    shard = index.parent / "model-00003-of-00003.safetensors"
    shard.write_bytes(shard.read_bytes()[:-8])
    _one_line_exit_2(["score", str(index.parent)], "model-00003-of-00003.safetensors: truncated", tmp_path)

    nan = tmp_path / "nan.safetensors"
    save_file({"fc.weight": torch.full((12, 20), math.nan)}, str(nan))
    _one_line_exit_2(["score", str(nan)], "no usable weight matrix (1 tensor skipped — fc.weight: non-finite values",
                     tmp_path)

    zero = tmp_path / "zero.safetensors"
    save_file({"fc.weight": torch.zeros(12, 20)}, str(zero))
    _one_line_exit_2(["score", str(zero)], "fc.weight: all-zero matrix", tmp_path)

    quantized = tmp_path / "int8.safetensors"
    save_file({"fc.weight": torch.ones(12, 20, dtype=torch.int8)}, str(quantized))
    _one_line_exit_2(["score", str(quantized)], "integer tensor (int8)", tmp_path)

    class Evil:
        def __reduce__(self) -> tuple:
            return (os.system, ("true",))

    evil = tmp_path / "evil.pt"
    torch.save({"w": torch.ones(12, 12), "x": Evil()}, evil)
    _one_line_exit_2(["score", str(evil)], "refused to load a pickle that needs code", tmp_path)

    _one_line_exit_2(["score", str(good), "--metrics", "bfee"], "unknown metric group 'bfee'; did you mean 'bfe'?", tmp_path)
    _one_line_exit_2(["score", str(good), "--lambda", "-1"], "lambda must be 'opt' or a positive number", tmp_path)
    _one_line_exit_2(["score", str(good), "--layers", "("], "--layers is not a valid regular expression", tmp_path)
    _one_line_exit_2(["score", str(good), "--head", "nope"], "--head 'nope' is not an analysed matrix", tmp_path)


def test_one_bad_tensor_is_skipped_not_fatal(tmp_path: Path, state_dict: dict) -> None:
    state = dict(state_dict)
    state["blocks.0.mlp.fc1.weight"] = state["blocks.0.mlp.fc1.weight"].clone()
    state["blocks.0.mlp.fc1.weight"][0, 0] = math.inf
    path = tmp_path / "one-bad.safetensors"
    save_file(state, str(path))
    code, out, _ = _run("score", str(path), "--format", "json", "--metrics", "bfe")
    assert code == 0
    data = json.loads(out)
    assert {"name": "blocks.0.mlp.fc1.weight", "reason": "non-finite values (NaN or Inf)", "shape": [64, 32],
            "dtype": "float32"} in data["skipped"]
    assert data["summary"]["bfe_head"] is not None


def test_default_checkpoint_is_scored() -> None:
    path = wbfe.default_checkpoint()
    code, out, _ = _run("score", "--format", "json", "--metrics", "bfe")
    assert code == 0
    data = json.loads(out)
    assert data["model"]["source"] == str(path)
    assert data["summary"]["head"] is not None and data["summary"]["bfe_head"] > 0
