"""The BFE-W applicability verdict where a reader sees a score: the CSV summary and ModelScore's
repr / HTML, checked against the verdict in ``summary`` (itself tested in test_applicability.py)."""

from __future__ import annotations

import csv
import io

import pytest

import wbfe
from wbfe.render.text import score_csv


def _bert(tmp_path, p: float):
    transformers = pytest.importorskip("transformers")
    import torch

    torch.manual_seed(0)
    model = transformers.BertForSequenceClassification(transformers.BertConfig(
        vocab_size=64, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
        hidden_dropout_prob=p, num_labels=3))
    model.save_pretrained(tmp_path / "bert")
    return wbfe.score(str(tmp_path / "bert"), metrics="bfe")


def test_csv_carries_status_and_reasons_on_every_row(tmp_path):
    result = _bert(tmp_path, 0.1)
    verdict = result.summary["bfe_applicability"]
    assert verdict["status"] == "fails"
    rows = list(csv.DictReader(io.StringIO(score_csv(result))))
    assert len(rows) == len(result.layers)
    assert {row["bfe_applicability"] for row in rows} == {"fails"}
    assert {row["bfe_applicability_reasons"] for row in rows} == {"; ".join(verdict["reasons"])}
    assert "dropout (rate 0.1)" in rows[0]["bfe_applicability_reasons"]


def test_csv_of_a_bare_state_dict_says_unknown():
    import torch

    state = {f"layers.{k}.weight": torch.randn(32, 24, generator=torch.Generator().manual_seed(k)) for k in range(3)}
    result = wbfe.score(state, metrics="bfe")
    rows = list(csv.DictReader(io.StringIO(score_csv(result))))
    assert [row["bfe_applicability"] for row in rows] == ["unknown"] * 3
    assert rows[0]["bfe_applicability_reasons"] == result.summary["bfe_applicability"]["reasons"][0]


def test_repr_and_html_show_the_status_only(tmp_path):
    result = _bert(tmp_path, 0.0)
    assert result.summary["bfe_applicability"]["status"] == "holds"
    text = repr(result)
    assert "\n" not in text and len(text) < 400, text
    assert text.endswith(", bfe_applicability='holds')")
    assert "one linear map" not in text  # the reasons stay in summary
    assert "<th>bfe_applicability</th><td>&#x27;holds&#x27;</td>" in result._repr_html_()
