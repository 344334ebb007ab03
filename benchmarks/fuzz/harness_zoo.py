"""Fuzz the zoo spec reader: the first byte picks CSV (even) or YAML (odd), the rest is the file.

A spec that parses must give a zoo whose entries have unique names, a reference and numeric
quality columns, and whose default quality column is one of its columns.

Independent check: where the reader accepts a spec, :mod:`csv`'s ``DictReader`` (or
``yaml.safe_load``) parse of the same text gives the rows, read by the rules docs/ranking.md
states: the models are the rows' ``model`` cells in order; the quality columns are exactly the
columns (names stripped) other than ``model``, ``checkpoint`` and ``source`` whose filled cells
are all numbers; each entry's value in one is its cell as a float (NaN where empty); its reference
is its ``checkpoint`` cell (or its label), as given or resolved to an absolute path. A spec the
parse refuses that the reader accepted is a finding.
"""

from __future__ import annotations

import math
import os
from typing import Any

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
    _check_rows(zoo, _parsed_rows(data))


_RESERVED = ("model", "checkpoint", "source")


def _parsed_rows(data: bytes) -> list[Any]:
    import csv
    import io

    import yaml

    try:
        text = data[1:].decode("utf-8-sig")
        if data[0] & 1:
            parsed = yaml.safe_load(text)
            return list(parsed if isinstance(parsed, list) else parsed["models"])
        return list(csv.DictReader(io.StringIO(text, newline="")))
    except Exception as exc:  # noqa: BLE001 - any refusal by csv/yaml of a spec the reader accepted
        raise AssertionError(f"the csv/yaml parse refuses a spec the reader accepted: {type(exc).__name__}: {exc}"
                             ) from None


def _cell(row: Any, key: str) -> str:
    """A row's cell of a column: the key as given, else the first whose name stripped is it."""
    value = row.get(key)
    if value is None:
        value = next((v for k, v in row.items() if str(k).strip() == key), None)
    return "" if value is None else str(value).strip()


def _number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _check_rows(zoo: Any, rows: list[Any]) -> None:
    columns: list[str] = []
    for row in rows:
        for column in (str(k).strip() for k in row):
            if column and column not in columns:  # (two keys of one row may strip to one name)
                columns.append(column)
    numeric = [c for c in columns if c not in _RESERVED
               and any(_cell(r, c) for r in rows) and all(_number(_cell(r, c)) for r in rows if _cell(r, c))]
    assert list(zoo.quality_columns) == numeric, f"quality columns {zoo.quality_columns}, the parse's {numeric}"
    assert [e.name for e in zoo.entries] == [_cell(r, "model") for r in rows], "models not the parse's rows"
    for entry, row in zip(zoo.entries, rows):
        for column in numeric:
            text = _cell(row, column)
            want = float(text) if text else math.nan
            got = entry.quality[column]
            assert got == want or (math.isnan(got) and math.isnan(want)), f"{entry.name!r}: {column} = {got!r}"
        given = _cell(row, "checkpoint") or entry.name
        assert entry.ref == given or os.path.isabs(entry.ref), f"{entry.name!r}: reference {entry.ref!r}, not {given!r}"


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
