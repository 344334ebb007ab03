"""Fuzz the zoo spec reader: the first byte picks CSV (even) or YAML (odd), the rest is the file.

A spec that parses must give a zoo whose entries have unique names, a reference and numeric
quality columns, and whose default quality column is one of its columns.
"""

from __future__ import annotations

import math

from benchmarks.fuzz.common import refused, put, time_bound
from wbfe.errors import WbfeError

NAME = "zoo"

# Tokens for libFuzzer's -dict: the columns and keys a spec names, and numbers that are not numbers.
DICTIONARY = ("model", "checkpoint", "source", "quality", "lower_is_better", "models", "name", "inf", "-inf", "nan",
              "1e309", ",", "\n", '"', "- ", ": ", "timm:", "~", "../", "{", "[", "null", "!!python/object", "&a", "*a")


def fuzz_one(data: bytes) -> None:
    """Read ``data[1:]`` as a zoo spec; raise on a finding."""
    from wbfe.ranking import load_zoo

    if not data:
        return
    path = put("zoo.yaml" if data[0] & 1 else "zoo.csv", data[1:])
    try:
        with time_bound():
            zoo = load_zoo(path)
    except WbfeError as exc:
        refused(exc)
        return
    names = [entry.name for entry in zoo.entries]
    assert len(set(names)) == len(names), "a zoo with two entries of one name"
    for entry in zoo.entries:
        assert isinstance(entry.name, str) and entry.name, f"entry name {entry.name!r}"
        assert isinstance(entry.ref, str) and entry.ref, f"{entry.name!r}: reference {entry.ref!r}"
        for column, value in entry.quality.items():
            assert column in zoo.quality_columns, f"{entry.name!r}: quality {column!r} is not a quality column"
            assert isinstance(value, float) and not math.isinf(value), f"{entry.name!r}: {column} = {value!r}"
    assert zoo.default_quality is None or zoo.default_quality in zoo.quality_columns, (
        f"default quality {zoo.default_quality!r} is not a column")
    assert set(zoo.lower_is_better) <= set(zoo.quality_columns) | set(), "lower-is-better names no column"


def seeds() -> dict[str, bytes]:
    """Specs as the docs write them: CSV (with a source column, an empty cell) and YAML."""
    import yaml

    csv_text = ("model,checkpoint,params,test_accuracy,test_loss,source\n"
                "small,timm:resnet18,11,0.71,1.2,\"paper, table 2\"\n"
                "big,timm:resnet50,25,0.80,,paper\n"
                "local,./m.safetensors,1,0.5,2.5,\n")
    spec = {"name": "fuzz-zoo", "quality": "acc", "lower_is_better": ["loss"],
            "models": [{"model": "a", "checkpoint": "org/model-a", "acc": 0.9, "loss": 0.3},
                       {"model": "b", "checkpoint": "sub/dir/b.safetensors", "acc": 0.7, "loss": 0.8}]}
    rows = [{"model": "torchvision:ResNet18_Weights.IMAGENET1K_V1", "top1": 69.8, "source": "torchvision docs"}]
    return {"zoo.csv": b"\x00" + csv_text.encode(), "zoo.yaml": b"\x01" + yaml.safe_dump(spec).encode(),
            "rows.yaml": b"\x01" + yaml.safe_dump(rows).encode()}
