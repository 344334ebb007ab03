"""The dropout on a head's input, read from the model's own forward pass on the meta device
(wbfe/framework/forward_trace.py): a dropout the backbone applies to its last output (T5's decoder,
XLNet's transformer) is on the head's input though no module beside the head holds it; a dropout
behind another layer with weights is not; a functional dropout counts like a module; a model
whose forward pass cannot run on meta is read from its module tree and says so."""

from __future__ import annotations

import pytest

import wbfe
from wbfe.framework.applicability import applicability

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

from wbfe.framework.forward_trace import HeadInput, head_input_dropouts  # noqa: E402
from wbfe.framework.transformers_model import describe_transformers  # noqa: E402


def _describe(arch: str, config):
    data = config.to_dict()
    data["architectures"] = [arch]
    return describe_transformers(data)


def _t5(**kw):
    return transformers.T5Config(vocab_size=64, d_model=16, d_kv=8, d_ff=32, num_layers=3, num_heads=2, **kw)


def test_t5_applies_dropout_to_its_decoders_output_before_lm_head(tmp_path):
    """T5's decoder stack ends final_layer_norm → dropout → (lm_head): the dropout is the decoder's
    own module, not one beside the head, so the module tree alone missed it."""
    torch.manual_seed(0)
    transformers.T5ForConditionalGeneration(_t5()).save_pretrained(tmp_path / "t5")
    verdict = wbfe.score(str(tmp_path / "t5"), metrics="bfe").summary["bfe_applicability"]
    assert verdict["status"] == "fails"
    assert verdict["reasons"][0].startswith("dropout on the features the head reads: decoder.dropout (rate 0.1); ")
    plain = _describe("T5ForConditionalGeneration", _t5(dropout_rate=0.0))
    assert plain.facts["dropout"] == [] and plain.facts["dropout_read"] == "forward pass on the meta device"
    assert applicability(plain)["status"] == "holds"


def test_xlnet_lm_reads_the_transformers_last_dropout_and_its_classifier_does_not():
    """XLNetModel returns dropout(output): the LM head reads it directly (fails); the classifier reads
    the sequence summary's linear map of it (a hidden layer's input), so only the summary's last
    dropout decides."""
    lm = _describe("XLNetLMHeadModel", transformers.XLNetConfig(vocab_size=64, d_model=32, n_layer=3, n_head=2,
                                                                d_inner=64))
    assert lm.facts["dropout"] == [["transformer.dropout", 0.1]]
    classifier = _describe("XLNetForSequenceClassification", transformers.XLNetConfig(
        vocab_size=64, d_model=32, n_layer=1, n_head=2, d_inner=64, num_labels=3, summary_last_dropout=0.0))
    assert classifier.facts["dropout"] == [] and applicability(classifier)["status"] == "holds"


def test_a_summary_stage_the_head_does_not_read_is_not_its_features():
    """GPT-2 double heads: lm_head reads ln_f; the multiple-choice summary beside it is another head's."""
    d = _describe("GPT2DoubleHeadsModel", transformers.GPT2Config(vocab_size=64, n_embd=16, n_layer=1, n_head=2))
    assert d.head == "lm_head.weight" and d.facts["dropout"] == [] and not d.facts["summary_stage"]
    assert "summary stage" not in applicability(d)["reasons"][0]


def test_a_model_that_cannot_run_on_meta_is_read_from_its_tree_and_says_why():
    d = _describe("BartForConditionalGeneration", transformers.BartConfig(
        vocab_size=64, d_model=16, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
        decoder_attention_heads=2, encoder_ffn_dim=32, decoder_ffn_dim=32))
    assert d.facts["dropout_read"].startswith("module tree: its forward pass does not run on the meta device (")


class _Functional(torch.nn.Module):
    """embedding → (a container holding a parameter of its own) → functional dropout → head."""

    def __init__(self, rate: float, behind_a_layer: bool):
        super().__init__()
        self.rate, self.behind = rate, behind_a_layer
        self.body = torch.nn.Module()
        self.body.embed = torch.nn.Embedding(10, 8)
        self.body.scale = torch.nn.Parameter(torch.ones(8))
        self.norm = torch.nn.LayerNorm(8)
        self.head = torch.nn.Linear(8, 3)

    def forward(self, input_ids):
        x = self.body.embed(input_ids) * self.body.scale
        x = torch.nn.functional.dropout(x, p=self.rate, training=True)
        return self.head(self.norm(x) if self.behind else x)


def test_a_functional_dropout_is_on_the_heads_input_unless_a_layer_follows_it():
    with torch.device("meta"):
        direct, behind, none = _Functional(0.3, False), _Functional(0.3, True), _Functional(0.0, False)
    assert head_input_dropouts(direct, "head.weight") == HeadInput([["model (functional)", 0.3]], "body.embed")
    assert head_input_dropouts(behind, "head.weight") == HeadInput([], "norm")
    assert head_input_dropouts(none, "head.weight") == HeadInput([], "body.embed")


def test_the_cut_stacks_give_the_whole_models_answer_and_are_put_back():
    """The pass runs each layer stack's first and last block only; the answer is the whole model's,
    and the skeleton keeps all its blocks afterwards."""
    with torch.device("meta"):
        model = transformers.BertForSequenceClassification(transformers.BertConfig(
            vocab_size=64, hidden_size=16, num_hidden_layers=6, num_attention_heads=2, intermediate_size=32,
            num_labels=3, classifier_dropout=0.25))
    seen: list[int] = []
    for k, layer in enumerate(model.bert.encoder.layer):
        layer.register_forward_pre_hook(lambda *_, k=k: seen.append(k))
    traced = head_input_dropouts(model, "classifier.weight")
    assert traced == HeadInput([["dropout", 0.25]], "bert.pooler.dense")
    assert seen == [0, 5] and len(model.bert.encoder.layer) == 6
