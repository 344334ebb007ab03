"""``wbfe describe`` beside a config.json: where transformers' source shows no weight stored
transposed and the config names the head, the rules decide without importing transformers; the
head, roles and orientation must be those a score reports with transformers' own description, and,
with transformers absent, those of a score that falls back to the rules too."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import wbfe

transformers = pytest.importorskip("transformers")

# id -> (model_type, class, config, what decides describe's columns with transformers installed)
CASES: dict[str, tuple[str, str, dict[str, Any], str]] = {
    "gpt2": ("gpt2", "GPT2LMHeadModel", dict(n_embd=32, n_layer=2, n_head=4, n_positions=64, vocab_size=96),
             "transformers"),  # Conv1D stores [in, out]: only the built model says which weights
    "bert-3-labels": ("bert", "BertForSequenceClassification",
                      dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                           vocab_size=96, num_labels=3), "rules"),
    "llama-untied": ("llama", "LlamaForCausalLM",
                     dict(hidden_size=32, intermediate_size=64, num_hidden_layers=12, num_attention_heads=4,
                          num_key_value_heads=2, vocab_size=96, tie_word_embeddings=False), "rules"),
    "llama-tied": ("llama", "LlamaForCausalLM",
                   dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                        num_key_value_heads=2, vocab_size=96, tie_word_embeddings=True), "rules"),
    # tie_word_embeddings, yet an LM head of its own stored: the rules would take the embedding,
    # transformers takes the stored head; describe must ask transformers.
    "llama-tied-own-head": ("llama", "LlamaForCausalLM",
                            dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                                 num_key_value_heads=2, vocab_size=96, tie_word_embeddings=True), "transformers"),
    "vit-5-labels": ("vit", "ViTForImageClassification",
                     dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
                          image_size=32, patch_size=8, num_labels=5), "rules"),
}

_COLUMNS = ("shape", "N", "M", "n_slices", "n_eigs", "role", "form", "head")


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    import torch

    out = {}
    for case, (model_type, cls, overrides, _) in CASES.items():
        torch.manual_seed(0)
        model = getattr(transformers, cls)(transformers.AutoConfig.for_model(model_type, **overrides))
        out[case] = tmp_path_factory.mktemp(case)
        model.save_pretrained(out[case])
        if case.endswith("-own-head"):
            from safetensors.torch import load_file, save_file

            stored = load_file(str(out[case] / "model.safetensors"))
            assert "lm_head.weight" not in stored  # transformers saves a tied head once
            stored["lm_head.weight"] = torch.randn(96, 32, generator=torch.Generator().manual_seed(1))
            save_file(stored, str(out[case] / "model.safetensors"), metadata={"format": "pt"})
    return out


_DESCRIBE = """
import json, sys
if sys.argv[1] == "blocked":
    sys.modules["transformers"] = None  # import transformers raises ImportError: as if not installed
import wbfe
out = {}
for folder in sys.argv[2:]:
    d = wbfe.describe(folder).to_dict()
    d["transformers_imported"] = "transformers" in sys.modules and sys.modules["transformers"] is not None
    if sys.argv[1] == "blocked":
        s = wbfe.score(folder, metrics="bfe")
        d["score"] = {"layers": s.layers, "head": s.summary["head"], "framework": s.model.get("framework")}
    out[folder] = d
print(json.dumps(out))
"""


def _run(mode: str, folders: list[Path]) -> dict[str, Any]:
    run = subprocess.run([sys.executable, "-c", _DESCRIBE, mode, *map(str, folders)], capture_output=True,
                         text=True, timeout=600)
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout.strip().splitlines()[-1])


def _by_name(matrices: list[dict[str, Any]]) -> dict[str, tuple[Any, ...]]:
    return {m["name"]: tuple(m[c] for c in _COLUMNS) for m in matrices}


def _score_columns(layers: list[dict[str, Any]], head: str) -> dict[str, tuple[Any, ...]]:
    # describe reads no tensor, so its N and M are the stored matrix's; a score's are its live part's,
    # with the exactly-zero rows and columns it found counted apart (BERT's zero padding embedding row).
    out = {}
    for r in layers:
        rows, cols = r["rows"] + r.get("dead_rows", 0), r["cols"] + r.get("dead_cols", 0)
        n_eigs = r["n_eigs"] if (rows, cols) == (r["rows"], r["cols"]) else min(rows, cols) * r["n_slices"]
        out[r["name"]] = (r["shape"], max(rows, cols), min(rows, cols), r["n_slices"], n_eigs, r["role"], r["form"],
                          r["name"] == head)
    return out


def test_describe_columns_equal_a_scores_with_transformers(folders: dict[str, Path]) -> None:
    # The rules cases in a fresh process, which must never import transformers; those that need the
    # built model here, where transformers is imported already.
    rules = [c for c in CASES if CASES[c][3] == "rules"]
    described = _run("installed", [folders[c] for c in rules])
    described.update({str(folders[c]): wbfe.describe(folders[c]).to_dict() for c in CASES if c not in rules})
    for case in CASES:
        d = described[str(folders[case])]
        s = wbfe.score(folders[case], metrics="bfe")
        assert s.model["framework"] == {"used": "transformers", "model": CASES[case][1],
                                        "dropout_read": "forward pass on the meta device"}
        assert d["head"] == s.summary["head"], case
        assert _by_name(d["matrices"]) == _score_columns(s.layers, s.summary["head"]), case
        assert sorted(x["name"] for x in d["skipped"]) == sorted(x["name"] for x in s.skipped), case
        used = CASES[case][3]
        assert d["model"]["framework"]["used"] == used, case
        if used == "rules":
            assert not d["transformers_imported"], case
        if used == "rules":
            assert d["head_source"] in ("config", "tied") and s.summary["head_source"] == "framework"
            assert "no layer stored transposed (Conv1D, ConvTranspose) in transformers' modeling_" in \
                d["model"]["framework"]["why"]
            # The rows are in the checkpoint's (natural) order, as the rules give it, and it says so.
            assert "rows in the checkpoint's order" in d["model"]["framework"]["why"]
        else:  # the built model decided: its order too, row for row
            assert [m["name"] for m in d["matrices"]] == [r["name"] for r in s.layers]
            assert d["head_source"] == s.summary["head_source"] == "framework"
    # GPT-2's Conv1D weights: out x in only because transformers said so (c_fc stores [32, 128]).
    gpt2 = {m["name"]: m for m in described[str(folders["gpt2"])]["matrices"]}
    assert gpt2["transformer.h.0.mlp.c_fc.weight"]["shape"] == [32, 128]
    assert gpt2["transformer.h.0.mlp.c_fc.weight"]["form"] == "dual"  # 128 outputs > 32 inputs
    tied = described[str(folders["llama-tied"])]
    assert (tied["head"], tied["head_source"]) == ("model.embed_tokens.weight", "tied")
    assert described[str(folders["llama-tied-own-head"])]["head"] == "lm_head.weight"


def test_describe_columns_equal_a_scores_without_transformers(folders: dict[str, Path]) -> None:
    described = _run("blocked", list(folders.values()))
    for case, folder in folders.items():
        d = described[str(folder)]
        s = d["score"]
        assert d["model"]["framework"]["used"] == s["framework"]["used"] == "rules", case
        assert "transformers is not installed" in d["model"]["framework"]["why"]
        assert d["head"] == s["head"], case
        assert [m["name"] for m in d["matrices"]] == [r["name"] for r in s["layers"]], case
        assert _by_name(d["matrices"]) == _score_columns(s["layers"], s["head"]), case
        assert not d["transformers_imported"]


def test_describe_with_head_given_or_left_open_by_the_config(folders: dict[str, Path], tmp_path: Path) -> None:
    """--head decides without the built model; a base model's config names no head, so the built model is asked."""
    import torch

    given = wbfe.describe(folders["bert-3-labels"], head="bert.pooler.dense.weight")
    assert (given.head, given.head_source, given.model["framework"]["used"]) == ("bert.pooler.dense.weight", "option",
                                                                                 "rules")
    torch.manual_seed(0)
    config = transformers.AutoConfig.for_model("bert", **CASES["bert-3-labels"][2])
    transformers.BertModel(config).save_pretrained(tmp_path / "base")
    described, scored = wbfe.describe(tmp_path / "base"), wbfe.score(tmp_path / "base", metrics="bfe")
    assert described.head is None and scored.summary["head"] is None
    assert described.model["framework"] == scored.model["framework"] == {
        "used": "transformers", "model": "BertModel",
        "note": "BertModel has no output embeddings or classifier (a base model); pass --head NAME"}


def test_describe_command_says_what_decided(folders: dict[str, Path]) -> None:
    from typer.testing import CliRunner

    from wbfe_cli.main import app

    out = CliRunner().invoke(app, ["describe", str(folders["bert-3-labels"])])
    assert out.exit_code == 0, out.output
    assert ("framework: rules (describe: no layer stored transposed (Conv1D, ConvTranspose) in transformers' "
            "modeling_bert.py, and the config decides the head; rows in the checkpoint's order") in out.stdout
    assert "head: classifier.weight (config)" in out.stdout
    built = CliRunner().invoke(app, ["describe", str(folders["gpt2"])])
    assert built.exit_code == 0 and "framework: transformers (GPT2LMHeadModel)" in built.stdout
