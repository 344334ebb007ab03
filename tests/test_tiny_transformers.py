"""Tiny random models of many architectures, built by `transformers` itself (`from_config`) and saved
with `save_pretrained`: the head the model's own `get_output_embeddings()` (or its classifier of
`num_labels` outputs) names is the head wbfe finds, and every stored tensor is accounted for, with a
reason that fits it."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

import wbfe  # noqa: E402

TINY = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            vocab_size=128, max_position_embeddings=64)
_BERT_IDS = dict(pad_token_id=0, bos_token_id=1, eos_token_id=2, cls_token_id=1, sep_token_id=2)
_VISION = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4, image_size=32,
               patch_size=8)

# id -> (model_type, Auto class name, config overrides). The vocabulary (128) is the MLP width of the
# GPT-2 and Falcon configs on purpose: the head must not be taken for an MLP matrix of its size.
CASES: dict[str, tuple[str, str, dict[str, Any]]] = {
    "llama-tied": ("llama", "AutoModelForCausalLM", dict(tie_word_embeddings=True)),
    "llama-untied": ("llama", "AutoModelForCausalLM", dict(tie_word_embeddings=False)),
    "qwen2-tied": ("qwen2", "AutoModelForCausalLM", dict(tie_word_embeddings=True)),
    "qwen3": ("qwen3", "AutoModelForCausalLM", dict(head_dim=8)),
    "gemma2": ("gemma2", "AutoModelForCausalLM", dict(head_dim=8)),
    "mistral": ("mistral", "AutoModelForCausalLM", dict()),
    "gpt2": ("gpt2", "AutoModelForCausalLM", dict(n_embd=32, n_layer=2, n_head=4, n_positions=64)),
    "gpt_neox": ("gpt_neox", "AutoModelForCausalLM", dict()),
    "falcon": ("falcon", "AutoModelForCausalLM", dict()),
    "qwen3_moe": ("qwen3_moe", "AutoModelForCausalLM",
                        dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16, head_dim=8)),
    "qwen2_moe-shared": ("qwen2_moe", "AutoModelForCausalLM",
                         dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16,
                              shared_expert_intermediate_size=48)),
    "mixtral": ("mixtral", "AutoModelForCausalLM", dict(num_local_experts=4, num_experts_per_tok=2)),
    "gpt_oss": ("gpt_oss", "AutoModelForCausalLM",
                dict(num_local_experts=4, num_experts_per_tok=2, head_dim=8,
                     layer_types=["full_attention", "sliding_attention"])),
    "bert-2-labels": ("bert", "AutoModelForSequenceClassification", dict(num_labels=2)),
    "roberta-3-labels": ("roberta", "AutoModelForSequenceClassification", dict(num_labels=3)),
    "distilbert-2-labels": ("distilbert", "AutoModelForSequenceClassification",
                            dict(num_labels=2, dim=32, hidden_dim=64, n_layers=2, n_heads=4)),
    "deberta-v2-2-labels": ("deberta-v2", "AutoModelForSequenceClassification", dict(num_labels=2)),
    "qwen2-2-labels": ("qwen2", "AutoModelForSequenceClassification", dict(num_labels=2, pad_token_id=0)),
    "distilbert-mlm": ("distilbert", "AutoModelForMaskedLM", dict(dim=32, hidden_dim=64, n_layers=2, n_heads=4)),
    "modernbert-mlm": ("modernbert", "AutoModelForMaskedLM", dict(_BERT_IDS)),
    "vit-3-labels": ("vit", "AutoModelForImageClassification", dict(_VISION, num_labels=3)),
    "resnet-5-labels": ("resnet", "AutoModelForImageClassification",
                        dict(embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1], num_labels=5)),
    "convnext-4-labels": ("convnext", "AutoModelForImageClassification",
                          dict(hidden_sizes=[8, 16], depths=[1, 1], num_labels=4)),
    "t5": ("t5", "AutoModelForSeq2SeqLM", dict(d_model=32, d_ff=64, num_layers=2, num_heads=4, d_kv=8)),
    "bart": ("bart", "AutoModelForSeq2SeqLM",
             dict(d_model=32, encoder_ffn_dim=64, decoder_ffn_dim=64, encoder_layers=1, decoder_layers=1,
                  encoder_attention_heads=4, decoder_attention_heads=4, pad_token_id=0, bos_token_id=1,
                  eos_token_id=2, decoder_start_token_id=2, forced_eos_token_id=2)),
    "whisper": ("whisper", "AutoModelForSpeechSeq2Seq",
                dict(d_model=32, encoder_ffn_dim=64, decoder_ffn_dim=64, encoder_layers=1, decoder_layers=1,
                     encoder_attention_heads=4, decoder_attention_heads=4, num_mel_bins=16,
                     max_source_positions=32, max_target_positions=32, pad_token_id=0, bos_token_id=1,
                     eos_token_id=2, decoder_start_token_id=1, suppress_tokens=[], begin_suppress_tokens=[])),
}


def _build(model_type: str, auto: str, overrides: dict[str, Any]) -> Any:
    torch.manual_seed(0)
    args = dict(TINY)
    args.update(overrides)
    config = transformers.AutoConfig.for_model(model_type, **args)
    return getattr(transformers, auto).from_config(config)


def _expected_head(model: Any) -> Any:
    """The model's own head weight (its LM head, tied or not, else its classifier)."""
    output = model.get_output_embeddings()
    if output is not None:
        weight = output.weight
    else:
        n = model.config.num_labels
        heads = [m for m in model.modules() if isinstance(m, (torch.nn.Linear, torch.nn.Conv2d))
                 and getattr(m, "out_features", getattr(m, "out_channels", None)) == n]
        weight = heads[-1].weight
    return weight.detach()


def _is_head(folder: Path, name: str | None, weight: Any) -> bool:
    """Is the stored tensor ``name`` the head's weight? (Saved names may differ from the module's:
    transformers writes some models in their original checkpoint's names.)"""
    from safetensors import safe_open

    for path in folder.glob("*.safetensors"):
        with safe_open(str(path), "pt") as f:
            if name in f.keys():
                stored = f.get_tensor(name)
                return stored.shape == weight.shape and torch.equal(stored.to(weight.dtype), weight)
    return False


def _stored(folder: Path) -> dict[str, tuple[list[int], str]]:
    from safetensors import safe_open

    out = {}
    for path in sorted(folder.glob("*.safetensors")):
        with safe_open(str(path), "pt") as f:
            for key in f.keys():
                t = f.get_slice(key)
                out[key] = (list(t.get_shape()), t.get_dtype())
    return out


def _reason_fits(name: str, shape: list[int], reason: str) -> bool:
    if reason.startswith(("1-D", "0-D")):
        return len(shape) <= 1
    if reason.startswith("bias"):
        return name.endswith("bias")
    if reason.startswith("integer"):
        return "num_batches_tracked" in name or name.endswith(("position_ids", "token_type_ids"))
    if reason.startswith("3-D parameter with one row"):
        return len(shape) == 3 and shape[0] == 1
    if reason.startswith("tied"):
        return True
    if reason.startswith("too small"):  # one row: Qwen2-MoE's shared_expert_gate [1, hidden]
        return len(shape) == 2 and min(shape) < 2
    return False


def _check(case: str, tmp_path: Path) -> None:
    model_type, auto, overrides = CASES[case]
    model = _build(model_type, auto, overrides)
    folder = tmp_path / case
    model.save_pretrained(folder)
    expected = _expected_head(model)
    result = wbfe.score(folder, metrics="bfe")
    summary = result.summary
    assert _is_head(folder, summary["head"], expected), (case, summary["head"], summary.get("head_note"))
    assert summary["head_source"] == "framework", (case, summary.get("head_note"), result.model.get("framework"))
    assert summary["bfe_head"] is not None and summary["bfe_head"] == summary["bfe_head"]  # finite
    stored = _stored(folder)
    rows = {r["name"] for r in result.layers}
    skipped = {s["name"]: s["reason"] for s in result.skipped}
    for name, (shape, _) in stored.items():
        expert_rows = [r for r in rows if r.startswith(name + "[")]
        assert name in rows or name in skipped or expert_rows, (case, name)
        if name in skipped:
            assert _reason_fits(name, shape, skipped[name]), (case, name, shape, skipped[name])
    if "moe" in case or case in ("mixtral", "gpt_oss"):  # saved per expert (qwen, mixtral) or fused (gpt-oss)
        assert summary["by_role"]["expert"]["n"] >= 2 * 4 * 2  # 2 layers x 4 experts x >= 2 matrices
        assert "router" in summary["by_role"]
    if case == "qwen2_moe-shared":
        assert "shared_expert" in summary["by_role"]


@pytest.mark.parametrize("case", CASES)  # all 26 take ~25 s on one busy core
def test_tiny_transformers(case: str, tmp_path: Path) -> None:
    _check(case, tmp_path)


def test_multimodal_rows_carry_their_component_and_the_head_is_the_language_model(tmp_path: Path) -> None:
    """Llava: a vision tower, a projector and a language model in one file."""
    text = dict(TINY, model_type="llama", tie_word_embeddings=False)
    vision = dict(_VISION, model_type="clip_vision_model", projection_dim=32)
    config = transformers.LlavaConfig(text_config=text, vision_config=vision, image_token_index=3,
                                      projector_hidden_act="gelu", vision_feature_layer=-1)
    torch.manual_seed(0)
    model = transformers.LlavaForConditionalGeneration(config)
    model.save_pretrained(tmp_path / "llava")
    result = wbfe.score(tmp_path / "llava", metrics="bfe")
    assert _is_head(tmp_path / "llava", result.summary["head"], _expected_head(model))
    assert result.summary["head_source"] == "framework"
    components = {r["component"] for r in result.layers}
    assert {"vision_tower", "language_model", "multi_modal_projector"} <= components
    by_component = result.summary["by_component"]
    for component in ("vision_tower", "language_model"):
        values = [r["bfe"] for r in result.layers if r["component"] == component]
        assert by_component[component]["n"] == len(values)
        assert by_component[component]["bfe_mean"] == pytest.approx(sum(values) / len(values), rel=1e-12)
    assert all(re.search(r"vision_tower", r["name"]) for r in result.layers if r["component"] == "vision_tower")


def test_qwen3_moe_fused_in_memory_layout_scores_as_its_per_expert_save(tmp_path: Path) -> None:
    """transformers 5 holds Qwen3-MoE experts fused ([E, 2I, H] gate_up, [E, H, I] down) and saves
    them per expert: both files give the same expert rows and numbers."""
    import json

    from safetensors.torch import save_file

    model_type, auto, overrides = CASES["qwen3_moe"]
    model = _build(model_type, auto, overrides)
    model.save_pretrained(tmp_path / "per-expert")
    fused = tmp_path / "fused"
    fused.mkdir()
    state = {k: v.contiguous() for k, v in model.state_dict().items() if k != "lm_head.weight" or
             not model.config.tie_word_embeddings}
    assert any(k.endswith("experts.gate_up_proj") and v.ndim == 3 for k, v in state.items())
    save_file(state, str(fused / "model.safetensors"))
    (fused / "config.json").write_text(json.dumps(model.config.to_dict()))
    a = {r["name"]: r for r in wbfe.score(tmp_path / "per-expert", metrics="bfe").layers if r["role"] == "expert"}
    b = {r["name"]: r for r in wbfe.score(fused, metrics="bfe").layers if r["role"] == "expert"}
    assert len(a) == len(b) == 2 * 4 * 3
    for name, row in a.items():
        layer, e, proj = re.match(r"model\.layers\.(\d+)\.mlp\.experts\.(\d+)\.(\w+)_proj\.weight$", name).groups()
        fused_name = (f"model.layers.{layer}.mlp.experts.down_proj[{e}]" if proj == "down"
                      else f"model.layers.{layer}.mlp.experts.gate_up_proj[{e}].{proj}")
        assert (row["rows"], row["cols"]) == (b[fused_name]["rows"], b[fused_name]["cols"])
        assert row["bfe"] == pytest.approx(b[fused_name]["bfe"], rel=1e-12)
