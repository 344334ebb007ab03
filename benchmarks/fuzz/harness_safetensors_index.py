"""Fuzz the safetensors shard index: ``model.safetensors.index.json`` beside two fixed shards.

The folder is opened as a whole, so the index is what picks the files; every tensor the shards
hold must then be read or listed as skipped with its reason.

Independent check: :mod:`json`'s parse of the same bytes names the shards (``weight_map``'s
values, as paths in the folder); the reader lists exactly the tensors those shards hold as the
``safetensors`` package reads them (a tensor the index leaves out is listed as skipped), each read
one with the package's bytes. An index :mod:`json` refuses that the reader read is a finding.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Optional

from benchmarks.fuzz.common import check_source, fresh_folder, put
from benchmarks.fuzz.harness_safetensors import safetensors_parse

NAME = "safetensors_index"

# Tokens for libFuzzer's -dict: the index's keys and shard names that must be refused.
DICTIONARY = ('"weight_map"', '"metadata"', '"model-00001-of-00002.safetensors"', '"model-00002-of-00002.safetensors"',
              '"../"', '"/etc/passwd"', '"model.safetensors.index.json"', '"."', '"a.weight"', '"extra.weight"', "null")
INDEX = "model.safetensors.index.json"
_FOLDER: Optional[Path] = None


def _shards() -> dict[str, bytes]:
    import torch
    from safetensors.torch import save

    g = torch.Generator().manual_seed(1)
    return {
        "model-00001-of-00002.safetensors": save({"a.weight": torch.randn(8, 6, generator=g),
                                                  "b.weight": torch.randn(8, 6, generator=g)}),
        "model-00002-of-00002.safetensors": save({"c.weight": torch.randn(4, 8, generator=g),
                                                  "extra.weight": torch.randn(4, 4, generator=g)}),
    }


def _folder() -> Path:
    global _FOLDER
    if _FOLDER is None:
        _FOLDER = fresh_folder("index")
        for name, data in _shards().items():
            put(name, data, _FOLDER)
    return _FOLDER


def fuzz_one(data: bytes) -> None:
    """Read the folder with ``data`` as its shard index; raise on a finding."""
    folder = _folder()
    put(INDEX, data, folder)
    check_source(folder, reference=lambda: _index_parse(folder, data))


def _index_parse(folder: Path, data: bytes) -> dict[str, Any]:
    try:
        weight_map = json.loads(data)["weight_map"]
        shards = {os.path.normpath(folder / shard) for shard in weight_map.values()}
    except Exception as exc:  # noqa: BLE001 - any refusal by json of an index wbfe read
        raise AssertionError(f"json refuses an index the reader read: {type(exc).__name__}: {exc}") from None
    out: dict[str, Any] = {}
    for shard in sorted(shards):
        # A tensor two shards hold is listed once (the reader's rule: the index says whose it is),
        # so the union of the names; our two shards hold distinct names.
        out.update(safetensors_parse(Path(shard)))
    return out


def seeds() -> dict[str, bytes]:
    """Valid indexes of the two shards (one lists a tensor twice, one leaves ``extra`` out)."""
    first, second = "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"
    full = {"a.weight": first, "b.weight": first, "c.weight": second, "extra.weight": second}
    return {
        "full.json": json.dumps({"metadata": {"total_size": 544}, "weight_map": full}).encode(),
        "partial.json": json.dumps({"weight_map": {"a.weight": first, "c.weight": "./" + second}}).encode(),
        "one.json": json.dumps({"weight_map": {"b.weight": first}}, indent=2).encode(),
    }
