"""Framework descriptions remembered on disk (wbfe.framework.stored): the JSON round trip gives the
description transformers and timm built; a second score of the same architecture, in a fresh
process, imports neither torch nor transformers and writes the same JSON; a damaged file is rebuilt;
the cache admin lists and prunes the files. And the config rule that knows GPT-2's Conv1D layout
without torch, checked against transformers' own build."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

from wbfe.errors import InvalidOptionError  # noqa: E402
from wbfe.framework import FrameworkDescription, describe_config  # noqa: E402
from wbfe.framework import stored  # noqa: E402
from wbfe.framework.config_layouts import CONV1D_MODEL_TYPES, rule_layout  # noqa: E402
from wbfe.ranking.cache_admin import cache_info, prune_cache  # noqa: E402

TINY = {
    "gpt2": dict(n_embd=32, n_layer=2, n_head=4, n_positions=64, vocab_size=96),
    "openai-gpt": dict(n_embd=32, n_layer=2, n_head=4, n_positions=64, vocab_size=96),
    "imagegpt": dict(n_embd=32, n_layer=2, n_head=4, n_positions=64, vocab_size=96),
    "decision_transformer": dict(hidden_size=32, n_layer=2, n_head=4, n_positions=64, state_dim=5, act_dim=3),
    "llama": dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, vocab_size=96),
    "bert": dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, vocab_size=96,
                 num_labels=3),
}
ARCH = {"gpt2": "GPT2LMHeadModel", "openai-gpt": "OpenAIGPTLMHeadModel", "imagegpt": "ImageGPTForCausalImageModeling",
        "decision_transformer": "DecisionTransformerModel", "llama": "LlamaForCausalLM",
        "bert": "BertForSequenceClassification"}


def _config(model_type: str) -> dict[str, Any]:
    config = transformers.AutoConfig.for_model(model_type, **TINY[model_type]).to_dict()
    return dict(config, architectures=[ARCH[model_type]])


@pytest.mark.parametrize("model_type", ["gpt2", "llama", "bert"])
def test_the_json_round_trip_is_the_built_description(model_type: str) -> None:
    built = describe_config(_config(model_type))
    assert isinstance(built, FrameworkDescription) and built.order and built.facts
    again = FrameworkDescription.from_dict(json.loads(json.dumps(built.to_dict())))
    assert again == built


def test_the_timm_round_trip_is_the_built_description() -> None:
    pytest.importorskip("timm", reason="needs the timm extra: pip install -e '.[test,timm]'")
    built = describe_config({"architecture": "resnet18", "num_classes": 7, "pretrained_cfg": {"classifier": "fc"}})
    assert isinstance(built, FrameworkDescription) and built.head == "fc.weight"
    assert FrameworkDescription.from_dict(json.loads(json.dumps(built.to_dict()))) == built


@pytest.mark.parametrize("bad", [{"framework": "x"}, {"framework": "x", "model": "m", "order": "a"},
                                 {"framework": "x", "model": "m", "layouts": {"w": "sideways"}},
                                 {"framework": "x", "model": "m", "tied": {"a": 1}}])
def test_from_dict_refuses_what_to_dict_never_wrote(bad: dict[str, Any]) -> None:
    with pytest.raises(InvalidOptionError):
        FrameworkDescription.from_dict(bad)


@pytest.mark.parametrize("model_type", sorted(CONV1D_MODEL_TYPES) + ["llama", "bert"])
def test_the_conv1d_rule_is_what_transformers_builds(model_type: str) -> None:
    """The layouts transformers' own build gives (its Conv1D modules) are exactly the rule's, for every
    weight of the model: the rule is right without torch."""
    built = describe_config(_config(model_type))
    assert isinstance(built, FrameworkDescription)
    config = {"model_type": model_type}
    by_rule = {name: layout for name in built.order if (layout := rule_layout(config, name)) is not None}
    assert by_rule == dict(built.layouts)
    assert bool(by_rule) == (model_type in CONV1D_MODEL_TYPES)


def test_the_key_follows_the_versions_and_the_config(monkeypatch: pytest.MonkeyPatch) -> None:
    config = {"config": _config("gpt2")}
    key = stored.description_key("transformers", ("transformers", "torch"), config)
    assert key is not None and key == stored.description_key("transformers", ("transformers", "torch"), config)
    assert stored.description_key("transformers", ("transformers", "torch"),
                                  {"config": dict(config["config"], n_layer=3)}) != key
    real = stored.metadata.version
    monkeypatch.setattr(stored.metadata, "version", lambda name: "0.0.1" if name == "transformers" else real(name))
    assert stored.description_key("transformers", ("transformers", "torch"), config) not in (key, None)
    assert stored.description_key("transformers", ("no-such-package-wbfe",), config) is None


PROBE = """
import json, sys
sys.argv = ["wbfe", *json.loads(sys.argv[1])]
from wbfe_cli.main import main
try:
    main()
except SystemExit as exc:
    assert not exc.code, exc.code
print(json.dumps(sorted({n.split(".")[0] for n in sys.modules} & {"torch", "transformers", "timm"})))
"""


def _score(folder: Path, out: Path, cache: Path) -> list[str]:
    env = {**os.environ, "WBFE_CACHE_DIR": str(cache)}
    argv = ["score", str(folder), "--metrics", "bfe", "--format", "json", "-o", str(out)]
    done = subprocess.run([sys.executable, "-c", PROBE, json.dumps(argv)], capture_output=True, text=True, env=env,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def gpt2_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("gpt2")
    config = transformers.GPT2Config(**TINY["gpt2"])
    transformers.GPT2LMHeadModel(config).save_pretrained(folder)
    return folder


def test_a_second_score_imports_neither_torch_nor_transformers(gpt2_folder: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    first = _score(gpt2_folder, tmp_path / "first.json", cache)
    assert {"torch", "transformers"} <= set(first)  # the first builds the model on the meta device
    files = list((cache / "descriptions").rglob("*.json"))
    assert len(files) == 1
    second = _score(gpt2_folder, tmp_path / "second.json", cache)
    assert second == []
    assert (tmp_path / "first.json").read_text() == (tmp_path / "second.json").read_text()
    result = json.loads((tmp_path / "second.json").read_text())
    assert result["model"]["framework"]["used"] == "transformers"
    rows = {r["name"]: r for r in result["layers"]}
    assert (rows["transformer.h.0.mlp.c_fc.weight"]["rows"], rows["transformer.h.0.mlp.c_fc.weight"]["cols"]) == (
        128, 32)  # the Conv1D layout, from the remembered description

    # wbfe cache lists it and prunes it with the rest
    info = cache_info(cache).to_dict()["kinds"]["descriptions"]
    assert (info["count"], info["bytes"]) == (1, files[0].stat().st_size)
    assert [u.kind for u in prune_cache(cache, max_size=0).removed] == ["descriptions"]
    assert not files[0].exists()


def test_a_damaged_file_is_built_again(gpt2_folder: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    _score(gpt2_folder, tmp_path / "first.json", cache)
    (path,) = (cache / "descriptions").rglob("*.json")
    data = json.loads(path.read_text())
    data["payload"]["description"]["head"] = "transformer.h.0.mlp.c_fc.weight"  # the checksum no longer holds
    path.write_text(json.dumps(data))
    assert {"torch", "transformers"} <= set(_score(gpt2_folder, tmp_path / "again.json", cache))
    assert (tmp_path / "first.json").read_text() == (tmp_path / "again.json").read_text()
    assert json.loads(path.read_text())["payload"]["description"]["head"] == "lm_head.weight"


def test_the_number_of_files_is_bounded(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("WBFE_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(stored, "MAX_FILES", 3)
    keys = [f"{i:064x}" for i in range(5)]
    for i, key in enumerate(keys):
        stored.remember(key, FrameworkDescription("transformers", f"M{i}"))
        os.utime(stored._path(key), (1000.0 + i, 1000.0 + i))
    assert sorted(p.stem for p in (tmp_path / "descriptions").rglob("*.json")) == keys[2:]
    assert stored.recall(keys[4]) == FrameworkDescription("transformers", "M4")
    assert stored.recall(keys[0]) is None


def test_a_granitemoe_router_is_a_router(tmp_path: Path) -> None:
    """GraniteMoE keeps its router's Linear inside a router module (``block_sparse_moe.router.layer.weight``):
    its description's classes (GraniteMoeTopKRouter, GraniteMoeExperts) say router and expert, and so do the
    rows (the name rule agrees without transformers)."""
    import wbfe
    from wbfe.engine.matrices import role_of

    torch.manual_seed(0)
    config = transformers.AutoConfig.for_model(
        "granitemoe", hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=96, num_local_experts=4, num_experts_per_tok=2)
    config.architectures = ["GraniteMoeForCausalLM"]
    transformers.GraniteMoeForCausalLM(config).save_pretrained(tmp_path)
    roles = {row["name"]: row["role"] for row in wbfe.score(tmp_path, metrics="bfe").layers}
    routers = [name for name in roles if ".router." in name]
    assert routers == [f"model.layers.{i}.block_sparse_moe.router.layer.weight" for i in range(2)]
    assert all(roles[name] == "router" and role_of(name, 2) == "router" for name in routers)
    experts = [name for name in roles if "_linear" in name]
    assert len(experts) == 2 * 4 * 3 and all(roles[name] == "expert" for name in experts)


def test_a_modules_own_classes_give_roles_its_names_do_not() -> None:
    """A module's class decides where its name says nothing: a ``Gate`` module's ``proj`` is a router."""
    import wbfe
    from wbfe.engine.matrices import role_of

    class TopKGate(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.proj = torch.nn.Linear(16, 4, bias=False)

    class Block(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.chooser = TopKGate()
            self.fc = torch.nn.Linear(16, 16)
            self.out = torch.nn.Linear(16, 3)

    torch.manual_seed(0)
    roles = {row["name"]: row["role"] for row in wbfe.score(Block(), metrics="bfe").layers}
    assert role_of("chooser.proj.weight", 2) == "other"  # the name alone says nothing
    assert roles["chooser.proj.weight"] == "router" and roles["fc.weight"] != "router"
