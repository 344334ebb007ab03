"""A folder is never silently reduced to one of its files: checkpoints of more than one format side by
side are several checkpoints, and the folder is refused with the list and how to name one; a
``config.json`` ties them together as one model saved in several formats (a Hugging Face repository),
and a sharded index ties its shards together."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

import wbfe
from wbfe.errors import CorruptCheckpointError
from wbfe.fixtures import default_checkpoint
from wbfe_cli.main import app


def _onnx_file(path: Path) -> None:
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((8, 16)).astype(np.float32), "fc.weight")
    node = helper.make_node("MatMul", ["x", "fc.weight"], ["y"])
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16])], [w])
    onnx.save(helper.make_model(graph), str(path))


@pytest.fixture
def mixed(tmp_path: Path) -> Path:
    folder = tmp_path / "mixed"
    folder.mkdir()
    shutil.copy(default_checkpoint(), folder / "model.safetensors")
    _onnx_file(folder / "model.onnx")
    np.savez(folder / "extra.npz", w=np.ones((4, 4), dtype=np.float32))
    return folder


def test_a_folder_of_several_formats_is_refused_with_the_list(mixed: Path) -> None:
    with pytest.raises(CorruptCheckpointError) as info:
        wbfe.score(mixed)
    message = str(info.value)
    assert message == (f"{mixed}: this folder holds checkpoints of more than one format (model.safetensors, "
                       f"extra.npz, model.onnx); name the file to score, e.g. {mixed / 'model.safetensors'}")
    # each file named alone is scored alone
    assert [r["name"] for r in wbfe.score(mixed / "model.onnx").layers] == ["fc.weight"]
    assert len(wbfe.score(mixed / "model.safetensors").layers) == 4


@pytest.mark.parametrize("command", [["score"], ["describe"], ["compare", "{ref}"]])
def test_the_cli_says_it_in_one_line(mixed: Path, command: list[str]) -> None:
    argv = [command[0], str(mixed)] + [c.format(ref=default_checkpoint()) for c in command[1:]]
    result = CliRunner().invoke(app, argv)
    assert result.exit_code == 2, result.output
    assert result.stderr.count("\n") == 1 and "more than one format" in result.stderr
    assert result.stderr.startswith("wbfe: error: ")


def test_a_config_ties_the_formats_together(mixed: Path) -> None:
    """A transformers folder with its config.json holds one model in several formats: the preferred
    one (safetensors) is read, as transformers reads it."""
    (mixed / "config.json").write_text(json.dumps({"model_type": "custom"}))
    direct = wbfe.score(mixed / "model.safetensors")
    assert [r["name"] for r in wbfe.score(mixed).layers] == [r["name"] for r in direct.layers]


def test_a_folder_of_one_format_still_scores(tmp_path: Path) -> None:
    folder = tmp_path / "one"
    folder.mkdir()
    shutil.copy(default_checkpoint(), folder / "model.safetensors")
    (folder / "README.md").write_text("notes")
    assert len(wbfe.score(folder).layers) == 4
