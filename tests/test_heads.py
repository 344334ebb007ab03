"""The head found by config, name, tie or structure, on small checkpoints named as real ones are;
--min-eigs on the tail fits only; rows in the checkpoint's own order."""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path

import numpy as np
import pytest
import torch

import wbfe
from wbfe.engine.heads import HeadChoice, choose_head, terminal_matrices
from wbfe.metrics.bfe import bfe_from_moments


def _randn(*shape: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed + sum(shape))
    return torch.randn(*shape, generator=g) / math.sqrt(shape[-1])


def _mlp(names: list[str], dims: list[int]) -> dict[str, torch.Tensor]:
    """A chain dims[0] -> dims[1] -> ... with one named Linear per step (PyTorch [out, in])."""
    return {f"{n}.weight": _randn(dims[i + 1], dims[i], seed=i) for i, n in enumerate(names)}


def _cnn_then(head: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    state = {"conv1.weight": _randn(16, 3, 3, 3), "layer1.0.conv1.weight": _randn(32, 16, 3, 3),
             "layer1.0.bn1.weight": torch.ones(32), "layer1.0.conv2.weight": _randn(64, 32, 3, 3)}
    state.update(head)
    return state


# (state dict, expected head, expected head_source): the names classifiers carry in real zoos.
TABLE = [
    pytest.param(_cnn_then({"output.weight": _randn(10, 64)}), "output.weight", "name", id="output"),
    pytest.param(_cnn_then({"final_fc.weight": _randn(7, 64)}), "final_fc.weight", "name", id="final_fc"),
    pytest.param(_mlp(["fc0", "fc1"], [784, 64, 10]), "fc1.weight", "structure", id="fc1-last"),
    pytest.param(_mlp(["dense", "dense_1", "dense_2"], [784, 128, 64, 10]), "dense_2.weight", "structure",
                 id="dense_2"),
    pytest.param(_cnn_then({"predictions.weight": _randn(5, 64)}), "predictions.weight", "name", id="predictions"),
    pytest.param(_cnn_then({"output_probs.weight": _randn(12, 64)}), "output_probs.weight", "name", id="output_probs"),
    pytest.param(_cnn_then({"new_head.weight": _randn(3, 64)}), "new_head.weight", "name", id="new_head"),
    pytest.param(_cnn_then({"conv_preds.weight": _randn(1000, 64, 1, 1)}), "conv_preds.weight", "name",
                 id="conv_preds-1x1"),
    pytest.param(_mlp(["model.layers.0.mlp.up_proj", "model.layers.0.mlp.down_proj", "score"], [32, 64, 32, 3]),
                 "score.weight", "name", id="score"),
    pytest.param(_cnn_then({"head.fc.weight": _randn(100, 64), "head.norm.weight": torch.ones(64)}),
                 "head.fc.weight", "name", id="head.fc"),
    pytest.param(_cnn_then({"features.final_conv.weight": _randn(21, 64, 1, 1)}), "features.final_conv.weight",
                 "structure", id="last-1x1-conv"),
    pytest.param(_cnn_then({"seg.out.weight": _randn(21, 64, 3, 3)}), "seg.out.weight", "structure",
                 id="last-kxk-conv"),
    # Keras names on weights in PyTorch's [out, in, k...] layout (every reader converts to it): the
    # name says nothing about the layout, so ``kernel:0`` is read as out x in like any other weight.
    pytest.param({"conv2d/kernel:0": _randn(32, 1, 3, 3), "conv2d_1/kernel:0": _randn(64, 32, 3, 3),
                  "dense/kernel:0": _randn(128, 1024), "dense_1/kernel:0": _randn(10, 128)},
                 "dense_1/kernel:0", "structure", id="keras-dense_1-kernel"),
    # The name rules alone pick `fc`, whose output the real classifier reads.
    pytest.param(_mlp(["features", "fc", "out_layer"], [784, 256, 128, 10]), "out_layer.weight", "structure",
                 id="named-fc-is-not-last"),
    # fixtures/fmnist-zoo/cnn-w10-d2 as stored (sorted names): 10 conv channels and 10 classes.
    pytest.param({"classifier.weight": _randn(10, 80), "fc1.weight": _randn(80, 980),
                  "features.0.weight": _randn(10, 1, 3, 3), "features.3.weight": _randn(20, 10, 3, 3)},
                 "classifier.weight", "name", id="10-channels-10-classes"),
    # Depthwise-separable blocks: a depthwise conv reads its own channel count.
    pytest.param({"stem.weight": _randn(32, 3, 3, 3), "b1.expand.weight": _randn(96, 32, 1, 1),
                  "b1.dw.weight": _randn(96, 1, 3, 3), "b1.project.weight": _randn(48, 96, 1, 1),
                  "top.weight": _randn(256, 48, 1, 1), "logit_layer.weight": _randn(9, 256)},
                 "logit_layer.weight", "structure", id="depthwise-net"),
]


@pytest.mark.parametrize("state,head,source", TABLE)
def test_head_of_real_naming_patterns(tmp_path: Path, state: dict, head: str, source: str) -> None:
    path = tmp_path / "model.pt"
    torch.save(state, path)
    result = wbfe.score(path, metrics="bfe")
    assert (result.summary["head"], result.summary["head_source"]) == (head, source)
    row = next(layer for layer in result.layers if layer["name"] == head)
    assert row["role"] == "head" and result.summary["bfe_head"] == row["bfe"]
    # The head's BFE-W is the closed form of its own spectrum, whatever its size.
    w = state[head].double()
    w = w.reshape(w.shape[0], -1)
    e = np.linalg.eigvalsh((w @ w.T if w.shape[0] <= w.shape[1] else w.T @ w).numpy())
    expected, _ = bfe_from_moments(float(e.mean()), float(np.log(e).mean()), "opt")
    assert row["bfe"] == pytest.approx(expected, rel=1e-9)


def test_two_outputs_are_named_in_the_note(tmp_path: Path) -> None:
    state = _mlp(["trunk", "aux_out"], [64, 32, 4]) | {"main_out.weight": _randn(6, 32)}
    torch.save(state, tmp_path / "m.pt")
    summary = wbfe.score(tmp_path / "m.pt", metrics="bfe").summary
    assert summary["head"] == "main_out.weight" and summary["head_source"] == "structure"
    assert "aux_out.weight" in summary["head_note"] and "main_out.weight" in summary["head_note"]


@pytest.mark.parametrize("bad", ["zero", "nan"])
def test_a_skipped_head_is_the_head_and_no_other_matrix_stands_in(tmp_path: Path, bad: str) -> None:
    """classifier.weight skipped (all zero, or a NaN) was passed over: the structure rule named a conv layer the head
    and reported its BFE-W as bfe_head; the head is now None, saying why, and --head still takes another."""
    state = _cnn_then({"classifier.weight": _randn(10, 64)})
    state["classifier.weight"] = torch.zeros(10, 64) if bad == "zero" else state["classifier.weight"] * math.nan
    torch.save(state, tmp_path / "m.pt")
    result = wbfe.score(tmp_path / "m.pt", metrics="bfe")
    reason = {"zero": "all-zero matrix", "nan": "non-finite values (NaN or Inf)"}[bad]
    assert result.summary["head"] is None and math.isnan(result.summary["bfe_head"])
    assert result.summary["head_note"] == (f"the head, classifier.weight, is skipped ({reason}); pass --head NAME to "
                                           "take another matrix")
    assert "head" not in {row["role"] for row in result.layers}
    chosen = wbfe.score(tmp_path / "m.pt", metrics="bfe", head="layer1.0.conv2.weight").summary
    assert (chosen["head"], chosen["head_source"]) == ("layer1.0.conv2.weight", "option")
    # --layers leaving the head out keeps its rule: the head among the matrices selected
    assert wbfe.score(tmp_path / "m.pt", metrics="bfe", layers="conv").summary["head"] == "layer1.0.conv2.weight"


def test_a_skipped_head_keeps_its_place_in_the_structure(tmp_path: Path) -> None:
    """A CNN whose last Linear (no head-like name) is zeroed: the structure rule did not see the skipped row, so
    net.5, whose output net.7 reads, was the only terminal matrix and reported as the head with its BFE-W."""
    state = {"net.0.weight": _randn(16, 3, 3, 3), "net.2.weight": _randn(32, 16, 3, 3),
             "net.5.weight": _randn(64, 512), "net.7.weight": torch.zeros(10, 64)}
    torch.save(state, tmp_path / "m.pt")
    result = wbfe.score(tmp_path / "m.pt", metrics="bfe")
    assert result.summary["head"] is None and math.isnan(result.summary["bfe_head"])
    assert result.summary["head_note"] == ("no other matrix reads the output of net.7.weight (all-zero matrix), "
                                           "which is skipped: the head by structure is not scored; pass --head NAME "
                                           "to take another matrix")
    assert "head" not in {row["role"] for row in result.layers}
    # Left out by --layers, it is no longer the model's: the head among the matrices selected
    assert wbfe.score(tmp_path / "m.pt", metrics="bfe", layers="net.[025]").summary["head"] == "net.5.weight"


def test_tied_lm_head_is_the_input_embedding(tmp_path: Path) -> None:
    embed = _randn(50, 16)
    state = {"model.embed_tokens.weight": embed, "model.layers.0.mlp.up_proj.weight": _randn(32, 16),
             "model.layers.0.mlp.down_proj.weight": _randn(16, 32), "lm_head.weight": embed}
    torch.save(state, tmp_path / "tied.pt")
    result = wbfe.score(tmp_path / "tied.pt", metrics="bfe")
    assert result.summary["head"] == "model.embed_tokens.weight" and result.summary["head_source"] == "tied"
    assert any(s["name"] == "lm_head.weight" and s["reason"].startswith("tied") for s in result.skipped)


def _save_hf_folder(folder: Path, state: dict[str, torch.Tensor], config: dict) -> Path:
    from safetensors.torch import save_file

    folder.mkdir()
    save_file(state, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps(config))
    return folder


# transformers builds Qwen2ForCausalLM and says its lm_head is tied ("framework"); an architecture
# defined by the checkpoint's own code is never run, and the config rules decide ("tied").
@pytest.mark.parametrize("arch,extra,source", [("Qwen2ForCausalLM", {}, "framework"),
                                               ("MyOwnForCausalLM", {"auto_map": {"AutoModel": "m.M"}}, "tied")])
def test_config_tied_embeddings_make_the_embedding_the_head(tmp_path: Path, arch: str, extra: dict,
                                                            source: str) -> None:
    state = {"model.embed_tokens.weight": _randn(50, 16), "model.layers.0.mlp.up_proj.weight": _randn(32, 16),
             "model.layers.0.mlp.down_proj.weight": _randn(16, 32), "model.layers.0.mlp.fc.weight": _randn(8, 16)}
    config = {"architectures": [arch], "vocab_size": 50, "tie_word_embeddings": True, **extra}
    folder = _save_hf_folder(tmp_path / "m", state, config)
    result = wbfe.score(folder, metrics="bfe")
    summary = result.summary
    assert (summary["head"], summary["head_source"]) == ("model.embed_tokens.weight", source)
    if source == "framework":
        assert "lm_head.weight is tied to model.embed_tokens.weight" in summary["head_note"]
        assert result.model["framework"] == {"used": "transformers", "model": arch,
                                               "dropout_read": "forward pass on the meta device"}
    else:
        assert result.model["framework"]["used"] == "rules" and "never runs" in result.model["framework"]["why"]
    # The same file named alone is read alone: no config, and the name rules find `fc`.
    alone = wbfe.score(folder / "model.safetensors", metrics="bfe").summary
    assert (alone["head"], alone["head_source"]) == ("model.layers.0.mlp.fc.weight", "name")


def test_config_labels_find_a_two_label_classifier_and_min_eigs_spares_bfe(tmp_path: Path) -> None:
    state = {"model.embed_tokens.weight": _randn(50, 16), "model.layers.0.mlp.up_proj.weight": _randn(32, 16),
             "model.layers.0.mlp.down_proj.weight": _randn(16, 32), "score.weight": _randn(2, 16)}
    config = {"architectures": ["Qwen2ForSequenceClassification"], "vocab_size": 50,
              "id2label": {"0": "neg", "1": "pos"}}
    folder = _save_hf_folder(tmp_path / "m", state, config)
    result = wbfe.score(folder, metrics="bfe,htsr,htmp", min_eigs=10)
    assert (result.summary["head"], result.summary["head_source"]) == ("score.weight", "framework")
    head = next(layer for layer in result.layers if layer["name"] == "score.weight")
    w = state["score.weight"].double()
    e = np.linalg.eigvalsh((w @ w.T).numpy())
    assert head["n_eigs"] == 2 and head["bfe"] == pytest.approx(bfe_from_moments(e.mean(), np.log(e).mean(), "opt")[0])
    for column in ("alpha", "h"):
        assert math.isnan(head[column]) and "min_eigs=10" in head["reasons"][column]
    assert not math.isnan(next(r for r in result.layers if r["name"].endswith("up_proj.weight"))["alpha"])
    # WeightWatcher-compatible mode keeps WeightWatcher's skip of small matrices.
    ww = wbfe.score(folder, metrics="bfe", ww_compatible=True)
    assert any(s["name"] == "score.weight" and "min_eigs=10" in s["reason"] for s in ww.skipped)


# A multiple-choice classifier scores each choice: one row, whatever num_labels says (2 by default), so it is
# too small to analyse. transformers knows it is the head; the config rules (a model defined by its own code)
# looked for num_labels rows, found none, and said nothing.
@pytest.mark.parametrize("arch,extra,note", [
    ("BertForMultipleChoice", {}, "transformers BertForMultipleChoice: the head classifier.weight is not analysed "
                                  "(too small: 1 eigenvalue(s) < BFE-W needs at least 2); pass --head NAME"),
    ("MyOwnForMultipleChoice", {"auto_map": {"AutoModelForMultipleChoice": "m.M"}},
     "config: MyOwnForMultipleChoice's head has 1 output row(s), but no analysed matrix has that many; "
     "pass --head NAME")])
def test_a_multiple_choice_head_has_one_output(tmp_path: Path, arch: str, extra: dict, note: str) -> None:
    state = {"bert.embeddings.word_embeddings.weight": _randn(50, 16),
             "bert.encoder.layer.0.intermediate.dense.weight": _randn(32, 16),
             "bert.encoder.layer.0.output.dense.weight": _randn(16, 32), "bert.pooler.dense.weight": _randn(16, 16),
             "classifier.weight": _randn(1, 16)}
    config = {"architectures": [arch], "vocab_size": 50, "hidden_size": 16, "num_hidden_layers": 1,
              "num_attention_heads": 2, "intermediate_size": 32, "num_labels": 2, **extra}
    summary = wbfe.score(_save_hf_folder(tmp_path / "m", state, config), metrics="bfe").summary
    assert (summary["head"], summary["head_note"]) == (None, note)
    layers = [{"name": "body.weight", "shape": [32, 16], "role": "mlp"},
              {"name": "classifier.weight", "shape": [1, 32], "role": "other"}]
    assert choose_head(layers, config={"architectures": ["MyOwnForMultipleChoice"], "num_labels": 2}).name == \
        "classifier.weight"


def test_config_rules_say_when_no_matrix_has_the_labels_rows() -> None:
    layers = [{"name": "body.weight", "shape": [32, 16], "role": "mlp"},
              {"name": "classifier.weight", "shape": [3, 32], "role": "other"}]
    chosen = choose_head(layers, config={"architectures": ["BertForSequenceClassification"], "num_labels": 2})
    assert (chosen.name, chosen.note) == (None, "config: BertForSequenceClassification's head has 2 output row(s), "
                                                "but no analysed matrix has that many; pass --head NAME")


def test_config_declares_a_base_model(tmp_path: Path) -> None:
    state = {"embeddings.word_embeddings.weight": _randn(50, 16), "encoder.layer.0.intermediate.dense.weight":
             _randn(32, 16), "encoder.layer.0.output.dense.weight": _randn(16, 32), "pooler.dense.weight": _randn(16, 16)}
    folder = _save_hf_folder(tmp_path / "m", state, {"architectures": ["BertModel"], "vocab_size": 50})
    summary = wbfe.score(folder, metrics="bfe").summary
    assert summary["head"] is None and "base model" in summary["head_note"]


def test_timm_pretrained_cfg_names_the_classifier(tmp_path: Path) -> None:
    state = _cnn_then({"head.weight": _randn(10, 64), "aux.weight": _randn(5, 64)})
    folder = _save_hf_folder(tmp_path / "m", state, {"architecture": "x", "pretrained_cfg": {"classifier": "aux"}})
    summary = wbfe.score(folder, metrics="bfe").summary
    assert (summary["head"], summary["head_source"]) == ("aux.weight", "config")


def test_terminal_matrices_closed_cases() -> None:
    chain = [("a", (64, 784), "mlp"), ("b", (10, 64), "mlp")]
    assert terminal_matrices(chain) == ["b"]
    # Embeddings and attention projections are never heads, although their output feeds no matrix.
    assert terminal_matrices([("e", (100, 16), "embedding"), ("k", (4, 16), "attention")]) == []
    assert choose_head([{"name": "x.weight", "shape": [3, 4], "role": "other"}], override="x").source == "option"
    # A square matrix does not read its own output: a lone 12 x 12 classifier is terminal (two of
    # them read each other's width, and neither is).
    assert terminal_matrices([("fc", (12, 12), "other")]) == ["fc"]
    assert terminal_matrices([("l1", (32, 32), "mlp"), ("l2", (32, 32), "mlp")]) == []


def _write_safetensors(path: Path, tensors: list[tuple[str, torch.Tensor]]) -> None:
    """A safetensors file with the tensors stored in the order given (as a writer that keeps the
    model's order does)."""
    header, blobs, offset = {}, [], 0
    for name, t in tensors:
        raw = t.contiguous().numpy().tobytes()
        header[name] = {"dtype": "F32", "shape": list(t.shape), "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    text = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def test_rows_follow_the_checkpoint_order(tmp_path: Path) -> None:
    from safetensors.torch import save_file

    layers = [(f"layers.{i}.fc.weight", _randn(12, 12, seed=i)) for i in range(12)]
    save_file(dict(layers), str(tmp_path / "sorted.safetensors"))  # the writer sorts by name
    rows = [r["name"] for r in wbfe.score(tmp_path / "sorted.safetensors", metrics="bfe").layers]
    assert rows == [name for name, _ in layers]  # 0, 1, 2, ..., 10, 11: natural order
    stored = [layers[i] for i in (3, 0, 11, 1)]
    _write_safetensors(tmp_path / "stored.safetensors", stored)
    assert [r["name"] for r in wbfe.score(tmp_path / "stored.safetensors", metrics="bfe").layers] == \
        [name for name, _ in stored]
    torch.save(dict(stored), tmp_path / "stored.pt")  # pickle: insertion order
    assert [r["name"] for r in wbfe.score(tmp_path / "stored.pt", metrics="bfe").layers] == \
        [name for name, _ in stored]


@pytest.mark.parametrize("sub", ["text_config", "language_config", "llm_config"])
def test_config_rules_read_a_multimodal_models_language_config(sub: str) -> None:
    """vocab_size and tie_word_embeddings where a multimodal model keeps them, under its language model's config
    (the head rules read only text_config, the expert rules all three: one reader now, wbfe.engine.experts')."""
    layers = [{"name": "language.model.embed_tokens.weight", "shape": [50, 16], "role": "embedding"},
              {"name": "language.model.layers.0.mlp.up_proj.weight", "shape": [32, 16], "role": "mlp"},
              {"name": "language.model.layers.0.mlp.down_proj.weight", "shape": [16, 32], "role": "mlp"}]
    vocab = [*layers, {"name": "language.proj.weight", "shape": [50, 16], "role": "mlp"}]
    arch = {"architectures": ["DeepseekVLV2ForCausalLM"]}
    # The only matrix of 50 output rows is the LM head by the config, not by structure as the last terminal one.
    assert choose_head(vocab, config={**arch, sub: {"vocab_size": 50}}) == HeadChoice("language.proj.weight", "config")
    # Tied: the input embedding is the head (without the config no matrix is terminal, and none is found).
    tied = choose_head(layers, config={**arch, sub: {"vocab_size": 50, "tie_word_embeddings": True}})
    assert (tied.name, tied.source) == ("language.model.embed_tokens.weight", "tied")
    assert choose_head(layers, config=arch).name is None


def test_no_head_found_says_so() -> None:
    # Each matrix reads the other's output: none is terminal, none is named as a head, and there is no config.
    summary = wbfe.score({"a.weight": _randn(16, 32), "b.weight": _randn(32, 16)}, metrics="bfe").summary
    assert (summary["head"], summary["head_source"]) == (None, None)
    assert summary["head_note"] == "no head found by config, name or structure; pass --head NAME"
